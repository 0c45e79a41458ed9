"""Where a rank's shard lives: Alg. 1 over the rank's part of its node (pure: shipped and hand-built topologies)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import conduit
from conduit.distributed.shards import rank_view, shard_storage
from conduit.placement import PlacementKind, Topology

TOPOLOGIES = Path(conduit.__file__).parent / "placement" / "topologies"


def a100() -> Topology:
    return Topology.load(TOPOLOGIES / "a100_8x_nvlink.yaml")


def test_a_rank_sees_its_gpu_alone_and_its_part_of_the_host() -> None:
    full = a100()
    node = full.nodes[0]
    view = rank_view(full, ordinal=5, local_ranks=8)
    (mine,) = view.nodes
    assert mine.gpu_count == 1 and [d.id for d in view.gpus(0)] == ["cuda:0"]
    assert mine.gpu_memory_bytes == (node.gpu_memory_bytes[5],)
    assert mine.pinned_to_gpu == (node.pinned_to_gpu[5],) and mine.gpu_local == (node.gpu_local[5],)
    assert mine.host_memory_bytes == node.host_memory_bytes // 8
    assert mine.pinned_memory_bytes == node.pinned_memory_bytes // 8
    assert mine.host_memcpy == node.host_memcpy
    shared = rank_view(full, ordinal=5, local_ranks=2, gpu_sharers=2)  # two ranks' learners on one GPU
    assert shared.nodes[0].gpu_memory_bytes == (node.gpu_memory_bytes[5] // 2,)
    with pytest.raises(ValueError, match="ordinal"):
        rank_view(full, ordinal=8, local_ranks=8)


def test_the_shard_goes_where_alg1_puts_it_on_the_rank_s_part_and_maps_to_the_real_gpu() -> None:
    cfg = conduit.ConduitConfig(policy="off_policy", train_batch_size=256, capacity=8_000_000)
    policy = shard_storage(cfg, torch.device("cuda:5"), 1_000_000, local_ranks=8, topology=a100())
    assert policy is not None and policy.device_map == {"cuda:0": "cuda:5"}
    placement = policy.placement_for(8_000)
    assert set(placement.devices) <= {"cpu", "pinned", "cuda:0"}  # never another rank's GPU
    # 64 ranks on the node: 50 GB of shard fits the rank's GPU, never its 1/64 of the host (30 GB)
    crowded = shard_storage(cfg, torch.device("cuda:5"), 1_000_000, local_ranks=64, topology=a100())
    assert crowded.placement_for(50_000).devices == ("cuda:0",)
    assert crowded.placement_for(50_000).kind is PlacementKind.SINGLE_GPU


def test_cpu_learners_and_a_pinned_storage_keep_the_single_process_choice() -> None:
    cfg = conduit.ConduitConfig(policy="off_policy", train_batch_size=8, capacity=100)
    assert shard_storage(cfg, torch.device("cpu"), 100, 2, topology=a100()) is None
    pinned = conduit.ConduitConfig(policy="off_policy", train_batch_size=8, capacity=100, storage_device="cpu")
    assert shard_storage(pinned, torch.device("cuda:1"), 100, 2, topology=a100()) is None
