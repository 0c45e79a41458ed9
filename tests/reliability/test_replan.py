"""Promise: a live re-plan hands every waiting caller to the new path.

The AutoPlanner re-plans while actors push and learners pull, so a mode switch
happens in normal use: a learner blocked in an overlapped pull, a push waiting
on back-pressure, an inline invocation in flight. These tests switch schedules
under real threads and check that nobody times out, and (through a queue) that
every row still arrives exactly once.
"""

from __future__ import annotations

import itertools
import random
import threading
import time

import pytest

from conduit import Conduit, Mode, Schedule
from tests.helpers import transitions
from tests.reliability.conftest import pull_until

OFF = [
    Schedule(Mode(i_ovl, gi), Mode(d_ovl, gd))
    for i_ovl, gi, d_ovl, gd in itertools.product((False, True), (1, 2), (False, True), (1, 2, 4))
]


@pytest.mark.parametrize("learners", [1, 2])
def test_schedules_switching_under_load_strand_nobody_and_lose_nothing(learners, crew):
    rows, b = 40_000, 50
    edp = Conduit(
        policy="off_policy", train_batch_size=b, capacity=100_000, sampler="fifo", max_times_sampled=1,
        min_size_to_sample=b, num_learners=learners, timeout_s=5.0, pinned=OFF[0], seed=0,
    )
    with edp:
        got: list[list] = [[] for _ in range(learners)]
        lock = threading.Lock()
        finished = threading.Event()

        def done() -> bool:
            with lock:
                return sum(len(x["tid"]) for g in got for x in g) >= rows

        def actor() -> None:
            for start in range(0, rows, 200):
                edp.push(transitions(200, start=start), timeout=5.0)

        def planner() -> None:
            rng = random.Random(0)
            while not finished.is_set():
                edp.reschedule(rng.choice(OFF), timeout=5.0)
                time.sleep(rng.uniform(0.0, 0.02))

        deadline = time.monotonic() + 90
        crew.start(actor, "actor")
        crew.start(planner, "planner")
        for r in range(learners):
            crew.start(lambda r=r: pull_until(edp, r, done, got[r], deadline), f"learner-{r}")
        while not done() and time.monotonic() < deadline and not crew.errors:
            time.sleep(0.05)
        finished.set()
        crew.join(30)
        tids = sorted(t for g in got for x in g for t in x["tid"].tolist())
        assert tids == list(range(rows))


@pytest.mark.parametrize("g", [1, 2])
def test_a_learner_blocked_in_an_overlapped_pull_is_served_inline_after_a_switch(g):
    """The learner waits on the worker (nothing to sample yet), the plan switches delivery to inline, then
    data comes: the waiting pull is served by the inline path well within its timeout."""
    edp = Conduit(
        policy="off_policy", train_batch_size=64, capacity=4096, timeout_s=10.0, min_size_to_sample=64,
        pinned=Schedule(Mode(False, 1), Mode(True, g)),
    )
    with edp:
        edp.push(transitions(16))
        out: dict = {}

        def learner() -> None:
            t0 = time.monotonic()
            out["batch"] = edp.pull(timeout=5.0)
            out["waited"] = time.monotonic() - t0

        t = threading.Thread(target=learner)
        t.start()
        time.sleep(0.2)  # blocked: 16 rows, sampling starts at 64
        edp.reschedule(Schedule(Mode(False, 1), Mode(False, 1)))
        edp.push(transitions(2048, start=16))
        t.join(6.0)
        assert not t.is_alive() and "batch" in out, "the learner was stranded by the switch"
        assert out["waited"] < 3.0


def test_a_learner_waiting_inline_is_served_by_the_worker_after_a_switch():
    edp = Conduit(
        policy="off_policy", train_batch_size=64, capacity=4096, timeout_s=10.0, min_size_to_sample=64,
        pinned=Schedule(Mode(False, 1), Mode(False, 1)),
    )
    with edp:
        edp.push(transitions(16))
        out: dict = {}
        t = threading.Thread(target=lambda: out.setdefault("batch", edp.pull(timeout=5.0)))
        t.start()
        time.sleep(0.2)
        edp.reschedule(Schedule(Mode(True, 2), Mode(True, 2)))
        edp.push(transitions(2048, start=16))
        edp.flush()
        t.join(6.0)
        assert not t.is_alive() and "batch" in out


def test_a_push_waiting_on_back_pressure_is_served_after_a_switch():
    """A push waits for the overlapped worker (g units pending); switching ingestion to inline releases it."""
    edp = Conduit(
        policy="off_policy", train_batch_size=8, capacity=4096, timeout_s=10.0,
        pinned=Schedule(Mode(True, 1), Mode(False, 1)),
    )
    gate = threading.Event()

    @edp.register_ingestion()
    def slow(actor_in, exp_out):
        gate.wait(5.0)
        exp_out.write(actor_in.read())

    with edp:
        pushes = threading.Thread(target=lambda: [edp.push(transitions(8, start=8 * i), timeout=5.0) for i in range(4)])
        pushes.start()
        time.sleep(0.2)
        switch = threading.Thread(target=lambda: edp.reschedule(Schedule(Mode(False, 1), Mode(False, 1)), timeout=5.0))
        switch.start()
        time.sleep(0.1)
        gate.set()
        switch.join(6.0)
        pushes.join(6.0)
        assert not switch.is_alive() and not pushes.is_alive()
        edp.flush()
        assert edp.stats().ingested_rows == 32


def test_on_policy_schedules_switching_between_iterations_keep_every_iteration_whole(crew):
    """On-policy: the plan switches while iterations are pushed and trained on; every iteration's epochs
    still cover its rows exactly once, and no pull waits out its timeout."""
    from fractions import Fraction

    from conduit.core import feasible_schedules

    m, rows, iterations = 4, 64, 30
    schedules = feasible_schedules("on_policy", m, 1, 1)
    assert len(schedules) > 1
    edp = Conduit(
        policy="on_policy", train_batch_size=rows, num_minibatches=m, num_epochs=2, timeout_s=5.0,
        pinned=schedules[0],
    )
    with edp:
        finished = threading.Event()
        seen: list[list[int]] = []

        def actor() -> None:
            for it in range(iterations):
                for k in range(4):
                    edp.push(transitions(rows // 4, start=it * rows + k * rows // 4), timeout=5.0)

        def planner() -> None:
            rng = random.Random(1)
            while not finished.is_set():
                edp.reschedule(rng.choice(schedules), timeout=5.0)
                time.sleep(rng.uniform(0.0, 0.01))

        crew.start(actor, "actor")
        crew.start(planner, "planner")
        for _ in range(iterations):
            tids: list[int] = []
            for batch in edp.minibatches(timeout=5.0):
                tids += batch["tid"].tolist()
            seen.append(tids)
        finished.set()
        crew.join(30)
        for it, tids in enumerate(seen):
            assert sorted(tids) == sorted(2 * list(range(it * rows, (it + 1) * rows))), f"iteration {it}"
    assert Fraction(1, m) in {s.delivery.granularity for s in schedules}


def test_an_inline_pull_after_a_switch_waits_for_the_old_workers_batch_and_keeps_the_order(crew):
    """A switch to inline returns once its invocation locks are free, while the old mode's worker may still be
    inside an invocation (here: held in the delivery hook). The next inline pull must not claim past that
    batch: the worker's mini-batch comes first, then the rest, in order, each once. (The race once delivered
    the next mini-batch first and the held one after the iteration's last, lost to it.)"""
    from fractions import Fraction

    from conduit.core import INLINE

    entered, release = threading.Event(), threading.Event()
    calls = itertools.count()
    overlapped = Schedule(Mode(False, Fraction(1)), Mode(True, Fraction(1, 4)))
    edp = Conduit(policy="on_policy", train_batch_size=64, num_minibatches=4, num_epochs=1, timeout_s=10.0,
                  pinned=overlapped)

    @edp.register_delivery(input="ExperienceBuffer", output="Learner")
    def held(exp_in, learn_out):  # the worker's first invocation waits until the test lets it go
        if next(calls) == 0:
            entered.set()
            release.wait(10)
        learn_out.write(exp_in.read())

    got: list = []
    with edp:
        for k in range(4):
            edp.push(transitions(16, start=16 * k))
        assert entered.wait(10)  # the worker holds mini-batch 0
        crew.start(lambda: edp.reschedule(INLINE, timeout=0.2), "switch")  # returns, the worker still inside
        crew.join(10)
        crew.start(lambda: got.extend(edp.minibatches(timeout=10.0)), "learner")
        time.sleep(0.2)  # the inline pull is under way (before the fix it claimed mini-batch 1 here)
        release.set()
        crew.join(20)
    assert [b.info.minibatch for b in got] == [0, 1, 2, 3]
    assert sorted(t for b in got for t in b["tid"].tolist()) == list(range(64))
