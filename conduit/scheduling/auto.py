"""The automatic planner: chooses a running runtime's schedule from its own loop.

Attach it to a runtime and keep training; it never changes what the learner
receives, only when and at what granularity ingestion and delivery run::

    edp = conduit.Conduit(config)
    planner = AutoPlanner(edp)
    with edp:
        for it in range(iterations):
            with edp.phase("rollout"):
                unit = rollout()
            edp.push(unit)
            batch = edp.pull()
            with edp.phase("update"):
                update(batch)

It moves through four phases, at iteration boundaries (each pull off-policy,
the last mini-batch of an iteration on-policy), in the caller's thread:

1. **observe** — ``observe`` iterations under the current schedule: iteration
   times, and ``T_rollout`` / ``T_update`` from ``edp.phase`` annotations (without
   them, the time outside Conduit is split evenly between the two, an assumption
   the model needs only for its hide terms); a copy of two pushed units.
2. **profile and probe** — ``T_ing(g)`` / ``T_del(g)`` of the registered graphs on
   scratch runtimes fed the captured units (:mod:`~conduit.scheduling.profiler`),
   then ``probe`` live iterations each of all-inline and of each path overlapped,
   which fit ``t_other`` and ``T_sync`` (:func:`~conduit.scheduling.profiler.fit_sync`).
   A probe's figure is its time per iteration over whole periods of the probed
   schedule (:mod:`~conduit.scheduling.steady`), never the median iteration,
   which drops the bursts of a coarse granularity.
3. **verify** — Eq. 2 ranks every feasible schedule; the model's ``verify``
   best and each overlap family's best and finest (``profiler.shortlist``;
   those not measured already as probes) run ``probe`` live iterations each,
   and the plan is the finest of those measured within the margin of the fastest, then
   inline, then the model's pick (``profiler.settle``): the model prunes dozens
   of candidates, measurement settles the few within its error.
   The inline schedule was measured as the all-inline probe: the plan must beat
   it by more than the noise of the two measurements (the spread of their
   periods; :func:`~conduit.scheduling.noise.beats`), or the plan is inline.
4. **run** — the runtime is rescheduled to the plan. The planner re-plans when the buffer migrated (the per-sample
   size changed) or, checked every ``window`` iterations, the iteration time moved
   from what the plan measured live by more than ``drift`` and more than the noise
   of the two; while it re-observes, the runtime runs inline (the gain it planned
   for may have gone with the drift), and the new plan must beat inline again.

Every live measurement, and the watch, is the one live planner's
(:class:`~conduit.scheduling.planner.LivePlanner`, which a sharded group's delivery
decides by too): this module adds what only one process has, the profile of its
registered graphs and the model that turns it into the few schedules worth measuring.

Designed for one training loop driving the runtime (one actor and one learner
thread); with several, drive ``Conduit.reschedule`` from a profile instead.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from conduit.core import INLINE, Policy, Schedule, feasible_schedules
from conduit.runtime import Conduit
from conduit.scheduling.fit import fit_sync, probe_schedules, settle, shortlist
from conduit.scheduling.measure import MeasureSettings, measure_delivery, measure_ingestion
from conduit.scheduling.model import Costs, Prediction, rank
from conduit.scheduling.noise import Spread
from conduit.scheduling.planner import LivePlanner, group_spread, spreads_of
from conduit.scheduling.steady import period
from conduit.storage.policy import FixedStorage

__all__ = ["AutoPlanner", "PlanEvent"]

log = logging.getLogger("conduit")


class Phase(str, Enum):
    OBSERVE = "observe"
    PROBE = "probe"
    VERIFY = "verify"
    RUN = "run"


@dataclass(frozen=True)
class PlanEvent:
    """One decision of the planner (``history`` keeps them all)."""

    iteration: int
    reason: str
    schedule: Schedule
    prediction: Prediction | None = None
    costs: Costs | None = None


@dataclass
class _Window:
    t_iter: list[float] = field(default_factory=list)
    outside: list[float] = field(default_factory=list)
    rollout: list[float] = field(default_factory=list)
    update: list[float] = field(default_factory=list)


class AutoPlanner:
    """Observes a runtime's loop, profiles, probes, and reschedules it (see the module docstring)."""

    def __init__(
        self,
        runtime: Conduit,
        *,
        observe: int = 10,
        probe: int = 8,
        window: int = 32,
        drift: float = 0.25,
        verify: int = 3,
        settings: MeasureSettings = MeasureSettings(warmup=1, repeats=5),
    ) -> None:
        self.rt = runtime
        self.observe_n = observe
        self.probe_n = probe
        self.window = window
        self.drift = drift
        self.verify_n = verify
        self.settings = settings
        self.phase = Phase.OBSERVE
        self.iteration = 0
        self.history: list[PlanEvent] = []
        self.costs: Costs | None = None
        self.prediction: Prediction | None = None
        #: what measures the schedules live, decides between them and watches the plan (one at a time)
        self.live: LivePlanner[Schedule] | None = None
        self._win = _Window()
        self._pool: list[dict[str, torch.Tensor]] = []
        self._boundary: float | None = None
        self._inside = 0.0  # seconds inside push/pull since the last boundary
        self._phases = {"rollout": 0.0, "update": 0.0}
        self._probes: dict[str, Schedule] = {}
        self._measured: dict[str, float] = {}
        self._ranked: list[Prediction] = []
        self.verified: dict[Schedule, float] = {}
        #: each schedule run live (probes and verification): its time per iteration, and the range over its periods
        self.spreads: dict[Schedule, Spread] = {}
        self._migrations = 0
        runtime.observers.append(self)

    # -- observer protocol (called by the runtime in the caller's thread) ---------
    def on_push(self, data: Any, t0: float, t1: float) -> None:
        self._inside += t1 - t0
        if self.phase is Phase.OBSERVE and len(self._pool) < 2:
            self._pool.append({k: torch.as_tensor(v).clone() for k, v in data.items()})

    def on_phase(self, name: str, t0: float, t1: float) -> None:
        if name in self._phases:
            self._phases[name] += t1 - t0

    def on_pull(self, batch: Any, t0: float, t1: float) -> None:
        self._inside += t1 - t0
        if self.rt.config.policy is Policy.ON_POLICY and not batch.info.last:
            return
        if self._boundary is None:  # the first boundary only starts the clock
            self._reset_clock(t1)
            return
        if self.phase is Phase.OBSERVE:
            self._record(t1 - self._boundary)
        self._reset_clock(t1)
        self.iteration += 1
        self._advance(t1)

    def _reset_clock(self, now: float) -> None:
        self._boundary = now
        self._inside = 0.0
        self._phases = {"rollout": 0.0, "update": 0.0}

    def _record(self, t_iter: float) -> None:
        w = self._win
        w.t_iter.append(t_iter)
        w.outside.append(max(0.0, t_iter - self._inside))
        w.rollout.append(self._phases["rollout"])
        w.update.append(self._phases["update"])

    # -- the state machine ----------------------------------------------------------
    def _advance(self, now: float) -> None:
        """At an iteration boundary: observe, or tick the live planner and act on what it says."""
        if self.phase is Phase.OBSERVE:
            if len(self._win.t_iter) >= self.observe_n and self._pool:
                self._profile(now)
            return
        assert self.live is not None
        schedule = self.live.tick(now)
        if self.phase is Phase.RUN:
            self._watch(now)
        elif self.live.deciding:  # every schedule of this round measured
            self._measured_round(now)
        elif schedule != self.rt.schedule:
            self.rt.reschedule(schedule)

    def prober(self, schedules: list[Schedule]) -> LivePlanner[Schedule]:
        """The live planner that measures ``schedules`` on this loop: each for ``_PROBE_SKIP`` unmeasured iterations,
        then windows of one period each, ``probe`` iterations at least; the plan checked every ``window``."""
        return LivePlanner(schedules, period=self._period_of, window=1, span=max(1, self.probe_n - self._PROBE_SKIP),
                           skip=self._PROBE_SKIP, watch_span=self.window, margin=self.MARGIN, drift=self.drift)

    def _trial(self, phase: Phase, schedules: list[Schedule], now: float) -> None:
        """Measure ``schedules`` live, one after another, from this boundary."""
        self.phase = phase
        self.live = self.prober(schedules)
        first = self.live.tick(now)
        if first != self.rt.schedule:
            self.rt.reschedule(first)

    def _measured_round(self, now: float) -> None:
        assert self.live is not None
        got = dict(zip(self.live.keys, spreads_of(self.live.times[None]), strict=True))
        if self.phase is Phase.PROBE:
            for name, schedule in self._probes.items():
                self._measured[name] = got[schedule].median
                self.spreads[schedule] = got[schedule]
            self._rank(now)
        else:
            for schedule, spread in got.items():
                self.verified[schedule] = spread.median
                self.spreads[schedule] = spread
            self._choose(now)

    def _rollout_update(self) -> tuple[float, float]:
        w = self._win
        rollout, update = statistics.median(w.rollout), statistics.median(w.update)
        if rollout == 0.0 and update == 0.0:  # no annotations: split the outside time evenly
            rollout = update = statistics.median(w.outside) / 2
        return rollout, update

    def _profile(self, now: float) -> None:
        rt, cfg = self.rt, self.rt.config
        t_rollout, t_update = self._rollout_update()
        device = self._storage_device()
        common: dict[str, Any] = dict(registry=rt.registry, storage=FixedStorage(device), settings=self.settings)
        t_ing = measure_ingestion(cfg, self._pool, cfg.ingestion_space, **common)
        t_del = measure_delivery(cfg, self._pool, cfg.delivery_space, **common)
        units = max(1, cfg.train_batch_size // _rows(self._pool[0])) if cfg.policy is Policy.ON_POLICY else 1
        self.costs = Costs(
            policy=cfg.policy, t_rollout=t_rollout, t_update=t_update, t_ing=t_ing, t_del=t_del,
            units_per_iteration=units, num_minibatches=cfg.num_minibatches, num_epochs=cfg.num_epochs,
        )
        coarsest = int(min(max(cfg.ingestion_space), max(cfg.delivery_space)))
        self._probes = probe_schedules(cfg.policy, cfg.num_minibatches, coarsest)
        self._measured = {}
        self.spreads = {}
        self._trial(Phase.PROBE, list(dict.fromkeys(self._probes.values())), now)

    def _rank(self, now: float) -> None:
        assert self.costs is not None
        cfg = self.rt.config
        self.costs = fit_sync(self.costs, self._measured, self._probes)
        schedules = feasible_schedules(
            cfg.policy, cfg.num_minibatches, int(max(cfg.ingestion_space)), int(max(cfg.delivery_space))
        )
        self._ranked = rank(self.costs, schedules)
        top = shortlist(self._ranked, max(1, self.verify_n))
        probed = {s: self._measured[name] for name, s in self._probes.items() if name in self._measured}
        self.verified = {s: probed[s] for s in top if s in probed}  # already measured live as a probe
        queue = [s for s in top if s not in self.verified] if len(top) > 1 else []
        if queue:
            self._trial(Phase.VERIFY, queue, now)
        else:
            self._choose(now)

    def _choose(self, now: float) -> None:
        assert self.costs is not None
        self.prediction = p = settle(self._ranked, self.judged, margin=self.MARGIN, spreads=self.spreads)
        self.history.append(PlanEvent(self.iteration, "planned", p.schedule, p, self.costs))
        log.info("conduit: auto-planned %s (predicted T_iter %.3f ms)", p.schedule, p.t_iter * 1e3)
        self.phase = Phase.RUN
        self.live = self.prober([p.schedule])
        # watched against what it measured live (the plan always was, inline as the all-inline probe)
        self.live.keep(0, self.spreads.get(p.schedule, Spread(p.t_iter, p.t_iter, p.t_iter)))
        self.rt.reschedule(p.schedule)
        self._migrations = self._buffer_migrations()

    def _watch(self, now: float) -> None:
        assert self.live is not None and self.live.planned is not None
        if self._buffer_migrations() != self._migrations:
            self._replan("the per-sample size changed (migration)")
            return
        if not self.live.checking:
            return
        planned, watched = self.live.planned, self.live.watched[None]
        if self.live.recheck(watched, now):
            self._replan(f"measured T_iter {group_spread(watched).median * 1e3:.3f} ms drifted from the planned "
                         f"{planned.median * 1e3:.3f} ms")

    @property
    def judged(self) -> dict[Schedule, float]:
        """What the plan is settled on: the verified shortlist and, measured as the all-inline probe, inline."""
        inline = {INLINE: self._measured["base"]} if "base" in self._measured else {}
        return {**inline, **self.verified}

    def _replan(self, reason: str) -> None:
        log.info("conduit: re-planning: %s", reason)
        self.history.append(PlanEvent(self.iteration, reason, self.rt.schedule))
        if self.rt.schedule != INLINE:
            self.rt.reschedule(INLINE)  # until a new plan beats inline again
        self._win = _Window()
        self._pool = []
        self.live = None
        self.phase = Phase.OBSERVE

    # -- helpers -----------------------------------------------------------------
    _PROBE_SKIP = 2  # iterations a probe drops after a reschedule (the new schedule's first invocations)
    MARGIN = 0.03  # the smallest relative gain that counts on one process (:func:`~conduit.scheduling.noise.noise`)

    def _period_of(self, schedule: Schedule) -> int:
        return period(schedule, self.rt.config.policy)

    def _buffer_migrations(self) -> int:
        buf = self.rt.buffer
        return buf.migrations if buf is not None else 0

    def _storage_device(self) -> torch.device | str:
        buf = self.rt.buffer
        storage = getattr(buf, "storage", None)
        if storage is not None:
            dev = storage.devices[0]
            return "pinned" if getattr(storage, "pinned", False) else dev
        return self.rt.config.storage_device or "cpu"


def _rows(unit: dict[str, torch.Tensor]) -> int:
    return int(next(iter(unit.values())).shape[0])
