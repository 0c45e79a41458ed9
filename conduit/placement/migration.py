"""Migration transfer plans: Eq. 3 of the paper (Appendix D), solved exactly.

scipy earns its place twice: ``scipy.optimize.linprog`` (HiGHS) solves the
min-makespan transportation LP exactly, and ``scipy.sparse.csgraph.maximum_flow``
turns its fractional flows into whole samples with exact row and column sums.

Eq. 3: volumes ``V_i`` on source devices, ``V'_j`` required on target devices
(``sum V = sum V'``); choose flows ``f_ij >= 0`` with ``sum_j f_ij = V_i`` and
``sum_i f_ij = V'_j`` minimizing ``max_ij f_ij / BW(d_i -> d'_j)``, the makespan
of transfers running in parallel on dedicated streams. As an LP over
``(f, t)``: minimize ``t`` subject to the sums and ``f_ij <= t * BW_ij``.

A device both a source and a target keeps data "in place" on the pair
``(d, d)``. :class:`LocalTransfer` decides what that costs: ``COPY`` (default)
charges the device's local copy bandwidth, because a migration for a grown
sample size re-lays every record into new storage even when it stays put;
``KEEP`` treats it as free (infinite bandwidth), for a pure re-sharding that
leaves resident records untouched.

Rounding (:func:`round_flows`): whole samples ``F_ij <= ceil(f_ij)`` with exact
row and column sums, found as an integer max flow (one exists because ``f`` is a
fractional flow within those capacities); so the rounded makespan is at most the
LP's plus one sample's time on the slowest pair used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from conduit.errors import PlacementError
from conduit.placement.records import Placement
from conduit.placement.topology import Topology

__all__ = [
    "FlowSolution",
    "LocalTransfer",
    "MigrationPlan",
    "Transfer",
    "bandwidth_matrix",
    "makespan",
    "plan_migration",
    "plan_placement_change",
    "round_flows",
    "solve_min_makespan",
]

_INT32_MAX = 2**31 - 1


class LocalTransfer(str, Enum):
    """The cost of data that stays on a device that is both source and target."""

    COPY = "copy"
    """Re-laid in place at the device's local copy bandwidth."""
    KEEP = "keep"
    """Left where it is: free (infinite bandwidth)."""


@dataclass(frozen=True)
class FlowSolution:
    """Fractional flows ``[i][j]`` (volume units) and the LP makespan (volume / bandwidth units)."""

    flows: np.ndarray
    makespan: float


def makespan(flows: np.ndarray, bandwidth: np.ndarray) -> float:
    """``max_ij flows_ij / bandwidth_ij`` (pairs carrying nothing, or of infinite bandwidth, cost 0)."""
    f = np.asarray(flows, dtype=np.float64)
    bw = np.asarray(bandwidth, dtype=np.float64)
    if f.size == 0:
        return 0.0
    if np.any((f > 0) & (bw <= 0)):
        return math.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        times = np.where(f > 0, f / bw, 0.0)
    return float(times.max())


def _check_volumes(
    sources: Sequence[float], targets: Sequence[float], bandwidth: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    v = np.asarray(sources, dtype=np.float64).reshape(-1)
    w = np.asarray(targets, dtype=np.float64).reshape(-1)
    bw = np.asarray(bandwidth, dtype=np.float64)
    if bw.shape != (v.size, w.size):
        raise PlacementError(f"bandwidth: expected shape ({v.size}, {w.size}) (sources x targets), received {bw.shape}")
    if np.any(~np.isfinite(v)) or np.any(v < 0) or np.any(~np.isfinite(w)) or np.any(w < 0):
        raise PlacementError(
            f"volumes: expected finite values >= 0, received sources {v.tolist()}, targets {w.tolist()}"
        )
    if np.any(np.isnan(bw)) or np.any(bw < 0):
        raise PlacementError(f"bandwidth: expected values >= 0 (inf allowed), received {bw.tolist()}")
    total_v, total_w = math.fsum(v), math.fsum(w)
    if abs(total_v - total_w) > 1e-9 * max(1.0, total_v, total_w):
        raise PlacementError(
            f"volumes: expected equal totals (sum V = sum V'), received sources {total_v} and targets {total_w}"
        )
    return v, w, bw


def solve_min_makespan(sources: Sequence[float], targets: Sequence[float], bandwidth: np.ndarray) -> FlowSolution:
    """Eq. 3 as an LP (HiGHS): flows with the given row/column sums minimizing the makespan.

    ``bandwidth[i][j]`` may be ``inf`` (free pair) or ``0`` (no path: no flow).
    Among optimal plans a second LP picks one of least total transfer time
    (``sum f_ij / BW_ij``), so nothing moves that need not. The returned
    makespan is that of the returned flows (equal to the optimum up to 1e-9).
    """
    v, w, bw = _check_volumes(sources, targets, bandwidth)
    m, n = bw.shape
    total = math.fsum(v)
    if m == 0 or n == 0 or total == 0.0:
        return FlowSolution(flows=np.zeros((m, n)), makespan=0.0)
    finite = bw[np.isfinite(bw) & (bw > 0)]
    scale_bw = float(finite.max()) if finite.size else 1.0
    vs, ws, bws = v / total, w / total, bw / scale_bw  # well-scaled LP: volumes sum to 1, bandwidths <= 1

    k = m * n  # variables: f (row-major), then t
    c = np.zeros(k + 1)
    c[-1] = 1.0
    a_eq = np.zeros((m + n, k + 1))
    for i in range(m):
        a_eq[i, i * n : (i + 1) * n] = 1.0
    for j in range(n):
        a_eq[m + j, j:k:n] = 1.0
    b_eq = np.concatenate([vs, ws])
    rows = [(i, j) for i in range(m) for j in range(n) if np.isfinite(bws[i, j]) and bws[i, j] > 0]
    a_ub = np.zeros((len(rows), k + 1))
    for r, (i, j) in enumerate(rows):
        a_ub[r, i * n + j] = 1.0
        a_ub[r, -1] = -bws[i, j]
    bounds = [(0.0, 0.0) if bws[i, j] == 0 else (0.0, None) for i in range(m) for j in range(n)] + [(0.0, None)]
    a_ub_arg = a_ub if rows else None
    b_ub_arg = np.zeros(len(rows)) if rows else None
    from scipy.optimize import linprog  # here: importing scipy.optimize takes a quarter second, for every CLI call

    res = linprog(c, A_ub=a_ub_arg, b_ub=b_ub_arg, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if res.status != 0:
        raise PlacementError(
            f"migration plan: no flow moves sources {v.tolist()} to targets {w.tolist()} over "
            f"bandwidths {bw.tolist()} (LP status {res.status}: {res.message})"
        )
    t_star = float(res.x[-1])
    x = res.x
    # Among makespan-optimal plans, prefer the least total transfer time (no needless moves).
    busy = np.array(
        [1.0 / bws[i, j] if np.isfinite(bws[i, j]) and bws[i, j] > 0 else 0.0 for i in range(m) for j in range(n)]
        + [0.0]
    )
    bounds[-1] = (0.0, t_star * (1.0 + 1e-9) + 1e-12)
    second = linprog(busy, A_ub=a_ub_arg, b_ub=b_ub_arg, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if second.status == 0:
        x = second.x
    flows = np.clip(x[:k].reshape(m, n), 0.0, None) * total
    return FlowSolution(flows=flows, makespan=makespan(flows, bw))


def round_flows(flows: np.ndarray, sources: Sequence[int], targets: Sequence[int], bandwidth: np.ndarray) -> np.ndarray:
    """Whole-sample flows with row sums ``sources`` and column sums ``targets`` exactly.

    Each ``F_ij <= ceil(f_ij)`` (snapped within 1e-6 of an integer); only pairs of
    positive bandwidth carry flow. Solved as an integer max flow.
    """
    v = [int(x) for x in sources]
    w = [int(x) for x in targets]
    f = np.asarray(flows, dtype=np.float64)
    bw = np.asarray(bandwidth, dtype=np.float64)
    m, n = len(v), len(w)
    if f.shape != (m, n) or bw.shape != (m, n):
        raise PlacementError(f"flows: expected shape ({m}, {n}), received flows {f.shape}, bandwidth {bw.shape}")
    if any(x < 0 for x in v + w) or sum(v) != sum(w):
        raise PlacementError(f"volumes: expected integers >= 0 with equal sums, received sources {v}, targets {w}")
    total = sum(v)
    if total > _INT32_MAX:
        raise PlacementError(f"volumes: expected at most {_INT32_MAX} samples in all, received {total}")
    if total == 0:
        return np.zeros((m, n), dtype=np.int64)
    ceil = np.ceil(f - 1e-6).clip(0, None)  # up to 1e-6 above an integer is LP noise: that integer
    usable = bw > 0
    for caps in (ceil, ceil + 1, np.full((m, n), float(total))):  # the last two only absorb LP noise
        cap = np.where(usable, np.minimum(caps, total), 0).astype(np.int64)
        result = _integer_flow(v, w, cap)
        if result is not None:
            return result
    raise PlacementError(
        f"migration plan: no whole-sample flow moves sources {v} to targets {w} over bandwidths {bw.tolist()}"
    )


def _integer_flow(v: list[int], w: list[int], cap: np.ndarray) -> np.ndarray | None:
    """A flow ``source -> i -> j -> sink`` saturating every source and target, or ``None``."""
    m, n = len(v), len(w)
    size = m + n + 2
    src, sink = 0, m + n + 1
    graph = np.zeros((size, size), dtype=np.int32)
    graph[src, 1 : m + 1] = v
    graph[1 : m + 1, m + 1 : m + n + 1] = cap
    graph[m + 1 : m + n + 1, sink] = w
    from scipy.sparse import csr_array  # here, as linprog: only a migration plan needs them
    from scipy.sparse.csgraph import maximum_flow

    res = maximum_flow(csr_array(graph), src, sink)
    if int(res.flow_value) != sum(v):
        return None
    flow = np.asarray(res.flow.toarray(), dtype=np.int64)[1 : m + 1, m + 1 : m + n + 1]
    return np.clip(flow, 0, None)


def bandwidth_matrix(
    topology: Topology, sources: Sequence[str], targets: Sequence[str], local: LocalTransfer = LocalTransfer.COPY
) -> np.ndarray:
    """``BW(d_i -> d'_j)`` in bytes/s; a device to itself per ``local``."""
    out = np.empty((len(sources), len(targets)))
    for i, s in enumerate(sources):
        for j, t in enumerate(targets):
            same = topology.canonical_id(s) == topology.canonical_id(t)
            out[i, j] = math.inf if same and local is LocalTransfer.KEEP else topology.bandwidth(s, t)
    return out


@dataclass(frozen=True, slots=True)
class Transfer:
    """One parallel copy of the plan."""

    source: str
    target: str
    samples: int
    seconds: float


@dataclass(frozen=True)
class MigrationPlan:
    """Whole-sample flows ``[source][target]`` and their makespan (Alg. 2's pre-solved plan)."""

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    flows: tuple[tuple[int, ...], ...]
    sample_bytes: int
    bandwidth: tuple[tuple[float, ...], ...]
    makespan_seconds: float
    """Of the whole-sample plan."""
    lp_makespan_seconds: float
    """Of the exact fractional optimum (a lower bound)."""

    def transfers(self) -> tuple[Transfer, ...]:
        """The copies that move something, slowest first."""
        out = [
            Transfer(s, t, n, 0.0 if math.isinf(bw) else n * self.sample_bytes / bw)
            for s, row, bw_row in zip(self.sources, self.flows, self.bandwidth, strict=True)
            for t, n, bw in zip(self.targets, row, bw_row, strict=True)
            if n > 0
        ]
        return tuple(sorted(out, key=lambda tr: -tr.seconds))


def plan_migration(
    topology: Topology,
    source_samples: Mapping[str, int],
    target_samples: Mapping[str, int],
    sample_bytes: int,
    local: LocalTransfer = LocalTransfer.COPY,
) -> MigrationPlan:
    """Eq. 3 for whole samples of ``sample_bytes`` bytes moved (the records' current size)."""
    if isinstance(sample_bytes, bool) or not isinstance(sample_bytes, int) or sample_bytes < 1:
        raise PlacementError(f"sample_bytes: expected an integer >= 1, received {sample_bytes!r}")
    sources = tuple(topology.canonical_id(d) for d, n in source_samples.items() if n > 0)
    targets = tuple(topology.canonical_id(d) for d, n in target_samples.items() if n > 0)
    for name, ids in (("source_samples", sources), ("target_samples", targets)):
        if len(set(ids)) != len(ids):
            raise PlacementError(f"{name}: expected distinct devices, received {list(ids)}")
    v = [int(n) for n in source_samples.values() if n > 0]
    w = [int(n) for n in target_samples.values() if n > 0]
    if sum(v) != sum(w):
        raise PlacementError(
            f"target_samples: expected {sum(v)} samples in all (as the sources hold), received {sum(w)}"
        )
    bw = bandwidth_matrix(topology, sources, targets, local)
    per_sample = bw / sample_bytes  # samples per second
    lp = solve_min_makespan(v, w, per_sample)
    whole = round_flows(lp.flows, v, w, per_sample)
    return MigrationPlan(
        sources=sources,
        targets=targets,
        flows=tuple(tuple(int(x) for x in row) for row in whole),
        sample_bytes=sample_bytes,
        bandwidth=tuple(tuple(float(x) for x in row) for row in bw),
        makespan_seconds=makespan(whole, per_sample),
        lp_makespan_seconds=lp.makespan,
    )


def plan_placement_change(
    topology: Topology,
    old: Placement,
    new: Placement,
    samples: int,
    sample_bytes: int,
    local: LocalTransfer = LocalTransfer.COPY,
) -> MigrationPlan:
    """The plan moving ``samples`` records laid out by ``old``'s shares into ``new``'s shares."""
    src = dict(zip(old.devices, old.sample_counts(samples), strict=True))
    dst = dict(zip(new.devices, new.sample_counts(samples), strict=True))
    return plan_migration(topology, src, dst, sample_bytes, local)
