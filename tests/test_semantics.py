"""Property tests of docs/design.md §2 under random push/pull sequences and schedules.

1. Training-data integrity: every pushed transition is ingested exactly once;
   every delivered row is a row that was in the buffer when sampled.
2. On-policy freshness: a mini-batch holds rows of its own iteration only, and
   every epoch covers the iteration exactly once.
3. Off-policy bounded staleness: a batch is at most ``g_del`` batches older than
   an inline sample, and ingestion lags rollouts by at most ``g_ing`` units.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from conduit import Conduit, Mode, Schedule
from conduit.config import Policy
from conduit.core import feasible_schedules
from tests.helpers import transitions

OFF_SCHEDULES = feasible_schedules(Policy.OFF_POLICY, g_ing_max=3, g_del_max=3)
ON_SCHEDULES = feasible_schedules(Policy.ON_POLICY, num_minibatches=4)

off_ops = st.lists(
    st.one_of(st.tuples(st.just("push"), st.integers(1, 9)), st.tuples(st.just("pull"), st.integers(0, 1))),
    min_size=1,
    max_size=25,
)


@given(schedule=st.sampled_from(OFF_SCHEDULES), ops=off_ops, learners=st.integers(1, 2))
def test_off_policy_integrity_and_bounded_staleness(schedule: Schedule, ops, learners):
    g_ing = int(schedule.ingestion.granularity)
    g_del = int(schedule.delivery.granularity)
    edp = Conduit(
        policy="off_policy", train_batch_size=4, capacity=1000, min_size_to_sample=1, num_learners=learners,
        seed=0, timeout_s=5.0, pinned=schedule,
    )
    pushed = 0
    with edp:
        for op, arg in ops:
            if op == "push":
                edp.push(transitions(arg, start=pushed))
                pushed += arg
                st_ = edp.stats()
                assert st_.pushed_units - st_.ingestion_invocations * g_ing <= g_ing  # lag bound
            elif pushed and edp.stats().ingested_rows > 0:
                b = edp.pull(arg % learners)
                ids = torch.from_numpy(b.info.ids)
                assert torch.equal(b["tid"], ids)  # rows are exactly the sampled transitions
                assert int(ids.max()) < b.info.buffer_version  # existed when sampled
                assert 0 <= b.info.staleness < g_del  # at most g_del batches older than inline
                assert b.info.version_lag >= 0
        edp.flush()
        contents = edp.buffer.contents()
        assert sorted(contents["tid"].tolist() if contents else []) == list(range(pushed))
        assert edp.stats().ingested_rows == pushed


@given(
    schedule=st.sampled_from(ON_SCHEDULES),
    units=st.lists(st.integers(1, 12), min_size=1, max_size=14),
    epochs=st.integers(1, 2),
)
def test_on_policy_freshness_and_exact_coverage(schedule: Schedule, units, epochs):
    train = 12
    edp = Conduit(
        policy="on_policy", train_batch_size=train, num_minibatches=4, num_epochs=epochs, seed=0,
        timeout_s=5.0, pinned=schedule,
    )

    def consume(iteration: int, expected: list[int]) -> None:
        mbs = list(edp.minibatches())
        assert {b.info.iteration for b in mbs} == {iteration}  # never mixes iterations
        for e in range(epochs):
            rows = torch.cat([b["tid"] for b in mbs if b.info.epoch == e]).tolist()
            assert sorted(rows) == expected  # every row exactly once per epoch
        assert all(b.info.mode == schedule.delivery for b in mbs)
        assert len(mbs) == 4 * epochs

    pushed, start, iteration = 0, 0, 0
    with edp:
        for n in units:
            edp.push(transitions(n, start=pushed))
            pushed += n
            if pushed - start >= train:  # the documented rule: the unit reaching train_batch_size closes it
                consume(iteration, list(range(start, pushed)))
                start, iteration = pushed, iteration + 1
        if pushed - start >= 4:
            edp.seal()
            consume(iteration, list(range(start, pushed)))


@given(sizes=st.lists(st.integers(1, 20), min_size=2, max_size=10))
def test_ingestion_order_follows_push_order_with_one_actor(sizes):
    with Conduit(policy="off_policy", train_batch_size=1, capacity=500, pinned=Schedule(Mode(True, 2), Mode(True, 1))) as edp:
        start = 0
        for n in sizes:
            edp.push(transitions(n, start=start))
            start += n
        edp.flush()
        assert edp.buffer.contents()["tid"].tolist() == list(range(start))
        assert edp.buffer.ids[: edp.buffer.size].tolist() == list(range(start))


@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("push"), st.integers(1, 9)),
            st.tuples(st.just("pull"), st.just(0)),
            st.tuples(st.just("reschedule"), st.integers(0, len(OFF_SCHEDULES) - 1)),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_rescheduling_mid_run_keeps_integrity_and_staleness(ops):
    edp = Conduit(policy="off_policy", train_batch_size=4, capacity=1000, min_size_to_sample=1, seed=0, timeout_s=5.0)
    pushed = 0
    with edp:
        for op, arg in ops:
            if op == "push":
                edp.push(transitions(arg, start=pushed))
                pushed += arg
            elif op == "reschedule":
                changed = OFF_SCHEDULES[arg].ingestion != edp.schedule.ingestion
                edp.reschedule(OFF_SCHEDULES[arg])
                if changed:
                    assert edp.stats().ingested_rows == pushed  # the old mode flushed what it had
            elif edp.stats().ingested_rows > 0:
                b = edp.pull()
                assert torch.equal(b["tid"], torch.from_numpy(b.info.ids))
                assert 0 <= b.info.staleness < int(b.info.mode.granularity)
        edp.flush()
        contents = edp.buffer.contents()
        assert sorted(contents["tid"].tolist() if contents else []) == list(range(pushed))


@given(
    switches=st.lists(st.sampled_from(ON_SCHEDULES), min_size=1, max_size=4),
)
def test_on_policy_rescheduling_between_and_within_iterations(switches):
    edp = Conduit(policy="on_policy", train_batch_size=16, num_minibatches=4, num_epochs=2, seed=0, timeout_s=5.0)
    with edp:
        for it, schedule in enumerate(switches):
            edp.reschedule(schedule)
            edp.push(transitions(16, start=16 * it))
            mbs = []
            for b in edp.minibatches():
                mbs.append(b)
                if len(mbs) == 3:  # switch again mid-iteration
                    edp.reschedule(switches[(it + 1) % len(switches)])
            assert {b.info.iteration for b in mbs} == {it}
            for e in (0, 1):
                rows = torch.cat([b["tid"] for b in mbs if b.info.epoch == e]).tolist()
                assert sorted(rows) == list(range(16 * it, 16 * it + 16))
