"""Pure functions that turn the profile's measurements into a plan (paper §6.3).

- :func:`probe_schedules` — the short runs that calibrate the overlap terms;
- :func:`fit_sync` — ``t_other`` and ``T_sync`` from what those runs measured;
- :func:`shortlist` — the schedules worth measuring on the loop;
- :func:`settle` — the plan, from the model's ranking and the shortlist's measurements.

No threads, no runtime, no clock: every input is explicit, so each is tested on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from typing import Any

from conduit.core import INLINE, Mode, Policy, Schedule, delivery_space, feasible_schedules, ingestion_space
from conduit.scheduling.model import Costs, Prediction, coarseness, predict
from conduit.scheduling.noise import Spread, pick

__all__ = ["fit_sync", "probe_schedules", "settle", "shortlist"]


def probe_schedules(
    policy: Policy, num_minibatches: int, g_max: int = 1, every: bool = False
) -> dict[str, Schedule]:
    """The short runs that calibrate ``t_other`` and the sync terms.

    All inline (``base``), then each path overlapped at its finest granularity
    (``ingestion``, ``delivery``) and, where the space has a coarser overlapped
    one, at the coarsest (``ingestion_coarse``, ``delivery_coarse``): two points
    per path fit the per-invocation and the per-iteration part of ``S(g)``.
    ``every``: also each path overlapped at every other feasible granularity
    (``ingestion@g``, ``delivery@g``), measured rather than read off the line.
    ``both``: both paths overlapped at their finest granularity, which measures
    what overlapping both costs beyond overlapping each (``Costs.s_both``).
    """
    one = Fraction(1)
    base = Schedule(Mode(False, one), Mode(False, one))
    probes = {"base": base}
    if policy is Policy.OFF_POLICY:
        probes["ingestion"] = Schedule(Mode(True, one), Mode(False, one))
        probes["delivery"] = Schedule(Mode(False, one), Mode(True, one))
        if g_max > 1:
            coarse = Fraction(g_max)
            probes["ingestion_coarse"] = Schedule(Mode(True, coarse), Mode(False, one))
            probes["delivery_coarse"] = Schedule(Mode(False, one), Mode(True, coarse))
    elif num_minibatches > 1:
        frac = Fraction(1, num_minibatches)
        probes["ingestion"] = Schedule(Mode(True, frac), Mode(False, one))
        probes["delivery"] = Schedule(Mode(False, one), Mode(True, frac))
        if num_minibatches > 2:
            probes["ingestion_coarse"] = Schedule(Mode(True, 1 - frac), Mode(False, one))
    feasible = set(feasible_schedules(policy, num_minibatches, g_max, g_max))
    if "ingestion" in probes and "delivery" in probes:
        both = Schedule(probes["ingestion"].ingestion, probes["delivery"].delivery)
        if both in feasible:
            probes["both"] = both
    if every:
        taken = set(probes.values())
        cfg_ing = ingestion_space(policy, num_minibatches, g_max)
        cfg_del = delivery_space(policy, num_minibatches, g_max)
        for g in cfg_ing:
            s = Schedule(Mode(True, g), Mode(False, one))
            if s in feasible and s not in taken:
                probes[f"ingestion@{g}"] = s
        for g in cfg_del:
            s = Schedule(Mode(False, one), Mode(True, g))
            if s in feasible and s not in taken:
                probes[f"delivery@{g}"] = s
    return probes


def fit_sync(costs: Costs, measured: dict[str, float], probes: dict[str, Schedule]) -> Costs:
    """``t_other`` from the all-inline run, ``S(g)`` per path from its overlapped probes, ``S_both`` (pure).

    With one probe on a path its excess over the model is all per invocation;
    with two (fine and coarse), ``S(g) = T_sync0 + n(g)·T_sync`` goes through
    both points where both parts come out non-negative (see :func:`_fit_line`).
    Every probed granularity's excess (``path``, ``path_coarse`` and, with
    ``probe_schedules(every=True)``, ``path@g``) is also kept as measured
    (``Costs.s_ing`` / ``s_del``): the line serves only the granularities left unprobed.

    Every fitted cost is physically meaningful: ``t_other`` and each overlap
    cost at least 0 (a negative one is a probe's noise, not a speed-up the
    model could bank on), and an overlap costs at most the work it overlaps
    (:meth:`~conduit.scheduling.model.Costs.overlap_cap`; ``S_both`` at most the
    smaller path's).
    """
    bare = replace(
        costs, t_other=0.0, t_sync_ing=0.0, t_sync_del=0.0, t_sync0_ing=0.0, t_sync0_del=0.0, s_ing={}, s_del={},
        s_both=0.0,
    )
    base = replace(bare, t_other=max(0.0, measured["base"] - predict(bare, probes["base"]).t_iter))
    # what each overlapped probe measured beyond the model without overlap costs
    excess = {name: measured[name] - predict(base, s).t_iter for name, s in probes.items() if name in measured}
    fitted: dict[str, Any] = {}
    for path, field_ in (("ingestion", "ing"), ("delivery", "del")):

        def g_of(name: str, path: str = path) -> Fraction:
            return probes[name].ingestion.granularity if path == "ingestion" else probes[name].delivery.granularity

        invocations = base.ingestion_invocations if path == "ingestion" else base.delivery_invocations
        points = [(invocations(g_of(name)), excess[name]) for name in (path, f"{path}_coarse") if name in excess]
        if len(points) == 1 or (len(points) == 2 and points[0][0] == points[1][0]):
            fitted[f"t_sync_{field_}"] = max(0.0, points[0][1] / points[0][0])
        elif len(points) == 2:
            fitted[f"t_sync_{field_}"], fitted[f"t_sync0_{field_}"] = _fit_line(points)
        fitted[f"s_{field_}"] = {
            g_of(name): min(max(0.0, e), base.overlap_cap(path, g_of(name)))
            for name, e in excess.items()
            if name in (path, f"{path}_coarse") or name.startswith(f"{path}@")
        }
    single = replace(base, **fitted)
    if "both" in measured and "both" in probes:
        both = probes["both"]
        cap = min(single.overlap_cap("ingestion", both.ingestion.granularity),
                  single.overlap_cap("delivery", both.delivery.granularity))
        fitted["s_both"] = min(max(0.0, measured["both"] - predict(single, both).t_iter), cap)
    return replace(single, **fitted)


def _fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(per_invocation, per_iteration)`` of ``S(n) = a + b·n`` through two probes, both kept ≥ 0.

    A negative part has no physical meaning — it is the noise of one probe
    extrapolated — so the fit falls back to the other part alone: through the
    origin by least squares, or a constant (the mean excess) when even that
    slope is negative.
    """
    (n1, e1), (n2, e2) = points
    b = (e1 - e2) / (n1 - n2)
    a = e1 - b * n1
    if a >= 0 and b >= 0:
        return b, a
    slope = (n1 * e1 + n2 * e2) / (n1 * n1 + n2 * n2)
    if a < 0 and slope >= 0:
        return slope, 0.0
    return 0.0, max(0.0, (e1 + e2) / 2)


def settle(
    ranked: Sequence[Prediction],
    verified: Mapping[Schedule, float],
    margin: float = 0.03,
    spreads: Mapping[Schedule, Spread] | None = None,
) -> Prediction:
    """The plan from the model's ranking and the shortlist's measurements (pure; ``ranked`` best first).

    The planners' one rule (:func:`~conduit.scheduling.noise.pick`): where the inline
    schedule was measured, a schedule counts only if it beats inline by more than
    the noise (``margin``, or the runs' own ``spreads`` where they are wider): a
    schedule that buys nothing measurable still costs a worker. Of those, schedules
    within the noise of the fastest are ties -- a difference that small is inside
    the noise of a few short runs on a shared machine -- and the plan is the finest
    of them (:func:`~conduit.scheduling.model.coarseness`: least grouping, so least
    staleness), then an all-inline schedule, then the model's order, which knows
    what overlapping each path costs. The model alone is blind to overlap costs
    that vary with ``g`` below its probes' noise, so on a tie it must not choose a
    coarser granularity; a finer schedule that does not beat inline, though, never
    hides a coarser one that does.
    """
    if not verified:
        return ranked[0]
    spreads = spreads or {}
    measured = {p.schedule: _around(verified[p.schedule], spreads.get(p.schedule)) for p in ranked
                if p.schedule in verified}
    rank_of = {p.schedule: i for i, p in enumerate(ranked)}

    def order(s: Schedule) -> tuple[Fraction, bool, int]:
        return coarseness(s), s.ingestion.overlap or s.delivery.overlap, rank_of[s]

    plan = pick(measured, order, margin, baseline=INLINE)
    return ranked[rank_of[plan]]


def _around(t: float, runs: Spread | None) -> Spread:
    """The measured time ``t`` with the range of its ``runs`` around it (a point where its runs are not known)."""
    return Spread(t, t, t) if runs is None else runs.shifted(t - runs.median)


def shortlist(ranked: Sequence[Prediction], top: int, families: bool = True) -> list[Schedule]:
    """The schedules to measure on the loop (pure; ``ranked`` best first).

    The model's ``top`` best, then — with ``families`` — for each overlap
    family (ingestion × delivery, inline or overlapped) the model's best of it
    and its best of the finest (:func:`~conduit.scheduling.model.coarseness`;
    ``g = 1`` off-policy), those not yet among them. The top of a
    ranking tends to be one family at neighbouring granularities, and where
    the model errs it errs about a whole family (the cost of overlapping a path
    on this machine) or about how that cost moves with ``g`` (probes whose
    differences are within their noise): one verified representative per
    family, and its finest member, protect the plan from both.
    """
    if top <= 0:
        return []
    out = [p.schedule for p in ranked[:top]]
    if families:
        members: dict[tuple[bool, bool], list[Schedule]] = {}
        for p in ranked:
            members.setdefault((p.schedule.ingestion.overlap, p.schedule.delivery.overlap), []).append(p.schedule)
        for family in members.values():
            for s in (family[0], min(family, key=coarseness)):  # min keeps the model's order among equals
                if s not in out:
                    out.append(s)
    return out

