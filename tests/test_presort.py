"""On-policy stores laid out in mini-batch order (``ConduitConfig.presort``).

The layout may change where rows sit and whether a mini-batch is a view or a
gathered copy, never which rows a learner gets: every test here compares a
presorted runtime with one that gathers, draw by draw.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit import Conduit
from conduit.buffers.iterations import IterationBuffer, laid_out
from conduit.core import Mode, Schedule
from conduit.spec import ExperienceSpec, FieldSpec
from conduit.storage import FixedStorage, TensorStorage
from tests.helpers import transitions

INLINE = Schedule(Mode(False, 1), Mode(False, 1))


def _run(presort: bool, units: list[int], seals: set[int], *, epochs: int, minibatches: int, batch: int,
         schedule: Schedule = INLINE, learners: int = 1) -> list[tuple[object, ...]]:
    """Push ``units`` (sealing early after the indices in ``seals``), consume every iteration, record it all."""
    got: list[tuple[object, ...]] = []
    cfg = dict(
        policy="on_policy", train_batch_size=batch, num_minibatches=minibatches, num_epochs=epochs,
        num_learners=learners, seed=7, tuning={"presort": presort},
    )
    with Conduit(**cfg, pinned=schedule) as edp:
        start = 0
        for i, n in enumerate(units):
            edp.push(transitions(n, start=start))
            start += n
            if i in seals:
                edp.seal()
            edp.flush()
            while edp.buffer.current() is not None:  # a sealed iteration to consume
                for learner in range(learners):
                    for b in edp.minibatches(learner):
                        info = b.info
                        got.append((
                            info.iteration, learner, info.epoch, info.minibatch, info.indices.tolist(),
                            info.ids.tolist(), b["tid"].tolist(), b["obs"].tolist(),
                        ))
    return got


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    units=st.lists(st.integers(1, 13), min_size=1, max_size=12),
    seal_after=st.sets(st.integers(0, 11), max_size=3),
    epochs=st.integers(1, 3),
    minibatches=st.integers(1, 3),
    learners=st.integers(1, 2),
)
def test_presorted_and_gathered_stores_deliver_the_same_minibatches(units, seal_after, epochs, minibatches, learners):
    # train batch 12 with units of 1-13 rows: iterations that end exactly, overshoot (rows past the
    # expected count), or are sealed early with fewer rows: each kind keeps its plan or draws its own
    need = minibatches * learners
    seals = set()
    rows = 0
    for i, n in enumerate(units):  # an early seal needs a mini-batch's worth for every learner
        rows += n
        if rows >= 12:
            rows = 0
        elif i in seal_after and rows >= need:
            seals.add(i)
            rows = 0
    kw = dict(epochs=epochs, minibatches=minibatches, batch=12, learners=learners)
    presorted = _run(True, units, seals, **kw)
    assert presorted == _run(False, units, seals, **kw)


def test_overlapped_paths_deliver_what_inline_ones_do_from_a_presorted_store():
    overlap = Schedule(Mode(True, Fraction(1, 4)), Mode(True, Fraction(1, 4)))
    kw = dict(epochs=2, minibatches=4, batch=32)
    units = [8] * 16
    assert _run(True, units, set(), schedule=overlap, **kw) == _run(False, units, set(), **kw)


def test_last_epoch_minibatches_are_views_and_a_kept_one_is_never_overwritten():
    with Conduit(policy="on_policy", train_batch_size=16, num_minibatches=2, num_epochs=2, seed=0) as edp:
        edp.push(transitions(16))
        batches = list(edp.minibatches())
        first, kept = batches[0], batches[-1]  # epoch 0: gathered; epoch 1 (the last): a view of the store
        assert first["obs"]._base is None and kept["obs"]._base is not None
        reference = {k: v.clone() for k, v in kept.items()}
        for i in range(1, 6):  # five more iterations: the store the kept view lies in must not be reused
            edp.push(transitions(16, start=16 * i))
            for _ in edp.minibatches():
                pass
        assert all(torch.equal(kept[k], reference[k]) for k in reference)
        del batches, first, kept, _
        stores = set()
        for i in range(6, 16):  # nothing kept: the stores rotate, none is allocated per iteration
            edp.push(transitions(16, start=16 * i))
            stores.add(id(edp.buffer.iterations[i].storage))
            for _ in edp.minibatches():
                pass
        assert len(stores) <= 3


def test_changing_an_earlier_epochs_minibatch_in_place_does_not_reach_a_later_epoch():
    def consume(presort: bool) -> list[list[float]]:
        out = []
        with Conduit(policy="on_policy", train_batch_size=12, num_minibatches=3, num_epochs=3, seed=3,
                     tuning={"presort": presort}) as edp:
            for i in range(3):
                edp.push(transitions(12, start=12 * i))
                for b in edp.minibatches():
                    out.append(b["obs"].sum(dim=1).tolist())
                    b["obs"].mul_(-1.0)  # a learner normalizing its mini-batch in place
        return out

    assert consume(True) == consume(False)


def test_laid_out_puts_each_minibatch_in_a_run_of_its_own():
    rng = np.random.default_rng(0)
    order = rng.permutation(10)
    epoch = [[order[0:3], order[3:5]], [order[5:8], order[8:10]]]  # two mini-batches for two learners
    position, runs = laid_out(epoch)
    assert runs == [[(0, 3), (3, 2)], [(5, 3), (8, 2)]]
    assert position is not None
    for mb, mb_runs in zip(epoch, runs):
        for rows, (start, n) in zip(mb, mb_runs):
            assert position[rows].tolist() == list(range(start, start + n))
    unshuffled = [[np.arange(0, 5)], [np.arange(5, 10)]]
    assert laid_out(unshuffled) == (None, [[(0, 5)], [(5, 5)]])


def test_storage_scatter_views_and_in_use():
    spec = ExperienceSpec.of(obs=((3,), "float32"), tid=((), "int64"))
    s = TensorStorage(spec, 8)
    slots = np.array([5, 0, 7, 2])
    data = {"obs": torch.arange(12, dtype=torch.float32).reshape(4, 3), "tid": torch.tensor([10, 11, 12, 13])}
    s.write_slots(slots, data)
    assert s.tensors["tid"][slots].tolist() == [10, 11, 12, 13]
    assert torch.equal(s.tensors["obs"][slots], data["obs"])
    assert not s.in_use()
    v = s.view(2, 4)
    assert v is not None and v["tid"].tolist() == s.tensors["tid"][2:6].tolist()
    assert s.in_use()
    array = v["obs"][1:].numpy()  # a numpy array of a view of a view still holds the memory
    del v
    assert s.in_use()
    del array
    assert not s.in_use()
    assert s.view(6, 4) is None  # past the end: no view


def test_an_iteration_buffer_reuses_only_stores_no_view_refers_to():
    buf = IterationBuffer(8, FixedStorage(), num_minibatches=2, num_epochs=1, num_learners=1, seed=0)
    held = []
    for i in range(4):
        buf.write(i, [transitions(8, start=8 * i)])
        buf.seal(i)
        it = buf.iterations[i]
        views = [buf.view(it, 0, j, 0) for j in range(2)]
        assert all(v is not None for v in views)
        held.append(views[0])
        buf.delivered(i, 0, 2)
    tids = [sorted(v["tid"].tolist()) for v in held]
    # every kept view still holds rows of its own iteration: no store was reused under it
    assert [all(8 * i <= t < 8 * (i + 1) for t in ts) for i, ts in enumerate(tids)] == [True] * 4
    assert len(buf._free) <= buf.max_in_flight


def test_a_store_that_hands_out_no_views_is_not_laid_out(monkeypatch):
    # a GPU store (here: a host one that says so) keeps rows in arrival order, every mini-batch gathered
    monkeypatch.setattr(TensorStorage, "hands_out_views", property(lambda self: False))
    buf = IterationBuffer(16, FixedStorage(), num_minibatches=2, num_epochs=1, num_learners=1, seed=0)
    buf.write(0, [transitions(16)])
    buf.seal(0)
    it = buf.iterations[0]
    assert it.position is None and it.runs is None
    assert buf.view(it, 0, 0, 0) is None
    assert sorted(buf.gather(it, np.concatenate(it.plan[0][0] + it.plan[0][1]))["tid"].tolist()) == list(range(16))


def test_a_field_that_grows_mid_iteration_keeps_every_row_laid_out():
    # longer sequences arrive halfway through an iteration: the store is re-allocated wider and every row,
    # wherever the layout had put it, comes along zero-padded
    def consume(presort: bool) -> list[list[list[float]]]:
        spec = ExperienceSpec.of(obs=FieldSpec("obs", (2,), torch.float32, growable=True), tid=((), "int64"))
        buf = IterationBuffer(
            12, FixedStorage(), num_minibatches=2, num_epochs=2, num_learners=1, spec=spec, seed=5,
            expected_rows=8, presort=presort,
        )
        out = []
        for i in range(3):
            buf.write(i, [{"obs": torch.full((4, 2), 10.0 * i + 1), "tid": torch.arange(8 * i, 8 * i + 4)}])
            buf.write(i, [{"obs": torch.full((4, 3 + i), 10.0 * i + 2), "tid": torch.arange(8 * i + 4, 8 * i + 8)}])
            buf.seal(i)
            it = buf.iterations[i]
            assert (it.runs is not None) is presort
            for epoch in range(2):
                for j in range(2):
                    part = buf.view(it, epoch, j, 0)
                    if part is None:
                        part = buf.gather(it, it.plan[epoch][j][0])
                    out.append(part["obs"].tolist())
            buf.delivered(i, 0, 4)
        return out

    got = consume(True)
    assert got == consume(False)
    assert any(row[-1] == 0.0 and row[0] == 1.0 for mb in got for row in mb)  # an early, narrow row, padded


def test_a_view_moved_to_shared_memory_takes_the_store_along_and_writes_follow():
    # a torch.multiprocessing queue moves a tensor it sends to shared memory: for a view that is the whole
    # field's memory, and the old block is freed under any numpy view the storage made of it earlier
    spec = ExperienceSpec.of(obs=((3,), "float32"), tid=((), "int64"))
    s = TensorStorage(spec, 8)
    views = s.view(0, 4)
    assert views is not None
    views["obs"].share_memory_()
    views["tid"].share_memory_()
    assert s.tensors["obs"].is_shared()
    s.write(4, {"obs": torch.full((2, 3), 7.0), "tid": torch.tensor([40, 41])})
    s.write_slots(np.array([7, 6]), {"obs": torch.full((2, 3), 9.0), "tid": torch.tensor([70, 60])})
    got = s.gather(torch.arange(4, 8))
    assert got["tid"].tolist() == [40, 41, 60, 70]
    assert got["obs"][:, 0].tolist() == [7.0, 7.0, 9.0, 9.0]
    assert torch.equal(views["obs"], s.tensors["obs"][:4])  # the view still shares the (moved) memory
    del views
    assert not s.in_use()
