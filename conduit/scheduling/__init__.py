"""Latency-aware scheduling: feasible spaces, cost model, optimizer, profiler."""

from __future__ import annotations

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
    "Mode",
    "Policy",
    "Schedule",
    "delivery_space",
    "feasible_schedules",
    "ingestion_space",
    "is_feasible_mode",
]
