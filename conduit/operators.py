"""Operator graphs: ingestion and delivery as chains of transfer and processing operators.

Two operator kinds (the paper's §2.2): **transfer** moves bytes between memory
domains (host->device, device->device, into/out of the buffer's storage);
**processing** reshapes, samples, batches, or runs a framework's registered
hook. A :class:`Graph` runs its operators in order on a :class:`Packet`, each
inside a trace span, and keeps per-invocation timings the profiler reads.

Graphs are built once per runtime (the paths in :mod:`conduit.paths` assemble them);
which thread runs them — the caller's (overlap=0) or a path worker (overlap=1) — is
the executor's business.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple, Protocol

import torch

from conduit.errors import HookFailed, SpecError
from conduit.hooks import LEARNER, Reader, Writer
from conduit.trace import Tracer

__all__ = ["FnOperator", "Graph", "HookOperator", "Operator", "OperatorKind", "Packet", "Record", "Running"]


class OperatorKind(str, Enum):
    TRANSFER = "transfer"
    PROCESSING = "processing"


class Record(Protocol):
    """A path's typed record of one invocation (what it claimed, what it drew)."""

    def facts(self) -> Mapping[str, Any]:
        """What a hook reads as its reader's ``info``."""
        ...


@dataclass
class Packet:
    """What flows through a graph: data parts plus the path's typed record of the invocation."""

    parts: list[dict[str, torch.Tensor]]
    record: Any = None
    #: what a hook attached to each part (``Writer.write(attach=)``); None when it attached nothing
    attached: list[Any] | None = None

    @property
    def rows(self) -> int:
        return sum(next(iter(p.values())).shape[0] for p in self.parts if p)


class Operator(ABC):
    """One node of a graph."""

    kind: OperatorKind = OperatorKind.PROCESSING
    name: str = "operator"

    @property
    def label(self) -> str:
        """What the operator is, for a message about a thread that is inside it."""
        return f"operator {self.name!r}"

    @abstractmethod
    def run(self, packet: Packet) -> Packet:
        """Transform a packet (may mutate and return it)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind.value}:{self.name})"


class FnOperator(Operator):
    """An operator from a function ``Packet -> Packet``."""

    def __init__(self, name: str, kind: OperatorKind, fn: Callable[[Packet], Packet]) -> None:
        self.name = name
        self.kind = kind
        self._fn = fn

    def run(self, packet: Packet) -> Packet:
        return self._fn(packet)


class HookOperator(Operator):
    """Runs a registered hook: one ``read()`` of the concatenated parts, any number of ``write()``s."""

    kind = OperatorKind.PROCESSING

    def __init__(self, name: str, fn: Callable[[Reader, Writer], Any], source: str, sink: str) -> None:
        self.name = name
        self._fn = fn
        self._source = source
        self._sink = sink

    @property
    def label(self) -> str:
        return f"the {self._source}->{self._sink} hook {getattr(self._fn, '__qualname__', repr(self._fn))!r}"

    def run(self, packet: Packet) -> Packet:
        data = concat(packet.parts)
        out = Writer(self._sink)
        try:
            info = packet.record.facts() if packet.record is not None else None
            self._fn(Reader(self._source, data, info), out)
            if self._sink != LEARNER and any(a is not None for a in out.attached):
                raise SpecError("write(attach=...): only a delivery hook attaches objects to what it writes")
        except Exception as exc:
            name = getattr(self._fn, "__qualname__", repr(self._fn))
            raise HookFailed(f"the {self._source}->{self._sink} hook {name!r}", exc) from exc
        packet.parts = out.items
        packet.attached = out.attached if any(a is not None for a in out.attached) else None
        return packet


def concat(parts: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Concatenate parts along the batch dimension (no copy for a single part)."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return {}
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


class Running(NamedTuple):
    """A thread inside one of a graph's operators: what a timeout or ``close()`` reports of it."""

    thread: str
    operator: Operator
    since: float  # time.monotonic() when it entered the operator

    def describe(self) -> str:
        return (
            f"thread {self.thread!r} has been inside {self.operator.label} for {time.monotonic() - self.since:.3g}s"
        )


class Graph:
    """A chain of operators with timing and tracing."""

    def __init__(self, name: str, operators: Sequence[Operator], tracer: Tracer, history: int = 256) -> None:
        self.name = name
        self.operators = list(operators)
        self.tracer = tracer
        #: wall seconds of recent invocations, with their granularity
        self.timings: deque[tuple[float, float]] = deque(maxlen=history)
        self.invocations = 0
        #: the threads inside an operator now, by thread ident (a hung hook is named by what waits on it)
        self.running: dict[int, Running] = {}

    def run(self, packet: Packet, granularity: float = 1.0) -> Packet:
        t0 = time.perf_counter()
        me = threading.current_thread()
        try:
            if self.tracer.enabled:
                with self.tracer.span(self.name, cat="conduit", granularity=granularity, rows=packet.rows):
                    for op in self.operators:
                        self.running[me.ident] = Running(me.name, op, time.monotonic())  # type: ignore[index]
                        with self.tracer.span(op.name, cat=op.kind.value):
                            packet = op.run(packet)
            else:  # no context managers when nobody is tracing
                for op in self.operators:
                    self.running[me.ident] = Running(me.name, op, time.monotonic())  # type: ignore[index]
                    packet = op.run(packet)
        finally:
            self.running.pop(me.ident, None)  # type: ignore[arg-type]
        self.timings.append((time.perf_counter() - t0, granularity))
        self.invocations += 1
        return packet

    def activity(self) -> list[str]:
        """What every thread inside this graph is doing now, longest first."""
        return [r.describe() for r in sorted(self.running.values(), key=lambda r: r.since)]

    def describe(self) -> str:
        return f"{self.name}: " + " -> ".join(f"{op.name}[{op.kind.value}]" for op in self.operators)
