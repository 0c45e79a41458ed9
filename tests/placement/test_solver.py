"""Candidates, the transfer model and Alg. 1: against brute force and the paper's MI250X result."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.errors import PlacementError
from conduit.placement import (
    DeviceKind,
    Placement,
    PlacementKind,
    PlacementRequest,
    SharePolicy,
    Topology,
    build_candidates,
    builtin_topology,
    evaluate_candidates,
    linear_scan,
    solve_placement,
)
from conduit.placement.candidates import cost_order
from conduit.placement.units import GB, GIB

K = PlacementKind


# -- an independent reference for the model and Alg. 1 ------------------------------------
def reference_time(topo: Topology, p: Placement, actors: Sequence[str], learners: Sequence[str], x: int) -> float:
    """Expected seconds per sample, written out directly from docs/design.md §3."""
    total = 0.0
    for dev, share in zip(p.devices, p.shares, strict=True):
        write = sum(x / topo.bandwidth(a, dev) for a in actors) / len(actors)
        read = sum(x / topo.bandwidth(dev, lr) for lr in learners) / len(learners)
        total += share * (write + read)
    return total


def reference_fits(topo: Topology, p: Placement, capacity: int, x: int, headroom: float) -> bool:
    counts = p.sample_counts(capacity)
    return all(
        n * x <= math.floor(topo.device(d).memory_bytes * (1 - headroom))
        for d, n in zip(p.devices, counts, strict=True)
    )


def reference_best(topo: Topology, pool: Sequence[Placement], req: PlacementRequest, x: int) -> float | None:
    """Exhaustive: the minimum modeled time over every feasible candidate of ``pool``."""
    times = [
        reference_time(topo, p, req.actors, req.learners, x)
        for p in pool
        if reference_fits(topo, p, req.capacity, x, req.headroom)
    ]
    return min(times) if times else None


def all_gpu_subsets(topo: Topology, node: int = 0) -> list[Placement]:
    """Host tiers plus every non-empty GPU subset of one node, equal shares: the true search space."""
    out = [Placement.of(K.CPU_PAGEABLE, [topo.host(node, DeviceKind.CPU).id])]  # type: ignore[union-attr]
    pinned = topo.host(node, DeviceKind.PINNED)
    if pinned is not None:
        out.append(Placement.of(K.CPU_PINNED, [pinned.id]))
    gpus = [g.id for g in topo.gpus(node)]
    for k in range(1, len(gpus) + 1):
        out += [Placement.of(K.SINGLE_GPU if k == 1 else K.SHARED_GPU, s) for s in itertools.combinations(gpus, k)]
    return out


def draw_request(data: Any, topo: Topology, policy: SharePolicy = SharePolicy.EQUAL) -> PlacementRequest:
    ids = [d.id for d in topo.devices if d.kind is not DeviceKind.PINNED]
    actors = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=2, unique=True))
    learners = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True))
    return PlacementRequest(
        actors=actors,
        learners=learners,
        capacity=data.draw(st.sampled_from((10**4, 10**5, 10**6))),
        headroom=data.draw(st.sampled_from((0.0, 0.1, 0.3))),
        share_policy=policy,
    )


# -- Alg. 1 == brute force ---------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(data=st.data(), nodes=st.sampled_from((1, 1, 2)), policy=st.sampled_from(tuple(SharePolicy)))
def test_alg1_equals_brute_force_over_the_candidates(
    data: Any, nodes: int, policy: SharePolicy, random_topology: Callable[..., Topology]
) -> None:
    topo = random_topology(data.draw, nodes=nodes)
    req = draw_request(data, topo, policy)
    x = data.draw(st.integers(1, 200_000))
    pool = build_candidates(topo, req)
    expected = reference_best(topo, pool, req, x)
    if expected is None:
        with pytest.raises(PlacementError, match="no feasible placement"):
            solve_placement(topo, req, x)
        return
    result = solve_placement(topo, req, x)
    assert result.chosen.feasible
    assert result.transfer_seconds == pytest.approx(expected, rel=1e-9)
    assert len(result.evaluations) == len(pool)
    for e in result.evaluations:  # every candidate is kept, modeled as the reference does
        assert e.transfer_seconds == pytest.approx(
            reference_time(topo, e.placement, req.actors, req.learners, x), rel=1e-12
        )
        assert e.feasible == reference_fits(topo, e.placement, req.capacity, x, req.headroom)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), gpus=st.integers(1, 5))
def test_candidates_hold_the_all_subsets_optimum_when_gpus_have_equal_memory(
    data: Any, gpus: int, random_topology: Callable[..., Topology]
) -> None:
    """With equal shares the model is separable over shards, so the best k-subset is the first k of the
    cost order; with equal free memory the candidate set P is exact against all 2^G subsets."""
    topo = random_topology(data.draw, gpus=gpus, homogeneous_memory=True)
    req = draw_request(data, topo)
    x = data.draw(st.integers(100, 100_000))
    truth = reference_best(topo, all_gpu_subsets(topo), req, x)
    ours = reference_best(topo, build_candidates(topo, req), req, x)
    assert (truth is None) == (ours is None)
    if truth is not None:
        assert ours == pytest.approx(truth, rel=1e-9)


def test_heuristic_versus_all_subsets_with_uneven_memory(random_topology: Callable[..., Topology]) -> None:
    """How close P gets when free memory differs between GPUs (documented, seeded).

    Measured here (seed 1234, 300 instances of 2-5 GPUs, 224 solvable over all subsets):
    where P has a feasible candidate, Alg. 1 over P matches the optimum over all 2^G
    subsets in 214 of 218 instances (98%), at worst 2.0x slower; in 6 (2.7%) P (equal
    shares) had nothing that fits while a subset avoiding a small GPU did.
    SharePolicy.MEMORY closes that gap: P's full GPU set then fits (checked below).
    With equal free memory P is exact (the property test above).
    """
    rng = random.Random(1234)
    solvable = exact = missed = 0
    worst = 1.0
    for _ in range(300):
        topo = random_topology(rng, gpus=rng.randint(2, 5), homogeneous_memory=False)
        gids = [g.id for g in topo.gpus()]
        req = PlacementRequest(
            actors=[rng.choice(["cpu", *gids])],
            learners=rng.sample(["cpu", *gids], rng.randint(1, 2)),
            capacity=rng.choice((10**5, 10**6)),
        )
        x = rng.choice((1_000, 5_000, 10_000, 20_000, 40_000))
        truth = reference_best(topo, all_gpu_subsets(topo), req, x)
        if truth is None:
            continue
        solvable += 1
        ours = reference_best(topo, build_candidates(topo, req), req, x)
        if ours is None:
            missed += 1
            memory_req = PlacementRequest(req.actors, req.learners, req.capacity, share_policy=SharePolicy.MEMORY)
            assert linear_scan(evaluate_candidates(topo, memory_req, x)) is not None
            continue
        assert ours >= truth * (1 - 1e-9)  # P is a subset of the search space
        exact += ours <= truth * (1 + 1e-9)
        worst = max(worst, ours / truth)
    assert solvable > 200
    assert exact / (solvable - missed) >= 0.95
    assert missed / solvable <= 0.05
    assert worst <= 2.5


# -- the model ----------------------------------------------------------------------------
def test_sharded_delivery_is_expected_time_not_averaged_bandwidth(fake_topology: Topology) -> None:
    x = 10_000
    req = PlacementRequest(actors="cpu", learners="cuda:0", capacity=1000)
    p = Placement.of(K.SHARED_GPU, ["cuda:0", "cuda:1", "cuda:3"])
    (e,) = evaluate_candidates(fake_topology, req, x, [p])
    local, peer1, peer3 = 800 * GB, 400 * GB, 50 * GB
    assert e.deliver_seconds == pytest.approx((x / local + x / peer1 + x / peer3) / 3)
    assert e.deliver_seconds != pytest.approx(x / ((local + peer1 + peer3) / 3))
    assert e.ingest_seconds == pytest.approx(x / (12 * GB))  # pageable host -> each GPU


def test_legs_average_over_actors_and_learners(fake_topology: Topology) -> None:
    x = 1_000
    req = PlacementRequest(actors=["cpu", "cuda:1"], learners=["cuda:0", "cuda:2"], capacity=10)
    (e,) = evaluate_candidates(fake_topology, req, x, [Placement.of(K.CPU_PINNED, ["pinned"])])
    assert e.ingest_seconds == pytest.approx((x / (20 * GB) + x / (25 * GB)) / 2)
    assert e.deliver_seconds == pytest.approx(x / (25 * GB))


def test_no_feasible_placement_states_the_missing_bytes(fake_topology: Topology) -> None:
    req = PlacementRequest(actors="cpu", learners="cuda:0", capacity=10**6, headroom=0.0)
    x = 400_000  # 400 GB: more than host memory (256 GiB) and all GPUs (104 GiB)
    with pytest.raises(PlacementError) as info:
        solve_placement(fake_topology, req, x)
    evaluations = evaluate_candidates(fake_topology, req, x)
    closest = min(evaluations, key=lambda e: e.missing_bytes)
    missing = 10**6 * x - 256 * GIB
    assert closest.placement == Placement.of(K.CPU_PAGEABLE, ["cpu"])
    assert closest.missing_bytes == missing
    message = str(info.value)
    assert f"needs {10**6 * x} B but has {256 * GIB} B usable: {missing} B" in message
    assert "missing" in message and "cpu_pageable(cpu)" in message


def test_sample_bytes_is_validated(fake_topology: Topology) -> None:
    req = PlacementRequest(actors="cpu", learners="cuda:0", capacity=10)
    with pytest.raises(PlacementError, match="sample_bytes: expected an integer >= 1, received 0"):
        solve_placement(fake_topology, req, 0)
    with pytest.raises(PlacementError, match="learners: device: expected one of"):
        solve_placement(fake_topology, PlacementRequest(actors="cpu", learners="cuda:7", capacity=10), 8)


# -- the candidate set --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mi250x_8gcd", "a100_8x_nvlink"])
@pytest.mark.parametrize("learners", [["cuda:0"], ["cuda:3"], [f"cuda:{i}" for i in range(8)], ["cpu"]])
def test_candidate_set_is_small_and_ordered(name: str, learners: list[str]) -> None:
    topo = builtin_topology(name)
    pool = build_candidates(topo, PlacementRequest(actors="cpu", learners=learners, capacity=10))
    kinds = [p.kind for p in pool]
    assert kinds[:2] == [K.CPU_PAGEABLE, K.CPU_PINNED]
    assert kinds.count(K.SINGLE_GPU) == 8
    assert 7 <= kinds.count(K.SHARED_GPU) <= 2 * 8  # at most 2G subsets per node
    assert kinds == sorted(kinds, key=lambda k: list(K).index(k))  # host, single, shared
    sizes = [len(p.shards) for p in pool if p.kind is K.SHARED_GPU]
    assert sizes == sorted(sizes)
    assert len({frozenset(p.devices) for p in pool}) == len(pool)


def test_no_pinned_candidate_without_pinned_memory(fake_topology: Topology) -> None:
    data = fake_topology.to_dict()
    node = data["nodes"][0]
    node.update(pinned_memory_bytes=None, pinned_to_gpu=None, gpu_to_pinned=None)
    topo = Topology.from_dict(data)
    pool = build_candidates(topo, PlacementRequest(actors="cpu", learners="cuda:0", capacity=10))
    assert K.CPU_PINNED not in {p.kind for p in pool}
    assert topo.host(0, DeviceKind.PINNED) is None


def test_kinds_restrict_the_candidates(mi250x: Topology) -> None:
    req = PlacementRequest(
        actors="cpu", learners="cuda:0", capacity=10**6, kinds=frozenset({K.CPU_PINNED, K.CPU_PAGEABLE})
    )
    assert {p.kind for p in build_candidates(mi250x, req)} == {K.CPU_PINNED, K.CPU_PAGEABLE}
    assert solve_placement(mi250x, req, 1037).placement == Placement.of(K.CPU_PINNED, ["pinned"])


def test_memory_share_policy_fits_uneven_gpus(fake_topology: Topology) -> None:
    """cuda:3 has 8 GiB free: a 35 GiB buffer over (cuda:2, cuda:3) fits only when split by memory."""
    x = 35 * 1024
    args = dict(actors="cpu", learners="cuda:2", capacity=GIB // 1024 * 1)
    pair = [Placement.of(K.SHARED_GPU, ["cuda:2", "cuda:3"])]
    equal = PlacementRequest(**args)  # type: ignore[arg-type]
    memory = PlacementRequest(**args, share_policy=SharePolicy.MEMORY)  # type: ignore[arg-type]
    assert not evaluate_candidates(fake_topology, equal, x, pair)[0].feasible
    weighted = [p for p in build_candidates(fake_topology, memory) if set(p.devices) == {"cuda:2", "cuda:3"}]
    (p,) = weighted
    assert dict(zip(p.devices, p.shares, strict=True)) == pytest.approx({"cuda:2": 0.8, "cuda:3": 0.2})
    assert evaluate_candidates(fake_topology, memory, x, weighted)[0].feasible


def test_multi_node_balances_capacity_across_nodes() -> None:
    topo = builtin_topology("a100_2node")
    req = PlacementRequest(actors=["node0/cpu", "node1/cpu"], learners=["node0/cuda:0", "node1/cuda:0"], capacity=10**6)
    multi = [p for p in build_candidates(topo, req) if p.kind is K.MULTI_NODE]
    assert len(multi) == 2 + 8  # host pageable, host pinned, k = 1..8 GPUs per node
    for p in multi:
        per_node = {
            n: sum(s for d, s in zip(p.devices, p.shares, strict=True) if d.startswith(f"node{n}/")) for n in (0, 1)
        }
        assert per_node == pytest.approx({0: 0.5, 1: 0.5})
    # 1 TB of experience: more than one node's GPUs (8 x 79 GiB) or both nodes' pinned memory.
    result = solve_placement(topo, req, 10**6)
    assert result.placement.kind is K.MULTI_NODE
    # 1e12 B over shards of 0.9 * 79 GiB needs 14 GPUs: 7 per node (more would dilute the local reads).
    assert [d.split("/")[0] for d in result.placement.devices] == ["node0"] * 7 + ["node1"] * 7


# -- the paper's qualitative result on the MI250X node (§7.3, Fig. 12/13, Fig. 16b) ------
DIMS_FIT = (128, 256, 512, 1_000, 2_000, 5_000)
DIMS_SHARDED = (10_000, 20_000)


@pytest.mark.parametrize("d", DIMS_FIT + DIMS_SHARDED)
def test_mi250x_single_gpu_while_it_fits_then_shared(
    d: int, mi250x: Topology, sample_bytes_of: Callable[[int], int]
) -> None:
    """Actor on CPU, learner on GCD 0, capacity 10^6 (batch 512 scales both legs alike)."""
    req = PlacementRequest(actors="cpu", learners="cuda:0", capacity=10**6)
    placement = solve_placement(mi250x, req, sample_bytes_of(d)).placement
    if d in DIMS_FIT:
        assert placement == Placement.of(K.SINGLE_GPU, ["cuda:0"])
    else:
        assert placement.kind is K.SHARED_GPU
        assert placement.devices[:2] == ("cuda:0", "cuda:1")  # the learner's GCD and its 400 GB/s twin
        if len(placement.devices) > 2:
            assert "cuda:6" in placement.devices and "cuda:7" not in placement.devices  # 200 over 100 GB/s


@pytest.mark.parametrize("d", DIMS_FIT + DIMS_SHARDED + (30_000,))
def test_mi250x_all_learners_prefer_the_fast_even_ranks(
    d: int, mi250x: Topology, sample_bytes_of: Callable[[int], int]
) -> None:
    """One learner per GCD: sharding uses the high-bandwidth ranks 0/2/4/6, never 1/3/5/7."""
    req = PlacementRequest(actors="cpu", learners=[f"cuda:{i}" for i in range(8)], capacity=10**6)
    placement = solve_placement(mi250x, req, sample_bytes_of(d)).placement
    if d in DIMS_FIT:
        assert placement.kind is K.SINGLE_GPU and placement.devices[0] in {"cuda:0", "cuda:2", "cuda:4", "cuda:6"}
    else:
        assert placement.kind is K.SHARED_GPU
        assert set(placement.devices) <= {"cuda:0", "cuda:2", "cuda:4", "cuda:6"}


def test_mi250x_even_ranks_are_the_all_subsets_optimum(mi250x: Topology) -> None:
    learners = [f"cuda:{i}" for i in range(8)]
    order = cost_order(mi250x, mi250x.gpus(), ["cpu"], learners)
    assert [g.id for g in order[:4]] == ["cuda:0", "cuda:2", "cuda:4", "cuda:6"]
    req = PlacementRequest(actors="cpu", learners=learners, capacity=10**6)
    x = 4 * 50_000_000 // 1  # 200 GB: needs 4 GCDs
    best = min(
        (p for p in all_gpu_subsets(mi250x) if len(p.devices) == 4),
        key=lambda p: reference_time(mi250x, p, req.actors, req.learners, x),
    )
    assert set(best.devices) == {"cuda:0", "cuda:2", "cuda:4", "cuda:6"}


def test_mi250x_pinned_beats_pageable_and_gpu_beats_both(mi250x: Topology) -> None:
    req = PlacementRequest(actors="cpu", learners="cuda:0", capacity=10**6)
    times = {str(e.placement): e.transfer_seconds for e in evaluate_candidates(mi250x, req, 1037)}
    assert times["single_gpu(cuda:0)"] < times["cpu_pinned(pinned)"] < times["cpu_pageable(cpu)"]
