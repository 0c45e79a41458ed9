"""The wave planner of a stage graph: which independent stages run at once, decided by the cost model.

What: :func:`plan` groups the :class:`~conduit.stages.Stage` nodes of one
iteration into waves (list scheduling over the dependency graph, one stage per
worker group per wave); :func:`serial_plan` is the reference order, one stage
at a time as given. :class:`~conduit.stages.StageRunner` (the core) runs either.

Why here: which stages to overlap is not hard-coded. For each candidate the
planner asks the core's cost model (:func:`conduit.scheduling.model.optimize`
over an inline and an overlapped schedule, with the profiled stage costs and
the measured cost of overlapping) whether running it beside the wave beats
running it after, so the one planner package decides the stage graph's
overlap as it decides the runtime's paths. Pure functions, no threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from conduit.core import Mode, Policy, Schedule
from conduit.scheduling.model import Costs, optimize
from conduit.stages import Plan, Stage, StageProfile, check_stages

__all__ = ["OVERLAPPED", "SERIAL", "overlap_pays", "plan", "serial_plan"]

SERIAL = Schedule(Mode(False, Fraction(1)), Mode(False, Fraction(1)))
OVERLAPPED = Schedule(Mode(True, Fraction(1)), Mode(False, Fraction(1)))


def overlap_pays(wave_s: float, stage_s: float, sync_s: float) -> tuple[bool, float]:
    """The core's model (Eq. 2) on one decision: run a stage beside a wave of ``wave_s``, or after it.

    The wave is the neighbour (``t_rollout``), the stage the path's work (``t_ing``):
    overlapped it costs ``wave + stage + sync - min(wave, stage)``, inline ``wave + stage``.
    Returns whether overlapping is the better schedule, and that schedule's predicted time.
    """
    costs = Costs(
        policy=Policy.OFF_POLICY,
        t_rollout=wave_s,
        t_update=0.0,
        t_ing={Fraction(1): stage_s},
        t_del={Fraction(1): 0.0},
        t_sync_ing=sync_s,
    )
    best = optimize(costs, [SERIAL, OVERLAPPED])
    return best.schedule == OVERLAPPED, best.t_iter


def plan(stages: Sequence[Stage], profile: StageProfile) -> Plan:
    """Group ``stages`` into waves; overlap exactly where the cost model says it pays.

    List scheduling over the dependency graph: among the stages whose producers
    are all in earlier waves, each worker group's first in the given order is a
    candidate (a group runs its stages one at a time, so they keep the
    framework's order); the wave starts with the costliest candidate and takes
    each further one only if :func:`overlap_pays` says so. A candidate left out
    waits for a later wave.
    """
    by_name = check_stages(stages)
    done: set[str] = set()
    waves: list[tuple[str, ...]] = []
    predicted = 0.0
    while len(done) < len(by_name):
        ready = [s for s in stages if s.name not in done and all(n in done for n in s.needs)]
        if not ready:
            raise ValueError(f"dependency cycle among {sorted(set(by_name) - done)}")
        per_group: dict[str, Stage] = {}
        for s in ready:
            per_group.setdefault(s.group, s)
        candidates = sorted(per_group.values(), key=lambda s: -profile.cost(s.name))
        wave = [candidates[0].name]
        wave_s = profile.cost(candidates[0].name)
        for c in candidates[1:]:
            pays, t = overlap_pays(wave_s, profile.cost(c.name), profile.sync_s)
            if pays:
                wave.append(c.name)
                wave_s = t
        waves.append(tuple(wave))
        done.update(wave)
        predicted += wave_s
    serial = sum(profile.cost(n) for n in by_name)
    return Plan(tuple(waves), predicted, serial)


def serial_plan(stages: Sequence[Stage], profile: StageProfile | None = None) -> Plan:
    """The reference order: one stage at a time, in the order given (which must be a topological order)."""
    by_name = check_stages(stages)
    seen: set[str] = set()
    for s in stages:
        if any(n not in seen for n in s.needs):
            raise ValueError(f"stage {s.name!r} comes before one of its producers {s.needs}")
        seen.add(s.name)
    p = profile or StageProfile()
    total = sum(p.cost(n) for n in by_name)
    return Plan(tuple((s.name,) for s in stages), total, total)
