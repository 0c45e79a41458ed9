"""The placement map ``M``: per-sample size -> placement, built offline (paper §5.3, App. D).

numpy earns its place for the geometric grid; :mod:`bisect` gives the
``O(log R)`` lookup of Alg. 2 line 1.

:func:`build_placement_map` sweeps a geometric grid of per-sample sizes ``x``,
solves Alg. 1 at each point and compresses runs of equal answers into regions
``[lo, hi)``. Between two grid points whose answers differ it then bisects on
the integer ``x`` for the exact boundary (Alg. 1's answer changes only when its
current choice stops fitting: times are linear in ``x`` and feasibility only
shrinks as ``x`` grows), so a lookup anywhere in a region returns a placement
that fits — never one that would OOM between grid points. Sizes where nothing
fits form regions whose placement is ``None``; looking one up raises
:class:`~conduit.errors.PlacementError` with the missing bytes.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from conduit.errors import PlacementError
from conduit.placement.candidates import build_candidates
from conduit.placement.records import Placement, PlacementRequest
from conduit.placement.solver import evaluate_candidates, infeasibility_message, linear_scan
from conduit.placement.topology import Topology

__all__ = ["MapRegion", "PlacementMap", "build_placement_map", "geometric_grid"]


@dataclass(frozen=True, slots=True)
class MapRegion:
    """Per-sample sizes ``lo <= x < hi`` bytes all map to ``placement`` (``None``: nothing fits)."""

    lo: int
    hi: int
    placement: Placement | None
    seconds_per_byte: float | None
    """Modeled ``T_transfer / x`` of the placement (constant within a region)."""


@dataclass(frozen=True)
class PlacementMap:
    """Contiguous regions over ``[x_min, x_max]``; :meth:`lookup` is ``O(log R)``."""

    request: PlacementRequest
    regions: tuple[MapRegion, ...]
    reason_beyond: str = ""
    """Why sizes in the infeasible regions fit nowhere (message at the first such size)."""
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.regions:
            raise PlacementError("PlacementMap.regions: expected at least one region, received none")
        for a, b in itertools.pairwise(self.regions):
            if a.hi != b.lo:
                raise PlacementError(
                    "PlacementMap.regions: expected contiguous regions, "
                    f"received [{a.lo}, {a.hi}) then [{b.lo}, {b.hi})"
                )
        object.__setattr__(self, "_starts", tuple(r.lo for r in self.regions))

    @property
    def x_min(self) -> int:
        return self.regions[0].lo

    @property
    def x_max(self) -> int:
        """The largest size covered (inclusive)."""
        return self.regions[-1].hi - 1

    def region(self, sample_bytes: int) -> MapRegion:
        if not self.x_min <= sample_bytes <= self.x_max:
            raise PlacementError(
                f"sample_bytes: expected a size within the placement map's range "
                f"[{self.x_min}, {self.x_max}] B, received {sample_bytes}"
            )
        return self.regions[bisect.bisect_right(self._starts, sample_bytes) - 1]

    def lookup(self, sample_bytes: int) -> Placement:
        """``M(x)``: the placement for samples of ``sample_bytes`` (raises where nothing fits)."""
        r = self.region(sample_bytes)
        if r.placement is None:
            raise PlacementError(
                f"placement map: no placement holds samples of {sample_bytes} B "
                f"(nothing fits from {r.lo} B on). {self.reason_beyond}"
            )
        return r.placement

    @property
    def placements(self) -> tuple[Placement, ...]:
        """Distinct placements in order of increasing sample size."""
        out: list[Placement] = []
        for r in self.regions:
            if r.placement is not None and r.placement not in out:
                out.append(r.placement)
        return tuple(out)


def geometric_grid(x_min: int, x_max: int, points: int) -> list[int]:
    """Distinct integers spread geometrically over ``[x_min, x_max]`` (both included)."""
    grid = np.unique(np.rint(np.geomspace(x_min, x_max, num=points)).astype(np.int64))
    values = sorted({int(v) for v in grid} | {x_min, x_max})
    return values


def build_placement_map(
    topology: Topology,
    request: PlacementRequest,
    *,
    x_min: int,
    x_max: int,
    points: int = 64,
    candidates: Sequence[Placement] | None = None,
) -> PlacementMap:
    """Sweep ``points`` geometric sizes in ``[x_min, x_max]`` bytes with Alg. 1 and compress to regions."""
    for name, v in (("x_min", x_min), ("x_max", x_max), ("points", points)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlacementError(f"{name}: expected an integer >= 1, received {v!r}")
    if x_max < x_min:
        raise PlacementError(f"x_max: expected >= x_min ({x_min}), received {x_max}")
    pool = build_candidates(topology, request) if candidates is None else tuple(candidates)
    memo: dict[int, tuple[Placement | None, float | None]] = {}
    reason = ""

    def solve(x: int) -> tuple[Placement | None, float | None]:
        nonlocal reason
        if x not in memo:
            evaluations = evaluate_candidates(topology, request, x, pool)
            best = linear_scan(evaluations)
            if best is None:
                if not reason:
                    reason = infeasibility_message(evaluations, request, x)
                memo[x] = (None, None)
            else:
                memo[x] = (best.placement, best.transfer_seconds / x)
        return memo[x]

    grid = geometric_grid(x_min, x_max, points)
    starts: list[int] = [grid[0]]
    for a, b in itertools.pairwise(grid):
        lo = a
        while solve(lo)[0] != solve(b)[0]:
            # smallest x in (lo, b] whose answer differs from lo's (answers change monotonically)
            left, right = lo, b
            while right - left > 1:
                mid = (left + right) // 2
                if solve(mid)[0] == solve(lo)[0]:
                    left = mid
                else:
                    right = mid
            starts.append(right)
            lo = right
    regions = []
    bounds = [*starts, x_max + 1]
    for lo, hi in itertools.pairwise(bounds):
        placement, per_byte = solve(lo)
        regions.append(MapRegion(lo=lo, hi=hi, placement=placement, seconds_per_byte=per_byte))
    return PlacementMap(request=request, regions=tuple(regions), reason_beyond=reason)
