"""Where one rank's shard lives: Alg. 1 over the part of its node that is the rank's alone.

Each rank holds ``capacity_r`` rows (its share of the buffer). On a GPU node the
candidates are the rank's own GPU and the node's pageable and pinned host
memory, of which the rank may take its fair part only: the other ranks on the
node place their shards there too. :func:`rank_view` is that part of the node
as a one-GPU topology (the rank's GPU as ``cuda:0``, host and pinned memory
divided by the ranks on the node), and :func:`shard_storage` plans the shard on
it with the core's :class:`~conduit.placement.PlacementPolicy` (its device map
sends ``cuda:0`` to the rank's real GPU): the same Alg. 1, the same measured
rates, never another rank's GPU, never more host memory than the rank's part.
On a machine without CUDA, or with the storage pinned by the config, the shard
keeps the single-process choice.
"""

from __future__ import annotations

from typing import Any

import torch

from conduit.config import ConduitConfig
from conduit.placement.topology import PER_GPU_FIELDS, Node, Topology

__all__ = ["rank_view", "shard_storage"]


def rank_view(topology: Topology, ordinal: int, local_ranks: int, node: int = 0, gpu_sharers: int = 1) -> Topology:
    """``node`` of ``topology`` as one rank on it sees it: GPU ``ordinal`` alone (as ``cuda:0``; ``1 / gpu_sharers``
    of its memory where several ranks' learners share it), and ``1 / local_ranks`` of the host's pageable and
    pinned memory."""
    if local_ranks < 1 or gpu_sharers < 1:
        raise ValueError(f"local_ranks, gpu_sharers: expected >= 1, received {local_ranks}, {gpu_sharers}")
    full = topology.nodes[node]
    if not 0 <= ordinal < full.gpu_count:
        raise ValueError(f"ordinal: expected a GPU of node {node} (0..{full.gpu_count - 1}), received {ordinal}")
    data: dict[str, Any] = full.model_dump()
    for key in PER_GPU_FIELDS:
        if data.get(key) is not None:
            data[key] = [data[key][ordinal]]
    data["gpu_to_gpu"] = [[0.0]]
    data["gpu_memory_bytes"] = [max(1, data["gpu_memory_bytes"][0] // gpu_sharers)]
    data["host_memory_bytes"] = max(1, full.host_memory_bytes // local_ranks)
    if full.pinned_memory_bytes is not None:
        data["pinned_memory_bytes"] = max(1, full.pinned_memory_bytes // local_ranks)
    notes = (*topology.notes, f"one rank's view: GPU {ordinal} of node {node}, 1/{local_ranks} of its host memory")
    return Topology(name=f"{topology.name}/rank-gpu{ordinal}", description=topology.description, notes=notes,
                    nodes=(Node(**data),))


def shard_storage(
    config: ConduitConfig, device: torch.device, capacity: int, local_ranks: int, topology: Topology | None = None,
    gpu_sharers: int = 1,
) -> Any | None:
    """The storage policy of a rank's shard of ``capacity`` rows for a learner on ``device`` (``None``: the
    single-process choice: no GPU learner, or ``storage_device`` pinned). ``topology``: the machine (default:
    :func:`~conduit.placement.this_machine_topology`, profiled once per process); ``local_ranks`` and
    ``gpu_sharers`` as in :func:`rank_view`."""
    if config.storage_device is not None or device.type != "cuda":
        return None
    from conduit.placement.policy import PlacementPolicy, this_machine_topology

    machine = topology if topology is not None else this_machine_topology()
    ordinal = device.index if device.index is not None else torch.cuda.current_device()
    view = rank_view(machine, ordinal, local_ranks, gpu_sharers=gpu_sharers)
    return PlacementPolicy(view, actors="cpu", learners="cuda:0", capacity=capacity,
                           headroom=config.memory_headroom, device_map={"cuda:0": f"cuda:{ordinal}"})
