"""Placement on real GPUs: sharded storage over tiers, and a GPU -> pinned migration in the runtime.

Skipped cleanly on machines without CUDA; run on a GPU machine with
``pytest -m gpu``. ``scripts/gpu_check.py`` measures the same paths.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import conduit
from conduit.placement import Node, PlacementKind, PlacementPolicy, Topology, solve_placement
from conduit.placement.units import GB, GIB, MIB
from conduit.spec import ExperienceSpec
from conduit.storage import ShardedStorage, TensorStorage
from tests.test_growth import Trace, check_rows, unit

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

FIELDS = ("obs", "next_obs", "action", "reward", "done", "tid")


def gpus() -> int:
    return min(torch.cuda.device_count(), 2)


def real_topology(gpu_memory: int = 8 * MIB) -> Topology:
    """The visible GPUs (up to two) with ``gpu_memory`` each, pinned and pageable host memory."""
    g = gpus()
    node = Node(
        host_memory_bytes=8 * GIB,
        pinned_memory_bytes=2 * GIB,
        gpu_memory_bytes=(gpu_memory,) * g,
        host_memcpy=20 * GB,
        gpu_local=(1000 * GB,) * g,
        host_to_gpu=(12 * GB,) * g,
        gpu_to_host=(12 * GB,) * g,
        pinned_to_gpu=(25 * GB,) * g,
        gpu_to_pinned=(25 * GB,) * g,
        gpu_to_gpu=tuple(tuple(0.0 if i == j else 200 * GB for j in range(g)) for i in range(g)),
    )
    return Topology(name="real-small", nodes=(node,))


def layouts() -> list[list[tuple[str, int]]]:
    out = [[("cuda:0", 40), ("pinned", 30), ("cpu", 27)], [("pinned", 50), ("cuda:0", 47)]]
    if torch.cuda.device_count() > 1:
        out.append([("cuda:1", 30), ("cuda:0", 37), ("pinned", 30)])
    return out


@pytest.mark.parametrize("shards", layouts())
@pytest.mark.parametrize("target", ["cuda:0", "cpu"])
def test_sharded_storage_over_tiers_equals_a_single_device(shards: list[tuple[str, int]], target: str) -> None:
    spec = ExperienceSpec.of(obs=((33,), "float32"), action=((), "int64"), flag=((), "bool"))
    rows = sum(n for _, n in shards)
    sharded, plain = ShardedStorage(spec, rows, shards), TensorStorage(spec, rows, "cpu")
    pos = 0
    for n in (30, 50, 64, 97, 11):  # wraps
        t = torch.arange(pos, pos + n)
        data = {"obs": t.float().unsqueeze(1).expand(-1, 33).clone(), "action": t, "flag": t % 3 == 0}
        sharded.write(pos, data)
        plain.write(pos, data)
        pos = (pos + n) % rows
    idx = torch.from_numpy(np.random.default_rng(0).integers(0, rows, 512))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the consumer runs on another stream: event hand-off must order it
        got = sharded.gather(idx, torch.device(target))
        same = {k: torch.equal(v.cpu(), plain.gather(idx)[k]) for k, v in got.items()}
    assert all(same.values()), same
    assert all(v.device.type == torch.device(target).type for v in got.values())
    back = sharded.read(rows - 5, 20)
    assert all(torch.equal(v.cpu(), plain.read(rows - 5, 20)[k]) for k, v in back.items())


def test_runtime_migrates_gpu_to_pinned_with_every_record_intact() -> None:
    policy = PlacementPolicy(
        real_topology(), learners="cuda:0", capacity=1024, headroom=0.0, kinds=["single_gpu", "cpu_pinned"]
    )
    trace = Trace()
    tid = 0
    with conduit.Conduit(
        policy="off_policy", train_batch_size=128, capacity=1024, learner_device="cuda:0", storage=policy,
        growable={"obs", "next_obs"}, seed=0,
    ) as edp:
        for dim in (256, 256, 256, 256, 512, 4096):  # 1024 x ~4 KB fits 8 MiB; 1024 x ~32 KB does not
            trace.add(tid, dim)
            edp.push(unit(tid, 256, dim))
            tid += 256
            edp.flush()
            for _ in range(3):
                batch = edp.pull()
                assert batch["obs"].device == torch.device("cuda:0")
                check_rows({k: batch[k].cpu() for k in FIELDS}, trace)
            buf = edp.buffer
            assert isinstance(buf, conduit.buffers.ReplayBuffer)
            with buf.lock:
                contents = {k: v.cpu() for k, v in buf.contents().items()}
                ids = buf.ids[: buf.size].copy()
            assert torch.equal(contents["tid"], torch.from_numpy(ids))
            check_rows(contents, trace)
    first, *rest = policy.history
    assert first.in_place and first.source.kind is PlacementKind.SINGLE_GPU
    (moved,) = [h for h in rest if h.changed]
    assert moved.source.kind is PlacementKind.SINGLE_GPU and moved.target.kind is PlacementKind.CPU_PINNED
    assert moved.rows_moved == 1024 and moved.measured_seconds > 0 and moved.modeled_seconds > 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_policy_shards_over_two_gpus_and_gathers_on_the_learner() -> None:
    policy = PlacementPolicy(real_topology(), learners="cuda:0", capacity=1024, headroom=0.0)
    spec = ExperienceSpec.of(obs=((2048,), "float32"), tid=((), "int64"))  # 8 MiB: two GPUs
    storage = policy.create(spec, 1024)
    assert isinstance(storage, ShardedStorage) and policy.active is not None
    assert policy.active.kind is PlacementKind.SHARED_GPU
    t = torch.arange(1024)
    storage.write(0, {"obs": t.float().unsqueeze(1).expand(-1, 2048).clone(), "tid": t})
    idx = torch.from_numpy(np.random.default_rng(1).integers(0, 1024, 512))
    got = storage.gather(idx, torch.device("cuda:0"))
    assert torch.equal(got["tid"].cpu(), idx)
    assert torch.equal(got["obs"][:, 7].cpu(), idx.float())


def test_for_this_machine_maps_the_live_choice_to_real_devices() -> None:
    policy = PlacementPolicy.for_this_machine(capacity=10_000)
    spec = ExperienceSpec.of(obs=((16,), "float32"))
    storage = policy.create(spec, 10_000)
    chosen = solve_placement(policy.topology, policy.request(10_000), spec.bytes_per_sample).placement
    assert policy.active == chosen
    gpu = chosen.kind in (PlacementKind.SINGLE_GPU, PlacementKind.SHARED_GPU)
    assert {d.type for d in storage.devices} == ({"cuda"} if gpu else {"cpu"})
    if chosen.kind is PlacementKind.CPU_PINNED:
        assert isinstance(storage, TensorStorage) and storage.pinned
