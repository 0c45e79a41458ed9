"""Conduit: an Experience Data Plane for distributed reinforcement learning.

The public face. ``import conduit`` pulls in torch, numpy and pydantic only:
never typer, rich, Ray or a framework (those live in ``conduit.cli`` and
``conduit.integrations``).
"""

from __future__ import annotations

from conduit._version import __version__
from conduit.batch import Batch, BatchInfo
from conduit.config import ConduitConfig, PrioritizedReplay, RateLimit, SchedulePin, Tuning
from conduit.core import Mode, Policy, RemoverKind, SamplerKind, Schedule
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
    CheckpointError,
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
from conduit.runtime import Conduit
from conduit.spec import ExperienceSpec, FieldSpec
from conduit.stats import RuntimeStats
from conduit.trace import Tracer, global_tracer

__all__ = [
    "Batch",
    "BatchInfo",
    "CheckpointError",
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
    "RateLimit",
    "RateLimited",
    "Reader",
    "RemoverKind",
    "RuntimeClosed",
    "RuntimeFailed",
    "RuntimeStats",
    "SamplerKind",
    "Schedule",
    "SchedulePin",
    "SemanticsError",
    "SpecError",
    "Tracer",
    "Tuning",
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
