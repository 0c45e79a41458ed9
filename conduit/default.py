"""The process-wide default runtime behind the module-level API.

``@conduit.register_ingestion`` / ``@conduit.register_delivery`` at module level
record hooks on the default registry; ``conduit.init(config)`` builds the
default runtime with them, and ``conduit.push`` / ``conduit.pull`` use it.
Runtimes created with ``conduit.Conduit(...)`` have their own registry.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from conduit.batch import Batch
from conduit.config import ConduitConfig
from conduit.errors import RuntimeClosed
from conduit.hooks import HookKind, HookRegistry
from conduit.runtime import Conduit
from conduit.spec import Data

__all__ = [
    "default_registry",
    "default_runtime",
    "init",
    "pull",
    "push",
    "register_delivery",
    "register_ingestion",
    "reset",
    "shutdown",
]

F = TypeVar("F", bound=Callable[..., Any])

_REGISTRY = HookRegistry()
_RUNTIME: Conduit | None = None
_LOCK = threading.Lock()


def default_registry() -> HookRegistry:
    return _REGISTRY


def register_ingestion(input: str = "Actor", output: str = "ExperienceBuffer") -> Callable[[F], F]:
    """Register the framework's ingestion hook on the default runtime (returns ``fn`` unchanged)."""
    return _REGISTRY.register(HookKind.INGESTION, input, output)


def register_delivery(input: str = "ExperienceBuffer", output: str = "Learner") -> Callable[[F], F]:
    """Register the framework's delivery hook on the default runtime (returns ``fn`` unchanged)."""
    return _REGISTRY.register(HookKind.DELIVERY, input, output)


def init(config: ConduitConfig | None = None, **kwargs: Any) -> Conduit:
    """Create (replacing any previous) the default runtime with the module-level hooks."""
    global _RUNTIME
    with _LOCK:
        if _RUNTIME is not None:
            _RUNTIME.close()
        _REGISTRY.frozen_reason = None
        _RUNTIME = Conduit(config, registry=_REGISTRY, **kwargs)
        return _RUNTIME


def default_runtime() -> Conduit:
    if _RUNTIME is None:
        raise RuntimeClosed("no default runtime: call conduit.init(config) first")
    return _RUNTIME


def push(data: Data, *, timeout: float | None = None, copy: bool | None = None) -> None:
    default_runtime().push(data, timeout=timeout, copy=copy)


def pull(learner: int = 0, *, timeout: float | None = None) -> Batch:
    return default_runtime().pull(learner, timeout=timeout)


def shutdown() -> None:
    """Close the default runtime (hooks stay registered for the next ``init``)."""
    global _RUNTIME
    with _LOCK:
        if _RUNTIME is not None:
            _RUNTIME.close()
        _RUNTIME = None
        _REGISTRY.frozen_reason = None


def reset() -> None:
    """Close the default runtime and forget module-level hooks (tests use this)."""
    shutdown()
    _REGISTRY.clear()
