"""An on-policy iteration's first mini-batches, delivered while its closing unit is still being written.

With delivery overlapped one mini-batch per invocation, the write that completes
an iteration stores its rows mini-batch by mini-batch and releases each of the
first epoch's mini-batches but the last as soon as its rows are in
(``IterationBuffer.early_minibatches``). That may change when a mini-batch
arrives, never which rows it holds: every test compares with a run that waits
for the seal.
"""

from __future__ import annotations

import threading
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit import Conduit
from conduit.buffers.iterations import IterationBuffer
from conduit.core import Mode, Schedule
from conduit.spec import ExperienceSpec
from conduit.storage import FixedStorage, TensorStorage
from tests.helpers import transitions

INLINE = Schedule(Mode(False, 1), Mode(False, 1))


def _overlapped(minibatches: int, ingestion: Fraction = Fraction(1, 4)) -> Schedule:
    return Schedule(Mode(True, ingestion), Mode(True, Fraction(1, minibatches)))


def _record(batches: list) -> list[tuple[object, ...]]:
    return [
        (b.info.iteration, b.info.epoch, b.info.minibatch, b.info.ids.tolist(), b["tid"].tolist(), b["obs"].tolist())
        for b in batches
    ]


def _consume(edp: Conduit, units: list[int], train: int) -> list[tuple[object, ...]]:
    """Push ``units``; consume each iteration once the unit reaching ``train`` rows has closed it."""
    got: list[tuple[object, ...]] = []
    start, rows = 0, 0
    for n in units:
        edp.push(transitions(n, start=start))
        start, rows = start + n, rows + n
        if rows >= train:
            got += _record(list(edp.minibatches(timeout=10)))
            rows = 0
    return got


def test_the_first_minibatch_arrives_while_the_closing_unit_is_still_being_written():
    reached, gate = threading.Event(), threading.Event()
    cfg = dict(policy="on_policy", train_batch_size=32, num_minibatches=4, num_epochs=2, seed=3, timeout_s=10.0)
    with Conduit(**cfg, pinned=_overlapped(4)) as edp:
        edp.start()
        buffer = edp.buffer
        assert isinstance(buffer, IterationBuffer) and buffer.early_minibatches

        def hold() -> None:  # the ingestion worker, inside the closing write, right after a release
            if 0 not in buffer.sealed and not gate.is_set():
                reached.set()
                gate.wait(10)

        buffer.on_data.append(hold)  # after the delivery path's own callback: mini-batch 0 is announced
        for i in range(4):
            edp.push(transitions(8, start=8 * i))
        assert reached.wait(10), "the closing write released no mini-batch before the seal"
        first = edp.pull(timeout=5)  # served while the iteration's last rows are still held back
        assert (first.info.iteration, first.info.epoch, first.info.minibatch) == (0, 0, 0)
        assert 0 not in buffer.sealed and buffer.iterations[0].early == 1
        gate.set()
        rest = [edp.pull(timeout=5) for _ in range(7)]
        assert rest[-1].info.last
        early = _record([first, *rest])
    with Conduit(**cfg, pinned=INLINE) as edp:
        assert early == _consume(edp, [8] * 4, 32)


def test_the_last_minibatch_waits_for_the_seal_and_the_iteration_is_released_once():
    buffer = IterationBuffer(
        16, FixedStorage(), num_minibatches=4, num_epochs=1, num_learners=1, seed=0,
    )
    buffer.early_minibatches = True
    released: list[int] = []
    buffer.on_data.append(lambda: released.append(buffer.iterations[0].early))
    buffer.write(0, [transitions(8)], closes=True)  # the caller's word alone is not enough: 8 of 16 rows
    buffer.write(0, [transitions(4, start=8)])
    assert buffer.iterations[0].early == 0
    buffer.write(0, [transitions(4, start=12)], closes=True)
    it = buffer.iterations[0]
    assert released == [1, 2, 3] and it.early == 3 and 0 not in buffer.sealed
    for _ in range(3):  # early deliveries count against the iteration, and never release it
        buffer.delivered(0, 0)
    assert 0 in buffer.iterations
    buffer.seal(0)
    assert it.remaining == [1]
    buffer.delivered(0, 0)
    assert 0 not in buffer.iterations and buffer.consumed == 1


def test_a_closing_write_of_another_size_releases_nothing_early():
    buffer = IterationBuffer(
        16, FixedStorage(), num_minibatches=4, num_epochs=1, num_learners=1, seed=0,
    )
    buffer.early_minibatches = True
    buffer.write(0, [transitions(12)])
    buffer.write(0, [transitions(6, start=12)], closes=True)  # overshoots: the plan is drawn again at the seal
    assert buffer.iterations[0].early == 0
    buffer.seal(0)
    assert sorted(np.concatenate([rows for mb in buffer.iterations[0].plan[0] for rows in mb]).tolist()) == list(
        range(18)
    )


def test_rows_land_where_a_write_in_order_puts_them():
    def store(early: bool) -> dict[str, torch.Tensor]:
        buffer = IterationBuffer(
            24, FixedStorage(), num_minibatches=3, num_epochs=2, num_learners=2, seed=5,
        )
        buffer.early_minibatches = early
        buffer.write(0, [transitions(10)])
        buffer.write(0, [transitions(9, start=10), transitions(5, start=19)], closes=True)  # two parts close it
        it = buffer.iterations[0]
        assert it.early == (2 if early else 0) and it.ids is not None
        assert np.concatenate(it.ids).tolist() == list(range(24))
        return it.storage.read(0, 24)

    early, in_order = store(True), store(False)
    assert all(torch.equal(early[k], in_order[k]) for k in in_order)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    units=st.lists(st.integers(1, 13), min_size=1, max_size=12),
    epochs=st.integers(1, 3),
    minibatches=st.integers(2, 4),
    pieces=st.integers(1, 3),
    presort=st.booleans(),
)
def test_overlapped_delivery_with_early_minibatches_delivers_what_inline_does(
    units, epochs, minibatches, pieces, presort
):
    # train batch 12 with units of 1-13 rows: iterations that end exactly (released early) or overshoot
    # (sealed with a plan of their own); a last, unfinished one is not consumed
    cfg = dict(
        policy="on_policy", train_batch_size=12, num_minibatches=minibatches, num_epochs=epochs, seed=11,
        tuning={"presort": presort}, timeout_s=10.0,
    )
    ingestion = Fraction(min(pieces, minibatches - 1), minibatches)  # on-policy: k/M, below 1 overlapped
    with Conduit(**cfg, pinned=_overlapped(minibatches, ingestion)) as edp:
        overlapped = _consume(edp, units, 12)
    with Conduit(**cfg, pinned=INLINE) as edp:
        assert overlapped == _consume(edp, units, 12)


@pytest.mark.parametrize(
    ("dim", "dtype"),
    [(4, "float32"), (4096, "float32"), (4, "bfloat16")],  # through numpy's temporary, row by row, through torch
)
def test_a_storage_writes_rows_picked_out_of_a_unit_to_their_slots(dim, dtype):
    spec = ExperienceSpec.of(obs=((dim,), dtype), tid=((), "int64"))
    storage = TensorStorage(spec, 8)
    unit = {"obs": torch.arange(5.0).repeat_interleave(dim).view(5, dim).to(getattr(torch, dtype)), "tid": torch.arange(5)}
    slots, rows = np.array([6, 1, 3]), np.array([4, 0, 2])
    storage.write_slots(slots, unit, rows)
    stored = storage.read(0, 8)
    assert stored["tid"][slots].tolist() == rows.tolist()
    assert torch.equal(stored["obs"][slots], unit["obs"][rows])
    assert stored["tid"][[0, 2, 4, 5, 7]].tolist() == [0] * 5  # nothing else written
