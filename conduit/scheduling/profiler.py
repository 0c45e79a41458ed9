"""The profiler: measures the costs the scheduler's model needs (paper §6.3).

- ``T_ing(g)`` / ``T_del(g)``: the wall time of one invocation of the real
  ingestion / delivery graph (the registered hooks included) at each feasible
  granularity, on data of the real experience spec, in a scratch runtime on the
  chosen storage; warm-up, repeats, medians.
- ``T_rollout`` / ``T_update``: supplied, or measured from the loop alone.
- ``T_sync``: what overlapping a path costs beyond the work it hides —
  hand-off and, on a CPU, contention with the compute it overlaps. It is
  calibrated from short runs of the real loop: all-inline, then each path
  overlapped at ``g = 1`` (or the smallest fraction on-policy); the difference
  between measured and modeled-without-sync time is ``T_sync``. The all-inline
  run also calibrates ``t_other``, the loop's own per-iteration bookkeeping.
  ``T_sync`` is per invocation (see :mod:`conduit.scheduling.model`): the
  probe's excess divided by the invocations it ran per iteration.
- **Verification**: the model ranks every feasible schedule, but on a loaded
  machine schedules within a few percent of each other are inside the noise of
  any one estimate. :func:`verify` runs the model's few best, and each overlap
  family's best and finest, on the real loop, interleaved; the plan is the
  finest of those measured within the noise margin of the fastest, then the
  model's pick among them: the model prunes dozens of candidates to a handful,
  measurement settles the rest. The inline schedule is measured with them,
  so a plan must beat it by more than the margin, and any plan but inline
  meets it (and the model's minimum) again in fresh rounds first
  (:func:`rematch`): the luckiest of a few noisy runs is not a plan. Each
  verification run is judged against rollout and update timed alone right
  before and after it, so the host's speed moving between runs does not
  decide the ranking (:func:`interleaved_medians`).

Everything is bounded: a handful of invocations per granularity and a few dozen
loop iterations per calibration run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import torch

from conduit.config import ConduitConfig
from conduit.hooks import HookRegistry
from conduit.runtime import Conduit
from conduit.scheduling.model import Costs, Prediction, coarseness, predict, rank
from conduit.scheduling.space import Mode, Policy, Schedule, delivery_space, feasible_schedules, ingestion_space
from conduit.storage.policy import StoragePolicy
from conduit.synthetic import SyntheticWorkload, bracketed_exposed, run_loop, standalone_costs

__all__ = [
    "INLINE",
    "ProfileResult",
    "ProfileSettings",
    "calibrate",
    "fit_sync",
    "interleaved_medians",
    "measure_delivery",
    "measure_ingestion",
    "probe_schedules",
    "profile_workload",
    "rematch",
    "settle",
    "shortlist",
    "verify",
]

Progress = Callable[[str], None]

#: the inline schedule at g = 1 on both paths: an RLlib-style buffer, what a user runs without a plan
INLINE = Schedule(Mode(False, Fraction(1)), Mode(False, Fraction(1)))


@dataclass(frozen=True)
class ProfileSettings:
    warmup: int = 2
    repeats: int = 7
    loop_iterations: int = 20
    loop_warmup: int = 4
    calibration_rounds: int = 2  # interleaved rounds of the calibration probes (median): one burst is not a fit
    verify_top: int = 3  # the model's best this many are measured on the loop (0: trust the model)
    verify_rounds: int = 2
    probe_every_granularity: bool = True  # calibrate overlap at every granularity, not only the finest and coarsest
    verify_margin: float = 0.03  # measured times this close to the fastest are ties (see settle)
    #: rollout and update are timed alone (this many repeats) before and after each verification run, and each run
    #: is judged against the two (see interleaved_medians); 0 judges raw times
    bracket_repeats: int = 7
    scratch_bytes: int = 256 << 20  # scratch replay buffers hold at most this much

    @classmethod
    def thorough(cls) -> ProfileSettings:
        """For runs that may take minutes (``conduit profile --validate``, ``conduit bench synthetic``).

        More rounds where single short runs decide: the shortlist's candidates
        are often within 5-10% of each other, about one run's noise on a
        shared machine (measured: verification in three rounds kept a schedule
        7% slower than one next to it in the ranking; in five, at dim 1,000,
        one profile of three planned delivery at g = 4 over g = 1, and the
        benchmark's 15 repeats then measured 0.56 ms exposed against 0.25).
        """
        return cls(calibration_rounds=3, verify_rounds=7)


@dataclass(frozen=True)
class ProfileResult:
    costs: Costs
    calibration: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    #: every feasible schedule under the fitted model, best first
    ranked: list[Prediction] = field(default_factory=list)
    #: measured median T_iter of the model's shortlist (empty when verification is off)
    verified: dict[Schedule, float] = field(default_factory=dict)
    #: measured times this close to the fastest are ties (see :func:`settle`)
    margin: float = 0.03

    @property
    def model_choice(self) -> Prediction:
        """Eq. 2's answer: the model's minimum."""
        return self.ranked[0]

    @property
    def choice(self) -> Prediction:
        """The plan: :func:`settle` over the verified shortlist, else the model's minimum."""
        return settle(self.ranked, self.verified, self.margin)


def _scratch_config(
    cfg: ConduitConfig, bytes_per_sample: int, settings: ProfileSettings, need_rows: int
) -> ConduitConfig:
    if cfg.policy is Policy.ON_POLICY:
        return cfg.model_copy(update={"timeout_s": 60.0})
    assert cfg.capacity is not None
    rows = max(need_rows, min(cfg.capacity, settings.scratch_bytes // max(1, bytes_per_sample)))
    rows = max(rows, cfg.train_batch_size * cfg.g_max)
    return cfg.model_copy(update={"capacity": rows, "min_size_to_sample": None, "timeout_s": 60.0})


def _timings(graph: Any, skip: int) -> float:
    times = [t for t, _ in list(graph.timings)[skip:]]
    if not times:
        raise RuntimeError(f"the {graph.name} graph recorded no invocations to time")
    return statistics.median(times)


def measure_ingestion(
    cfg: ConduitConfig,
    pool: Sequence[dict[str, torch.Tensor]],
    granularities: Sequence[Fraction],
    *,
    registry: HookRegistry | None = None,
    storage: StoragePolicy | None = None,
    settings: ProfileSettings = ProfileSettings(),
) -> dict[Fraction, float]:
    """Median wall time of one ingestion invocation at each granularity."""
    out: dict[Fraction, float] = {}
    unit_rows = int(next(iter(pool[0].values())).shape[0])
    bps = sum(int(v[0].numel() * v.element_size()) for v in pool[0].values())
    for g in granularities:
        invocations = settings.warmup + settings.repeats
        units = invocations * int(g) if g >= 1 else -(-invocations * g.numerator // g.denominator)
        scfg = _scratch_config(cfg, bps, settings, units * unit_rows)
        ing = Mode(g < 1, g)
        dlv = Mode(False, Fraction(1))
        with Conduit(scfg, schedule=Schedule(ing, dlv), registry=_copy(registry), storage=storage) as edp:
            for k in range(units):
                edp.push(pool[k % len(pool)])
                if cfg.policy is Policy.ON_POLICY and edp.ready():
                    for _ in edp.minibatches():
                        pass
            edp.flush()
            assert edp.ingestion is not None
            out[g] = _timings(edp.ingestion.graph, settings.warmup)
    return out


def measure_delivery(
    cfg: ConduitConfig,
    pool: Sequence[dict[str, torch.Tensor]],
    granularities: Sequence[Fraction],
    *,
    registry: HookRegistry | None = None,
    storage: StoragePolicy | None = None,
    settings: ProfileSettings = ProfileSettings(),
) -> dict[Fraction, float]:
    """Median wall time of one delivery invocation at each granularity."""
    out: dict[Fraction, float] = {}
    bps = sum(int(v[0].numel() * v.element_size()) for v in pool[0].values())
    for g in granularities:
        scfg = _scratch_config(cfg, bps, settings, 0)
        dlv = Mode(g < 1, g)
        schedule = Schedule(Mode(False, Fraction(1)), dlv)
        with Conduit(scfg, schedule=schedule, registry=_copy(registry), storage=storage) as edp:
            invocations = settings.warmup + settings.repeats
            if cfg.policy is Policy.OFF_POLICY:
                assert scfg.capacity is not None
                k = 0
                while edp.stats().ingested_rows < scfg.capacity:
                    edp.push(pool[k % len(pool)])
                    k += 1
                for _ in range(invocations * int(g)):
                    edp.pull()
            else:
                k = 0
                assert edp.delivery is not None
                while edp.delivery.graph.invocations < invocations:
                    while not edp.ready():
                        edp.push(pool[k % len(pool)])
                        k += 1
                    for _ in edp.minibatches():
                        pass
            assert edp.delivery is not None
            out[g] = _timings(edp.delivery.graph, settings.warmup)
    return out


def _copy(registry: HookRegistry | None) -> HookRegistry | None:
    """A fresh registry with the same hooks (a started runtime freezes its registry)."""
    if registry is None:
        return None
    fresh = HookRegistry()
    fresh._hooks = dict(registry._hooks)
    return fresh


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
    (``Costs.s_ing`` / ``s_del``, floored at 0): the line serves only the
    granularities left unprobed.
    """
    bare = replace(
        costs, t_other=0.0, t_sync_ing=0.0, t_sync_del=0.0, t_sync0_ing=0.0, t_sync0_del=0.0, s_ing={}, s_del={},
        s_both=0.0,
    )
    base = replace(bare, t_other=measured["base"] - predict(bare, probes["base"]).t_iter)
    # what each overlapped probe measured beyond the model without overlap costs
    excess = {name: measured[name] - predict(base, s).t_iter for name, s in probes.items() if name in measured}
    fitted: dict[str, Any] = {}
    for path, field_ in (("ingestion", "ing"), ("delivery", "del")):

        def g_of(name: str, path: str = path) -> Fraction:
            return probes[name].ingestion.granularity if path == "ingestion" else probes[name].delivery.granularity

        invocations = base.ingestion_invocations if path == "ingestion" else base.delivery_invocations
        points = [(invocations(g_of(name)), excess[name]) for name in (path, f"{path}_coarse") if name in excess]
        if len(points) == 1 or (len(points) == 2 and points[0][0] == points[1][0]):
            fitted[f"t_sync_{field_}"] = points[0][1] / points[0][0]
        elif len(points) == 2:
            fitted[f"t_sync_{field_}"], fitted[f"t_sync0_{field_}"] = _fit_line(points)
        fitted[f"s_{field_}"] = {
            g_of(name): max(0.0, e)
            for name, e in excess.items()
            if name in (path, f"{path}_coarse") or name.startswith(f"{path}@")
        }
    single = replace(base, **fitted)
    if "both" in measured and "both" in probes:
        fitted["s_both"] = measured["both"] - predict(single, probes["both"]).t_iter
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
    return 0.0, (e1 + e2) / 2


def calibrate(
    workload: SyntheticWorkload,
    costs: Costs,
    settings: ProfileSettings = ProfileSettings(),
    progress: Progress | None = None,
    g_max: int = 1,
) -> tuple[Costs, dict[str, float]]:
    """Fit ``t_other`` and the sync terms per path from short runs of the synthetic loop.

    Rollout and update are timed alone again after every round, and the medians
    (with ``costs``' own measurement) replace ``costs``' before the fit: ``t_other``
    is what the loop costs beyond them, and on a host whose speed moves within
    seconds a measurement taken before the rounds would fold the drift into it.
    """
    pool = workload.units()
    probes = probe_schedules(workload.policy, workload.num_minibatches, g_max, every=settings.probe_every_granularity)
    alone = [(costs.t_rollout, costs.t_update)]
    by_schedule = interleaved_medians(
        workload, list(dict.fromkeys(probes.values())), settings.calibration_rounds, settings.loop_iterations,
        settings.loop_warmup, pool=pool, progress=progress, label="calibrating ",
        between=lambda: alone.append(standalone_costs(workload)),
    )
    costs = replace(
        costs, t_rollout=statistics.median(a for a, _ in alone), t_update=statistics.median(b for _, b in alone)
    )
    measured = {name: by_schedule[s] for name, s in probes.items()}
    fitted = fit_sync(costs, measured, probes)
    return fitted, {f"t_iter_{k}": v for k, v in measured.items()} | {"t_other": fitted.t_other}


def profile_workload(
    workload: SyntheticWorkload,
    *,
    settings: ProfileSettings = ProfileSettings(),
    g_max: int = 4,
    progress: Progress | None = None,
) -> ProfileResult:
    """Profile the synthetic workload end to end: rollout/update, T_ing(g), T_del(g), T_sync."""
    t0 = time.perf_counter()
    cfg = workload.config(g_max=g_max)
    pool = workload.units()
    if progress:
        progress("rollout and update alone")
    t_rollout, t_update = standalone_costs(workload)
    if progress:
        progress("ingestion granularities")
    t_ing = measure_ingestion(cfg, pool, cfg.ingestion_space, settings=settings)
    if progress:
        progress("delivery granularities")
    t_del = measure_delivery(cfg, pool, cfg.delivery_space, settings=settings)
    costs = Costs(
        policy=workload.policy, t_rollout=t_rollout, t_update=t_update, t_ing=t_ing, t_del=t_del,
        units_per_iteration=workload.units_per_iteration, num_minibatches=workload.num_minibatches,
        num_epochs=workload.num_epochs,
    )
    costs, calib = calibrate(workload, costs, settings, progress, g_max)
    ranked = rank(costs, feasible_schedules(cfg.policy, cfg.num_minibatches, g_max, g_max))
    top = shortlist(ranked, settings.verify_top)
    baseline = INLINE if settings.verify_top > 0 else None
    if baseline is not None and baseline not in top:
        top.append(baseline)  # a plan must beat what the user runs without one (settle)
    level = costs.t_rollout + costs.t_update  # one level for the shortlist's times and the rematch's
    verified = {}
    if len(top) > 1:
        verified = verify(workload, top, settings=settings, progress=progress, pool=pool, level=level)
    verified = rematch(
        workload, ranked, verified, settings=settings, progress=progress, pool=pool, baseline=baseline, level=level
    )
    return ProfileResult(costs, calib, time.perf_counter() - t0, ranked, verified, settings.verify_margin)


def settle(ranked: Sequence[Prediction], verified: Mapping[Schedule, float], margin: float = 0.03) -> Prediction:
    """The plan from the model's ranking and the shortlist's measurements (pure; ``ranked`` best first).

    Schedules measured within ``margin`` of the fastest measured are ties — a
    difference that small is inside the noise of a few short runs on a shared
    machine. Of those the plan is the finest (:func:`~conduit.scheduling.model.coarseness`:
    least grouping, so least staleness), then an all-inline schedule (a
    schedule that buys nothing measurable still costs a worker: the inline
    schedule, when measured, stays unless a plan beats it by more than
    ``margin``), then the model's order, which knows what overlapping each path
    costs. (The rule before kept the model's own minimum on any tie; the model,
    blind to overlap costs that vary with ``g`` below its probes' noise, then
    kept coarse schedules measured 4-11% slower than overlap at ``g = 1`` in the
    synthetic benchmark. A rule that preferred fewer workers before the model's
    order exposed the ingestion the overlapped schedule would have hidden.)
    """
    if not verified:
        return ranked[0]
    fastest = min(verified.values())
    # measured times are levels plus what each run took beyond the costs alone around it, which noise can
    # take to zero or below with tiny costs; the margin is of the fastest's size, so such a time ties itself
    limit = fastest + abs(fastest) * margin
    tied = [p for p in ranked if p.schedule in verified and verified[p.schedule] <= limit]

    def order(p: Prediction) -> tuple[Fraction, bool]:
        return coarseness(p.schedule), p.schedule.ingestion.overlap or p.schedule.delivery.overlap

    return min(tied, key=order)  # min keeps the first of equals: the model's order


def rematch(
    workload: SyntheticWorkload,
    ranked: Sequence[Prediction],
    verified: Mapping[Schedule, float],
    *,
    settings: ProfileSettings = ProfileSettings(),
    progress: Progress | None = None,
    pool: list[dict[str, torch.Tensor]] | None = None,
    baseline: Schedule | None = None,
    level: float | None = None,
) -> dict[Schedule, float]:
    """``verified`` with fresh times for the plan :func:`settle` picks, and for what it beat, until they agree.

    The fastest of several schedules measured in a few short runs is, among
    near-equals, the luckiest (the winner's curse): ``conduit profile``, two
    rounds, chose a schedule its model put 0.85 ms behind inline and its own
    check then measured 12% slower than inline (+102% exposed latency) in one
    of two runs here, as it had before (+196% in one of two runs). The model's
    own minimum is no exception: on-policy, a plan that was the model's minimum
    and had beaten inline by more than the margin in two rounds measured 8%
    slower than inline in the closing check (+85% exposed latency). So a plan
    other than the ``baseline`` (without one: other than the model's minimum)
    meets both again in ``verify_rounds`` fresh interleaved rounds, whose times
    replace the first ones; repeated while another schedule would take its place.
    """
    out = dict(verified)
    if not out or not ranked:
        return out
    own = ranked[0].schedule
    anchor = own if baseline is None else baseline  # what a plan must beat once more to be kept
    rematched: set[Schedule] = set()
    while True:
        plan = settle(ranked, out, settings.verify_margin).schedule
        if plan == anchor or plan in rematched:
            return out
        rematched.add(plan)
        pool = workload.units() if pool is None else pool
        out.update(
            interleaved_medians(
                workload, list(dict.fromkeys(s for s in (baseline, own, plan) if s is not None)),
                settings.verify_rounds, settings.loop_iterations, settings.loop_warmup,
                pool=pool, progress=progress, label="rematch ", bracket_repeats=settings.bracket_repeats, level=level,
            )
        )


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


def verify(
    workload: SyntheticWorkload,
    schedules: Sequence[Schedule],
    *,
    settings: ProfileSettings = ProfileSettings(),
    progress: Progress | None = None,
    pool: list[dict[str, torch.Tensor]] | None = None,
    level: float | None = None,
) -> dict[Schedule, float]:
    """Median ``T_iter`` of each schedule on the real loop, ``verify_rounds`` interleaved rounds, each run judged
    against rollout and update timed alone around it (``settings.bracket_repeats``; ``level``: see
    :func:`interleaved_medians`)."""
    pool = workload.units() if pool is None else pool
    return interleaved_medians(
        workload, schedules, settings.verify_rounds, settings.loop_iterations, settings.loop_warmup,
        pool=pool, progress=progress, label="verifying ", bracket_repeats=settings.bracket_repeats, level=level,
    )


def interleaved_medians(
    workload: SyntheticWorkload,
    schedules: Sequence[Schedule],
    rounds: int,
    iterations: int,
    warmup: int,
    *,
    pool: list[dict[str, torch.Tensor]],
    progress: Progress | None = None,
    label: str = "",
    between: Callable[[], object] | None = None,
    bracket_repeats: int = 0,
    level: float | None = None,
) -> dict[Schedule, float]:
    """``T_iter`` of each schedule: the median over ``rounds`` interleaved runs of the loop of each run's
    steady time per iteration (:attr:`~conduit.synthetic.LoopResult.steady`: whole periods, not the median iteration).

    The order alternates from round to round, so slow drift of the machine (a
    neighbour's job starting) does not favour whichever runs first, and one
    burst of load lands on no schedule twice. ``between`` runs after each round
    (a measurement that must see the same drift, such as the costs alone).

    With ``bracket_repeats``, rollout and update are also timed alone right
    before the first run and after each, and a run counts as ``level`` (default:
    the median of those alone times) plus what it took beyond the mean of the
    two around it (:func:`~conduit.synthetic.bracketed_exposed`). This host's
    speed moves within seconds by more than the differences ranked here: in one
    profile at dim 1,000 the loop's rollout and update alone took 15 ms for a
    10 ms workload, raw times ranked inline first, and the overlapped schedule
    then exposed 87% less than inline in the same slow state.
    """
    bracket = bracket_repeats > 0
    runs: list[tuple[Schedule, float]] = []
    alone = [sum(standalone_costs(workload, bracket_repeats))] if bracket else []
    for r in range(max(1, rounds)):
        for s in schedules if r % 2 == 0 else list(reversed(schedules)):
            if progress:
                progress(f"{label}{s}")
            runs.append((s, run_loop(workload, s, iterations, warmup, pool=pool).steady))
            if bracket:
                alone.append(sum(standalone_costs(workload, bracket_repeats)))
        if between is not None:
            between()
    if not bracket:
        return {s: statistics.median(t for x, t in runs if x == s) for s in schedules}
    base = statistics.median(alone) if level is None else level
    return {s: base + statistics.median(v) for s, v in bracketed_exposed(runs, alone).items()}
