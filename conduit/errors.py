"""Conduit's error hierarchy.

One small tree, rooted at :class:`ConduitError`. Each concrete error also
subclasses the builtin that fits, so callers that already catch ``ValueError``
or ``TimeoutError`` keep working (the pattern of ``pydantic_settings``).
Messages name the field, the expected and the received value.
"""

from __future__ import annotations

import difflib
import traceback
from collections.abc import Iterable
from typing import Any

__all__ = [
    "CheckpointError",
    "ConduitError",
    "ConduitTimeout",
    "ConfigError",
    "DeviceFailed",
    "HookError",
    "HookFailed",
    "PlacementError",
    "RateLimited",
    "RuntimeClosed",
    "RuntimeFailed",
    "SemanticsError",
    "SpecError",
    "UnevenMinibatches",
    "WorkerDied",
    "classify",
    "closest",
    "suggest",
]


class UnevenMinibatches(UserWarning):
    """An iteration's rows do not split evenly into its mini-batches (they differ by one row)."""


class ConduitError(Exception):
    """Base class of every error Conduit raises on purpose."""


class ConfigError(ConduitError, ValueError):
    """A configuration was rejected at construction."""


class CheckpointError(ConduitError, ValueError):
    """A checkpoint is missing, corrupt, foreign, unsafe to load, or does not fit the runtime."""


class SpecError(ConduitError, ValueError):
    """A write does not match the experience spec; the buffer is unchanged."""


class HookError(ConduitError, TypeError):
    """A hook was registered with the wrong endpoints or signature."""


class PlacementError(ConduitError, ValueError):
    """No placement can hold the buffer, or a placement is malformed."""


class SemanticsError(ConduitError, RuntimeError):
    """A call would break one of the semantics Conduit guarantees (docs/design.md §2)."""


class ConduitTimeout(ConduitError, TimeoutError):
    """A blocking call did not complete within its timeout."""

    #: a push that timed out: True where its unit stays queued and is ingested when the invocation in flight
    #: ends; False where nothing of it was taken (the push changed nothing)
    queued: bool = False


class RateLimited(ConduitTimeout):
    """A non-blocking push or pull would break the samples-per-insert ratio."""


class RuntimeClosed(ConduitError, RuntimeError):
    """The runtime was closed; no further push or pull is accepted."""


class RuntimeFailed(ConduitError, RuntimeError):
    """An operator, hook or worker failed; the runtime stopped.

    The original exception is the ``__cause__`` and its formatted traceback is
    kept in :attr:`original_traceback` and appended to the message, so the
    failure is readable even when re-raised from another thread's call.
    """

    def __init__(self, where: str, original: BaseException, tb_text: str | None = None) -> None:
        self.where = where
        self.original = original
        self.original_traceback = tb_text or "".join(
            traceback.format_exception(type(original), original, original.__traceback__)
        )
        super().__init__(
            f"{where} failed with {type(original).__name__}: {original}\n"
            f"--- original traceback ---\n{self.original_traceback}"
        )
        self.__cause__ = original

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt from its attributes, not by calling ``__init__`` with the message: Ray copies and
        # pickles exceptions raised in actors and tasks, and subclasses take other arguments
        state = {k: v for k, v in self.__dict__.items() if k != "__cause__"}
        return (_rebuilt, (type(self), self.args, state))


def _rebuilt(cls: type[RuntimeFailed], args: tuple[Any, ...], state: dict[str, Any]) -> RuntimeFailed:
    """A :class:`RuntimeFailed` (or subclass) with these ``args`` and attributes (see ``__reduce__``)."""
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class HookFailed(RuntimeFailed):
    """A registered ingestion or delivery hook raised."""


class DeviceFailed(RuntimeFailed):
    """A device (CUDA) error on a transfer or stream; the device may need a reset."""


class WorkerDied(RuntimeFailed):
    """A worker thread failed outside any operator (a bug, or an injected fault)."""


def classify(where: str, exc: BaseException, tb_text: str | None = None) -> RuntimeFailed:
    """Wrap ``exc`` in the RuntimeFailed subtype that says what failed."""
    if isinstance(exc, RuntimeFailed):
        return exc
    name = type(exc).__name__
    if name in ("AcceleratorError", "CudaError", "OutOfMemoryError") or (
        isinstance(exc, RuntimeError) and ("CUDA error" in str(exc) or "CUDA out of memory" in str(exc))
    ):
        return DeviceFailed(where, exc, tb_text)
    if where.endswith("worker"):
        return WorkerDied(where, exc, tb_text)
    return RuntimeFailed(where, exc, tb_text)


def closest(key: str, valid: Iterable[str]) -> str | None:
    """The valid name a misspelled ``key`` most likely meant, if any is close."""
    found = difflib.get_close_matches(key, list(valid), n=1)
    return found[0] if found else None


def suggest(key: str, valid: Iterable[str], listing: str = "valid") -> str:
    """For a message about an unknown ``key``: ``did you mean 'x'?``, else every valid name."""
    names = sorted(valid)
    match = closest(key, names)
    return f"did you mean {match!r}?" if match else f"{listing}: {', '.join(names)}"
