"""Post-generation ingestion as a graph of Conduit operators, scheduled by the core's cost model.

What: verl's post-generation stages (colocated reward, old log-prob, reference
log-prob, values, advantage) become :class:`Stage` nodes with explicit
dependencies and the worker group each one occupies. :func:`plan` groups them
into *waves*: stages inside a wave run at once, waves run one after another.
:class:`StageRunner` runs a plan, each stage as a :class:`conduit.operators.Graph`
of one processing operator (traced and timed like every Conduit operator), and
feeds the measured stage costs back into :class:`StageProfile`.

Why: the paper's gain on verl is reward running beside the log-prob stages
instead of before them. Which stages to overlap is not hard-coded: for each
candidate the planner asks the core's cost model (:func:`conduit.scheduling.model.optimize`
over an inline and an overlapped schedule, with the profiled stage costs and the
measured cost of overlapping) whether overlapping beats running it after. Two
invariants are structural: a stage never starts before its producers finished,
and two stages on the same worker group never share a wave (colocated workers
serialise on the Ray actor anyway).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from conduit.core import Mode, Policy, Schedule
from conduit.operators import FnOperator, Graph, OperatorKind, Packet
from conduit.scheduling.model import Costs, optimize
from conduit.trace import Tracer

__all__ = ["Plan", "Stage", "StageProfile", "StageRunner", "plan", "serial_plan"]

SERIAL = Schedule(Mode(False, Fraction(1)), Mode(False, Fraction(1)))
OVERLAPPED = Schedule(Mode(True, Fraction(1)), Mode(False, Fraction(1)))


@dataclass(frozen=True)
class Stage:
    """One post-generation stage: what it runs, where, and what it waits for.

    Attributes:
        name: unique within a graph (``"reward"``, ``"old_log_prob"``, ...).
        group: the worker group (or ``"driver"``) the stage occupies; stages of one group never overlap.
        needs: names of the stages whose outputs it reads.
        fn: runs the stage; returns its output (kept by the runner under ``name``).
    """

    name: str
    group: str
    needs: tuple[str, ...]
    fn: Callable[[], Any]


@dataclass(frozen=True)
class Plan:
    """Waves of stage names, and what the cost model predicted for them."""

    waves: tuple[tuple[str, ...], ...]
    predicted_s: float
    serial_s: float

    @property
    def overlapped(self) -> bool:
        return any(len(w) > 1 for w in self.waves)

    def describe(self) -> str:
        return " -> ".join("(" + " || ".join(w) + ")" if len(w) > 1 else w[0] for w in self.waves)


@dataclass
class StageProfile:
    """Measured stage costs (median of recent runs) and the measured cost of overlapping one stage.

    ``prior_s`` answers for a stage never measured: equal priors make the first
    plan overlap whatever the groups allow (overlap is free when ``sync_s`` is 0),
    and the costs measured on that iteration decide every later plan.
    """

    history: int = 8
    prior_s: float = 1.0
    sync_s: float = 0.0
    samples: dict[str, deque[float]] = field(default_factory=dict)
    sync_samples: deque[float] = field(default_factory=lambda: deque(maxlen=8))

    def cost(self, name: str) -> float:
        s = self.samples.get(name)
        return statistics.median(s) if s else self.prior_s

    def record(self, name: str, seconds: float) -> None:
        self.samples.setdefault(name, deque(maxlen=self.history)).append(seconds)

    def record_wave(self, names: Sequence[str], wall_s: float, alone_s: Mapping[str, float]) -> None:
        """What one overlapped wave took beyond its longest stage, per overlapped stage: the sync cost."""
        if len(names) < 2:
            return
        excess = wall_s - max(alone_s[n] for n in names)
        self.sync_samples.append(max(0.0, excess) / (len(names) - 1))
        self.sync_s = statistics.median(self.sync_samples)

    def to_json(self) -> dict[str, float]:
        return {**{f"cost_s/{n}": self.cost(n) for n in sorted(self.samples)}, "sync_s": self.sync_s}


def _overlap_pays(wave_s: float, stage_s: float, sync_s: float) -> tuple[bool, float]:
    """The core's model (Eq. 2) on one decision: run ``stage`` beside a wave of ``wave_s``, or after it.

    The wave is the neighbour (``t_rollout``), the stage the path's work (``t_ing``):
    overlapped it costs ``wave + stage + sync - min(wave, stage)``, inline ``wave + stage``.
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


def _check(stages: Sequence[Stage]) -> dict[str, Stage]:
    by_name = {s.name: s for s in stages}
    if len(by_name) != len(stages):
        raise ValueError(f"duplicate stage names in {[s.name for s in stages]}")
    for s in stages:
        missing = [n for n in s.needs if n not in by_name]
        if missing:
            raise ValueError(f"stage {s.name!r} needs {missing}, which no stage produces")
    return by_name


def plan(stages: Sequence[Stage], profile: StageProfile) -> Plan:
    """Group ``stages`` into waves; overlap exactly where the cost model says it pays.

    List scheduling over the dependency graph: among the stages whose producers
    are all in earlier waves, the costliest of each worker group is a candidate;
    the wave starts with the costliest candidate and takes each further one only
    if :func:`_overlap_pays` says so. A candidate left out waits for a later wave.
    """
    by_name = _check(stages)
    done: set[str] = set()
    waves: list[tuple[str, ...]] = []
    predicted = 0.0
    while len(done) < len(by_name):
        ready = [s for s in stages if s.name not in done and all(n in done for n in s.needs)]
        if not ready:
            raise ValueError(f"dependency cycle among {sorted(set(by_name) - done)}")
        per_group: dict[str, Stage] = {}
        for s in sorted(ready, key=lambda s: -profile.cost(s.name)):
            per_group.setdefault(s.group, s)
        candidates = sorted(per_group.values(), key=lambda s: -profile.cost(s.name))
        wave = [candidates[0].name]
        wave_s = profile.cost(candidates[0].name)
        for c in candidates[1:]:
            pays, t = _overlap_pays(wave_s, profile.cost(c.name), profile.sync_s)
            if pays:
                wave.append(c.name)
                wave_s = t
        waves.append(tuple(wave))
        done.update(wave)
        predicted += wave_s
    serial = sum(profile.cost(n) for n in by_name)
    return Plan(tuple(waves), predicted, serial)


def serial_plan(stages: Sequence[Stage], profile: StageProfile | None = None) -> Plan:
    """verl's own order: one stage at a time, in the order given (a valid topological order)."""
    by_name = _check(stages)
    seen: set[str] = set()
    for s in stages:
        if any(n not in seen for n in s.needs):
            raise ValueError(f"stage {s.name!r} comes before one of its producers {s.needs}")
        seen.add(s.name)
    p = profile or StageProfile()
    total = sum(p.cost(n) for n in by_name)
    return Plan(tuple((s.name,) for s in stages), total, total)


@dataclass
class WaveTiming:
    names: tuple[str, ...]
    wall_s: float
    stage_s: dict[str, float]


class StageRunner:
    """Runs plans of stages: a wave's stages in threads, each as a one-operator Conduit graph."""

    def __init__(self, tracer: Tracer | None = None, max_workers: int = 4) -> None:
        self.tracer = tracer or Tracer(enabled=False)
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="conduit-verl")
        self.graphs: dict[str, Graph] = {}
        self.lock = threading.Lock()

    def _graph(self, stage: Stage) -> Graph:
        op = FnOperator(stage.name, OperatorKind.PROCESSING, _calls(stage.fn))
        with self.lock:
            g = self.graphs.get(stage.name)
            if g is None:
                g = self.graphs[stage.name] = Graph(f"verl.{stage.name}", [op], self.tracer)
            else:  # one graph per stage name, kept across iterations for its timings; this iteration's call
                g.operators = [op]
            return g

    def _run_one(self, stage: Stage) -> tuple[Any, float]:
        t0 = time.perf_counter()
        out = self._graph(stage).run(Packet(parts=[])).record
        return out, time.perf_counter() - t0

    def run(
        self,
        stages: Sequence[Stage],
        the_plan: Plan,
        profile: StageProfile | None = None,
        outputs: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], list[WaveTiming]]:
        """Run every wave; return each stage's output and what each wave took (recorded into ``profile``).

        ``outputs`` (filled wave by wave) lets a stage read its producers' outputs.
        """
        by_name = _check(stages)
        outputs = {} if outputs is None else outputs
        timings: list[WaveTiming] = []
        for wave in the_plan.waves:
            groups = [by_name[n].group for n in wave]
            if len(set(groups)) != len(groups):
                raise ValueError(f"wave {wave} puts two stages on one worker group {groups}")
            t0 = time.perf_counter()
            if len(wave) == 1:
                results = {wave[0]: self._run_one(by_name[wave[0]])}
            else:
                futs = {n: self.pool.submit(self._run_one, by_name[n]) for n in wave}
                results = {n: f.result() for n, f in futs.items()}  # re-raises a stage's error
            wall = time.perf_counter() - t0
            stage_s = {n: r[1] for n, r in results.items()}
            outputs.update({n: r[0] for n, r in results.items()})
            timings.append(WaveTiming(wave, wall, stage_s))
            if profile is not None:
                for n, sec in stage_s.items():
                    profile.record(n, sec)
                profile.record_wave(wave, wall, stage_s)
        return outputs, timings

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def _calls(fn: Callable[[], Any]) -> Callable[[Packet], Packet]:
    def op(packet: Packet) -> Packet:
        packet.record = fn()
        return packet

    return op
