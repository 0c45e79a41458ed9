"""What a training loop waits on: the seconds spent inside chosen calls of live objects, by part.

The exposed experience-path latency (docs/design.md §4) is the time the training loop
waits on experience handling; work overlapped on another thread is hidden and not
counted, only what the loop waits for is. :class:`WaitTimer` measures it on the live
objects, so a framework's stock path and Conduit's are measured by the same code: it
wraps named methods (each call's time is charged to a part), or the iterators a method
returns (each ``next`` is charged), and takes the wrappers off again on :meth:`~WaitTimer.close`.
:func:`measure_interleaved` trains several runs interleaved (A, B, A, B, ...), so every
run sees the same machine load over time, which matters on a shared machine, and
:func:`summary_table` gives their medians.

A framework adapter says which calls are its experience path (the RLlib adapter's
``ExperiencePathTimer``); the timing is here.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["WaitTimer", "measure_interleaved", "summary_table"]


class WaitTimer:
    """Seconds spent inside wrapped calls of live objects, accumulated by part."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._patched: list[tuple[Any, str]] = []

    def charge(self, key: str, dt: float) -> None:
        self.seconds[key] = self.seconds.get(key, 0.0) + dt

    def patch(self, obj: Any, name: str, replacement: Callable[..., Any]) -> None:
        """Put ``replacement`` in ``obj``'s ``name`` (an instance attribute, taken off by :meth:`close`)."""
        setattr(obj, name, replacement)
        self._patched.append((obj, name))

    def wrap(self, obj: Any, name: str, key: str) -> None:
        """Charge every call of ``obj.name`` to ``key``."""
        original: Callable[..., Any] = getattr(obj, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.charge(key, time.perf_counter() - t0)

        self.patch(obj, name, timed)

    def wrap_iterators(self, obj: Any, name: str, key: str) -> None:
        """Charge every ``next`` of the iterators ``obj.name`` returns to ``key`` (a returned mapping is no
        iterator of the loop's and is handed back as it is)."""
        original: Callable[..., Any] = getattr(obj, name)

        @functools.wraps(original)
        def iterating(*args: Any, **kwargs: Any) -> Any:
            it = original(*args, **kwargs)
            return it if isinstance(it, Mapping) else _Timed(it, self, key)

        self.patch(obj, name, iterating)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def reset(self) -> dict[str, float]:
        """The seconds so far (by part), then start from zero."""
        out, self.seconds = self.seconds, {}
        return out

    def close(self) -> None:
        """Take the wrappers off (the objects' class methods show through again)."""
        for obj, name in self._patched:
            obj.__dict__.pop(name, None)
        self._patched.clear()


class _Timed:
    """An iterable whose every ``next`` is charged to ``key`` (the wait for the last, ending one too)."""

    def __init__(self, it: Any, timer: WaitTimer, key: str) -> None:
        self._it, self._timer, self._key = it, timer, key

    def __iter__(self) -> Iterator[Any]:
        source = iter(self._it)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(source)
            except StopIteration:
                self._timer.charge(self._key, time.perf_counter() - t0)
                return
            self._timer.charge(self._key, time.perf_counter() - t0)
            yield item


def measure_interleaved(
    runs: Mapping[str, Callable[[], Any]],
    timers: Mapping[str, WaitTimer],
    iterations: int,
    *,
    describe: Callable[[Any], dict[str, Any]] = lambda result: {},
    verbose: bool = True,
) -> dict[str, list[dict[str, Any]]]:
    """Call each run's training step ``iterations`` times, interleaved (A, B, A, B, ...).

    Per iteration and run: wall time, the seconds its timer charged (``experience_s``, by part in
    ``parts``) and their share of the iteration, plus what ``describe`` reads from the step's result
    (a framework's return and step counts).
    """
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in runs}
    for i in range(iterations):
        for label, step in runs.items():
            timer = timers[label]
            timer.reset()
            t0 = time.perf_counter()
            result = step()
            wall = time.perf_counter() - t0
            row = {"label": label, "iteration": i, "wall_s": wall, "experience_s": timer.total,
                   "share": timer.total / wall if wall > 0 else 0.0, **describe(result), "parts": dict(timer.seconds)}
            results[label].append(row)
            if verbose:
                ret = row.get("return_mean")
                print(f"[{label}] iter {i}: {wall:.2f}s, experience path {timer.total * 1e3:.0f} ms "
                      f"({row['share']:.0%}), return {'n/a' if ret is None else f'{ret:.1f}'}", flush=True)
    return results


def summary_table(results: Mapping[str, list[dict[str, Any]]], skip: int = 1) -> str:
    """Markdown: median iteration time and exposed experience path per run (first ``skip`` iterations dropped)."""
    lines = [
        f"| run | iterations timed / run (the first {skip} warm up) | iteration time (s, median) "
        "| exposed experience path (ms/iter, median) | share of iteration |",
        "|---|---|---|---|---|",
    ]
    for label, rows in results.items():
        kept = rows[skip:] if len(rows) > skip else rows
        wall = statistics.median(r["wall_s"] for r in kept)
        exp = statistics.median(r["experience_s"] for r in kept)
        share = statistics.median(r["share"] for r in kept)
        lines.append(f"| {label} | {len(kept)} of {len(rows)} | {wall:.3f} | {exp * 1e3:.1f} | {share:.1%} |")
    return "\n".join(lines)
