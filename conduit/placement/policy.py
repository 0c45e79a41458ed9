"""The placement storage policy: the buffer lives where Alg. 1 says, and moves by Alg. 2.

:class:`PlacementPolicy` is a :class:`~conduit.storage.policy.StoragePolicy`.
It precomputes the placement map ``M`` once per capacity (Alg. 1 over a range
of per-sample sizes ``x``) and then only looks sizes up:

- ``create(spec, rows)``: ``M(spec.bytes_per_sample)`` -> a
  :class:`~conduit.storage.tensor.TensorStorage` (one device) or a
  :class:`~conduit.storage.sharded.ShardedStorage` with the placement's
  whole-sample shard sizes (:meth:`Placement.sample_counts`).
- ``migrate(old, spec, valid)`` (Alg. 2; the buffer calls it under its lock,
  so ingestion and delivery are paused): look the grown size up. Same placement
  and same shard sizes -> re-lay rows in place (new storage on the same devices,
  padded copy). Otherwise move the valid rows by the Eq. 3 plan
  (:func:`~conduit.placement.migration.plan_migration`, whole samples), laid out
  by :func:`~conduit.placement.relayout.plan_layout` so every record keeps its
  ring slot; copies run on dedicated streams per source device where CUDA is.
  The old storage is released, and a :class:`MigrationRecord` is kept.

Topology device ids (``cpu``, ``pinned``, ``cuda:k``) become torch devices by
their local id, or by ``device_map`` (tests back "GPU" ids with CPU memory this
way). Multi-node placements need a distributed storage and are not offered.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from conduit.errors import PlacementError
from conduit.placement.candidates import build_candidates
from conduit.placement.live import profile_topology
from conduit.placement.migration import MigrationPlan, plan_migration
from conduit.placement.model import usable_bytes
from conduit.placement.placement_map import PlacementMap, build_placement_map
from conduit.placement.records import Placement, PlacementKind, PlacementRequest, SharePolicy
from conduit.placement.relayout import in_place_copies, plan_layout, shard_volumes, target_volumes
from conduit.placement.solver import solve_placement
from conduit.placement.topology import DeviceKind, Topology
from conduit.spec import ExperienceSpec
from conduit.storage.base import Storage
from conduit.storage.sharded import RowLayout, ShardedStorage, move_rows, shards_of
from conduit.storage.tensor import TensorStorage

__all__ = ["MigrationRecord", "PlacementPolicy", "this_machine_topology"]

log = logging.getLogger("conduit")


@functools.cache
def _profiled() -> Topology:
    return profile_topology(name="this_machine")


def this_machine_topology(refresh: bool = False) -> Topology:
    """:func:`profile_topology` of this machine, measured once per process (``refresh`` re-measures)."""
    if refresh:
        _profiled.cache_clear()
    return _profiled()


@dataclass(frozen=True)
class MigrationRecord:
    """One call of :meth:`PlacementPolicy.migrate`."""

    source: Placement
    target: Placement
    sample_bytes_before: int
    sample_bytes_after: int
    rows_moved: int
    modeled_seconds: float
    """Makespan of the copies by the topology's bandwidths (Eq. 3's objective, at the old sample size)."""
    measured_seconds: float
    """Wall time of the copies, devices synchronized."""
    total_seconds: float
    """Wall time of the whole migration: allocation, copies, release."""
    in_place: bool
    """Same placement and shard sizes: rows re-laid on their own devices."""
    plan: MigrationPlan | None

    @property
    def changed(self) -> bool:
        return self.source != self.target


@dataclass(frozen=True)
class _Placed:
    placement: Placement
    ids: tuple[str, ...]
    """Topology ids of the storage's shards (devices holding at least one row)."""


class PlacementPolicy:
    """Bandwidth-aware, capacity-constrained placement of the buffer, migrating as samples grow.

    Args:
        topology: the machine (profiled, loaded or hand-built).
        actors, learners: topology device ids of the endpoints (learners default
            to ``cuda:0`` when the topology has GPUs, else ``cpu``).
        capacity: ``C_buf`` planned for (default: the rows each ``create`` asks for).
        headroom: fraction of each device's memory left unused.
        kinds: restrict the candidate kinds (default: every single-node kind).
        share_policy: how sharded candidates divide capacity.
        device_map: topology id -> torch device, for ids whose local id is not
            the device to use (default: ``cuda:k`` -> ``cuda:k``, ``pinned`` -> pinned host).
        map_range: ``(x_min, x_max)`` bytes for the placement map (default: 1 up
            to the largest size any device set could hold).
        map_points: grid points of the map sweep.
    """

    def __init__(
        self,
        topology: Topology,
        *,
        actors: str | Sequence[str] = "cpu",
        learners: str | Sequence[str] | None = None,
        capacity: int | None = None,
        headroom: float = 0.1,
        kinds: Iterable[PlacementKind | str] | None = None,
        share_policy: SharePolicy | str = SharePolicy.EQUAL,
        device_map: Mapping[str, str | torch.device] | None = None,
        map_range: tuple[int, int] | None = None,
        map_points: int = 64,
    ) -> None:
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise PlacementError(f"capacity: expected an integer >= 1 or None, received {capacity!r}")
        self.topology = topology
        self.capacity = capacity
        self.kinds = _local_kinds(kinds)
        if learners is None:
            learners = "cuda:0" if topology.gpus(0) else "cpu"
        # validates endpoints, headroom and share policy now; each capacity gets its own request later
        self._base = PlacementRequest(
            actors=actors, learners=learners, capacity=capacity or 1, headroom=headroom,
            share_policy=share_policy, kinds=self.kinds,  # type: ignore[arg-type]  # validated there
        )
        build_candidates(topology, self._base)  # unknown actor/learner ids fail here, naming the field
        self.device_map = {_map_key(topology, k): v for k, v in (device_map or {}).items()}
        if map_range is not None and not (1 <= map_range[0] <= map_range[1]):
            raise PlacementError(f"map_range: expected (x_min, x_max) with 1 <= x_min <= x_max, received {map_range}")
        self.map_range = map_range
        self.map_points = map_points
        self._maps: dict[int, PlacementMap] = {}
        self._placed: weakref.WeakKeyDictionary[Storage, _Placed] = weakref.WeakKeyDictionary()
        self._history: list[MigrationRecord] = []
        self._lock = threading.RLock()
        self.active: Placement | None = None
        self._last_rows: int | None = None

    @classmethod
    def for_this_machine(cls, *, refresh: bool = False, **kwargs: Any) -> PlacementPolicy:
        """A policy for the profiled local machine (profiled once per process); ``kwargs`` as the constructor."""
        topology = this_machine_topology(refresh)
        if "learners" not in kwargs:
            kwargs["learners"] = "cuda:0" if topology.gpus(0) else "cpu"
        return cls(topology, **kwargs)

    # -- planning ---------------------------------------------------------------
    def request(self, capacity: int) -> PlacementRequest:
        b = self._base
        return PlacementRequest(b.actors, b.learners, capacity, b.headroom, b.share_policy, b.kinds)

    def _capacity(self, rows: int) -> int:
        return self.capacity if self.capacity is not None and self.capacity >= rows else rows

    def _default_capacity(self, capacity: int | None) -> int:
        if capacity is not None:
            return capacity
        if self.capacity is not None:
            return self.capacity
        if self._last_rows is not None:
            return self._last_rows
        raise PlacementError("capacity: expected a capacity (none was given to the policy nor created yet)")

    def placement_map(self, capacity: int | None = None) -> PlacementMap:
        """``M`` for ``capacity`` samples (default: the policy's, else the last created), built once and cached."""
        cap = self._default_capacity(capacity)
        with self._lock:
            if cap not in self._maps:
                lo, hi = self.map_range or (1, self._largest_size(cap))
                self._maps[cap] = build_placement_map(
                    self.topology, self.request(cap), x_min=lo, x_max=hi, points=self.map_points
                )
            return self._maps[cap]

    def _largest_size(self, capacity: int) -> int:
        """A size past which nothing can fit: every device's usable memory together, per sample."""
        total = sum(usable_bytes(d.memory_bytes, self._base.headroom) for d in self.topology.devices)
        return max(1, total // capacity + 1)

    def placement_for(self, sample_bytes: int, capacity: int | None = None) -> Placement:
        """``M(x)``; raises :class:`PlacementError` naming the missing bytes when nothing fits."""
        cap = self._default_capacity(capacity)
        m = self.placement_map(cap)
        if m.x_min <= sample_bytes <= m.x_max:
            region = m.region(sample_bytes)
            if region.placement is not None:
                return region.placement
        return solve_placement(self.topology, self.request(cap), sample_bytes).placement  # raises: missing bytes

    # -- StoragePolicy ----------------------------------------------------------
    def create(self, spec: ExperienceSpec, rows: int) -> Storage:
        with self._lock:
            placement = self.placement_for(spec.bytes_per_sample, self._capacity(rows))
            ids, counts = self._shard_rows(placement, rows)
            storage = self._build(spec, rows, ids, counts, None)
            self._placed[storage] = _Placed(placement, ids)
            self.active = placement
            self._last_rows = rows
            log.info("conduit: buffer of %d rows x %d B placed on %s", rows, spec.bytes_per_sample, placement)
            return storage

    def migrate(self, old: Storage, spec: ExperienceSpec, valid: int) -> Storage:
        with self._lock:
            started = time.perf_counter()
            x_old, x_new = old.spec.bytes_per_sample, spec.bytes_per_sample
            source = self.placement_of(old)
            target = self.placement_for(x_new, self._capacity(old.rows))
            src_shards, src_layout = shards_of(old)
            ids, counts = self._shard_rows(target, old.rows)
            plan: MigrationPlan | None = None
            in_place = target == source.placement and counts == src_layout.shard_rows
            if in_place:
                layout, copies = src_layout, in_place_copies(src_layout, valid)
                volumes = shard_volumes(src_layout, valid)
                modeled = max(
                    (v * x_old / self.topology.bandwidth(d, d) for d, v in zip(ids, volumes)), default=0.0
                )
            else:
                plan = plan_migration(
                    self.topology,
                    dict(zip(source.ids, shard_volumes(src_layout, valid))),
                    dict(zip(ids, target_volumes(counts, valid))),
                    x_old,
                )
                flows = [[0] * len(ids) for _ in source.ids]
                for s, row in zip(plan.sources, plan.flows):
                    for t, n in zip(plan.targets, row):
                        flows[source.ids.index(s)][ids.index(t)] += n
                layout, copies = plan_layout(src_layout, valid, flows, counts)
                modeled = plan.makespan_seconds
            new = self._build(spec, old.rows, ids, counts, layout)
            copy_started = time.perf_counter()
            move_rows(src_shards, shards_of(new)[0], copies)
            measured = time.perf_counter() - copy_started
            old.close()
            self._placed[new] = _Placed(target, ids)
            self.active = target
            record = MigrationRecord(
                source=source.placement, target=target, sample_bytes_before=x_old, sample_bytes_after=x_new,
                rows_moved=valid, modeled_seconds=modeled, measured_seconds=measured,
                total_seconds=time.perf_counter() - started, in_place=in_place, plan=plan,
            )
            self._history.append(record)
            log.info(
                "conduit: migrated %d rows %s -> %s (x %d -> %d B) in %.4f s (modeled %.4f s)",
                valid, source.placement, target, x_old, x_new, measured, modeled,
            )
            return new

    @property
    def history(self) -> tuple[MigrationRecord, ...]:
        """Every migration so far, oldest first."""
        with self._lock:
            return tuple(self._history)

    def placement_of(self, storage: Storage) -> _Placed:
        """Where ``storage`` lives, as a placement over topology ids (inferred for storages made elsewhere)."""
        known = self._placed.get(storage)
        if known is not None:
            return known
        if isinstance(storage, ShardedStorage):
            ids = tuple(self.topology.canonical_id(label) for label in storage.labels)
            counts = [s.rows for s in storage.shards]
            kind = PlacementKind.SHARED_GPU if len(ids) > 1 else _kind_of(self.topology, ids[0])
            return _Placed(Placement.of(kind, ids, counts), ids)
        if isinstance(storage, TensorStorage):
            local = "pinned" if storage.pinned else str(storage.device)
            reverse = [k for k, v in self.device_map.items() if str(v) == local]
            dev = reverse[0] if len(reverse) == 1 else self.topology.canonical_id(local)
            return _Placed(Placement.of(_kind_of(self.topology, dev), [dev]), (dev,))
        raise PlacementError(
            f"storage: expected a TensorStorage or ShardedStorage to migrate, received {type(storage).__name__}"
        )

    # -- building ----------------------------------------------------------------
    def torch_device(self, device_id: str) -> str | torch.device:
        """The torch device (or ``"pinned"``) backing a topology id."""
        cid = self.topology.canonical_id(device_id)
        return self.device_map.get(cid, self.topology.device(cid).local_id)

    @staticmethod
    def _shard_rows(placement: Placement, rows: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
        pairs = [(d, n) for d, n in zip(placement.devices, placement.sample_counts(rows)) if n > 0]
        return tuple(d for d, _ in pairs), tuple(n for _, n in pairs)

    def _build(
        self, spec: ExperienceSpec, rows: int, ids: Sequence[str], counts: Sequence[int], layout: RowLayout | None
    ) -> Storage:
        devices = [self.torch_device(i) for i in ids]
        if len(ids) == 1 and (layout is None or layout.identity):
            return TensorStorage(spec, rows, devices[0])
        return ShardedStorage(spec, rows, list(zip(devices, counts)), layout=layout, labels=ids)

    def __repr__(self) -> str:
        return f"PlacementPolicy({self.topology.name!r}, active={self.active})"


def _map_key(topology: Topology, device_id: str) -> str:
    try:
        return topology.canonical_id(device_id)
    except PlacementError as e:
        raise PlacementError(f"device_map: {e}") from e


def _kind_of(topology: Topology, device_id: str) -> PlacementKind:
    kind = topology.device(device_id).kind
    if kind is DeviceKind.CPU:
        return PlacementKind.CPU_PAGEABLE
    if kind is DeviceKind.PINNED:
        return PlacementKind.CPU_PINNED
    return PlacementKind.SINGLE_GPU


def _local_kinds(kinds: Iterable[PlacementKind | str] | None) -> frozenset[PlacementKind]:
    local = frozenset(PlacementKind) - {PlacementKind.MULTI_NODE}
    if kinds is None:
        return local
    given = list(kinds)
    try:
        chosen = frozenset(PlacementKind(k) for k in given)
    except ValueError as e:
        raise PlacementError(
            f"kinds: expected kinds among {', '.join(sorted(k.value for k in local))}, received {given}"
        ) from e
    if not chosen or not chosen <= local:
        raise PlacementError(
            f"kinds: expected one or more of {', '.join(sorted(k.value for k in local))} (a multi-node buffer "
            f"needs a distributed storage), received {sorted(k.value for k in chosen)}"
        )
    return chosen

