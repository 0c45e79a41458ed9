"""Latency-aware scheduling: the cost model and its fit (pure), the profiler, the planner.

It sits above the runtime: the runtime never imports it. One live planner decides every
running schedule (:mod:`.planner`: it measures the candidates on the loop, decides by one rule,
:func:`.noise.pick` -- a plan must beat inline by more than the noise, then the finest within
the noise of the fastest -- and watches the plan for drift), for one process and for a sharded
group (the ranks gather their windows and decide on the same matrix). One process's front end
(:mod:`.auto`) adds what only it has: the profile of its registered graphs and the model's
ranking (:func:`.fit.settle`), which choose the few schedules worth measuring. The stage
graph's waves (:mod:`.stages`) are the model's overlap decision per stage. The pure parts
(:mod:`.model`, :mod:`.fit`, :mod:`.steady`) are re-exported here; the parts that
drive runtimes (:mod:`.measure`, :mod:`.profiler`, :mod:`.auto`, :mod:`.workload`)
are imported from their modules (``from conduit.scheduling.auto import AutoPlanner``).
"""

from __future__ import annotations

from conduit.core import (
    INLINE,
    Mode,
    Policy,
    Schedule,
    delivery_space,
    feasible_schedules,
    ingestion_space,
    is_feasible_mode,
)
from conduit.scheduling.fit import fit_sync, probe_schedules, settle, shortlist
from conduit.scheduling.model import Costs, Prediction, optimize, predict, rank

__all__ = [
    "INLINE",
    "Costs",
    "Mode",
    "Policy",
    "Prediction",
    "Schedule",
    "delivery_space",
    "feasible_schedules",
    "fit_sync",
    "ingestion_space",
    "is_feasible_mode",
    "optimize",
    "predict",
    "probe_schedules",
    "rank",
    "settle",
    "shortlist",
]
