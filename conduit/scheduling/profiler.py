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

import torch

from conduit.core import INLINE, Schedule, feasible_schedules
from conduit.scheduling.fit import fit_sync, probe_schedules, settle, shortlist
from conduit.scheduling.measure import MeasureSettings, measure_delivery, measure_ingestion
from conduit.scheduling.model import Costs, Prediction, rank
from conduit.scheduling.workload import SyntheticWorkload, bracketed_exposed, run_loop, standalone_costs

__all__ = [
    "ProfileResult",
    "ProfileSettings",
    "calibrate",
    "interleaved_medians",
    "planned_steps",
    "profile_workload",
    "rematch",
    "verify",
]

Progress = Callable[[str], None]


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

    @property
    def measure(self) -> MeasureSettings:
        """What the invocation measurements take of these settings."""
        return MeasureSettings(self.warmup, self.repeats, self.scratch_bytes)

    @classmethod
    def thorough(cls) -> ProfileSettings:
        """For runs that may take minutes (the benchmarks' validation sweep and synthetic loop).

        More rounds where single short runs decide: the shortlist's candidates are
        often as close to each other as one run's noise on a shared machine.
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


def planned_steps(workload: SyntheticWorkload, settings: ProfileSettings = ProfileSettings(), g_max: int = 4) -> int:
    """How many progress steps :func:`profile_workload` reports, before any rematch (which adds its own)."""
    probes = probe_schedules(workload.policy, workload.num_minibatches, g_max, every=settings.probe_every_granularity)
    calibration = len(set(probes.values())) * max(1, settings.calibration_rounds)
    verification = (settings.verify_top + 1) * max(1, settings.verify_rounds) if settings.verify_top > 0 else 0
    return 3 + calibration + verification


def profile_workload(
    workload: SyntheticWorkload,
    *,
    settings: ProfileSettings = ProfileSettings(),
    g_max: int = 4,
    progress: Progress | None = None,
    expect: Callable[[int], None] | None = None,
) -> ProfileResult:
    """Profile the synthetic workload end to end: rollout/update, T_ing(g), T_del(g), T_sync.

    ``progress(what)`` is told each step as it starts; ``expect(n)``, once the shortlist is known, how
    many steps are left (rematches, which depend on what is measured, add their own).
    """
    t0 = time.perf_counter()
    cfg = workload.config(g_max=g_max)
    pool = workload.units()
    if progress:
        progress("rollout and update alone")
    t_rollout, t_update = standalone_costs(workload)
    if progress:
        progress("ingestion granularities")
    t_ing = measure_ingestion(cfg, pool, cfg.ingestion_space, settings=settings.measure)
    if progress:
        progress("delivery granularities")
    t_del = measure_delivery(cfg, pool, cfg.delivery_space, settings=settings.measure)
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
    if expect is not None:
        expect(len(top) * max(1, settings.verify_rounds) if len(top) > 1 else 0)
    verified = {}
    if len(top) > 1:
        verified = verify(workload, top, settings=settings, progress=progress, pool=pool, level=level)
    verified = rematch(
        workload, ranked, verified, settings=settings, progress=progress, pool=pool, baseline=baseline, level=level
    )
    return ProfileResult(costs, calib, time.perf_counter() - t0, ranked, verified, settings.verify_margin)


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
    near-equals, the luckiest (the winner's curse), and the model's own minimum
    is no exception. So a plan other than the ``baseline`` (without one: other
    than the model's minimum) meets both again in ``verify_rounds`` fresh
    interleaved rounds, whose times replace the first ones; repeated while
    another schedule would take its place.
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
    steady time per iteration (:attr:`~conduit.scheduling.workload.LoopResult.steady`: whole periods, not the
    median iteration).

    The order alternates from round to round, so slow drift of the machine (a
    neighbour's job starting) does not favour whichever runs first, and one
    burst of load lands on no schedule twice. ``between`` runs after each round
    (a measurement that must see the same drift, such as the costs alone).

    With ``bracket_repeats``, rollout and update are also timed alone right
    before the first run and after each, and a run counts as ``level`` (default:
    the median of those alone times) plus what it took beyond the mean of the
    two around it (:func:`~conduit.scheduling.workload.bracketed_exposed`). A shared
    host's speed moves within seconds by more than the differences ranked here,
    so raw times would rank the host's state, not the schedules.
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

