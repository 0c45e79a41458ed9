"""The host a profile runs on: how busy other processes keep its CPUs, and a hard time budget.

A profile on a machine another job is loading measures that job as much as
Conduit: the profiler reads the CPU time *other* processes took from
``/proc/stat`` (all CPUs' busy time minus this process's own) and responds to
it (see :mod:`conduit.scheduling.profiler`). Where ``/proc/stat`` does not exist
(macOS, Windows) the load reads as unknown (``None``) and the profile proceeds
as on a quiet host, saying so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["Deadline", "ForeignLoad", "busy_and_total_ticks"]

PROC_STAT = Path("/proc/stat")


def busy_and_total_ticks(text: str) -> tuple[int, int]:
    """``(busy, total)`` clock ticks of all CPUs from the first line of ``/proc/stat`` (pure).

    Idle is ``idle + iowait``; busy is the rest (user, nice, system, irq, softirq, steal).
    """
    fields = text.split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu":
        raise ValueError("not /proc/stat: the first line does not start with 'cpu'")
    ticks = [int(x) for x in fields[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    total = sum(ticks[:8])  # guest times are already counted in user
    return total - idle, total


class ForeignLoad:
    """CPU load of other processes since the last reading, as a fraction of all this host's CPUs (0 to 1)."""

    def __init__(self, stat: Path = PROC_STAT) -> None:
        self.stat = stat
        self.cpus = os.cpu_count() or 1
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._sample()

    def _sample(self) -> tuple[int, int, float] | None:
        try:
            busy, total = busy_and_total_ticks(self.stat.read_text())
        except (OSError, ValueError):
            return None
        own = os.times()
        return busy, total, own.user + own.system

    def read(self) -> float | None:
        """The foreign load since the previous reading (``None``: unknown on this OS, or no time has passed)."""
        now = self._sample()
        last, self._last = self._last, now
        if now is None or last is None or now[1] <= last[1]:
            return None
        busy = (now[0] - last[0]) / (now[1] - last[1])
        own = (now[2] - last[2]) * self.tick / (now[1] - last[1])
        return min(1.0, max(0.0, busy - own))


class Deadline:
    """A hard time budget: what is left of it, and whether the next step still fits.

    The next step is assumed as long as the longest one recorded so far (:meth:`record`), shared with every
    :meth:`share` of this deadline: a budget is kept by never starting a step it cannot afford.
    """

    def __init__(
        self, seconds: float, clock: Callable[[], float] = time.monotonic, _longest: list[float] | None = None
    ) -> None:
        self.clock = clock
        self.seconds = seconds
        self.start = self._now()
        self._longest = [0.0] if _longest is None else _longest

    def _now(self) -> float:
        return float(self.clock())

    @property
    def spent(self) -> float:
        return self._now() - self.start

    @property
    def left(self) -> float:
        return max(0.0, self.seconds - self.spent)

    def affords(self, seconds: float | None = None) -> bool:
        """Whether a step of ``seconds`` (default: the longest recorded) fits in what is left."""
        return (self._longest[0] if seconds is None else seconds) <= self.left

    def record(self, seconds: float) -> None:
        """A step took ``seconds``: the next is assumed at least as long."""
        self._longest[0] = max(self._longest[0], seconds)

    def share(self, fraction: float) -> Deadline:
        """A deadline for a part of the work: ``fraction`` of what is left now, on the same clock and steps."""
        return Deadline(self.left * fraction, self.clock, self._longest)
