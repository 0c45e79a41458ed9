"""The candidate set ``P`` of Alg. 1 (paper §5.2, "approximate solution").

Pure functions over a topology and a :class:`PlacementRequest`; standard
library only.

For every node that hosts an actor or a learner:

* CPU pageable, and CPU pinned where the node has pinned memory;
* each single GPU;
* shared GPU over subsets of increasing size, from two greedy orders of the
  node's GPUs (so at most ``2(G-1)`` shared subsets per node, ``G`` singles):

  - the **cost order**: GPUs by their per-byte ingest + deliver cost for these
    actors and learners. Because the model is separable over shards, with
    equal shares the best ``k``-subset of any GPUs with equal free memory is
    exactly the first ``k`` of this order, so ``P`` loses nothing there (the
    tests check it against all subsets);
  - the **fabric order** (the paper's "preferring high-bandwidth ranks"):
    start from the node's first learner GPU, or else the best-connected GPU,
    and repeatedly add the GPU with the most bandwidth (both directions) to the
    GPUs already chosen. It keeps well-connected groups together, which also
    makes migrations between them fast.

In a multi-node topology, additionally (``multi_node``, the paper's cross-node
balance): capacity split equally across all nodes, held in each node's pageable
host memory, pinned host memory, or its first ``k`` GPUs of the cost order
(``k = 1 .. min G``).

Order matters only for ties (Alg. 1 keeps the first minimum): host tiers,
single GPUs, shared GPUs by size, multi-node — fewer shards first.
"""

from __future__ import annotations

from collections.abc import Sequence

from conduit.placement.model import device_cost
from conduit.placement.records import Placement, PlacementKind, PlacementRequest, SharePolicy
from conduit.placement.topology import Device, DeviceKind, Topology, endpoint_ids

__all__ = ["build_candidates", "cost_order", "fabric_order"]


def cost_order(
    topology: Topology, gpus: Sequence[Device], actors: Sequence[str], learners: Sequence[str]
) -> list[Device]:
    """``gpus`` by per-byte ingest + deliver cost (ties: node, ordinal)."""
    return sorted(gpus, key=lambda d: (device_cost(topology, d.id, actors, learners).total, d.node, d.ordinal or 0))


def _link(topology: Topology, a: Device, b: Device) -> float:
    return topology.bandwidth(a.id, b.id) + topology.bandwidth(b.id, a.id)


def fabric_order(topology: Topology, gpus: Sequence[Device], learners: Sequence[str]) -> list[Device]:
    """Greedy growth over one node's GPUs: seed, then most bandwidth to the chosen set."""
    pool = list(gpus)
    if not pool:
        return []
    connectivity = {d.id: sum(_link(topology, d, o) for o in pool if o.id != d.id) for d in pool}
    learner_gpus = [d for d in pool if d.id in learners]
    seed = learner_gpus[0] if learner_gpus else max(pool, key=lambda d: (connectivity[d.id], -(d.ordinal or 0)))
    chosen = [seed]
    rest = [d for d in pool if d.id != seed.id]
    while rest:
        best = max(
            rest,
            key=lambda d: (sum(_link(topology, d, c) for c in chosen), connectivity[d.id], -(d.ordinal or 0)),
        )
        chosen.append(best)
        rest.remove(best)
    return chosen


def _shares(devices: Sequence[Device], policy: SharePolicy) -> list[float]:
    if policy is SharePolicy.MEMORY:
        return [float(d.memory_bytes) for d in devices]
    return [1.0] * len(devices)


def _node_balanced(groups: Sequence[Sequence[Device]], policy: SharePolicy) -> Placement:
    """One group per node, each node holding ``1/N`` of capacity, split within by ``policy``."""
    devices: list[str] = []
    shares: list[float] = []
    for group in groups:
        weights = _shares(group, policy)
        total = sum(weights)
        devices += [d.id for d in group]
        shares += [w / total / len(groups) for w in weights]
    return Placement.of(PlacementKind.MULTI_NODE, devices, shares)


def build_candidates(topology: Topology, request: PlacementRequest) -> tuple[Placement, ...]:
    """``P`` for ``request`` on ``topology`` (see the module docstring), without duplicates."""
    actors = endpoint_ids(topology, request.actors, "actors")
    learners = endpoint_ids(topology, request.learners, "learners")
    nodes = sorted({topology.device(i).node for i in actors + learners})
    policy = request.share_policy

    host: list[Placement] = []
    singles: list[Placement] = []
    shared: list[tuple[int, Placement]] = []
    for n in nodes:
        cpu = topology.host(n, DeviceKind.CPU)
        pinned = topology.host(n, DeviceKind.PINNED)
        assert cpu is not None
        host.append(Placement.of(PlacementKind.CPU_PAGEABLE, [cpu.id]))
        if pinned is not None:
            host.append(Placement.of(PlacementKind.CPU_PINNED, [pinned.id]))
        gpus = topology.gpus(n)
        singles += [Placement.of(PlacementKind.SINGLE_GPU, [g.id]) for g in gpus]
        for order in (cost_order(topology, gpus, actors, learners), fabric_order(topology, gpus, learners)):
            for k in range(2, len(order) + 1):
                subset = order[:k]
                shared.append(
                    (k, Placement.of(PlacementKind.SHARED_GPU, [d.id for d in subset], _shares(subset, policy)))
                )
    shared.sort(key=lambda item: item[0])  # stable: cost order before fabric order at equal size

    multi: list[Placement] = []
    if topology.is_multi_node:
        all_nodes = range(len(topology.nodes))
        cpus = [topology.host(n, DeviceKind.CPU) for n in all_nodes]
        multi.append(_node_balanced([[d] for d in cpus if d is not None], policy))
        pinned_all = [topology.host(n, DeviceKind.PINNED) for n in all_nodes]
        if all(p is not None for p in pinned_all):
            multi.append(_node_balanced([[p] for p in pinned_all if p is not None], policy))
        orders = [cost_order(topology, topology.gpus(n), actors, learners) for n in all_nodes]
        for k in range(1, min(len(o) for o in orders) + 1):
            multi.append(_node_balanced([o[:k] for o in orders], policy))

    out: list[Placement] = []
    seen: set[tuple[PlacementKind, frozenset[str]]] = set()
    for p in host + singles + [p for _, p in shared] + multi:
        key = (p.kind, frozenset(p.devices))
        if key in seen or (request.kinds is not None and p.kind not in request.kinds):
            continue
        seen.add(key)
        out.append(p)
    return tuple(out)
