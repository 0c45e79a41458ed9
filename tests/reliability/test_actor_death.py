"""Promise: one actor process dying (``kill -9``) costs only that actor; the learner trains on.

Real spawned processes push through ``actor_channel``; one is killed mid-run.
The learner keeps pulling, the loss is reported (log, ``stats()``, the callback,
``channel.stats()``), and every unit the dead actor had acknowledged is in the
buffer.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest
import torch
import torch.multiprocessing as mp

from conduit import Conduit, SpecError


def _actor_main(actor, k: int, units: int, pace: float) -> None:
    with actor:
        for u in range(units):
            tid = torch.arange(16) + 100_000 * k + 16 * u
            actor.push({"obs": tid.float().unsqueeze(1).repeat(1, 4), "tid": tid})
            time.sleep(pace)


def test_a_killed_actor_costs_only_itself(caplog):
    lost = []
    units = 60
    with Conduit(policy="off_policy", train_batch_size=32, capacity=100_000, timeout_s=30, seed=0) as edp:
        channel = edp.actor_channel(maxsize=4, on_actor_lost=lost.append)
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_actor_main, args=(channel.actor(), k, units, 0.01)) for k in range(4)]
        for p in procs:
            p.start()
        victim = procs[2]
        deadline = time.monotonic() + 60
        pulls = 0
        with caplog.at_level(logging.WARNING, logger="conduit"):
            # mid-run: the victim has loaded its handle (it is watched from then on) and handed over some units
            while (channel.stats().received_by[2] < 5 or channel.received < 40) and time.monotonic() < deadline:
                if edp.ready():
                    edp.pull()
                    pulls += 1
                time.sleep(0.005)
            os.kill(victim.pid, signal.SIGKILL)
            while not lost and time.monotonic() < deadline:
                if edp.ready():
                    edp.pull()  # the learner keeps training meanwhile
                    pulls += 1
                time.sleep(0.005)
            for p in procs:
                p.join(60)
            survivors = [p for p in procs if p is not victim]
            assert all(p.exitcode == 0 for p in survivors) and victim.exitcode == -signal.SIGKILL
            channel.drain(3 * units + lost[0].received, timeout=30)
            edp.flush()
            for _ in range(10):
                edp.pull()
        assert len(lost) == 1 and lost[0].actor == 2 and lost[0].pid == victim.pid
        assert f"actor 2 (pid {victim.pid}) died" in caplog.text
        stats = edp.stats()
        assert stats.actors_lost == 1 and channel.stats().lost == lost
        tids = set(edp.buffer.contents()["tid"].tolist())
        for k in (0, 1, 3):  # every unit of every surviving actor
            assert {100_000 * k + i for i in range(16 * units)} <= tids
        from_victim = {t for t in tids if 200_000 <= t < 300_000}
        assert len(from_victim) == 16 * lost[0].received  # exactly what it had handed over, all of it
        assert from_victim == {200_000 + i for i in range(16 * lost[0].received)}
        assert edp.failure.error is None


def _bad_actor_main(actor) -> None:
    import numpy as np

    actor.push({"obs": np.zeros((4, 4), np.float32), "tid": np.arange(4)})
    actor.flush()
    actor.push({"obs": np.zeros((4, 4), np.complex64), "tid": np.arange(4)})  # refused by the runtime
    try:
        actor.flush()
    except SpecError:
        actor.push({"obs": np.zeros((4, 4), np.float32), "tid": np.arange(4)})  # told once; the actor goes on
        actor.close()
        os._exit(3)
    os._exit(0)


def test_a_unit_the_runtime_refuses_is_reported_to_its_actor_not_fatal():
    with Conduit(policy="off_policy", train_batch_size=4, capacity=64, timeout_s=30) as edp:
        channel = edp.actor_channel()
        p = mp.get_context("spawn").Process(target=_bad_actor_main, args=(channel.actor(),))
        p.start()
        p.join(60)
        assert p.exitcode == 3
        channel.drain(3)
        assert channel.stats().refused == 1 and channel.stats().lost == [] and edp.failure.error is None
        edp.push({"obs": torch.zeros(4, 4), "tid": torch.arange(4)})


@pytest.mark.parametrize("fields", [3, 60], ids=["one-message", "in-parts"])
def test_units_of_any_width_arrive_whole(fields):
    """A unit of many fields is sent in parts (each written atomically) and arrives whole."""
    with Conduit(policy="off_policy", train_batch_size=4, capacity=64, timeout_s=30) as edp:
        channel = edp.actor_channel()
        p = mp.get_context("spawn").Process(target=_wide_actor_main, args=(channel.actor(), fields))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        channel.drain(2)
        edp.flush()
        got = edp.buffer.contents()
        assert len(got) == fields and all(v.shape[0] == 8 for v in got.values())
        assert all((got[f"f{i}"][:, 0] == i).all() for i in range(fields))


def _wide_actor_main(actor, fields: int) -> None:
    with actor:
        for _ in range(2):
            actor.push({f"f{i}": torch.full((4, 2), float(i)) for i in range(fields)})
