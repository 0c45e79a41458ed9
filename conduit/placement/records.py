"""Placement records: what a placement is, and what the planner is asked.

Plain frozen dataclasses (no dependency): they are values the solver, the
placement map, the migration planner, the storage and the CLI pass around,
compare and hash. They validate at construction and raise
:class:`~conduit.errors.PlacementError` naming the field.

A :class:`Placement` is a kind label plus shards ``(device id, share)``; the
shares are fractions of the buffer's capacity and sum to 1. Whole-sample shard
sizes come from :meth:`Placement.sample_counts` (largest remainder), which is
also what feasibility checks, so the planner and the storage agree exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from conduit.errors import PlacementError

__all__ = [
    "Placement",
    "PlacementKind",
    "PlacementRequest",
    "Shard",
    "SharePolicy",
    "largest_remainder",
]

_SHARE_TOLERANCE = 1e-9


class PlacementKind(str, Enum):
    """The paper's placement options (§5.1) plus the multi-node spread."""

    CPU_PAGEABLE = "cpu_pageable"
    CPU_PINNED = "cpu_pinned"
    SINGLE_GPU = "single_gpu"
    SHARED_GPU = "shared_gpu"
    MULTI_NODE = "multi_node"


class SharePolicy(str, Enum):
    """How a sharded candidate divides capacity among its devices.

    ``EQUAL`` (the default) gives every shard ``1/|S|`` of the samples, as the
    paper's model assumes (a learner reads a given shard with probability
    ``1/|S|``) and as uniform replay over a round-robin layout produces.
    ``MEMORY`` splits in proportion to each device's free memory, so a subset
    fits whenever its aggregate memory does (for uneven free memory).
    Multi-node candidates first split capacity equally across nodes (the
    paper's cross-node balance), then within a node by the policy.
    """

    EQUAL = "equal"
    MEMORY = "memory"


@dataclass(frozen=True, slots=True)
class Shard:
    """``share`` (0 < share <= 1) of the buffer's samples live on ``device``."""

    device: str
    share: float

    def __post_init__(self) -> None:
        if not isinstance(self.device, str) or not self.device:
            raise PlacementError(f"Shard.device: expected a device id, received {self.device!r}")
        if not (isinstance(self.share, (int, float)) and 0.0 < self.share <= 1.0 + _SHARE_TOLERANCE):
            raise PlacementError(f"Shard.share: expected 0 < share <= 1, received {self.share!r}")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the buffer lives: a kind label and its shards (shares sum to 1)."""

    kind: PlacementKind
    shards: tuple[Shard, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.kind, PlacementKind):
            raise PlacementError(f"Placement.kind: expected a PlacementKind, received {self.kind!r}")
        if not self.shards:
            raise PlacementError("Placement.shards: expected at least one shard, received none")
        devices = [s.device for s in self.shards]
        if len(set(devices)) != len(devices):
            raise PlacementError(f"Placement.shards: expected distinct devices, received {devices}")
        total = math.fsum(s.share for s in self.shards)
        if abs(total - 1.0) > 1e-6:
            raise PlacementError(f"Placement.shards: expected shares summing to 1, received {total!r}")
        single = self.kind in (PlacementKind.CPU_PAGEABLE, PlacementKind.CPU_PINNED, PlacementKind.SINGLE_GPU)
        if single and len(self.shards) != 1:
            raise PlacementError(
                f"Placement.shards: expected 1 shard for kind {self.kind.value}, received {len(self.shards)}"
            )

    @classmethod
    def of(cls, kind: PlacementKind, devices: Sequence[str], shares: Sequence[float] | None = None) -> Placement:
        """Shards over ``devices``; equal shares unless ``shares`` (normalized to sum 1) are given."""
        devs = tuple(devices)
        if shares is None:
            weights = [1.0] * len(devs)
        else:
            weights = [float(w) for w in shares]
            if len(weights) != len(devs):
                raise PlacementError(
                    f"Placement shares: expected {len(devs)} values (one per device), received {len(weights)}"
                )
            if any(not w > 0.0 for w in weights):
                raise PlacementError(f"Placement shares: expected positive weights, received {weights}")
        total = math.fsum(weights) if weights else 1.0
        return cls(kind, tuple(Shard(d, w / total) for d, w in zip(devs, weights, strict=True)))

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(s.device for s in self.shards)

    @property
    def shares(self) -> tuple[float, ...]:
        return tuple(s.share for s in self.shards)

    def sample_counts(self, capacity: int) -> tuple[int, ...]:
        """Whole samples per shard for a buffer of ``capacity`` samples (sums to ``capacity``)."""
        return largest_remainder(self.shares, capacity)

    def __str__(self) -> str:
        return f"{self.kind.value}({', '.join(self.devices)})"


def largest_remainder(weights: Sequence[float], total: int) -> tuple[int, ...]:
    """Split the integer ``total`` in proportion to ``weights`` (Hamilton's method).

    Each part is the floor or the ceiling of its exact quota; the sum is exactly
    ``total``; ties go to the earlier part, so the split is deterministic.
    """
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise PlacementError(f"total: expected an integer >= 0, received {total!r}")
    if not weights:
        if total:
            raise PlacementError(f"weights: expected at least one weight to split {total}, received none")
        return ()
    w_sum = math.fsum(weights)
    if not w_sum > 0.0 or any(w < 0.0 for w in weights):
        raise PlacementError(f"weights: expected non-negative weights with a positive sum, received {list(weights)}")
    quotas = [total * w / w_sum for w in weights]
    parts = [min(math.floor(q), total) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - parts[i]), i))
    deficit = total - sum(parts)
    k = 0
    while deficit > 0:  # hand the leftovers to the largest remainders
        parts[order[k % len(order)]] += 1
        deficit -= 1
        k += 1
    k = len(order) - 1
    while deficit < 0:  # float noise overshot: take back from the smallest remainders
        i = order[k % len(order)]
        if parts[i] > 0:
            parts[i] -= 1
            deficit += 1
        k -= 1
    return tuple(parts)


def _as_ids(value: str | Sequence[str], what: str) -> tuple[str, ...]:
    ids = (value,) if isinstance(value, str) else tuple(value)
    if not ids or any(not isinstance(i, str) or not i for i in ids):
        raise PlacementError(f"PlacementRequest.{what}: expected one or more device ids, received {value!r}")
    return ids


@dataclass(frozen=True)
class PlacementRequest:
    """What the planner is asked: endpoints, capacity and limits (sample size comes per call).

    Attributes:
        actors: device(s) actors write from (``"cpu"`` for CPU actors); the
            ingestion leg averages over them.
        learners: device(s) learners read into; the delivery leg averages over them.
        capacity: ``C_buf``, buffer capacity in samples.
        headroom: fraction of each device's free memory left unused.
        share_policy: how sharded candidates divide capacity (see :class:`SharePolicy`).
        kinds: restrict candidates to these kinds (``None``: all).
    """

    actors: Sequence[str]
    learners: Sequence[str]
    capacity: int
    headroom: float = 0.1
    share_policy: SharePolicy = SharePolicy.EQUAL
    kinds: frozenset[PlacementKind] | None = field(default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "actors", _as_ids(self.actors, "actors"))
        object.__setattr__(self, "learners", _as_ids(self.learners, "learners"))
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int) or self.capacity < 1:
            raise PlacementError(f"PlacementRequest.capacity: expected an integer >= 1, received {self.capacity!r}")
        if not (isinstance(self.headroom, (int, float)) and 0.0 <= self.headroom < 1.0):
            raise PlacementError(f"PlacementRequest.headroom: expected 0 <= headroom < 1, received {self.headroom!r}")
        try:
            object.__setattr__(self, "share_policy", SharePolicy(self.share_policy))
        except ValueError as e:
            choices = ", ".join(p.value for p in SharePolicy)
            raise PlacementError(
                f"PlacementRequest.share_policy: expected one of {choices}, received {self.share_policy!r}"
            ) from e
        if self.kinds is not None:
            try:
                kinds = frozenset(PlacementKind(k) for k in self.kinds)
            except ValueError as e:
                choices = ", ".join(k.value for k in PlacementKind)
                raise PlacementError(
                    f"PlacementRequest.kinds: expected kinds among {choices}, received {sorted(map(str, self.kinds))}"
                ) from e
            if not kinds:
                raise PlacementError("PlacementRequest.kinds: expected at least one kind (or None), received none")
            object.__setattr__(self, "kinds", kinds)
