"""Promise: a queue delivers every row exactly once (``max_times_sampled=1``, Reverb's queue).

A draw reserves the rows it takes in the same hold of the buffer's lock, and a
claim promises itself its rows before it draws, so no other learner, thread or
prefetching worker can take them while the batch is on its way (conduit.slots,
conduit.paths.replay). These tests run real actor and learner threads through
every schedule and learner count, bounded in rows and time.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time

import numpy as np
import pytest
import torch

from conduit import Conduit, Mode, RateLimit, RateLimited, Schedule
from tests.helpers import transitions
from tests.reliability.conftest import pull_until, until

B = 50
#: the Done-means grid: learners x delivery timing x granularity, 10^5 rows each
GRID = list(itertools.product((1, 2, 4), (False, True), (1, 2, 4)))


def _run_queue(edp: Conduit, rows: int, learners: int, crew, *, actors: int = 2, chunk: int = 250) -> list[int]:
    """``actors`` threads push ``rows`` rows in chunks; ``learners`` threads pull until every row came out."""
    got: list[list] = [[] for _ in range(learners)]
    per_actor = rows // actors
    delivered = [0]
    lock = threading.Lock()

    def actor(a: int) -> None:
        for start in range(a * per_actor, (a + 1) * per_actor, chunk):
            edp.push(transitions(chunk, start=start))

    def done() -> bool:
        with lock:
            delivered[0] = sum(len(b["tid"]) for g in got for b in g)
            return delivered[0] >= rows

    deadline = time.monotonic() + 120
    for a in range(actors):
        crew.start(lambda a=a: actor(a), f"actor-{a}")
    for r in range(learners):
        crew.start(lambda r=r: pull_until(edp, r, done, got[r], deadline), f"learner-{r}")
    crew.join(150)
    return [t for g in got for b in g for t in b["tid"].tolist()]


def _queue(learners: int, overlap: bool, g: int, **kw) -> Conduit:
    cfg = dict(
        policy="off_policy", train_batch_size=B, capacity=100_000, sampler="fifo", max_times_sampled=1,
        min_size_to_sample=B, num_learners=learners, timeout_s=10.0, pinned=Schedule(Mode(False, 1), Mode(overlap, g)),
        seed=0,
    )
    return Conduit(**{**cfg, **kw})


@pytest.mark.parametrize("learners, overlap, g", GRID, ids=[f"L{n}-{'ovl' if o else 'inl'}-g{g}" for n, o, g in GRID])
def test_every_row_is_delivered_exactly_once(learners, overlap, g, crew):
    rows = 100_000
    with _queue(learners, overlap, g) as edp:
        tids = _run_queue(edp, rows, learners, crew)
        twice = [t for t, c in collections.Counter(tids).items() if c > 1]
        assert twice == [], f"{len(twice)} rows delivered more than once, e.g. {twice[:5]}"
        assert sorted(tids) == list(range(rows))
        assert edp.buffer.size == 0 and edp.buffer.evicted_by_sampling == rows


@pytest.mark.parametrize("learners, overlap, g", [(1, False, 1), (2, True, 2), (4, True, 1)],
                         ids=["L1-inl-g1", "L2-ovl-g2", "L4-ovl-g1"])
def test_reverbs_queue_limiter_makes_a_full_queue_wait_and_loses_no_row(learners, overlap, g, crew):
    """``RateLimit.queue(capacity)`` (Reverb's ``Queue``): actors pushing ten times the capacity wait while the
    queue is full, where the remover would evict rows nobody drew; every row is delivered once, in order on
    one learner, and nothing is evicted unsampled."""
    capacity, rows = 2 * B * 4, 10 * 2 * B * 4
    with _queue(learners, overlap, g, capacity=capacity, rate_limit=RateLimit.queue(capacity)) as edp:
        tids = _run_queue(edp, rows, learners, crew, actors=1, chunk=B)
        assert sorted(tids) == list(range(rows)) and len(tids) == rows
        if learners == 1:
            assert tids == sorted(tids)
        assert edp.buffer.evicted_by_sampling == rows and edp.stats().push_blocked_s > 0
    with _queue(1, False, 1, capacity=capacity, rate_limit=RateLimit.queue(capacity, block=False)) as edp:
        edp.push(transitions(capacity))
        with pytest.raises(RateLimited, match="max_diff"):  # full: refused at once, nothing overwritten
            edp.push(transitions(B, start=capacity))
        assert edp.pull()["tid"].tolist() == list(range(B))


SAMPLERS = ("fifo", "lifo", "uniform", "prioritized")
REMOVERS = ("fifo", "lifo", "uniform", "prioritized")
#: every combination the config admits (a prioritized remover needs the prioritized sampler's priorities)
COMBOS = [(s, r) for s in SAMPLERS for r in REMOVERS if r != "prioritized" or s == "prioritized"]


@pytest.mark.parametrize("sampler, remover", COMBOS, ids=[f"{s}-sampler-{r}-remover" for s, r in COMBOS])
@pytest.mark.parametrize("schedule", ["inline", "overlapped-g2"])
@pytest.mark.parametrize("learners", [1, 2, 4])
def test_no_row_is_delivered_twice_with_any_sampler_and_remover(sampler, remover, schedule, learners, crew):
    """A small buffer (the remover evicts rows nobody drew yet): never a row twice, and every row pushed is
    delivered, still in the buffer, or was evicted by the remover, exactly one of those."""
    overlap, g = (False, 1) if schedule == "inline" else (True, 2)
    rows = 6_000
    with _queue(learners, overlap, g, capacity=1_000, sampler=sampler, remover=remover) as edp:
        stop = threading.Event()
        got: list[list] = [[] for _ in range(learners)]

        def actor() -> None:
            for start in range(0, rows, 100):
                edp.push(transitions(100, start=start))
            stop.set()

        def learner(r: int) -> None:
            deadline = time.monotonic() + 60
            pull_until(edp, r, lambda: stop.is_set() and not edp.ready(r), got[r], deadline)

        crew.start(actor, "actor")
        for r in range(learners):
            crew.start(lambda r=r: learner(r), f"learner-{r}")
        crew.join(90)
        edp.flush()
        tids = [t for gr in got for b in gr for t in b["tid"].tolist()]
        counts = collections.Counter(tids)
        assert max(counts.values()) == 1, f"rows delivered twice: {[t for t, c in counts.items() if c > 1][:5]}"
        left = set(edp.buffer.contents()["tid"].tolist()) if edp.buffer.size else set()
        assert not (left & set(tids)), "a delivered row is still in the buffer"
        assert set(tids) | left <= set(range(rows))


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlapped"])
def test_two_threads_pulling_for_one_learner_share_the_queue(overlap, crew):
    """Two threads of one learner (a trainer's two threads): no empty-buffer failure, no row twice."""
    rows = 20_000
    with _queue(1, overlap, 2) as edp:
        got: list[list] = [[], []]
        lock = threading.Lock()

        def done() -> bool:
            with lock:
                return sum(len(b["tid"]) for gr in got for b in gr) >= rows

        def actor() -> None:
            for start in range(0, rows, 500):
                edp.push(transitions(500, start=start))

        deadline = time.monotonic() + 60
        crew.start(actor, "actor")
        for k in range(2):
            crew.start(lambda k=k: pull_until(edp, 0, done, got[k], deadline), f"puller-{k}")
        crew.join(90)
        tids = sorted(t for gr in got for b in gr for t in b["tid"].tolist())
        assert tids == list(range(rows))


def test_a_staged_batch_dropped_unread_gives_its_rows_back():
    """Reserved rows of a batch that never reaches a learner are not lost: the next draw may take them."""
    edp = _queue(1, True, 2, capacity=1_000)
    with edp:
        edp.push(transitions(4 * B))
        first = edp.pull()
        until(lambda: edp.delivery.staged[0])
        edp.delivery.set_mode(Mode(False, 1))  # the worker claims nothing more; what it staged stays staged
        table, limiter = edp.buffer.table, edp.delivery.limiter
        assert table.held_count > 0  # staged rows are reserved: no other draw may take them
        with edp.delivery.cond:
            staged = edp.delivery.staged[0].popleft()
            reserved = limiter.reserved
            edp.delivery._unstage(0, staged)  # what close() does with every staged batch
        assert limiter.reserved == reserved - len(staged.info.rows)
        assert not table.held[staged.info.indices].any() and table.reserved[staged.info.indices].sum() == 0
        again = {t for _ in range(3) for t in edp.pull()["tid"].tolist()}
        assert set(staged.info.ids.tolist()) <= again  # drawn again (FIFO: the oldest rows come first)
        assert set(first["tid"].tolist()).isdisjoint(again)


def test_prioritized_draws_under_a_budget_are_distinct_and_weighted_by_the_full_distribution():
    from conduit.buffers.replay import ReplayBuffer
    from conduit.samplers.prioritized import PrioritizedSampler
    from conduit.storage import FixedStorage

    buf = ReplayBuffer(64, FixedStorage(torch.device("cpu")), PrioritizedSampler(64), max_times_sampled=2, seed=0)
    buf.write([transitions(64)])
    buf.update_priorities(np.arange(64), np.arange(64), np.r_[np.full(63, 0.01), 100.0])
    s = buf.sample(10, reserve=True)
    assert len(set(s.ids.tolist())) == 10 and 63 in s.ids.tolist()  # the heavy row once, not ten times
    assert buf.table.held_count == 0 and int(buf.table.reserved.sum()) == 10
    s2 = buf.sample(10, reserve=True)  # row 63's second use is taken now: it is held
    assert 63 in s2.ids.tolist() and buf.table.held[63]
    s3 = buf.sample(10, reserve=True)
    assert 63 not in s3.ids.tolist()
    buf.delivered(s.indices, s.ids, reserved=True)
    buf.delivered(s2.indices, s2.ids, reserved=True)
    assert not buf.table.valid[63]  # used twice: evicted


def test_a_pull_interrupted_mid_gather_gives_its_rows_back(monkeypatch):
    """A KeyboardInterrupt (a notebook's stop button) inside a draw: the promise and the reservations go back."""
    with _queue(1, False, 1, capacity=1_000) as edp:
        edp.push(transitions(2 * B))
        real = edp.buffer.storage.gather
        calls = {"n": 0}

        def interrupted(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 1:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        monkeypatch.setattr(edp.buffer.storage, "gather", interrupted)
        with pytest.raises(KeyboardInterrupt):
            edp.pull()
        assert edp.delivery._promised == 0 and edp.buffer.table.held_count == 0
        assert edp.failure.error is None
        tids = sorted(t for _ in range(2) for t in edp.pull()["tid"].tolist())
        assert tids == list(range(2 * B))
