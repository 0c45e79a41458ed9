"""Eq. 3 migration plans: the LP against independent optima, and whole-sample rounding."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.errors import PlacementError
from conduit.placement import (
    LocalTransfer,
    Placement,
    PlacementKind,
    Topology,
    plan_migration,
    plan_placement_change,
    round_flows,
    solve_min_makespan,
)
from conduit.placement.migration import makespan
from conduit.placement.units import GB

K = PlacementKind
BANDWIDTHS = (1.0, 2.0, 5.0, 10.0, 50.0, 100.0)


def cut_optimum(v: Sequence[float], w: Sequence[float], bw: np.ndarray) -> float:
    """The min makespan from max-flow/min-cut (Gale's theorem), by brute force over all cuts.

    Moving V into W within capacities t*BW is possible iff for every source set S and
    target set T: V(S) <= W(T) + t * BW(S, not T). So t* = max (V(S) - W(T)) / BW(S, not T).
    """
    best = 0.0
    m, n = len(v), len(w)
    for r in range(1, m + 1):
        for s in itertools.combinations(range(m), r):
            for q in range(n + 1):
                for t in itertools.combinations(range(n), q):
                    num = sum(v[i] for i in s) - sum(w[j] for j in t)
                    if num <= 0:
                        continue
                    den = sum(bw[i, j] for i in s for j in range(n) if j not in t)
                    if den == 0:
                        return math.inf
                    best = max(best, num / den)
    return best


@st.composite
def instances(draw: Any, max_side: int = 3) -> tuple[list[int], list[int], np.ndarray]:
    m = draw(st.integers(1, max_side))
    n = draw(st.integers(1, max_side))
    v = draw(st.lists(st.integers(0, 1000), min_size=m, max_size=m))
    total = sum(v)
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=n - 1, max_size=n - 1)))
    w = [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]
    bw = np.array(draw(st.lists(st.sampled_from(BANDWIDTHS), min_size=m * n, max_size=m * n))).reshape(m, n)
    return v, w, bw


@settings(max_examples=150, deadline=None)
@given(instance=instances())
def test_lp_makespan_equals_the_min_cut_optimum(instance: tuple[list[int], list[int], np.ndarray]) -> None:
    v, w, bw = instance
    sol = solve_min_makespan(v, w, bw)
    assert sol.makespan == pytest.approx(cut_optimum(v, w, bw), rel=1e-6, abs=1e-9)
    f = sol.flows
    assert np.all(f >= 0)
    np.testing.assert_allclose(f.sum(axis=1), v, atol=1e-6 * max(1, sum(v)))
    np.testing.assert_allclose(f.sum(axis=0), w, atol=1e-6 * max(1, sum(v)))
    assert makespan(f, bw) == pytest.approx(sol.makespan, rel=1e-9, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    v=st.tuples(st.integers(0, 500), st.integers(0, 500)),
    split=st.floats(0.0, 1.0),
    bw=st.lists(st.sampled_from(BANDWIDTHS), min_size=4, max_size=4),
)
def test_lp_equals_a_fine_grid_search_on_2x2(v: tuple[int, int], split: float, bw: list[float]) -> None:
    """2x2 has one degree of freedom a = f11; scan it finely."""
    total = sum(v)
    w1 = round(total * split)
    w = (w1, total - w1)
    b = np.array(bw).reshape(2, 2)
    lo, hi = max(0, w1 - v[1]), min(v[0], w1)
    a = np.linspace(lo, hi, 20001)
    flows = np.clip(np.stack([a, v[0] - a, w1 - a, v[1] - w1 + a]), 0, None)  # f11, f12, f21, f22
    best = float((flows / b.reshape(4, 1)).max(axis=0).min())
    step = (hi - lo) / 20000 / min(bw) if hi > lo else 0.0
    sol = solve_min_makespan(v, w, b)
    assert sol.makespan <= best * (1 + 1e-8) + 1e-9
    assert sol.makespan >= best - step - 1e-9


@settings(max_examples=150, deadline=None)
@given(instance=instances(max_side=4))
def test_rounding_keeps_sums_exact(instance: tuple[list[int], list[int], np.ndarray]) -> None:
    v, w, bw = instance
    sol = solve_min_makespan(v, w, bw)
    whole = round_flows(sol.flows, v, w, bw)
    assert whole.dtype.kind == "i" and np.all(whole >= 0)
    assert whole.sum(axis=1).tolist() == v
    assert whole.sum(axis=0).tolist() == w
    assert np.all(whole <= np.ceil(sol.flows - 1e-6) + 1)
    slowest_sample = max((1.0 / bw[i, j] for i, j in zip(*np.nonzero(whole), strict=True)), default=0.0)
    assert makespan(whole, bw) <= sol.makespan + slowest_sample + 1e-9


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_rounding_any_fractional_plan(data: Any) -> None:
    """Integer plan + random fractional moves around 2x2 cycles: row/column sums stay integer."""
    m, n = data.draw(st.integers(2, 4)), data.draw(st.integers(2, 4))
    f = np.array(data.draw(st.lists(st.integers(0, 20), min_size=m * n, max_size=m * n)), dtype=float).reshape(m, n)
    for _ in range(data.draw(st.integers(1, 6))):
        i1, i2 = data.draw(st.lists(st.integers(0, m - 1), min_size=2, max_size=2, unique=True))
        j1, j2 = data.draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
        room = min(f[i1, j2], f[i2, j1])
        delta = data.draw(st.floats(0.0, 1.0)) * room
        f[i1, j1] += delta
        f[i2, j2] += delta
        f[i1, j2] -= delta
        f[i2, j1] -= delta
    v = [round(float(x)) for x in f.sum(axis=1)]
    w = [round(float(x)) for x in f.sum(axis=0)]
    whole = round_flows(f, v, w, np.ones((m, n)))
    assert whole.sum(axis=1).tolist() == v and whole.sum(axis=0).tolist() == w
    assert np.all(whole <= np.ceil(f - 1e-6) + 1e-9)


def test_single_gpu_to_shared_pair(mi250x: Topology) -> None:
    x = 80_013
    old = Placement.of(K.SINGLE_GPU, ["cuda:0"])
    new = Placement.of(K.SHARED_GPU, ["cuda:0", "cuda:1"])
    plan = plan_placement_change(mi250x, old, new, samples=760_001, sample_bytes=x)
    assert plan.sources == ("cuda:0",) and plan.targets == ("cuda:0", "cuda:1")
    assert plan.flows == ((380_001, 380_000),)
    slowest = plan.transfers()[0]
    assert (slowest.source, slowest.target) == ("cuda:0", "cuda:1")
    assert plan.makespan_seconds == pytest.approx(380_000 * x / (400 * GB))
    assert plan.makespan_seconds >= plan.lp_makespan_seconds * (1 - 1e-9)


def test_keep_in_place_is_free_and_copy_is_not(mi250x: Topology) -> None:
    src = {"cuda:0": 500, "cuda:1": 500}
    dst = {"cuda:0": 400, "cuda:1": 400, "cuda:6": 200}
    keep = plan_migration(mi250x, src, dst, 1_000_000, LocalTransfer.KEEP)
    copy = plan_migration(mi250x, src, dst, 1_000_000, LocalTransfer.COPY)
    assert keep.makespan_seconds <= copy.makespan_seconds
    # Only the 200 samples bound for cuda:6 cost time when staying put is free: 0->6 at 200, 1->6 at 100 GB/s.
    assert keep.makespan_seconds == pytest.approx(200 * 1e6 / (300 * GB), rel=0.02)
    assert dict(((t.source, t.target), t.seconds) for t in keep.transfers())[("cuda:0", "cuda:0")] == 0.0
    for plan in (keep, copy):
        assert [sum(r) for r in plan.flows] == [500, 500]
        assert [sum(c) for c in zip(*plan.flows, strict=True)] == [400, 400, 200]


def test_pinned_to_gpu_and_cross_node() -> None:
    from conduit.placement import builtin_topology

    topo = builtin_topology("mi250x_2node")
    plan = plan_placement_change(
        topo,
        Placement.of(K.CPU_PINNED, ["node0/pinned"]),
        Placement.of(K.MULTI_NODE, ["node0/cuda:0", "node1/cuda:0"]),
        samples=1000,
        sample_bytes=4096,
    )
    assert plan.flows == ((500, 500),)
    assert plan.makespan_seconds == pytest.approx(500 * 4096 / (25 * GB))  # the inter-node leg


def test_degenerate_and_invalid_inputs(mi250x: Topology) -> None:
    empty = solve_min_makespan([0, 0], [0], np.ones((2, 1)))
    assert empty.makespan == 0.0 and not empty.flows.any()
    forced = solve_min_makespan([4, 2], [2, 4], np.array([[0.0, 1.0], [1.0, 1.0]]))
    assert forced.flows[0, 0] == pytest.approx(0.0) and forced.makespan == pytest.approx(4.0)
    free = solve_min_makespan([3], [3], np.array([[math.inf]]))
    assert free.makespan == 0.0 and free.flows[0, 0] == pytest.approx(3.0)
    with pytest.raises(PlacementError, match="no flow moves"):
        solve_min_makespan([1, 1], [1, 1], np.array([[0.0, 0.0], [1.0, 1.0]]))
    with pytest.raises(
        PlacementError, match=r"volumes: expected equal totals \(sum V = sum V'\), received sources 3.0 and targets 2.0"
    ):
        solve_min_makespan([3], [2], np.ones((1, 1)))
    with pytest.raises(PlacementError, match=r"bandwidth: expected shape \(1, 2\)"):
        solve_min_makespan([2], [1, 1], np.ones((2, 2)))
    with pytest.raises(PlacementError, match="target_samples: expected 10 samples in all"):
        plan_migration(mi250x, {"cuda:0": 10}, {"cuda:1": 9}, 8)
    with pytest.raises(PlacementError, match="sample_bytes: expected an integer >= 1"):
        plan_migration(mi250x, {"cuda:0": 10}, {"cuda:1": 10}, 0)
    with pytest.raises(PlacementError, match="source_samples: expected distinct devices"):
        plan_migration(builtin_topology_two(), {"cuda:0": 5, "node0/cuda:0": 5}, {"cuda:1": 10}, 8)


def builtin_topology_two() -> Topology:
    from conduit.placement import builtin_topology

    return builtin_topology("a100_2node")
