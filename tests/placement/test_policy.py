"""PlacementPolicy (Alg. 1 storage, Alg. 2 migration) and the slot-preserving re-layout, on CPU.

"GPU" ids of the test topologies are backed by CPU memory through ``device_map``;
pinned memory likewise, so every tier mix is exercised without CUDA.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conduit.buffers.replay import ReplayBuffer
from conduit.errors import PlacementError
from conduit.placement import (
    Node,
    Placement,
    PlacementKind,
    PlacementPolicy,
    Topology,
    plan_migration,
    this_machine_topology,
)
from conduit.placement.relayout import in_place_copies, plan_layout, shard_volumes, target_volumes
from conduit.samplers import UniformSampler
from conduit.spec import ExperienceSpec, FieldSpec
from conduit.storage import FixedStorage, RowLayout, ShardedStorage, TensorStorage
from conduit.storage.sharded import Segment
from tests.placement.conftest import transition_bytes

K = PlacementKind
KIB = 1024
GB = 10**9


def small_topology(gpu_kib: int = 64, host_kib: int = 4096, pinned_kib: int | None = 256) -> Topology:
    """Three small "GPUs" (0-1 fast), pinned and pageable host memory; sizes in KiB.

    Per byte the model ranks single GPU < shared GPUs < pinned < pageable; with
    100 samples of ``4 * dim + 8`` bytes: one GPU up to dim 161, two up to 325,
    three up to 479, pinned up to 653, pageable host beyond.
    """
    g = 3
    links = [[0.0 if i == j else (300 if {i, j} == {0, 1} else 100) * GB for j in range(g)] for i in range(g)]
    pinned = pinned_kib is not None
    node = Node(
        host_memory_bytes=host_kib * KIB,
        pinned_memory_bytes=pinned_kib * KIB if pinned else None,
        gpu_memory_bytes=(gpu_kib * KIB,) * g,
        host_memcpy=20 * GB,
        gpu_local=(800 * GB,) * g,
        host_to_gpu=(12 * GB,) * g,
        gpu_to_host=(10 * GB,) * g,
        pinned_to_gpu=(15 * GB,) * g if pinned else None,
        gpu_to_pinned=(15 * GB,) * g if pinned else None,
        gpu_to_gpu=tuple(tuple(r) for r in links),
    )
    return Topology(name="small3", nodes=(node,))


CPU_BACKED = {"cuda:0": "cpu", "cuda:1": "cpu", "cuda:2": "cpu", "pinned": "cpu"}


def policy(topology: Topology | None = None, **kw: Any) -> PlacementPolicy:
    kw.setdefault("headroom", 0.0)
    topo = topology or small_topology()
    ids = {d.id for d in topo.devices}
    kw.setdefault("device_map", {k: v for k, v in CPU_BACKED.items() if k in ids})
    return PlacementPolicy(topo, learners="cuda:0", **kw)


def spec_of(dim: int) -> ExperienceSpec:
    return ExperienceSpec.of(obs=FieldSpec("obs", (dim,), torch.float32, growable=True), tid=((), "int64"))


def rows(first: int, n: int, dim: int) -> dict[str, torch.Tensor]:
    tid = torch.arange(first, first + n)
    return {"obs": (tid + 1).float().unsqueeze(1).expand(-1, dim).clone(), "tid": tid}


def expected(ids: list[int], dims: dict[int, int], width: int) -> torch.Tensor:
    out = torch.zeros(len(ids), width)
    for r, t in enumerate(ids):
        out[r, : dims[t]] = t + 1
    return out


# -- the pure re-layout ---------------------------------------------------------------------------
def random_layout(rng: random.Random, total: int) -> RowLayout:
    """Any bijection ring row -> (shard, row) over a random split of ``total`` rows."""
    cuts = sorted(rng.sample(range(1, total), rng.randint(0, min(3, total - 1))))
    shard_rows = [b - a for a, b in zip([0, *cuts], [*cuts, total])]
    physical = [(k, r) for k, n in enumerate(shard_rows) for r in range(n)]
    rng.shuffle(physical)
    if rng.random() < 0.3:
        physical.sort()
    return RowLayout(shard_rows, [Segment(i, 1, k, r) for i, (k, r) in enumerate(physical)])


def random_flows(rng: random.Random, sources: list[int], targets: list[int]) -> list[list[int]]:
    left, need = list(sources), list(targets)
    flows = [[0] * len(targets) for _ in sources]
    cells = [(i, j) for i in range(len(sources)) for j in range(len(targets))]
    while sum(left):
        rng.shuffle(cells)
        for i, j in cells:
            n = min(left[i], need[j], rng.randint(0, max(left[i], 1)))
            flows[i][j] += n
            left[i] -= n
            need[j] -= n
    return flows


@given(seed=st.integers(0, 10**9), total=st.integers(2, 40))
def test_plan_layout_moves_the_planned_flows_and_keeps_every_slot(seed: int, total: int) -> None:
    rng = random.Random(seed)
    old = random_layout(rng, total)
    valid = rng.randint(0, total)
    new_rows = [n for n in random_layout(rng, total).shard_rows]
    volumes = list(shard_volumes(old, valid))
    targets = list(target_volumes(new_rows, valid))
    assert sum(targets) == valid and all(t <= r for t, r in zip(targets, new_rows))
    flows = random_flows(rng, volumes, targets)
    new, copies = plan_layout(old, valid, flows, new_rows)
    assert new.shard_rows == tuple(new_rows) and new.rows == total

    # simulate: old shards hold their ring row numbers; apply the copies
    src = [np.full(n, -1) for n in old.shard_rows]
    for s in old.segments:
        src[s.shard][s.offset : s.offset + s.length] = np.arange(s.start, s.start + s.length)
    dst = [np.full(n, -1) for n in new_rows]
    moved = np.zeros((len(volumes), len(new_rows)), dtype=int)
    for c in copies:
        assert (dst[c.dst][c.dst_row : c.dst_row + c.rows] == -1).all()  # nothing written twice
        dst[c.dst][c.dst_row : c.dst_row + c.rows] = src[c.src][c.src_row : c.src_row + c.rows]
        moved[c.src, c.dst] += c.rows
    assert moved.tolist() == flows
    shard, local = new.locate(torch.arange(valid))
    assert [int(dst[k][r]) for k, r in zip(shard.tolist(), local.tolist())] == list(range(valid))


def test_in_place_copies_cover_the_valid_rows_once() -> None:
    layout = RowLayout((3, 4), [Segment(0, 2, 1, 2), Segment(2, 3, 0, 0), Segment(5, 2, 1, 0)])
    copies = in_place_copies(layout, 6)
    assert sum(c.rows for c in copies) == 6 and all(c.src == c.dst and c.src_row == c.dst_row for c in copies)


def test_plan_layout_rejects_flows_that_do_not_match() -> None:
    layout = RowLayout.contiguous([4, 4])
    with pytest.raises(PlacementError, match="flows\\[0\\]"):
        plan_layout(layout, 8, [[3, 0], [0, 4]], [4, 4])
    with pytest.raises(PlacementError, match="at most its rows"):
        plan_layout(layout, 8, [[4, 0], [4, 0]], [5, 3])
    with pytest.raises(PlacementError, match="new_rows"):
        plan_layout(layout, 8, [[4, 0], [0, 4]], [4, 5])


# -- create -----------------------------------------------------------------------------------------
def test_create_places_by_the_map_single_then_sharded() -> None:
    p = policy(capacity=100)
    small = p.create(spec_of(8), 100)  # 40 B x 100 fits one 64 KiB "GPU"
    assert isinstance(small, TensorStorage) and p.active == Placement.of(K.SINGLE_GPU, ["cuda:0"])
    big = p.create(spec_of(300), 100)  # 1208 B x 100 = 118 KiB: two GPUs
    assert isinstance(big, ShardedStorage)
    assert p.active is not None and p.active.kind is K.SHARED_GPU and p.active.devices == ("cuda:0", "cuda:1")
    assert [s.rows for s in big.shards] == list(p.active.sample_counts(100)) == [50, 50]
    assert big.labels == ("cuda:0", "cuda:1")
    assert p.placement_map() is p.placement_map(100)  # built once


def test_capacity_defaults_to_the_rows_asked_for_and_can_exceed_them() -> None:
    p = policy()
    with pytest.raises(PlacementError, match="capacity"):
        p.placement_map()
    p.create(spec_of(100), 100)
    assert p.placement_map().request.capacity == 100
    assert p.active is not None and p.active.kind is K.SINGLE_GPU
    planned = policy(capacity=400)  # e.g. several on-policy iteration stores
    storage = planned.create(spec_of(100), 100)
    assert planned.active is not None and planned.active.kind is K.SHARED_GPU and storage.rows == 100


def test_no_placement_fits_names_the_missing_bytes() -> None:
    p = policy(small_topology(host_kib=128, pinned_kib=None), capacity=100)
    with pytest.raises(PlacementError, match=r"missing") as info:
        p.create(spec_of(2_000), 100)  # 800 KB: more than all devices together
    assert "B" in str(info.value)
    storage = p.create(spec_of(8), 100)
    with pytest.raises(PlacementError, match="missing"):
        p.migrate(storage, spec_of(2_000), 10)


def test_construction_validates_arguments() -> None:
    with pytest.raises(PlacementError, match="learners: device"):
        PlacementPolicy(small_topology(), learners="cuda:7")
    with pytest.raises(PlacementError, match="share_policy"):
        PlacementPolicy(small_topology(), share_policy="bogus")
    with pytest.raises(PlacementError, match="capacity"):
        PlacementPolicy(small_topology(), capacity=0)
    with pytest.raises(PlacementError, match="map_range"):
        PlacementPolicy(small_topology(), map_range=(10, 1))


def test_sizes_outside_a_narrow_map_are_solved_directly() -> None:
    p = policy(capacity=100, map_range=(10, 100))
    assert p.placement_map().x_max == 100
    assert p.placement_for(40) == Placement.of(K.SINGLE_GPU, ["cuda:0"])
    assert p.placement_for(1_208).kind is K.SHARED_GPU  # beyond the map: Alg. 1 on the spot
    with pytest.raises(PlacementError, match="missing"):
        p.placement_for(10**6)


def test_device_map_names_unknown_ids() -> None:
    with pytest.raises(PlacementError, match="device_map: device: expected one of"):
        PlacementPolicy(small_topology(pinned_kib=None), device_map={"pinned": "cpu"})


def test_kinds_restrict_candidates_and_multi_node_is_refused() -> None:
    p = policy(capacity=100, kinds=["cpu_pinned", "cpu_pageable"])
    p.create(spec_of(8), 100)
    assert p.active == Placement.of(K.CPU_PINNED, ["pinned"])
    with pytest.raises(PlacementError, match="distributed storage"):
        policy(kinds=[K.MULTI_NODE])
    with pytest.raises(PlacementError, match="kinds"):
        policy(kinds=["gpu_cluster"])


def test_mi250x_policy_reproduces_the_paper_without_allocating(mi250x: Topology) -> None:
    p = PlacementPolicy(mi250x, learners="cuda:0", capacity=10**6)
    assert p.placement_for(transition_bytes(1_000)) == Placement.of(K.SINGLE_GPU, ["cuda:0"])
    assert p.placement_for(transition_bytes(5_000)) == Placement.of(K.SINGLE_GPU, ["cuda:0"])
    wide = p.placement_for(transition_bytes(20_000))
    assert wide.kind is K.SHARED_GPU and wide.devices[:2] == ("cuda:0", "cuda:1") and "cuda:7" not in wide.devices


# -- migrate ---------------------------------------------------------------------------------------
def filled(p: PlacementPolicy, dim: int, n: int, capacity: int = 100) -> tuple[Any, dict[int, int]]:
    storage = p.create(spec_of(dim), capacity)
    storage.write(0, rows(0, n, dim))
    return storage, dict.fromkeys(range(n), dim)


def test_same_placement_re_lays_in_place_with_padding() -> None:
    p = policy(capacity=100)
    old, dims = filled(p, 4, 60)
    new = p.migrate(old, spec_of(6), 60)
    (h,) = p.history
    assert h.in_place and not h.changed and h.plan is None and h.rows_moved == 60
    assert h.sample_bytes_before == 24 and h.sample_bytes_after == 32
    got = new.read(0, 60)
    assert torch.equal(got["tid"], torch.arange(60)) and torch.equal(got["obs"], expected(list(range(60)), dims, 6))
    assert old.tensors == {}  # released


@pytest.mark.parametrize(
    ("dims", "kinds", "target"),
    [
        ((8, 300), None, "shared_gpu(cuda:0, cuda:1)"),
        ((300, 400), None, "shared_gpu(cuda:0, cuda:1, cuda:2)"),
        ((300, 600), None, "cpu_pinned(pinned)"),
        ((8, 900), None, "cpu_pageable(cpu)"),
        ((8, 300), ["cpu_pinned", "single_gpu"], "cpu_pinned(pinned)"),
    ],
)
def test_migration_follows_the_eq3_plan_and_keeps_slots(
    dims: tuple[int, int], kinds: list[str] | None, target: str
) -> None:
    p = policy(capacity=100, kinds=kinds)
    old, seen = filled(p, dims[0], 100)
    old.write(0, rows(100, 37, dims[0]))  # wrap: slots 0..36 now hold ids 100..136
    seen.update(dict.fromkeys(range(100, 137), dims[0]))
    source = p.active
    new = p.migrate(old, spec_of(dims[1]), 100)
    (h,) = p.history
    assert h.changed and h.source == source and h.target == p.active and h.rows_moved == 100
    assert str(h.target) == target
    assert h.plan is not None and h.modeled_seconds == h.plan.makespan_seconds > 0 and h.measured_seconds > 0
    reference = plan_migration(
        p.topology,
        dict(zip(source.devices, source.sample_counts(100))),  # type: ignore[union-attr]
        dict(zip(h.target.devices, h.target.sample_counts(100))),
        h.sample_bytes_before,
    )
    assert h.plan.makespan_seconds == pytest.approx(reference.makespan_seconds)
    ids = [*range(100, 137), *range(37, 100)]
    got = new.read(0, 100)
    assert got["tid"].tolist() == ids
    assert torch.equal(got["obs"], expected(ids, seen, dims[1]))
    idx = torch.tensor([99, 0, 36, 37, 50, 0])
    assert new.gather(idx)["tid"].tolist() == [ids[i] for i in idx.tolist()]


@given(seed=st.integers(0, 10**6))
def test_random_growth_round_trips_every_record(seed: int) -> None:
    rng = random.Random(seed)
    p = policy(capacity=50)
    dim = rng.choice((2, 10, 100))
    storage = p.create(spec_of(dim), 50)
    ring: list[int | None] = [None] * 50
    dims: dict[int, int] = {}
    pos = tid = 0
    for _ in range(rng.randint(1, 6)):
        n = rng.randint(1, 50)
        storage.write(pos, rows(tid, n, dim))
        for i in range(n):
            ring[(pos + i) % 50] = tid + i
            dims[tid + i] = dim
        pos, tid = (pos + n) % 50, tid + n
        dim = min(dim + rng.choice((0, 5, 100, 400)), 1_200)
        if dim > storage.spec["obs"].shape[0]:
            valid = sum(r is not None for r in ring)
            storage = p.migrate(storage, spec_of(dim), valid)
    valid = sum(r is not None for r in ring)
    ids = [r for r in ring[:valid] if r is not None]
    got = storage.read(0, valid) if valid else None
    if got is not None:
        assert got["tid"].tolist() == ids
        assert torch.equal(got["obs"], expected(ids, dims, storage.spec["obs"].shape[0]))


def test_the_policy_drives_a_replay_buffer() -> None:
    p = policy(capacity=64)
    buf = ReplayBuffer(64, p, UniformSampler(64), seed=0, growable=frozenset({"obs"}))
    buf.write([rows(0, 40, 4)])
    buf.write([rows(40, 40, 500)])  # grows: 2 KB x 64 no longer fits one 64 KiB "GPU"
    assert buf.migrations == 1 and p.history[0].changed and isinstance(buf.storage, ShardedStorage)
    data = buf.contents()
    assert torch.equal(data["tid"], torch.from_numpy(buf.ids))
    sampled = buf.sample(32)
    assert torch.equal(sampled.data["tid"], torch.from_numpy(sampled.ids))


def test_foreign_storage_is_recognised_and_migrated() -> None:
    p = policy(capacity=100)
    old = FixedStorage("cpu").create(spec_of(4), 100)
    old.write(0, rows(0, 100, 4))
    assert p.placement_of(old).placement == Placement.of(K.CPU_PAGEABLE, ["cpu"])
    new = p.migrate(old, spec_of(5), 100)
    assert new.read(0, 100)["tid"].tolist() == list(range(100))


def test_for_this_machine_profiles_once() -> None:
    topo = this_machine_topology()
    assert this_machine_topology() is topo
    p = PlacementPolicy.for_this_machine(capacity=1_000)
    assert p.topology is topo
    storage = p.create(spec_of(4), 1_000)
    expected_device = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    assert storage.devices[0].type in {expected_device.type, "cpu"}


@pytest.mark.parametrize(("learner", "planned"), [("cpu", False), ("cuda:0", True), (["cpu", "cuda:0"], True)])
def test_the_runtime_plans_placement_only_for_learners_on_a_gpu(monkeypatch, learner, planned) -> None:
    """CPU learners keep pageable host memory even where CUDA exists (and nothing is profiled for them)."""
    import conduit
    from conduit.placement import policy as policy_module

    calls: list[dict[str, Any]] = []

    def for_this_machine(**kwargs: Any) -> FixedStorage:
        calls.append(kwargs)
        return FixedStorage("pinned")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a one-GPU machine, as the runtime sees it
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(policy_module.PlacementPolicy, "for_this_machine", staticmethod(for_this_machine))
    edp = conduit.Conduit(
        policy="off_policy", train_batch_size=8, capacity=64, learner_device=learner,
        num_learners=len(learner) if isinstance(learner, list) else 1,
    )
    assert len(calls) == (1 if planned else 0)
    assert isinstance(edp.storage_policy, FixedStorage)
    assert str(edp.storage_policy.device) == ("pinned" if planned else "cpu")
    if planned:
        assert calls[0]["learners"] == (learner if isinstance(learner, list) else [learner])
    edp.close()
