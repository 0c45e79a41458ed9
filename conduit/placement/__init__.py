"""Capacity-constrained, bandwidth-aware placement (paper §5, Alg. 1, Alg. 2, Eq. 3).

Pure planning: where the experience buffer lives and how it moves when the
per-sample size grows. Nothing here allocates buffers or touches devices except
:func:`profile_topology`, which measures the live machine, and
:class:`PlacementPolicy`, which allocates storage and moves rows.

- :mod:`~conduit.placement.topology` — devices, free memory, bandwidth per path;
  JSON/YAML files; :mod:`~conduit.placement.builtin` — shipped machines.
- :mod:`~conduit.placement.live` — micro-benchmarks into a topology.
- :mod:`~conduit.placement.records` — :class:`Placement`, :class:`PlacementRequest`.
- :mod:`~conduit.placement.model` — the transfer model and capacity check.
- :mod:`~conduit.placement.candidates` — the candidate set ``P``.
- :mod:`~conduit.placement.solver` — Alg. 1 (Eq. 1).
- :mod:`~conduit.placement.placement_map` — the placement map ``M``.
- :mod:`~conduit.placement.migration` — Eq. 3 transfer plans.
- :mod:`~conduit.placement.relayout` — which rows move where, keeping ring slots.
- :mod:`~conduit.placement.policy` — :class:`PlacementPolicy`, the storage policy
  that allocates the buffer where Alg. 1 says and migrates it (Alg. 2).

The names below are imported from their modules on first use (PEP 562), so
``conduit plan`` does not import torch to read a topology file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conduit import _lazy

if TYPE_CHECKING:
    from conduit.placement.builtin import builtin_topology, list_builtin_topologies
    from conduit.placement.candidates import build_candidates
    from conduit.placement.live import profile_topology
    from conduit.placement.migration import (
        LocalTransfer,
        MigrationPlan,
        Transfer,
        plan_migration,
        plan_placement_change,
        round_flows,
        solve_min_makespan,
    )
    from conduit.placement.model import TransferTime, placement_cost, shard_fits
    from conduit.placement.placement_map import MapRegion, PlacementMap, build_placement_map
    from conduit.placement.policy import MigrationRecord, PlacementPolicy, this_machine_topology
    from conduit.placement.records import Placement, PlacementKind, PlacementRequest, Shard, SharePolicy
    from conduit.placement.solver import (
        CandidateEvaluation,
        PlacementResult,
        evaluate_candidates,
        linear_scan,
        solve_placement,
    )
    from conduit.placement.topology import Device, DeviceKind, Node, Topology

__getattr__, __dir__ = _lazy.exports(
    __name__,
    {
        "conduit.placement.builtin": "builtin_topology list_builtin_topologies",
        "conduit.placement.candidates": "build_candidates",
        "conduit.placement.live": "profile_topology",
        "conduit.placement.migration": (
            "LocalTransfer MigrationPlan Transfer plan_migration plan_placement_change round_flows "
            "solve_min_makespan"
        ),
        "conduit.placement.model": "TransferTime placement_cost shard_fits",
        "conduit.placement.placement_map": "MapRegion PlacementMap build_placement_map",
        "conduit.placement.policy": "MigrationRecord PlacementPolicy this_machine_topology",
        "conduit.placement.records": "Placement PlacementKind PlacementRequest Shard SharePolicy",
        "conduit.placement.solver": (
            "CandidateEvaluation PlacementResult evaluate_candidates linear_scan solve_placement"
        ),
        "conduit.placement.topology": "Device DeviceKind Node Topology",
    },
)

__all__ = [
    "CandidateEvaluation",
    "Device",
    "DeviceKind",
    "LocalTransfer",
    "MapRegion",
    "MigrationPlan",
    "MigrationRecord",
    "Node",
    "Placement",
    "PlacementKind",
    "PlacementMap",
    "PlacementPolicy",
    "PlacementRequest",
    "PlacementResult",
    "Shard",
    "SharePolicy",
    "Topology",
    "Transfer",
    "TransferTime",
    "build_candidates",
    "build_placement_map",
    "builtin_topology",
    "evaluate_candidates",
    "linear_scan",
    "list_builtin_topologies",
    "placement_cost",
    "plan_migration",
    "plan_placement_change",
    "profile_topology",
    "round_flows",
    "shard_fits",
    "solve_min_makespan",
    "solve_placement",
    "this_machine_topology",
]
