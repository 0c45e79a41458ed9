"""Latency-aware scheduling: feasible spaces, cost model, optimizer, profiler, automatic planner.

``conduit.scheduling.auto`` and ``.profiler`` import the runtime; import them
from their modules (``from conduit.scheduling.auto import AutoPlanner``).
"""

from __future__ import annotations

from conduit.scheduling.model import Costs, Prediction, optimize, predict, rank
from conduit.scheduling.space import (
    Mode,
    Policy,
    Schedule,
    delivery_space,
    feasible_schedules,
    ingestion_space,
    is_feasible_mode,
)

__all__ = [
    "Costs",
    "Mode",
    "Policy",
    "Prediction",
    "Schedule",
    "delivery_space",
    "feasible_schedules",
    "ingestion_space",
    "is_feasible_mode",
    "optimize",
    "predict",
    "rank",
]
