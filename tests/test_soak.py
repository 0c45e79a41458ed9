"""Load: many actor and learner threads, a million transitions, exact accounting, bounded memory."""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from conduit import Conduit, Mode, Schedule

ACTORS, LEARNERS, UNIT, TOTAL = 8, 2, 1000, 1_000_000


def unit(actor: int, k: int) -> dict[str, torch.Tensor]:
    tid = torch.arange(UNIT, dtype=torch.int64) + (actor * (TOTAL // ACTORS) + k * UNIT)
    return {"obs": tid.float().unsqueeze(1).expand(-1, 8).contiguous(), "reward": torch.ones(UNIT), "tid": tid}


def test_a_million_transitions_from_eight_actors_to_two_learners():
    g_ing = 2
    edp = Conduit(
        policy="off_policy", train_batch_size=256, capacity=1 << 17, num_learners=LEARNERS, seed=0, timeout_s=60,
        pinned=Schedule(Mode(True, g_ing), Mode(True, 2)),
    )
    seen: list[np.ndarray] = []

    @edp.register_ingestion(input="Actor", output="ExperienceBuffer")
    def record(actor_in, exp_out):
        d = actor_in.read()
        seen.append(d["tid"].numpy().copy())
        exp_out.write(d)

    done = threading.Event()
    errors: list[BaseException] = []
    pulled = [0] * LEARNERS
    max_pending = [0]

    def actor(a: int) -> None:
        try:
            for k in range(TOTAL // ACTORS // UNIT):
                edp.push(unit(a, k))
        except BaseException as e:
            errors.append(e)

    def learner(rank: int) -> None:
        try:
            while not done.is_set():
                if not edp.ready():
                    time.sleep(0.001)
                    continue
                b = edp.pull(rank, timeout=10)
                assert torch.equal(b["obs"][:, 0], b["tid"].float())  # whole, untorn rows
                assert torch.equal(b["obs"][:, -1], b["tid"].float())
                assert int(b.info.ids.max()) < b.info.buffer_version  # rows that existed when sampled
                assert b.info.staleness < 2  # g_del = 2
                pulled[rank] += 1
        except BaseException as e:
            errors.append(e)

    def monitor() -> None:
        while not done.is_set():
            max_pending[0] = max(max_pending[0], edp.ingestion.pending_units)
            time.sleep(0.0005)

    with edp:
        threads = [threading.Thread(target=actor, args=(a,)) for a in range(ACTORS)]
        threads += [threading.Thread(target=learner, args=(r,)) for r in range(LEARNERS)]
        mon = threading.Thread(target=monitor)
        for t in [*threads, mon]:
            t.start()
        for t in threads[:ACTORS]:
            t.join(120)
        edp.flush()
        done.set()
        for t in [*threads[ACTORS:], mon]:
            t.join(30)
        stats = edp.stats()
        buffer_ids = edp.buffer.ids.copy()
    assert not errors, errors[:3]
    ingested = np.concatenate(seen)
    assert ingested.size == TOTAL and np.array_equal(np.sort(ingested), np.arange(TOTAL))  # each exactly once
    assert stats.pushed_rows == stats.ingested_rows == TOTAL
    live = buffer_ids[buffer_ids >= 0]
    assert live.size == 1 << 17 and np.unique(live).size == live.size and live.max() == TOTAL - 1
    assert min(pulled) > 0 and stats.pulls == sum(pulled)
    # back-pressure: a push returns only with at most g_ing units pending; blocked pushers hold theirs
    assert max_pending[0] <= g_ing + ACTORS
    assert not any(t.is_alive() for t in [*threads, mon]), "a thread hung"  # how fast is a benchmark's job
