"""Promise: a save beside pushing actors and a waiting learner stalls nobody longer than the save itself.

Lock order (conduit/runtime.py, ``Conduit.state_dict``): a save pauses ingestion
and delivery between invocations, settles the delivery's counts, reads the
buffer's admissions under the ingestion's condition, then copies the rows with
no path lock held. Pushes queue and pulls take staged batches meanwhile; an
inline pull waiting for data waits without its invocation lock, so a save never
waits for data and data never waits for a save to end.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from conduit import Conduit, Mode, Schedule
from conduit.checkpoint import load
from tests.helpers import transitions

SCHEDULES = [
    Schedule(Mode(i_ovl, gi), Mode(d_ovl, gd))
    for i_ovl, gi, d_ovl, gd in itertools.product((False, True), (1, 2), (False, True), (1, 2))
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=str)
def test_save_push_and_pull_together_under_every_schedule(schedule, tmp_path, crew):
    """A learner waits for data, actors push, the main thread saves three times: every call returns, no pull
    waits longer than a save plus a margin, and every checkpoint restores to a consistent runtime."""
    edp = Conduit(
        policy="off_policy", train_batch_size=32, capacity=20_000, timeout_s=10.0, min_size_to_sample=2_000,
        pinned=schedule, seed=0,
    )
    with edp:
        edp.push(transitions(1_000))  # the learner waits: sampling starts at 2,000
        pulls: list[float] = []
        saves: list[float] = []
        stop = threading.Event()

        def learner() -> None:
            while not stop.is_set():
                t0 = time.monotonic()
                edp.pull(timeout=8.0)
                pulls.append(time.monotonic() - t0)

        def actor(a: int) -> None:
            for i in range(40):
                edp.push(transitions(40, start=10_000 * (a + 1) + 40 * i), timeout=8.0)
                time.sleep(0.002)

        crew.start(learner, "learner")
        for a in range(4):
            crew.start(lambda a=a: actor(a), f"actor-{a}")
        for k in range(3):
            t0 = time.monotonic()
            edp.save(tmp_path / f"ck{k}", timeout=8.0)
            saves.append(time.monotonic() - t0)
            time.sleep(0.05)
        for t in crew.threads[1:]:
            t.join(10.0)
        edp.flush()
        deadline = time.monotonic() + 5
        while len(pulls) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.set()
        crew.join(10.0)
        assert pulls, "the learner never got a batch although 7,400 rows were pushed"
        # the first pull waited for data; after it, no pull waited longer than the longest save plus a margin
        assert max(pulls[1:], default=0.0) <= max(saves) + 2.0, (pulls, saves)
    for k in range(3):
        manifest, state = load(tmp_path / f"ck{k}")
        pulls_saved = sum(manifest["delivery"]["pulls"])
        staged = sum(len(q) for q in state["delivery"]["staged"])
        assert state["buffer"]["limiter"]["samples"] == 32 * pulls_saved
        assert staged <= 2 * schedule.delivery.granularity
        with Conduit.from_checkpoint(tmp_path / f"ck{k}") as again:
            again.flush()
            assert again.stats().buffer_rows == again.buffer.size


def test_a_save_of_a_large_buffer_while_eight_actors_push_does_not_hold_them_up(tmp_path, crew):
    """10^5 rows in the buffer, 8 actors pushing: the save completes and every actor's pushes complete;
    the times are reported (BENCHMARKS.md records them), not asserted."""
    edp = Conduit(policy="off_policy", train_batch_size=64, capacity=100_000, timeout_s=20.0, seed=0)
    with edp:
        for i in range(0, 100_000, 5_000):
            edp.push(transitions(5_000, dim=16, start=i))
        pushed = [0] * 8

        def actor(a: int) -> None:
            for i in range(50):
                edp.push(transitions(64, dim=16, start=200_000 + a * 10_000 + 64 * i), timeout=15.0)
                pushed[a] += 1

        for a in range(8):
            crew.start(lambda a=a: actor(a), f"actor-{a}")
        t0 = time.monotonic()
        edp.save(tmp_path / "big", timeout=15.0)
        took = time.monotonic() - t0
        crew.join(30.0)
        assert pushed == [50] * 8
        print(f"save of 100,000 rows beside 8 pushing actors: {took:.2f}s")
    manifest, _ = load(tmp_path / "big")
    assert manifest["buffer"]["inserted"] >= 100_000
