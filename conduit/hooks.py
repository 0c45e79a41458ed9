"""The paper's hook interface: ``@register_ingestion`` / ``@register_delivery``.

A decorator records a :class:`HookSpec` on a :class:`HookRegistry` and returns
the function unchanged (the typer ``Typer.command`` pattern); nothing runs at
import time. A hook receives two endpoints::

    @conduit.register_ingestion(input="Actor", output="ExperienceBuffer")
    def ingestion(actor_in, exp_out):
        exp_out.write(fw_ops(actor_in.read()))

``read()`` returns the invocation's data (``g`` rollout units concatenated, or
``g`` training batches concatenated); ``write()`` may be called any number of
times (zero filters the data out). A path without a hook runs the identity.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

import torch

from conduit.errors import HookError, SpecError
from conduit.spec import as_tensors, batch_size_of

__all__ = [
    "ACTOR",
    "EXPERIENCE_BUFFER",
    "LEARNER",
    "HookKind",
    "HookRegistry",
    "HookSpec",
    "Reader",
    "Writer",
    "identity",
]

log = logging.getLogger("conduit")

ACTOR = "Actor"
EXPERIENCE_BUFFER = "ExperienceBuffer"
LEARNER = "Learner"

F = TypeVar("F", bound=Callable[..., Any])


class HookKind(str, Enum):
    INGESTION = "ingestion"
    DELIVERY = "delivery"


#: The graph's node names each hook must connect.
ENDPOINTS: dict[HookKind, tuple[str, str]] = {
    HookKind.INGESTION: (ACTOR, EXPERIENCE_BUFFER),
    HookKind.DELIVERY: (EXPERIENCE_BUFFER, LEARNER),
}


@dataclass(frozen=True)
class HookSpec:
    kind: HookKind
    fn: Callable[[Reader, Writer], Any]
    input: str
    output: str

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))


class Reader:
    """The input endpoint of a hook: ``read()`` returns this invocation's data."""

    def __init__(self, name: str, data: dict[str, torch.Tensor], info: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self._data = data
        #: Read-only facts about the invocation (granularity, indices, weights...).
        self.info: Mapping[str, Any] = info or {}

    def read(self) -> dict[str, torch.Tensor]:
        return self._data

    def __repr__(self) -> str:
        return f"Reader({self.name!r}, fields={list(self._data)})"


class Writer:
    """The output endpoint of a hook: ``write(data)`` stages data for the next node."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.items: list[dict[str, torch.Tensor]] = []
        #: each write's ``attach`` (None where it had none)
        self.attached: list[Any] = []

    def write(self, data: Mapping[str, Any], *, attach: Any = None) -> None:
        """Stage ``data``; a delivery hook may ``attach`` one object to each training batch it writes (a
        framework's own batch type built over the tensors, say), which the learner reads as
        ``batch.info.attachment``: the work of building it then runs on the delivery worker, off the
        learner's thread. A hook that attaches writes one training batch per ``write``."""
        if not isinstance(data, Mapping):
            raise SpecError(f"{self.name}.write expects a mapping of field -> tensor, got {type(data).__name__}")
        tensors = as_tensors(data)
        batch_size_of(tensors)
        self.items.append(tensors)
        self.attached.append(attach)

    def __repr__(self) -> str:
        return f"Writer({self.name!r}, writes={len(self.items)})"


def identity(src: Reader, dst: Writer) -> None:
    """The hook a path runs when none is registered."""
    dst.write(src.read())


class HookRegistry:
    """At most one ingestion and one delivery hook."""

    def __init__(self) -> None:
        self._hooks: dict[HookKind, HookSpec] = {}
        self._lock = threading.Lock()
        self.frozen_reason: str | None = None

    def register(self, kind: HookKind, input: str, output: str) -> Callable[[F], F]:
        expected = ENDPOINTS[kind]
        if (input, output) != expected:
            raise HookError(
                f"register_{kind.value}(input={input!r}, output={output!r}): a {kind.value} hook connects "
                f"input={expected[0]!r} to output={expected[1]!r}"
            )

        def decorator(fn: F) -> F:
            _check_signature(kind, fn)
            with self._lock:
                if self.frozen_reason is not None:
                    raise HookError(f"cannot register {fn!r}: {self.frozen_reason}")
                old = self._hooks.get(kind)
                if old is not None and old.fn is not fn:
                    name = getattr(fn, "__qualname__", fn)
                    log.warning("conduit: %s hook %s replaces %s", kind.value, name, old.name)
                self._hooks[kind] = HookSpec(kind, fn, input, output)
            return fn

        return decorator

    def copy(self) -> HookRegistry:
        """A fresh, unfrozen registry with the same hooks (a started runtime freezes its own)."""
        fresh = HookRegistry()
        with self._lock:
            fresh._hooks = dict(self._hooks)
        return fresh

    def get(self, kind: HookKind) -> HookSpec | None:
        return self._hooks.get(kind)

    def function(self, kind: HookKind) -> Callable[[Reader, Writer], Any]:
        spec = self._hooks.get(kind)
        return spec.fn if spec is not None else identity

    def clear(self) -> None:
        with self._lock:
            self._hooks.clear()
            self.frozen_reason = None

    def freeze(self, reason: str) -> None:
        with self._lock:
            self.frozen_reason = reason


def _check_signature(kind: HookKind, fn: Callable[..., Any]) -> None:
    if not callable(fn):
        raise HookError(f"a {kind.value} hook must be callable, got {type(fn).__name__}")
    try:
        inspect.signature(fn).bind(object(), object())
    except TypeError as e:
        names = ("actor_in, exp_out") if kind is HookKind.INGESTION else ("exp_in, learn_out")
        raise HookError(
            f"{getattr(fn, '__qualname__', fn)!r} cannot be a {kind.value} hook: it must take two "
            f"positional arguments ({names}): {e}"
        ) from e
    except ValueError:
        pass  # builtins without a signature: accept
