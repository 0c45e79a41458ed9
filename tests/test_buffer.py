"""Ring math, FIFO eviction, generations, all-or-nothing writes, growth."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conduit import ExperienceSpec, FieldSpec, SemanticsError, SpecError
from conduit.buffers.iterations import IterationBuffer
from conduit.buffers.replay import ReplayBuffer
from conduit.ext import stored_in_order
from conduit.samplers import PrioritizedSampler, UniformSampler
from conduit.slots import SlotTable, UniformRemover
from conduit.storage import FixedStorage
from tests.helpers import transitions


def ring(capacity=10, sampler=None, **kw):
    return ReplayBuffer(capacity, FixedStorage(), sampler or UniformSampler(capacity), seed=0, **kw)


def test_writes_wrap_around_the_ring_fifo():
    buf = ring(10)
    buf.write([transitions(7)])
    buf.write([transitions(6, start=7)])  # wraps: slots 7,8,9,0,1,2
    assert buf.size == 10 and buf.table.pos == 3 and buf.inserted == 13
    tid = buf.contents()["tid"].tolist()
    assert tid == [10, 11, 12, 3, 4, 5, 6, 7, 8, 9]  # 0,1,2 evicted first
    assert buf.ids.tolist() == tid


def test_multi_part_write_larger_than_capacity_in_total_keeps_the_newest():
    buf = ring(4)
    buf.write([transitions(3), transitions(3, start=3)])
    assert sorted(buf.contents()["tid"].tolist()) == [2, 3, 4, 5]


def test_single_write_larger_than_capacity_is_rejected_and_changes_nothing():
    buf = ring(4)
    buf.write([transitions(2)])
    with pytest.raises(SpecError, match="exceeds the buffer capacity of 4"):
        buf.write([transitions(5)])
    assert buf.inserted == 2 and buf.contents()["tid"].tolist() == [0, 1]


def test_bad_part_rejects_the_whole_write():
    buf = ring(8)
    buf.write([transitions(2)])
    bad = transitions(2, start=2)
    bad["obs"] = torch.zeros(2, 5)
    before = (buf.inserted, buf.table.pos, buf.size, buf.contents()["tid"].tolist(), buf.rng.bit_generator.state)
    with pytest.raises(SpecError, match="field 'obs'"):
        buf.write([transitions(2, start=2), bad])
    after = (buf.inserted, buf.table.pos, buf.size, buf.contents()["tid"].tolist(), buf.rng.bit_generator.state)
    assert before == after


def test_sample_returns_matching_rows_ids_and_version():
    buf = ring(16)
    buf.write([transitions(12)])
    s = buf.sample(32)
    assert s.version == 12
    np.testing.assert_array_equal(s.data["tid"].numpy(), s.ids)
    np.testing.assert_array_equal(buf.ids[s.indices], s.ids)
    assert s.data["obs"].shape == (32, 4)


@given(
    writes=st.lists(st.lists(st.integers(1, 13), min_size=1, max_size=3), min_size=1, max_size=12),
    kind=st.sampled_from(["ring", "prioritized ring", "uniform remover", "max_times_sampled"]),
)
def test_a_draws_ids_are_the_ids_its_slots_held_then_whenever_they_are_read(writes, kind):
    """A pure ring's ids are worked out from the ring's state at the draw when first read (DrawnRows): read
    after later writes overwrote the slots, they still name the rows gathered (each row's ``tid``)."""
    sampler = PrioritizedSampler(13, alpha=0.6, beta=0.4) if kind == "prioritized ring" else None
    kw = {"remover": UniformRemover()} if kind == "uniform remover" else {}
    if kind == "max_times_sampled":
        kw["max_times_sampled"] = 3
    buf = ring(13, sampler, **kw)
    drawn, first = [], 0
    for parts in writes:
        buf.write([transitions(n, start=first + sum(parts[:i])) for i, n in enumerate(parts)])
        first += sum(parts)
        s = buf.sample(7)
        split_parts, whole = buf.sample_split([3, 4])
        drawn += [s, whole._replace(data={k: torch.cat([p[k] for p in split_parts]) for k in split_parts[0]})]
        if kind == "max_times_sampled":  # both draws counted (rows sampled 3 times leave: holes in the table)
            for d in drawn[-2:]:
                buf.delivered(d.indices, d.ids)
    assert (buf.table.ring_state() is not None) == (kind in ("ring", "prioritized ring"))
    for s in drawn:  # read only now, after every later write
        np.testing.assert_array_equal(s.ids, s.data["tid"].numpy())
        assert s.ids.dtype == np.int64 and s.indices.dtype == np.int64
        np.testing.assert_array_equal(s.rows[2:5].ids, s.ids[2:5])


def test_a_loaded_slot_table_is_a_pure_ring_only_if_its_ids_say_so():
    buf = ring(8)
    buf.write([transitions(5)])
    buf.write([transitions(6, start=5)])  # wraps
    state = buf.table.state_dict()
    table = SlotTable(8)
    table.load_state_dict(state)
    assert table.ring_state() == buf.table.ring_state() == (3, 11, 8)
    s = buf.sample(16)
    np.testing.assert_array_equal(s.ids, table.ids[s.indices])
    state["ids"][4] = 99  # not what a ring's writes leave
    table.load_state_dict(state)
    assert table.ring_state() is None
    table.occupy_ring(2, 11)  # and stays so: its ids are read from the table
    assert table.ring_state() is None


def test_a_uniform_draw_makes_its_slot_array_only_when_read():
    table = SlotTable(10)
    table.occupy_ring(10, 0)
    d = UniformSampler(10).sample(6, table, np.random.default_rng(0))
    assert d.array is None and d.tensor is not None
    np.testing.assert_array_equal(d.indices, d.tensor.numpy())


@pytest.mark.parametrize("sampler", [None, PrioritizedSampler(16, alpha=0.6, beta=0.4)], ids=["uniform", "prioritized"])
def test_sample_split_is_one_draw_split_into_batches(sampler):
    one, split = ring(16, sampler), ring(16, sampler and PrioritizedSampler(16, alpha=0.6, beta=0.4))
    for buf in (one, split):
        buf.write([transitions(12)])
    whole = one.sample(9)
    outs = [None, {k: torch.empty((3, *v.shape[1:]), dtype=v.dtype) for k, v in whole.data.items()}, None]
    parts, s = split.sample_split([2, 3, 4], outs=outs)
    np.testing.assert_array_equal(s.indices, whole.indices)  # same seed, same single draw
    assert [p["tid"].shape[0] for p in parts] == [2, 3, 4]
    assert parts[1]["obs"].data_ptr() == outs[1]["obs"].data_ptr()  # gathered into the given memory
    for k in whole.data:
        assert torch.equal(torch.cat([p[k] for p in parts]), whole.data[k])


def test_priority_updates_skip_slots_overwritten_since_sampling():
    buf = ring(4, PrioritizedSampler(4, alpha=1.0, eps=0.0))
    buf.write([transitions(4)])
    s = buf.sample(8)
    buf.write([transitions(2, start=4)])  # overwrites slots 0 and 1
    applied = buf.update_priorities(s.indices, s.ids, np.full(8, 5.0))
    live = np.isin(s.indices, [2, 3])
    assert applied == int(live.sum())
    leaves = buf.sampler.tree.leaves()
    assert leaves[0] == leaves[1] == 1.0  # new rows: max priority before the update
    for slot in set(s.indices[live].tolist()):
        assert leaves[slot] == 5.0


def test_update_priorities_validates_lengths_and_values():
    buf = ring(4, PrioritizedSampler(4))
    buf.write([transitions(4)])
    s = buf.sample(2)
    with pytest.raises(ValueError, match="must match"):
        buf.update_priorities(s.indices, s.ids, np.ones(3))
    with pytest.raises(ValueError, match="finite"):
        buf.update_priorities(s.indices, s.ids, np.array([1.0, np.nan]))


def test_sampling_an_empty_buffer_is_an_error():
    with pytest.raises(SemanticsError):
        ring(4).sample(1)


def test_growable_field_relayout_keeps_every_record_padded():
    spec = ExperienceSpec.of(obs=FieldSpec("obs", (2,), torch.float32, growable=True), tid=((), "int64"))
    buf = ring(6, spec=spec)
    buf.write([{"obs": torch.ones(3, 2), "tid": torch.arange(3)}])
    buf.write([{"obs": torch.full((2, 5), 2.0), "tid": torch.arange(3, 5)}])
    assert buf.spec["obs"].shape == (5,)
    c = buf.contents()
    assert c["obs"].shape == (5, 5)
    assert torch.equal(c["obs"][:3, :2], torch.ones(3, 2)) and torch.all(c["obs"][:3, 2:] == 0)
    assert torch.equal(c["obs"][3:], torch.full((2, 5), 2.0))
    buf.write([{"obs": torch.ones(1, 2), "tid": torch.tensor([5])}])  # a smaller one is padded
    assert buf.contents()["obs"][5].tolist() == [1, 1, 0, 0, 0]


def test_direct_samples_follow_a_migration_and_never_keep_the_old_storage_alive():
    spec = ExperienceSpec.of(obs=FieldSpec("obs", (2,), torch.float32, growable=True), tid=((), "int64"))
    buf = ring(6, spec=spec)
    buf.memory.min_bytes = 0  # recycle even these tiny fields
    buf.write([{"obs": torch.ones(3, 2), "tid": torch.arange(3)}])
    first = buf.sample(4)
    assert first.data["obs"].shape == (4, 2)
    old = weakref.ref(buf.storage)
    buf.write([{"obs": torch.full((2, 5), 2.0), "tid": torch.arange(3, 5)}])  # widens obs: a new storage
    del first
    gc.collect()
    assert old() is None  # the recycling decision holds the migrated-away ring weakly
    s = buf.sample(4)
    assert s.data["obs"].shape == (4, 5) and torch.equal(s.data["tid"], torch.from_numpy(s.ids))


def test_iteration_buffer_never_mixes_iterations():
    buf = IterationBuffer(12, FixedStorage(), num_minibatches=2, num_epochs=1, num_learners=1, seed=0)
    buf.write(0, [transitions(4)])
    buf.write(1, [transitions(4, start=4)])
    with pytest.raises(SemanticsError, match="more than 2 ahead"):
        buf.write(2, [transitions(1)])
    buf.seal(0)
    with pytest.raises(SemanticsError, match="after it was sealed"):
        buf.write(0, [transitions(1)])
    it = buf.current()
    assert it is not None and it.index == 0 and it.id_array().tolist() == [0, 1, 2, 3]
    buf.delivered(0, 0, 2)
    assert buf.current() is None and buf.consumed == 1 and buf.accepts(2)


@pytest.mark.parametrize("presort", [True, False])
def test_iteration_buffer_grows_for_a_unit_larger_than_its_slack(presort):
    # seeded: one shuffle of four rows in 24 is the identity, which lays nothing out (unseeded, this test failed
    # in ~4% of runs); seed 0 scatters the first three rows
    buf = IterationBuffer(
        4, FixedStorage(), num_minibatches=1, num_epochs=1, num_learners=1, presort=presort, seed=0
    )
    buf.write(0, [transitions(3), transitions(3, start=3)])
    it = buf.iterations[0]
    # laid out (presort), the first 4 rows were scattered over the store before it grew: every row survives
    assert it.rows == 6 and buf.gather(it, np.arange(6))["tid"].tolist() == list(range(6))
    assert (it.position is not None) is presort


def test_priority_mass_is_the_sum_and_minimum_of_the_rows_priorities():
    """What a draw over several buffers as one reads (conduit.distributed): total p^alpha, its minimum, beta."""
    import numpy as np

    from conduit import Conduit
    from tests.helpers import transitions

    edp = Conduit(policy="off_policy", train_batch_size=8, capacity=64, sampler="prioritized", seed=0)
    with edp:
        edp.push(transitions(32))
        edp.flush()
        buf = edp.buffer
        slots = stored_in_order(buf.state_dict()).slots
        buf.update_priorities(slots, buf.ids[slots].copy(), np.arange(1.0, 33.0))
        leaves, _ = buf.priorities_at(slots)
        total, low, beta = buf.priority_mass()
        assert total == pytest.approx(float(leaves.sum())) and low == pytest.approx(float(leaves.min()))
        assert beta == edp.config.prioritized.beta
    plain = Conduit(policy="off_policy", train_batch_size=8, capacity=64)
    with plain:
        plain.push(transitions(16))
        plain.flush()
        with pytest.raises(SemanticsError, match="priority_mass needs sampler='prioritized'"):
            plain.buffer.priority_mass()


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_stored_in_order_reads_a_state_back_as_the_running_buffer_holds_it(sampler):
    """``stored_in_order`` (what RLlib's state and a re-sharding restore are written from) is the live buffer's
    slots and ``priorities_at``, after the ring wrapped and priorities moved, without the buffer."""
    from conduit import Conduit

    edp = Conduit(policy="off_policy", train_batch_size=8, capacity=48, sampler=sampler, seed=0)
    with edp:
        for start in (0, 40):  # wraps the 48-slot ring
            edp.push({k: v[start : start + 40] for k, v in transitions(80).items()})
        edp.flush()
        buf = edp.buffer
        ids = buf.ids
        slots = np.flatnonzero(ids >= 0)[np.argsort(ids[ids >= 0], kind="stable")]  # the ring's order, by hand
        if sampler == "prioritized":
            buf.update_priorities(slots, buf.ids[slots].copy(), np.linspace(0.5, 3.0, slots.size))
        stored = stored_in_order(edp.state_dict()["buffer"])
        np.testing.assert_array_equal(stored.slots, slots)
        assert stored.rows["tid"].tolist() == list(range(32, 80))
        want = transitions(80)
        for k in want:
            assert torch.equal(stored.rows[k], want[k][32:]), k
        if sampler == "prioritized":
            leaves, top = buf.priorities_at(slots)
            np.testing.assert_array_equal(stored.leaves, leaves)
            assert stored.max_priority == top == pytest.approx(3.0)
        else:
            assert stored.leaves is None and stored.max_priority == 1.0
    empty = Conduit(policy="off_policy", train_batch_size=8, capacity=16)
    with empty:
        assert stored_in_order(empty.state_dict()["buffer"]).rows == {}


def test_load_rows_writes_stored_rows_back_into_another_capacity_with_their_priorities():
    """``Conduit.load_rows`` is ``stored_in_order``'s inverse (RLlib's bounded restore, a re-sharding restore):
    the rows oldest first, the newest ``capacity`` kept, the oldest ones with the leaves they had and later
    rows at the max priority, as new rows; a buffer that stored anything already refuses it."""
    from conduit import Conduit, ConfigError

    kw = dict(policy="off_policy", train_batch_size=8, sampler="prioritized", seed=0)
    src = Conduit(capacity=48, **kw)
    with src:
        src.push(transitions(40))
        src.flush()
        slots = stored_in_order(src.state_dict()["buffer"]).slots
        src.buffer.update_priorities(slots, src.buffer.ids[slots].copy(), np.linspace(0.5, 3.0, 40))
        stored = stored_in_order(src.state_dict()["buffer"])
    more = {k: v[30:40] for k, v in transitions(40, start=40).items()}  # rows added since: no leaves
    rows = {k: torch.cat([stored.rows[k], more[k]]) for k in stored.rows}
    dst = Conduit(capacity=32, **kw)
    with dst:
        assert dst.load_rows(rows, leaves=stored.leaves, max_priority=stored.max_priority) == 32
        back = stored_in_order(dst.state_dict()["buffer"])
        for k in rows:
            assert torch.equal(back.rows[k], rows[k][-32:]), k
        np.testing.assert_allclose(back.leaves[:22], stored.leaves[18:])  # the 22 old rows kept, as they were
        alpha = dst.config.prioritized.alpha
        np.testing.assert_allclose(back.leaves[22:], stored.max_priority**alpha)  # the 10 later ones, as new rows
        assert back.max_priority == stored.max_priority
        with pytest.raises(SemanticsError, match="fills an empty buffer"):
            dst.load_rows(rows)
    with Conduit(policy="on_policy", train_batch_size=8, rollout_unit_size=8) as on:
        with pytest.raises(ConfigError, match="load_rows needs an off-policy runtime"):
            on.load_rows(rows)


def test_set_beta_and_use_rng_steer_the_next_draws():
    """The sampling controls a framework owns (RLlib anneals beta at each sample and may set its buffer's
    generator): the runtime's ``set_beta`` weighs the next draws with it, ``use_rng`` draws with the generator
    given (the same generator state, the same rows); beta on a uniform buffer is refused."""
    from conduit import Conduit, SchedulePin

    def runtime(sampler: str) -> Conduit:
        edp = Conduit(policy="off_policy", train_batch_size=8, capacity=64, sampler=sampler, seed=0,
                      pinned=SchedulePin(delivery_overlap=False))
        edp.push(transitions(32))
        edp.flush()
        return edp

    with runtime("prioritized") as a, runtime("prioritized") as b:
        a.buffer.update_priorities(np.arange(32), a.buffer.ids[:32].copy(), np.linspace(0.5, 3.0, 32))
        a.set_beta(1.0)
        leaves = a.buffer.sampler.leaf_values(np.arange(32))
        w = (32 * leaves / leaves.sum()) ** -1.0
        batch = a.pull()
        np.testing.assert_allclose(batch.info.weights, (w / w.max())[batch.info.indices], rtol=1e-5)
        a.use_rng(np.random.default_rng(7))
        b.use_rng(np.random.default_rng(7))
        b.buffer.update_priorities(np.arange(32), b.buffer.ids[:32].copy(), np.linspace(0.5, 3.0, 32))
        assert a.pull().info.ids.tolist() == b.pull().info.ids.tolist()
    with runtime("uniform") as u, pytest.raises(SemanticsError, match="set_beta needs sampler='prioritized'"):
        u.set_beta(0.5)
    with runtime("uniform") as u, runtime("uniform") as v, runtime("uniform") as w:  # uniform draws with it too
        for edp, seed in ((u, 7), (v, 7), (w, 8)):
            edp.use_rng(np.random.default_rng(seed))
        first = u.pull().info.ids.tolist()
        assert first == v.pull().info.ids.tolist() != w.pull().info.ids.tolist()


def test_a_refused_load_rows_changes_nothing_and_loaded_rows_count_as_inserts():
    """Rows ``load_rows`` refuses (a spec mismatch) leave the sampler's max priority as it was; under a
    samples-per-insert ratio, loaded rows count as inserts, so learners sample them as they would pushed rows."""
    from conduit import Conduit, RateLimit

    spec = ExperienceSpec.of(obs=((3,), "float32"), r=((), "float32"))
    with Conduit(policy="off_policy", train_batch_size=4, capacity=16, sampler="prioritized", seed=0,
                 spec=spec) as edp:
        with pytest.raises(SpecError):
            edp.load_rows({"obs": np.zeros((4, 3), np.float32), "r": np.zeros((4, 2), np.float32)},
                          leaves=np.ones(4), max_priority=7.0)
        assert edp.buffer.sampler.max_priority == 1.0 and edp.buffer.inserted == 0
    with Conduit(policy="off_policy", train_batch_size=8, capacity=64, seed=0, timeout_s=10,
                 rate_limit=RateLimit(samples_per_insert=1.0, tolerance=8)) as edp:
        edp.load_rows({"x": np.arange(16, dtype=np.float32)[:, None]})
        assert [len(edp.pull(timeout=5).info.rows) for _ in range(2)] == [8, 8]
