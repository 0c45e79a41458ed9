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

- **A moving host**: other processes' CPU load is read from ``/proc/stat``
  before the profile starts (:mod:`conduit.scheduling.host`); on a busy host
  the profile waits a bounded time for it to quieten, then runs more
  verification rounds; rollout and update timed alone between calibration
  rounds show a host whose speed moves, with the same response. What it did
  is in :attr:`ProfileResult.notes`.
- **Physically meaningful**: every fitted cost is non-negative and an overlap
  costs at most the work it overlaps (:mod:`conduit.scheduling.fit`); each
  measured time is a :class:`~conduit.scheduling.noise.Spread`, and a plan is
  kept over inline only when it beats inline by more than that noise
  (:func:`~conduit.scheduling.fit.settle`).

Everything is bounded: a handful of invocations per granularity, a few dozen
loop iterations per run, and, with ``ProfileSettings.budget_s``, a hard time
budget: no run starts that the budget cannot afford (the plan is then decided
on what was measured, inline unless something measurably beat it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from conduit.core import INLINE, Schedule, feasible_schedules
from conduit.scheduling.fit import fit_sync, probe_schedules, settle, shortlist
from conduit.scheduling.host import Deadline
from conduit.scheduling.measure import MeasureSettings
from conduit.scheduling.model import Costs, Prediction, rank
from conduit.scheduling.noise import Spread
from conduit.scheduling.source import CostSource, LiveSource
from conduit.scheduling.workload import DRIFT, SyntheticWorkload, bracketed_exposed

__all__ = [
    "ProfileResult",
    "ProfileSettings",
    "calibrate",
    "interleaved",
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
    #: is judged against the two (see interleaved); 0 judges raw times
    bracket_repeats: int = 7
    scratch_bytes: int = 256 << 20  # scratch replay buffers hold at most this much
    #: a hard time budget for the whole profile (seconds; None: unbounded): no run starts that it cannot afford
    budget_s: float | None = None
    #: other processes' CPU load (a fraction of the host's CPUs) above which the host counts as busy
    busy_load: float = 0.2
    #: on a busy host: wait at most this long (and at most a tenth of the budget) for it to quieten
    busy_wait_s: float = 10.0
    #: on a busy or moving host: this many more verification rounds (as far as the budget affords)
    busy_rounds: int = 3

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
    #: each verified schedule's runs: median, lowest, highest
    spreads: dict[Schedule, Spread] = field(default_factory=dict)
    #: what the profile noticed about the host and did about it (busy, moving, out of budget), in words
    notes: tuple[str, ...] = ()
    #: other processes' CPU load when the profile started (None: unknown on this OS)
    load: float | None = None
    #: the plan when verification was asked for but the budget ran out before inline was measured: inline
    #: (a plan is never kept over inline without a measurement that says it is faster)
    unverified: Schedule | None = None

    @property
    def model_choice(self) -> Prediction:
        """Eq. 2's answer: the model's minimum."""
        return self.ranked[0]

    @property
    def choice(self) -> Prediction:
        """The plan: :func:`settle` over the verified shortlist, else the model's minimum (or :attr:`unverified`)."""
        if self.unverified is not None and self.unverified not in self.verified:
            return next(p for p in self.ranked if p.schedule == self.unverified)
        return settle(self.ranked, self.verified, self.margin, self.spreads)


class _Log:
    """Notes in words, each once."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def __call__(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)


def calibrate(
    source: CostSource,
    workload: SyntheticWorkload,
    costs: Costs,
    settings: ProfileSettings = ProfileSettings(),
    progress: Progress | None = None,
    g_max: int = 1,
    deadline: Deadline | None = None,
    note: Callable[[str], None] | None = None,
) -> tuple[Costs, dict[str, float]]:
    """Fit ``t_other`` and the sync terms per path from short runs of the synthetic loop.

    Rollout and update are timed alone again after every round, and the medians
    (with ``costs``' own measurement) replace ``costs``' before the fit: ``t_other``
    is what the loop costs beyond them, and on a host whose speed moves within
    seconds a measurement taken before the rounds would fold the drift into it.
    With ``settings.bracket_repeats``, each run is also judged against rollout and
    update timed alone right around it (:func:`interleaved`), as verification does.
    Alone costs that move by more than :data:`~conduit.scheduling.workload.DRIFT`
    between rounds are noted (``calibration["moving"] = 1``). Without the all-inline
    run (out of budget) nothing is fitted: every sync term stays 0.
    """
    probes = probe_schedules(workload.policy, workload.num_minibatches, g_max, every=settings.probe_every_granularity)
    alone = [(costs.t_rollout, costs.t_update)]
    by_schedule = interleaved(
        source, list(dict.fromkeys(probes.values())), settings.calibration_rounds, settings.loop_iterations,
        settings.loop_warmup, progress=progress, label="calibrating ",
        between=lambda: alone.append(source.alone(15)), deadline=deadline, note=note,
        bracket_repeats=settings.bracket_repeats, level=0.0 if settings.bracket_repeats > 0 else None,
    )
    costs = replace(
        costs, t_rollout=statistics.median(a for a, _ in alone), t_update=statistics.median(b for _, b in alone)
    )
    if settings.bracket_repeats > 0:  # each run's excess over the costs alone around it, on the costs' level
        level = costs.t_rollout + costs.t_update
        by_schedule = {s: v.shifted(level) for s, v in by_schedule.items()}
    sums = Spread.of(a + b for a, b in alone)
    moving = sums.median > 0 and (sums.high - sums.low) / sums.median > DRIFT
    if moving and note is not None:
        note(
            f"the host's speed moved while it was profiled: rollout + update alone ranged "
            f"{sums.low * 1e3:.3f}-{sums.high * 1e3:.3f} ms between calibration rounds"
        )
    measured = {name: by_schedule[s].median for name, s in probes.items() if s in by_schedule}
    if "base" not in measured:
        return costs, {"moving": float(moving)}
    fitted = fit_sync(costs, measured, {n: s for n, s in probes.items() if n in measured})
    return fitted, {f"t_iter_{k}": v for k, v in measured.items()} | {"t_other": fitted.t_other, "moving": moving}


def planned_steps(workload: SyntheticWorkload, settings: ProfileSettings = ProfileSettings(), g_max: int = 4) -> int:
    """How many progress steps :func:`profile_workload` reports, before any rematch (which adds its own)."""
    probes = probe_schedules(workload.policy, workload.num_minibatches, g_max, every=settings.probe_every_granularity)
    calibration = len(set(probes.values())) * max(1, settings.calibration_rounds)
    verification = (settings.verify_top + 1) * max(1, settings.verify_rounds) if settings.verify_top > 0 else 0
    return 4 + calibration + verification


def quieten(
    source: CostSource, settings: ProfileSettings, deadline: Deadline, note: Callable[[str], None]
) -> float | None:
    """Other processes' CPU load now; on a busy host, wait (bounded) for it to drop, and say what happened."""
    source.wait(0.2)  # a reading needs time to pass
    load = source.load()
    if load is None:
        note("other processes' CPU load is unknown here (no /proc/stat): profiled as on a quiet host")
        return None
    if load <= settings.busy_load:
        return load
    waited, limit = 0.0, min(settings.busy_wait_s, deadline.left / 10)
    first = load
    while load is not None and load > settings.busy_load and waited + 1.0 <= limit:
        source.wait(1.0)
        waited += 1.0
        load = source.load()
    if load is not None and load <= settings.busy_load:
        note(f"other processes kept {first:.0%} of the CPUs busy; waited {waited:.0f} s until they used {load:.0%}")
    else:
        note(
            f"other processes keep {first:.0%} of the CPUs busy (waited {waited:.0f} s, they did not stop): "
            f"more verification rounds, interleaved, each run judged against rollout and update timed beside it"
        )
    return load


def profile_workload(
    workload: SyntheticWorkload,
    *,
    settings: ProfileSettings = ProfileSettings(),
    g_max: int = 4,
    progress: Progress | None = None,
    expect: Callable[[int], None] | None = None,
    source: CostSource | None = None,
) -> ProfileResult:
    """Profile the synthetic workload end to end: rollout/update, T_ing(g), T_del(g), T_sync, then verify.

    ``progress(what)`` is told each step as it starts; ``expect(n)``, once the shortlist is known, how
    many steps are left (rematches, which depend on what is measured, add their own). ``source``: where the
    measurements come from (default: the live loop on this host).
    """
    cfg = workload.config(g_max=g_max)
    source = LiveSource(workload, settings.measure, g_max) if source is None else source
    deadline = Deadline(math.inf if settings.budget_s is None else settings.budget_s, source.now)
    note = _Log()
    if progress:
        progress("reading the host's load")
    load = quieten(source, settings, deadline, note)
    busy = load is not None and load > settings.busy_load
    if progress:
        progress("rollout and update alone")
    t_rollout, t_update = source.alone(15)
    if progress:
        progress("ingestion granularities")
    t_ing = source.ingestion(cfg.ingestion_space)
    if progress:
        progress("delivery granularities")
    t_del = source.delivery(cfg.delivery_space)
    costs = Costs(
        policy=workload.policy, t_rollout=t_rollout, t_update=t_update, t_ing=t_ing, t_del=t_del,
        units_per_iteration=workload.units_per_iteration, num_minibatches=workload.num_minibatches,
        num_epochs=workload.num_epochs,
    )
    costs, calib = calibrate(source, workload, costs, settings, progress, g_max, deadline.share(0.5), note)
    if calib.get("moving"):
        busy = True
    ranked = rank(costs, feasible_schedules(cfg.policy, cfg.num_minibatches, g_max, g_max))
    top = shortlist(ranked, settings.verify_top)
    baseline = INLINE if settings.verify_top > 0 else None
    if baseline is not None:
        top = [baseline, *(s for s in top if s != baseline)]  # measured first: a plan must beat it (settle)
    rounds = settings.verify_rounds + (settings.busy_rounds if busy else 0)
    level = costs.t_rollout + costs.t_update  # one level for the shortlist's times and the rematch's
    if expect is not None:
        expect(len(top) * max(1, rounds) if len(top) > 1 else 0)
    spreads: dict[Schedule, Spread] = {}
    if len(top) > 1:
        spreads = verify(
            source, top, settings=replace(settings, verify_rounds=rounds), progress=progress, level=level,
            deadline=deadline, note=note,
        )
    spreads = rematch(
        source, ranked, spreads, settings=replace(settings, verify_rounds=rounds), progress=progress,
        baseline=baseline, level=level, deadline=deadline, note=note,
    )
    verified = {s: v.median for s, v in spreads.items()}
    result = ProfileResult(
        costs, calib, deadline.spent, ranked, verified, settings.verify_margin, spreads, tuple(note.notes), load,
        unverified=baseline,
    )
    inline_kept = baseline is not None and baseline in spreads and result.choice.schedule == baseline
    if inline_kept and ranked[0].schedule != baseline:
        note("the plan is inline: no candidate beat it by more than the noise its runs showed")
        result = replace(result, notes=tuple(note.notes))
    return result


def rematch(
    source: CostSource,
    ranked: Sequence[Prediction],
    verified: Mapping[Schedule, Spread],
    *,
    settings: ProfileSettings = ProfileSettings(),
    progress: Progress | None = None,
    baseline: Schedule | None = None,
    level: float | None = None,
    deadline: Deadline | None = None,
    note: Callable[[str], None] | None = None,
) -> dict[Schedule, Spread]:
    """``verified`` with fresh times for the plan :func:`settle` picks, and for what it beat, until they agree.

    The fastest of several schedules measured in a few short runs is, among
    near-equals, the luckiest (the winner's curse), and the model's own minimum
    is no exception. So a plan other than the ``baseline`` (without one: other
    than the model's minimum) meets both again in ``verify_rounds`` fresh
    interleaved rounds, whose times replace the first ones; repeated while
    another schedule would take its place. Out of budget, the first times stand.
    """
    out = dict(verified)
    if not out or not ranked:
        return out
    own = ranked[0].schedule
    anchor = own if baseline is None else baseline  # what a plan must beat once more to be kept
    rematched: set[Schedule] = set()
    while True:
        medians = {s: v.median for s, v in out.items()}
        plan = settle(ranked, medians, settings.verify_margin, out).schedule
        if plan == anchor or plan in rematched:
            return out
        rematched.add(plan)
        fresh = interleaved(
            source, list(dict.fromkeys(s for s in (baseline, own, plan) if s is not None)),
            settings.verify_rounds, settings.loop_iterations, settings.loop_warmup,
            progress=progress, label="rematch ", bracket_repeats=settings.bracket_repeats, level=level,
            deadline=deadline, note=note,
        )
        if set(fresh) != {s for s in (baseline, own, plan) if s is not None}:
            return out  # the budget ran out mid-match: what was measured in full stands
        out.update(fresh)


def verify(
    source: CostSource,
    schedules: Sequence[Schedule],
    *,
    settings: ProfileSettings = ProfileSettings(),
    progress: Progress | None = None,
    level: float | None = None,
    deadline: Deadline | None = None,
    note: Callable[[str], None] | None = None,
) -> dict[Schedule, Spread]:
    """``T_iter`` of each schedule on the real loop, ``verify_rounds`` interleaved rounds, each run judged
    against rollout and update timed alone around it (``settings.bracket_repeats``; ``level``: see
    :func:`interleaved`)."""
    return interleaved(
        source, schedules, settings.verify_rounds, settings.loop_iterations, settings.loop_warmup,
        progress=progress, label="verifying ", bracket_repeats=settings.bracket_repeats, level=level,
        deadline=deadline, note=note,
    )


def interleaved(
    source: CostSource,
    schedules: Sequence[Schedule],
    rounds: int,
    iterations: int,
    warmup: int,
    *,
    progress: Progress | None = None,
    label: str = "",
    between: Callable[[], object] | None = None,
    bracket_repeats: int = 0,
    level: float | None = None,
    deadline: Deadline | None = None,
    note: Callable[[str], None] | None = None,
) -> dict[Schedule, Spread]:
    """``T_iter`` of each schedule over ``rounds`` interleaved runs of the loop: the median, lowest and highest
    run (each run's steady time per iteration: whole periods, not the median iteration).

    The order alternates from round to round, so slow drift of the machine (a
    neighbour's job starting) does not favour whichever runs first, and one
    burst of load lands on no schedule twice. ``between`` runs after each round
    (a measurement that must see the same drift, such as the costs alone).

    With ``bracket_repeats``, rollout and update are also timed alone right
    before the first run and after each, and a run counts as ``level`` (default:
    the median of those alone times) plus what it took beyond the mean of the
    two around it (:func:`~conduit.scheduling.workload.bracketed_exposed`),
    never less than ``level``: a shared host's speed moves within seconds by more
    than the differences ranked here, so raw times would rank the host's state, not the schedules.

    With a ``deadline``, a run starts only when the longest run it has seen (:meth:`Deadline.record`) still
    fits; a schedule with no run is left out of the result, and ``note`` is told.
    """
    bracket = bracket_repeats > 0
    runs: list[tuple[Schedule, float]] = []
    alone = [sum(source.alone(bracket_repeats))] if bracket else []
    stopped = False
    for r in range(max(1, rounds)):
        for s in schedules if r % 2 == 0 else list(reversed(schedules)):
            if deadline is not None and not deadline.affords():
                stopped = True
                break
            if progress:
                progress(f"{label}{s}")
            t0 = source.now()
            runs.append((s, source.loop(s, iterations, warmup)))
            if bracket:
                alone.append(sum(source.alone(bracket_repeats)))
            if deadline is not None:
                deadline.record(source.now() - t0)
        if stopped:
            break
        if between is not None:
            between()
    if stopped and note is not None:
        note(f"the time budget ran out while {label.strip() or 'measuring'}: decided on the runs it allowed")
    if not bracket:
        return {s: Spread.of(t for x, t in runs if x == s) for s in schedules if any(x == s for x, _ in runs)}
    base = statistics.median(alone) if level is None else level
    return {s: Spread.of((base + e for e in v), floor=base) for s, v in bracketed_exposed(runs, alone).items()}


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
    """:func:`interleaved` on the live loop of ``workload``, medians only (the benchmarks' sweeps)."""
    source = LiveSource(workload, pool=pool)
    spreads = interleaved(
        source, schedules, rounds, iterations, warmup, progress=progress, label=label, between=between,
        bracket_repeats=bracket_repeats, level=level,
    )
    return {s: v.median for s, v in spreads.items()}
