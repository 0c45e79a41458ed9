"""Conduit: an Experience Data Plane for distributed reinforcement learning.

The public face. Each public name is imported from its module on first use
(PEP 562, :mod:`conduit._lazy`), so ``import conduit`` alone imports nothing heavy
and ``conduit --help`` answers at once; the first use of a runtime name pulls in
torch, numpy and pydantic only: never typer, rich, Ray or a framework (those
live in ``conduit.cli`` and ``conduit.integrations``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conduit import _lazy
from conduit._version import __version__

if TYPE_CHECKING:
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

__getattr__, __dir__ = _lazy.exports(
    __name__,
    {
        "conduit.batch": "Batch BatchInfo",
        "conduit.config": "ConduitConfig PrioritizedReplay RateLimit SchedulePin Tuning",
        "conduit.core": "Mode Policy RemoverKind SamplerKind Schedule",
        "conduit.default": (
            "default_registry default_runtime init pull push register_delivery register_ingestion reset shutdown"
        ),
        "conduit.errors": (
            "CheckpointError ConduitError ConduitTimeout ConfigError DeviceFailed HookError HookFailed "
            "PlacementError RateLimited RuntimeClosed RuntimeFailed SemanticsError SpecError WorkerDied"
        ),
        "conduit.hooks": "Reader Writer",
        "conduit.runtime": "Conduit",
        "conduit.spec": "ExperienceSpec FieldSpec",
        "conduit.stats": "RuntimeStats",
        "conduit.trace": "Tracer global_tracer",
    },
)

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
