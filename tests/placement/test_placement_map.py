"""The placement map M: regions, exact boundaries, lookups equal to Alg. 1."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.errors import PlacementError
from conduit.placement import (
    Placement,
    PlacementKind,
    PlacementRequest,
    Topology,
    build_placement_map,
    evaluate_candidates,
    linear_scan,
    solve_placement,
)
from conduit.placement.placement_map import geometric_grid


def _alg1(topo: Topology, req: PlacementRequest, x: int) -> Placement | None:
    best = linear_scan(evaluate_candidates(topo, req, x))
    return None if best is None else best.placement


def test_mi250x_map_follows_the_growth_trace(mi250x: Topology, sample_bytes_of: Callable[[int], int]) -> None:
    """Transition dimension 128 -> 20,000 (the paper's Fig. 13): single GPU, then ever wider shards."""
    req = PlacementRequest(actors="cpu", learners="cuda:0", capacity=10**6)
    lo, hi = sample_bytes_of(128), sample_bytes_of(20_000)
    m = build_placement_map(mi250x, req, x_min=lo, x_max=hi, points=32)
    assert m.x_min == lo and m.x_max == hi
    assert m.regions[0].placement == Placement.of(PlacementKind.SINGLE_GPU, ["cuda:0"])
    assert [len(p.devices) for p in m.placements] == [1, 2, 3]
    assert all(r.placement is not None for r in m.regions)
    for d in (128, 1_000, 5_000, 7_000, 7_500, 10_000, 15_000, 20_000):
        x = sample_bytes_of(d)
        assert m.lookup(x) == solve_placement(mi250x, req, x).placement
    # the boundary is exact: the single GPU holds x = hi - 1 of its region and not one byte more
    first = m.regions[0]
    (single,) = evaluate_candidates(mi250x, req, first.hi - 1, [first.placement])  # type: ignore[list-item]
    (over,) = evaluate_candidates(mi250x, req, first.hi, [first.placement])  # type: ignore[list-item]
    assert single.feasible and not over.feasible


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_lookup_equals_alg1_everywhere(data: Any, random_topology: Callable[..., Topology]) -> None:
    topo = random_topology(data.draw, nodes=data.draw(st.sampled_from((1, 2))))
    ids = [d.id for d in topo.devices]
    req = PlacementRequest(
        actors=data.draw(st.sampled_from(ids)),
        learners=data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=2, unique=True)),
        capacity=data.draw(st.sampled_from((10**4, 10**5, 10**6))),
    )
    x_min = data.draw(st.integers(1, 10_000))
    x_max = x_min * data.draw(st.integers(1, 1_000))
    m = build_placement_map(topo, req, x_min=x_min, x_max=x_max, points=data.draw(st.integers(2, 12)))
    assert len(m.regions) <= len(m.placements) + 1
    probes = data.draw(st.lists(st.integers(x_min, x_max), min_size=1, max_size=12))
    for x in probes + [r.lo for r in m.regions] + [r.hi - 1 for r in m.regions]:
        expected = _alg1(topo, req, x)
        if expected is None:
            with pytest.raises(PlacementError, match="no placement holds samples"):
                m.lookup(x)
        else:
            assert m.lookup(x) == expected


def test_lookup_outside_and_beyond(fake_topology: Topology) -> None:
    req = PlacementRequest(actors="cpu", learners="cuda:0", capacity=10**6, headroom=0.0)
    m = build_placement_map(fake_topology, req, x_min=1_000, x_max=10**6, points=16)
    with pytest.raises(
        PlacementError, match=r"expected a size within the placement map's range \[1000, 1000000\] B, received 999"
    ):
        m.lookup(999)
    last = m.regions[-1]
    assert last.placement is None  # 10^6 samples of 1 MB fit nowhere on this node
    with pytest.raises(PlacementError, match=r"(?s)no placement holds samples of 1000000 B.*missing"):
        m.lookup(10**6)
    assert m.lookup(1_000) == Placement.of(PlacementKind.SINGLE_GPU, ["cuda:0"])


def test_map_arguments_are_validated(fake_topology: Topology) -> None:
    req = PlacementRequest(actors="cpu", learners="cuda:0", capacity=10)
    with pytest.raises(PlacementError, match="x_max: expected >= x_min"):
        build_placement_map(fake_topology, req, x_min=10, x_max=5)
    with pytest.raises(PlacementError, match="points: expected an integer >= 1, received 0"):
        build_placement_map(fake_topology, req, x_min=1, x_max=5, points=0)


def test_geometric_grid_covers_the_ends() -> None:
    grid = geometric_grid(1_037, 160_013, 8)
    assert grid[0] == 1_037 and grid[-1] == 160_013
    assert grid == sorted(set(grid))
    assert geometric_grid(7, 7, 5) == [7]
