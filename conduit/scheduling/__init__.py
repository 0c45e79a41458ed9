"""Latency-aware scheduling: the cost model and its fit (pure), the profiler, the planners.

It sits above the runtime: the runtime never imports it. Every planner here decides by one
rule (:func:`.noise.pick`: a plan must beat inline by more than the noise, then the finest
within the noise of the fastest): one process's automatic planner (:mod:`.auto`, the model's
ranking settled by measurement, :func:`.fit.settle`), a sharded group's delivery planner
(:mod:`.group`, the same rule over the ranks' gathered windows, alike on every rank), and the
stage-wave planner (:mod:`.stages`, the model's overlap decision per stage). The pure parts
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
