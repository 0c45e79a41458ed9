"""Alg. 1: the bandwidth-aware, capacity-constrained linear scan (paper Eq. 1).

``p* = argmin_{p in P} T_transfer(p)  s.t.  C_buf * x <= Mem(p) * (1 - headroom)``

Pure functions; standard library only. :func:`evaluate_candidates` models every
candidate (time and per-shard fit) without raising, so a CLI can print the whole
table; :func:`linear_scan` is Alg. 1 over those evaluations; :func:`solve_placement`
puts them together and raises :class:`~conduit.errors.PlacementError` — saying
how many bytes are missing at the closest candidate — when nothing fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conduit.errors import PlacementError
from conduit.placement.candidates import build_candidates
from conduit.placement.model import DeviceCost, ShardFit, device_cost, placement_cost, shard_fits
from conduit.placement.records import Placement, PlacementRequest
from conduit.placement.topology import Topology, endpoint_ids
from conduit.placement.units import format_bytes

__all__ = [
    "TIE_TOLERANCE",
    "CandidateEvaluation",
    "PlacementResult",
    "evaluate_candidates",
    "infeasibility_message",
    "linear_scan",
    "solve_placement",
]


TIE_TOLERANCE = 1e-9
"""Relative difference below which two modeled times are a tie (the earlier candidate wins)."""


@dataclass(frozen=True, slots=True)
class CandidateEvaluation:
    """One candidate under one workload: modeled per-sample time and per-shard fit."""

    placement: Placement
    ingest_seconds: float
    deliver_seconds: float
    shards: tuple[ShardFit, ...]
    push_call_seconds: float = 0.0
    """The runtime's fixed seconds per push, whatever its size (:meth:`Node.call_seconds`)."""
    pull_call_seconds: float = 0.0
    """The runtime's fixed seconds per pull."""

    @property
    def transfer_seconds(self) -> float:
        """``T_transfer(p)`` per sample."""
        return self.ingest_seconds + self.deliver_seconds

    def iteration_seconds(self, unit_rows: int, batch_rows: int) -> float:
        """Modeled seconds of one push of ``unit_rows`` samples and one pull of ``batch_rows``."""
        return (unit_rows * self.ingest_seconds + batch_rows * self.deliver_seconds
                + self.push_call_seconds + self.pull_call_seconds)

    @property
    def required_bytes(self) -> int:
        return sum(s.required_bytes for s in self.shards)

    @property
    def usable_bytes(self) -> int:
        return sum(s.usable_bytes for s in self.shards)

    @property
    def missing_bytes(self) -> int:
        """Bytes that do not fit on their shard's device (0 when feasible)."""
        return sum(s.missing_bytes for s in self.shards)

    @property
    def feasible(self) -> bool:
        return all(s.fits for s in self.shards)


@dataclass(frozen=True, slots=True)
class PlacementResult:
    """Alg. 1's answer, with every candidate kept for inspection."""

    request: PlacementRequest
    sample_bytes: int
    evaluations: tuple[CandidateEvaluation, ...]
    chosen: CandidateEvaluation

    @property
    def placement(self) -> Placement:
        return self.chosen.placement

    @property
    def transfer_seconds(self) -> float:
        return self.chosen.transfer_seconds


def _check_sample_bytes(sample_bytes: int) -> None:
    if isinstance(sample_bytes, bool) or not isinstance(sample_bytes, int) or sample_bytes < 1:
        raise PlacementError(f"sample_bytes: expected an integer >= 1, received {sample_bytes!r}")


def _check_rows(rows: Sequence[int], sample_bytes: int) -> tuple[int, ...]:
    out = tuple(rows)
    if not out or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in out) or sum(out) != sample_bytes:
        raise PlacementError(
            f"row_bytes: expected the sample's column sizes, integers >= 1 summing to sample_bytes "
            f"({sample_bytes}), received {list(out)}"
        )
    return out


def evaluate_candidates(
    topology: Topology,
    request: PlacementRequest,
    sample_bytes: int,
    candidates: Sequence[Placement] | None = None,
    row_bytes: Sequence[int] | None = None,
) -> tuple[CandidateEvaluation, ...]:
    """Model every candidate (default: :func:`build_candidates`) for samples of ``sample_bytes``.

    ``row_bytes``: the sample's column sizes (each column is written and gathered by its own call), which
    select the host rates measured at those row sizes and count the calls; ``None``: one column, at the
    row-size-independent rates (``host_memcpy``, ``host_gather``), as the placement map plans.
    """
    _check_sample_bytes(sample_bytes)
    rows = _check_rows(row_bytes, sample_bytes) if row_bytes is not None else None
    actors = endpoint_ids(topology, request.actors, "actors")
    learners = endpoint_ids(topology, request.learners, "learners")
    pool = build_candidates(topology, request) if candidates is None else tuple(candidates)
    push_call, pull_call = topology.nodes[topology.device(learners[0]).node].call_seconds(len(rows or (1,)))
    costs: dict[str, DeviceCost] = {}
    out: list[CandidateEvaluation] = []
    for p in pool:
        for d in p.devices:
            if d not in costs:
                costs[d] = device_cost(topology, topology.canonical_id(d), actors, learners, rows)
        t = placement_cost(topology, p, actors, learners, sample_bytes, costs, rows)
        fits = shard_fits(topology, p, request.capacity, sample_bytes, request.headroom)
        out.append(CandidateEvaluation(p, t.ingest_seconds, t.deliver_seconds, fits, push_call, pull_call))
    return tuple(out)


def linear_scan(evaluations: Sequence[CandidateEvaluation]) -> CandidateEvaluation | None:
    """Alg. 1 lines 1-6: the first feasible candidate of minimum ``T_transfer`` (``None`` if none fits).

    Times within a relative :data:`TIE_TOLERANCE` count as equal, so float noise
    in summation order cannot make a sharded candidate beat an equally fast one
    listed earlier (fewer shards).
    """
    best: CandidateEvaluation | None = None
    t_min = float("inf")
    for e in evaluations:
        if e.feasible:
            t = e.transfer_seconds
            if t < t_min * (1.0 - TIE_TOLERANCE):
                t_min, best = t, e
    return best


def infeasibility_message(
    evaluations: Sequence[CandidateEvaluation], request: PlacementRequest, sample_bytes: int
) -> str:
    """Why nothing fits: needed vs usable bytes at the candidate missing the fewest bytes."""
    total = request.capacity * sample_bytes
    head = (
        f"no feasible placement: capacity {request.capacity} samples x {sample_bytes} B = {total} B "
        f"({format_bytes(total)}) with {request.headroom:.0%} memory headroom"
    )
    if not evaluations:
        return head + "; the candidate set is empty (check PlacementRequest.kinds)"
    closest = min(evaluations, key=lambda e: (e.missing_bytes, e.transfer_seconds))
    worst = max(closest.shards, key=lambda s: s.missing_bytes)
    return (
        f"{head}; the closest candidate {closest.placement} needs {closest.required_bytes} B but has "
        f"{closest.usable_bytes} B usable: {closest.missing_bytes} B ({format_bytes(closest.missing_bytes)}) "
        f"missing (shard {worst.device}: needs {worst.required_bytes} B, has {worst.usable_bytes} B). "
        f"Lower the capacity or the sample size, lower the headroom, or add devices."
    )


def solve_placement(
    topology: Topology,
    request: PlacementRequest,
    sample_bytes: int,
    candidates: Sequence[Placement] | None = None,
    row_bytes: Sequence[int] | None = None,
) -> PlacementResult:
    """Eq. 1 by Alg. 1; raises :class:`PlacementError` (with the missing bytes) when nothing fits."""
    evaluations = evaluate_candidates(topology, request, sample_bytes, candidates, row_bytes)
    chosen = linear_scan(evaluations)
    if chosen is None:
        raise PlacementError(infeasibility_message(evaluations, request, sample_bytes))
    return PlacementResult(request=request, sample_bytes=sample_bytes, evaluations=evaluations, chosen=chosen)
