"""Stage graphs: named units of work with producers and a worker group each, run wave by wave.

What: a :class:`Stage` is one unit of a workload's per-iteration path (score
the rollouts, compute old log-probs, values, the advantage, ...): the worker
group it occupies, the stages whose outputs it reads, and the call that runs
it. A :class:`Plan` groups stage names into *waves*: the stages of a wave run
at once, the waves one after another. :class:`StageRunner` runs a plan, each
stage as a :class:`conduit.operators.Graph` of one processing operator (traced
and timed like every Conduit operator), and records what each stage and each
wave took into a :class:`StageProfile`, whose medians the planner
(:mod:`conduit.scheduling.stages`) reads on the next iteration.

Why here, not in an adapter: any grouped on-policy workload whose stages sit
on separate worker groups (resource pools) can hide the latency of the
independent ones, and the threads that do it are the core's
(:class:`conduit.executor.Lane`, one per worker group: a group's calls keep
their order, two groups run at once). Invariants: a stage never starts before
its producers finished (a wave starts only once every stage of the wave before
it ended); two stages of one group never share a wave (refused); a stage's
exception is re-raised from :meth:`StageRunner.run`, after its partners ended,
and no later wave starts.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

import torch

from conduit.executor import Lane
from conduit.operators import FnOperator, Graph, OperatorKind, Packet
from conduit.trace import Tracer

__all__ = ["Plan", "Stage", "StageProfile", "StageRunner", "WaveTiming", "check_stages"]

#: how long the end of a run waits for its lanes' threads to stop (they are idle by then)
LANE_JOIN_S = 5.0


@dataclass(frozen=True)
class Stage:
    """One stage: what it runs, where, and what it waits for.

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


def check_stages(stages: Sequence[Stage]) -> dict[str, Stage]:
    """The stages by name; refuses a repeated name or a producer no stage provides."""
    by_name = {s.name: s for s in stages}
    if len(by_name) != len(stages):
        raise ValueError(f"duplicate stage names in {[s.name for s in stages]}")
    for s in stages:
        missing = [n for n in s.needs if n not in by_name]
        if missing:
            raise ValueError(f"stage {s.name!r} needs {missing}, which no stage produces")
    return by_name


@dataclass
class WaveTiming:
    """What one wave took: its wall time and each stage's own time."""

    names: tuple[str, ...]
    wall_s: float
    stage_s: dict[str, float]


class StageRunner:
    """Runs plans of stages: a wave of one on the calling thread, a wider wave's stages on their groups' lanes.

    A worker group gets its :class:`~conduit.executor.Lane` (one daemon thread,
    ``conduit-<prefix>-<group>``) the first time one of its stages runs beside
    another in a :meth:`run`, and every lane is closed when that run ends, so no
    thread outlives a run (a trainer need not close the runner). The lanes and the
    per-stage graphs are only touched from the thread that calls :meth:`run` (one
    caller at a time), so the runner holds no lock.
    ``prefix`` also names the graphs in traces (``"<prefix>.<stage>"``).
    """

    def __init__(self, tracer: Tracer | None = None, prefix: str = "stage") -> None:
        self.tracer = tracer or Tracer(enabled=False)
        self.prefix = prefix
        self.graphs: dict[str, Graph] = {}
        self.lanes: dict[str, Lane] = {}
        self.closed = False

    def graph(self, stage: Stage) -> Graph:
        """The stage's graph (one per name, kept across iterations for its timings), set to this call."""
        op = FnOperator(stage.name, OperatorKind.PROCESSING, _calls(stage.fn))
        g = self.graphs.get(stage.name)
        if g is None:
            g = self.graphs[stage.name] = Graph(f"{self.prefix}.{stage.name}", [op], self.tracer)
        else:
            g.operators = [op]
        return g

    def lane(self, group: str) -> Lane:
        """The group's lane; its OpenMP team is the caller's (a stage is the framework's code, as it runs serially:
        its driver-side reductions, a metric's mean say, then give the same bits as on the caller's thread)."""
        lane = self.lanes.get(group)
        if lane is None:
            lane = self.lanes[group] = Lane(f"{self.prefix}-{group}", threads=torch.get_num_threads())
        return lane

    def run(
        self,
        stages: Sequence[Stage],
        the_plan: Plan,
        profile: StageProfile | None = None,
        outputs: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], list[WaveTiming]]:
        """Run every wave; return each stage's output and what each wave took (recorded into ``profile``).

        ``outputs`` (filled wave by wave) lets a stage read its producers' outputs.
        A wave ends when all its stages ended; then the first failure (in the
        wave's order) is re-raised and no later wave starts.
        """
        if self.closed:
            raise RuntimeError("the stage runner is closed")
        by_name = check_stages(stages)
        outputs = {} if outputs is None else outputs
        timings: list[WaveTiming] = []
        try:
            self._waves(by_name, the_plan, profile, outputs, timings)
        except BaseException:
            self._close_lanes(LANE_JOIN_S)  # the stage's failure is what the caller needs to see
            raise
        if not self._close_lanes(LANE_JOIN_S):
            raise RuntimeError(f"a stage lane did not stop within {LANE_JOIN_S} s after the run")
        return outputs, timings

    def _waves(
        self,
        by_name: Mapping[str, Stage],
        the_plan: Plan,
        profile: StageProfile | None,
        outputs: dict[str, Any],
        timings: list[WaveTiming],
    ) -> None:
        for wave in the_plan.waves:
            unknown = [n for n in wave if n not in by_name]
            if unknown:
                raise ValueError(f"wave {wave} names stages {unknown} that are not in the graph")
            groups = [by_name[n].group for n in wave]
            if len(set(groups)) != len(groups):
                raise ValueError(f"wave {wave} puts two stages on one worker group {groups}")
            t0 = time.perf_counter()
            results = self._wave([by_name[n] for n in wave])
            wall = time.perf_counter() - t0
            stage_s = {n: r[1] for n, r in results.items()}
            outputs.update({n: r[0] for n, r in results.items()})
            timings.append(WaveTiming(wave, wall, stage_s))
            if profile is not None:
                for n, sec in stage_s.items():
                    profile.record(n, sec)
                profile.record_wave(wave, wall, stage_s)

    def _wave(self, wave: Sequence[Stage]) -> dict[str, tuple[Any, float]]:
        if len(wave) == 1:
            return {wave[0].name: _timed(self.graph(wave[0]))}
        graphs = [self.graph(s) for s in wave]
        futures: list[Future[tuple[Any, float]]] = [self.lane(s.group).submit(_timed, g) for s, g in zip(wave, graphs)]
        wait(futures)  # a failed stage ends the wave only once its partners ended too
        return {s.name: f.result() for s, f in zip(wave, futures)}  # re-raises the first failure, in the wave's order

    def close(self, timeout: float = 5.0) -> bool:
        """Refuse further runs and stop any lane (none is left after a run); True when all ended in ``timeout``."""
        self.closed = True
        return self._close_lanes(timeout)

    def _close_lanes(self, timeout: float) -> bool:
        """Stop every lane after the calls already submitted, joined within ``timeout`` in all; True when all ended."""
        deadline = time.monotonic() + timeout
        gone = [lane.close(deadline - time.monotonic()) for lane in self.lanes.values()]
        self.lanes.clear()
        return all(gone)


def _timed(graph: Graph) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = graph.run(Packet(parts=[])).record
    return out, time.perf_counter() - t0


def _calls(fn: Callable[[], Any]) -> Callable[[Packet], Packet]:
    def op(packet: Packet) -> Packet:
        packet.record = fn()
        return packet

    return op
