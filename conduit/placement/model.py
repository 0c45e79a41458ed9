"""The transfer-latency model and the capacity check (paper §5.1, Eq. 1's constraint).

Pure functions over a :class:`~conduit.placement.topology.Topology`; no
dependency beyond the standard library.

Transfer model, per sample of ``x`` bytes::

    T_transfer(p) = T_ingest(p) + T_deliver(p)
    T_ingest(p)   = sum_s share_s * mean_a  x / BW(a -> s)     (actors a, shards s)
    T_deliver(p)  = sum_s share_s * mean_l  x / BW(s -> l)     (learners l)

``BW(s -> l)`` of the delivery leg is :meth:`Topology.deliver_bandwidth`: a copy
rate, or, for rows in host memory where the topology measured a gather rate, the
gather and the copy one after the other (sampled rows are scattered).
``BW(a -> s)`` is :meth:`Topology.ingest_bandwidth`. Where the sample's column
sizes (``rows``) are given, both read the host write and gather rates the node
measured at those row sizes (:mod:`conduit.placement.rates`); the model is then
linear in ``x`` for that layout of columns. Without them (the placement map,
keyed by ``x`` alone) host legs keep the row-size-independent rates.

Beside the per-byte legs the runtime has a fixed cost per call (a push, a pull:
Python, locks, one write or gather call per column), the same whatever the
placement on one node: :meth:`Node.call_seconds`. Per sample it vanishes with the
unit and batch sizes, so Alg. 1 compares the per-byte legs alone; an iteration's
modeled time adds it (:meth:`CandidateEvaluation.iteration_seconds`).

A written sample lands on shard ``s`` with probability ``share_s`` and a sampled
one is read from ``s`` with the same probability, so both legs are *expected
times* over shards (a learner on a shard's own GPU reads it at that GPU's local
copy rate, remote shards over the peer link) — never an averaged bandwidth.
With several actors or learners each leg is averaged over them. The model is
linear in ``x`` and separable over shards: each device has a per-byte ingest and
deliver cost, and a placement's cost is their share-weighted sum.

Capacity: shard ``s`` holds ``n_s`` whole samples (largest remainder of
``C_buf`` by share) and fits when ``n_s * x <= floor(Mem(s) * (1 - headroom))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from conduit.placement.records import Placement
from conduit.placement.topology import Topology

__all__ = [
    "DeviceCost",
    "ShardFit",
    "TransferTime",
    "device_cost",
    "placement_cost",
    "shard_fits",
    "usable_bytes",
]


@dataclass(frozen=True, slots=True)
class DeviceCost:
    """Seconds per byte to write into (``ingest``) and read out of (``deliver``) one device."""

    ingest: float
    deliver: float

    @property
    def total(self) -> float:
        return self.ingest + self.deliver


@dataclass(frozen=True, slots=True)
class TransferTime:
    """Modeled per-sample seconds of a placement's two legs."""

    ingest_seconds: float
    deliver_seconds: float

    @property
    def total_seconds(self) -> float:
        return self.ingest_seconds + self.deliver_seconds


@dataclass(frozen=True, slots=True)
class ShardFit:
    """Whether one shard's samples fit on its device."""

    device: str
    samples: int
    required_bytes: int
    usable_bytes: int

    @property
    def missing_bytes(self) -> int:
        return max(0, self.required_bytes - self.usable_bytes)

    @property
    def fits(self) -> bool:
        return self.required_bytes <= self.usable_bytes


def device_cost(
    topology: Topology,
    device: str,
    actors: Sequence[str],
    learners: Sequence[str],
    rows: Sequence[int] | None = None,
) -> DeviceCost:
    """Per-byte ingest and deliver seconds of a shard on ``device`` (mean over endpoints) for samples whose
    columns have ``rows`` bytes each (``None``: row-size-independent rates)."""
    ingest = math.fsum(1.0 / topology.ingest_bandwidth(a, device, rows) for a in actors) / len(actors)
    deliver = math.fsum(1.0 / topology.deliver_bandwidth(device, lr, rows) for lr in learners) / len(learners)
    return DeviceCost(ingest=ingest, deliver=deliver)


def placement_cost(
    topology: Topology,
    placement: Placement,
    actors: Sequence[str],
    learners: Sequence[str],
    sample_bytes: float,
    costs: Mapping[str, DeviceCost] | None = None,
    rows: Sequence[int] | None = None,
) -> TransferTime:
    """``T_transfer`` of ``placement`` for samples of ``sample_bytes`` (expected time over shards).

    ``costs`` may carry precomputed :func:`device_cost` values (the solver
    computes each device once per call); ``rows`` as in :func:`device_cost`.
    """
    ingest = deliver = 0.0
    for shard in placement.shards:
        c = costs[shard.device] if costs is not None and shard.device in costs else None
        if c is None:
            c = device_cost(topology, shard.device, actors, learners, rows)
        ingest += shard.share * c.ingest
        deliver += shard.share * c.deliver
    return TransferTime(ingest_seconds=ingest * sample_bytes, deliver_seconds=deliver * sample_bytes)


def usable_bytes(memory_bytes: int, headroom: float) -> int:
    """Free memory the buffer may take: ``floor(memory * (1 - headroom))``."""
    return math.floor(memory_bytes * (1.0 - headroom))


def shard_fits(
    topology: Topology, placement: Placement, capacity: int, sample_bytes: int, headroom: float
) -> tuple[ShardFit, ...]:
    """Per-shard capacity check of ``C_buf * x <= Mem(p) * (1 - headroom)``."""
    counts = placement.sample_counts(capacity)
    return tuple(
        ShardFit(
            device=shard.device,
            samples=n,
            required_bytes=n * sample_bytes,
            usable_bytes=usable_bytes(topology.device(shard.device).memory_bytes, headroom),
        )
        for shard, n in zip(placement.shards, counts, strict=True)
    )
