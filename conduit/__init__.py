"""Conduit: an Experience Data Plane for distributed reinforcement learning.

The public face. ``import conduit`` pulls in torch, numpy and pydantic only:
never typer, rich, Ray or a framework (those live in ``conduit.cli`` and
``conduit.integrations``).
"""

from __future__ import annotations

from conduit.batch import Batch, BatchInfo
from conduit.config import ConduitConfig, PrioritizedReplay, SamplerKind, SchedulePin
from conduit.default import (
    default_registry,
    default_runtime,
    init,
    pull,
    push,
    register_delivery,
    register_ingestion,
    reset,
    shutdown,
)
from conduit.errors import (
    ConduitError,
    ConduitTimeout,
    ConfigError,
    DeviceFailed,
    HookError,
    HookFailed,
    PlacementError,
    RateLimited,
    RuntimeClosed,
    RuntimeFailed,
    SemanticsError,
    SpecError,
    WorkerDied,
)
from conduit.hooks import Reader, Writer
from conduit.runtime import Conduit, RuntimeStats
from conduit.scheduling.space import Mode, Policy, Schedule
from conduit.spec import ExperienceSpec, FieldSpec
from conduit.trace import Tracer, global_tracer

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "BatchInfo",
    "Conduit",
    "ConduitConfig",
    "ConduitError",
    "ConduitTimeout",
    "ConfigError",
    "DeviceFailed",
    "ExperienceSpec",
    "FieldSpec",
    "HookError",
    "HookFailed",
    "Mode",
    "PlacementError",
    "Policy",
    "PrioritizedReplay",
    "RateLimited",
    "Reader",
    "RuntimeClosed",
    "RuntimeFailed",
    "RuntimeStats",
    "SamplerKind",
    "Schedule",
    "SchedulePin",
    "SemanticsError",
    "SpecError",
    "Tracer",
    "WorkerDied",
    "Writer",
    "__version__",
    "default_registry",
    "default_runtime",
    "global_tracer",
    "init",
    "pull",
    "push",
    "register_delivery",
    "register_ingestion",
    "reset",
    "shutdown",
]
