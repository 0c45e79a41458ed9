"""A timeline of operator invocations, rollouts and updates.

Off by default and cheap when off (one attribute check per span). When on,
spans are appended to a list (thread-safe under the GIL) and written as a
Chrome / Perfetto trace (``{"traceEvents": [...]}``, complete events ``ph: "X"``
with microsecond timestamps), so a user sees ingestion and delivery overlap
rollout and update. Every span is also a ``torch.profiler.record_function``
range, so the same names show up in a torch profiler trace.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["Span", "Tracer", "global_tracer"]


@dataclass(frozen=True)
class Span:
    name: str
    cat: str
    start_ns: int
    end_ns: int
    tid: int
    thread: str
    args: dict[str, Any] | None = None

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


class Tracer:
    """Records spans when enabled; ``span()`` is a no-op context otherwise."""

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        self.spans: list[Span] = []
        self._t0 = time.perf_counter_ns()

    def clear(self) -> None:
        self.spans = []

    @contextlib.contextmanager
    def span(self, name: str, cat: str = "conduit", **args: Any) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        start = time.perf_counter_ns()
        with torch.profiler.record_function(f"{cat}/{name}"):
            try:
                yield
            finally:
                end = time.perf_counter_ns()
                th = threading.current_thread()
                self.spans.append(Span(name, cat, start, end, th.ident or 0, th.name, args or None))

    def to_chrome(self) -> dict[str, Any]:
        """The Chrome trace-event JSON object (Perfetto opens it)."""
        pid = os.getpid()
        events: list[dict[str, Any]] = []
        threads: dict[int, str] = {}
        for s in self.spans:
            threads.setdefault(s.tid, s.thread)
            ev: dict[str, Any] = {
                "name": s.name,
                "cat": s.cat,
                "ph": "X",
                "ts": (s.start_ns - self._t0) / 1e3,
                "dur": (s.end_ns - s.start_ns) / 1e3,
                "pid": pid,
                "tid": s.tid,
            }
            if s.args:
                ev["args"] = {k: _jsonable(v) for k, v in s.args.items()}
            events.append(ev)
        for tid, tname in threads.items():
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": tname}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_chrome()))
        return path


def _jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


_GLOBAL = Tracer()


def global_tracer() -> Tracer:
    """The process-wide tracer runtimes use unless given one."""
    return _GLOBAL
