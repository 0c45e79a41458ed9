"""Sum-tree and samplers against naive references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from conduit.samplers import PrioritizedSampler, SumTree, UniformSampler, minibatch_plan
from conduit.samplers.sumtree import NATIVE
from conduit.slots import SlotTable

#: both sum-tree implementations where the C one is built (it is wherever a compiler was: test_streaming checks)
KINDS = [False, True] if NATIVE else [False]


def table(live: int, capacity: int = 100) -> SlotTable:
    t = SlotTable(capacity)
    t.occupy(np.arange(live), 0)
    return t


@given(
    capacity=st.integers(1, 70),
    ops=st.lists(st.tuples(st.integers(0, 69), st.floats(0, 100, allow_nan=False)), min_size=1, max_size=60),
)
@example(capacity=5, ops=[(0, 1.0), (32, 1.401298464324817e-45), (33, 1.0)])  # a denormal next to 1.0
@pytest.mark.parametrize("native", KINDS)
def test_sumtree_matches_naive_prefix_search(native, capacity, ops):
    tree = SumTree(capacity, native=native)
    naive = np.zeros(capacity)
    for leaf, value in ops:
        leaf %= capacity
        tree.update(np.array([leaf]), np.array([value]))
        naive[leaf] = value
    assert tree.total == pytest.approx(naive.sum())
    nz = naive[naive > 0]
    assert tree.min == (nz.min() if nz.size else np.inf)
    if naive.sum() <= 0:
        return
    cums = np.cumsum(naive)
    points = np.linspace(0, naive.sum(), 50, endpoint=False)
    found = tree.find(points)
    tol = 1e-9 * max(1.0, naive.sum())
    for p, f in zip(points, found):
        # the found leaf is never empty, and p lies in its segment [cums[f] - naive[f], cums[f]) up to float
        # rounding (a tie at a border may resolve to either neighbour; a leaf whose mass vanishes next to the
        # running sum, e.g. 1.4e-45 after 1.0, still owns the border point in exact arithmetic)
        assert naive[f] > 0
        assert cums[f] - naive[f] - tol <= p <= cums[f] + tol


@given(
    capacity=st.integers(1, 300),
    batches=st.lists(
        st.lists(st.tuples(st.integers(0, 299), st.sampled_from([0.0, 1e-300, 0.25, 1.0, 3.5, 1e6])), max_size=40),
        min_size=1, max_size=12,
    ),
)
def test_sumtree_path_updates_equal_level_updates_bit_for_bit(capacity, batches):
    """Few leaves go up their paths, many go level by level: the two build the very same tree."""
    by_path, by_level = SumTree(capacity, native=False), SumTree(capacity, native=False)
    by_path.FEW, by_level.FEW = 10**9, 0
    for batch in batches:
        leaves = np.array([leaf % capacity for leaf, _ in batch], dtype=np.int64)
        values = np.array([v for _, v in batch], dtype=np.float64)
        by_path.update(leaves, values)
        by_level.update(leaves, values)
        assert np.array_equal(by_path._sum, by_level._sum) and np.array_equal(by_path._min, by_level._min)


@given(
    capacity=st.integers(1, 300),
    pushes=st.lists(
        st.tuples(st.integers(0, 299), st.integers(1, 300), st.sampled_from([0.0, 1e-300, 0.25, 1.0, 3.5, 1e6])),
        min_size=1, max_size=12,
    ),
    seed=st.integers(0, 2**31 - 1),
)
def test_sumtree_consecutive_leaves_update_like_the_general_path_bit_for_bit(capacity, pushes, seed):
    """A ring's push sets consecutive leaves by ranges of nodes; the same leaves out of order go level by level."""
    rng = np.random.default_rng(seed)
    by_range, by_level = SumTree(capacity, native=False), SumTree(capacity, native=False)
    by_range.FEW = by_level.FEW = 0
    for start, n, value in pushes:
        start %= capacity
        leaves = np.arange(start, min(capacity, start + n), dtype=np.int64)
        values = value * (1.0 + rng.random(leaves.size))  # different values a leaf: sums that round differently
        by_range.update(leaves, values)
        order = rng.permutation(leaves.size)
        by_level.update(leaves[order], values[order])
        assert np.array_equal(by_range._sum, by_level._sum) and np.array_equal(by_range._min, by_level._min)


def test_a_ring_push_of_many_rows_updates_the_sumtree_by_ranges(monkeypatch):
    sampler = PrioritizedSampler(1000, alpha=0.6, beta=0.4)
    sampler.tree.native = False  # the numpy path (the C one walks every leaf's path in one loop)
    calls = []
    real = SumTree._update_range
    monkeypatch.setattr(SumTree, "_update_range", lambda self, first, v: calls.append(first) or real(self, first, v))
    sampler.on_insert(np.arange(100, 356))
    assert calls == [100]
    assert sampler.tree.total == pytest.approx(256 * sampler.max_priority**0.6)


@pytest.mark.parametrize("native", KINDS)
def test_sumtree_rejects_a_bad_leaf_or_value_and_changes_nothing(native):
    for few in (10**9, 0):
        tree = SumTree(40, native=native)
        tree.FEW = few
        tree.update(np.arange(40), np.arange(40, dtype=np.float64))
        before = tree._sum.copy()
        for leaves, values, error in (
            ([3, 5], [1.0, -1.0], ValueError), ([3, 5], [1.0, float("nan")], ValueError),
            ([3, 5], [float("inf"), 1.0], ValueError), ([3, 40], [1.0, 1.0], IndexError), ([-1], [1.0], IndexError),
        ):
            with pytest.raises(error):
                tree.update(np.array(leaves), np.array(values))
            assert np.array_equal(tree._sum, before) and tree.get(np.array([3])).tolist() == [3.0]


@pytest.mark.parametrize("native", KINDS)
def test_sumtree_vectorized_update_with_duplicates_last_wins(native):
    tree = SumTree(8, native=native)
    tree.update(np.array([1, 1, 2]), np.array([5.0, 3.0, 1.0]))
    assert tree.get(np.array([1, 2])).tolist() == [3.0, 1.0]
    assert tree.total == 4.0


@pytest.mark.parametrize("native", KINDS)
def test_sumtree_never_returns_empty_leaves(native):
    tree = SumTree(16, native=native)
    tree.update(np.array([3, 9]), np.array([1.0, 2.0]))
    found = tree.find(np.random.default_rng(0).random(10_000) * tree.total)
    assert set(found.tolist()) <= {3, 9}


@pytest.mark.skipif(not NATIVE, reason="conduit._native is not built (no C compiler at install)")
@given(
    capacity=st.integers(1, 300),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["ring", "random", "one"]), st.integers(0, 299), st.integers(1, 300),
            st.sampled_from([0.0, 5e-324, 1e-300, 0.25, 1.0, 3.5, 1e6]),
        ),
        min_size=1, max_size=12,
    ),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_c_sumtree_builds_and_searches_the_numpy_tree_bit_for_bit(capacity, steps, seed):
    """Ring pushes (consecutive leaves, wrapping), random updates with repeats and zeros, single leaves:
    after every step both trees hold the same bits, and every prefix sum finds the same leaf."""
    rng = np.random.default_rng(seed)
    c, py = SumTree(capacity, native=True), SumTree(capacity, native=False)
    for kind, start, n, value in steps:
        if kind == "ring":
            leaves = (start + np.arange(n)) % capacity
        elif kind == "random":
            leaves = rng.integers(0, capacity, n)
        else:
            leaves = np.array([start % capacity])
        values = value * (1.0 + rng.random(leaves.size)) * (rng.random(leaves.size) < 0.9)
        c.update(leaves, values)
        py.update(leaves, values)
        assert np.array_equal(c._sum, py._sum) and np.array_equal(c._min, py._min)
        total = py.total
        if total > 0:
            points = np.concatenate([rng.random(64) * total, [0.0, np.nextafter(total, 0.0)]])
            points = np.concatenate([points, np.cumsum(py.leaves())[:-1]])  # exactly on the borders
            points = points[points < total]
            assert np.array_equal(c.find(points), py.find(points))


def test_a_c_sumtree_where_it_is_not_built_says_why(monkeypatch):
    from conduit.samplers import sumtree

    monkeypatch.setattr(sumtree, "_native", None)
    with pytest.raises(RuntimeError, match="not built"):
        SumTree(8, native=True)
    assert SumTree(8, native=False).native is False


def test_uniform_sampler_stays_in_valid_rows():
    s = UniformSampler(100)
    d = s.sample(1000, table(7), np.random.default_rng(0))
    assert d.indices.min() >= 0 and d.indices.max() < 7 and d.weights is None


def test_prioritized_sampling_frequencies_follow_priorities():
    s = PrioritizedSampler(4, alpha=1.0, beta=1.0, eps=0.0)
    s.on_insert(np.arange(4))
    s.update_priorities(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]))
    rng = np.random.default_rng(1)
    counts = np.zeros(4)
    for _ in range(200):
        counts += np.bincount(s.sample(50, table(4, 4), rng).indices, minlength=4)
    freq = counts / counts.sum()
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.01)


def test_prioritized_importance_weights_match_the_formula():
    alpha, beta = 0.6, 0.4
    s = PrioritizedSampler(5, alpha=alpha, beta=beta, eps=0.0)
    s.on_insert(np.arange(5))
    pr = np.array([0.5, 1.0, 2.0, 3.0, 4.0])
    s.update_priorities(np.arange(5), pr)
    d = s.sample(64, table(5, 5), np.random.default_rng(0))
    p = pr**alpha / (pr**alpha).sum()
    w = (5 * p) ** -beta
    w /= w.max()
    np.testing.assert_allclose(d.weights, w[d.indices], rtol=1e-5)


def test_new_rows_get_the_max_priority_seen():
    s = PrioritizedSampler(4, alpha=1.0, eps=0.0)
    s.on_insert(np.array([0]))
    s.update_priorities(np.array([0]), np.array([9.0]))
    s.on_insert(np.array([1]))
    assert s.tree.get(np.array([1]))[0] == 9.0


def test_prioritized_state_round_trip():
    s = PrioritizedSampler(8)
    s.on_insert(np.arange(5))
    s.update_priorities(np.arange(5), np.arange(5) + 1.0)
    t = PrioritizedSampler(8)
    t.load_state_dict(s.state_dict())
    rng1, rng2 = np.random.default_rng(3), np.random.default_rng(3)
    np.testing.assert_array_equal(s.sample(16, table(5, 8), rng1).indices, t.sample(16, table(5, 8), rng2).indices)


@given(rows=st.integers(8, 300), m=st.integers(1, 4), epochs=st.integers(1, 3), learners=st.integers(1, 2))
def test_minibatch_plan_covers_every_row_once_per_epoch(rows, m, epochs, learners):
    plan = minibatch_plan(rows, m, epochs, np.random.default_rng(0), learners)
    assert len(plan) == epochs
    for epoch in plan:
        assert len(epoch) == m and all(len(mb) == learners for mb in epoch)
        flat = np.concatenate([shard for mb in epoch for shard in mb])
        assert sorted(flat.tolist()) == list(range(rows))
        sizes = [sum(len(s) for s in mb) for mb in epoch]
        assert max(sizes) - min(sizes) <= 1


def test_minibatch_plan_rejects_too_few_rows():
    with pytest.raises(ValueError):
        minibatch_plan(3, 4, 1, np.random.default_rng(0))


@given(n=st.integers(0, 300), k=st.integers(1, 9))
def test_plan_split_is_numpy_array_split(n, k):
    from conduit.samplers.minibatch import split

    a = np.arange(n, dtype=np.int64)
    ours, theirs = split(a, k), np.array_split(a, k)
    assert len(ours) == len(theirs) == k
    assert all(np.array_equal(x, y) for x, y in zip(ours, theirs))


def test_new_rows_start_at_the_configured_max_priority_and_feedback_sets_beta_for_the_next_draws():
    """What frameworks set through the runtime's face: SRL's ``max_priority`` as config, an annealed ``beta``
    with each priority update (no setter on the buffer)."""
    import torch

    import conduit

    edp = conduit.Conduit(policy="off_policy", train_batch_size=4, capacity=16, sampler="prioritized", seed=1,
                          prioritized=conduit.PrioritizedReplay(alpha=0.5, beta=0.4, max_priority=4.0),
                          pinned=conduit.SchedulePin(delivery_overlap=False))
    with edp:
        edp.push({"x": torch.arange(8.0)})
        edp.flush()
        leaves, top = edp.buffer.priorities_at(np.arange(8))
        assert top == 4.0 and np.allclose(leaves, 2.0)
        batch = edp.pull()
        edp.update_priorities(batch, np.array([1.0, 2.0, 3.0, 4.0]), beta=1.0)
        assert edp.buffer.sampler.beta == 1.0
        nxt = edp.pull()
        leaves, _ = edp.buffer.priorities_at(np.arange(8))
        w = (8 * leaves / leaves.sum()) ** -1.0  # beta = 1 from this draw on
        np.testing.assert_allclose(nxt.info.weights, (w / w.max())[nxt.info.indices], rtol=1e-5)
        with pytest.raises(ValueError, match="beta"):
            edp.update_priorities(nxt, np.ones(4), beta=1.5)


@pytest.mark.parametrize("distinct", [False, True])
def test_a_prioritized_draw_carries_its_rows_leaves_and_beta(distinct):
    """What a draw over several buffers as one re-weighs by (conduit.distributed): each drawn row's ``p^alpha`` and
    the ``beta`` of its weights, read in the draw itself; the local weights follow from them."""
    live = table(20, 32)
    sampler = PrioritizedSampler(32, alpha=0.6, beta=0.4)
    slots = np.arange(20)
    sampler.on_insert(slots)
    sampler.update_priorities(slots, np.linspace(0.1, 4.0, slots.size))
    rng = np.random.default_rng(3)
    draw = sampler.sample_distinct(8, live, rng) if distinct else sampler.sample(12, live, rng)
    np.testing.assert_array_equal(draw.leaves, sampler.leaf_values(draw.indices))
    assert draw.beta == 0.4
    low = sampler.tree.min
    np.testing.assert_allclose(draw.weights, (draw.leaves / low) ** -0.4, rtol=1e-6)
    assert UniformSampler(32).sample(4, live, rng).leaves is None
