"""Where the profiler's measurements come from: :class:`CostSource`, and the live one.

The profiler's decisions (what to fit, what to run again, when to stop, what to
keep) are tested against a synthetic source that injects foreign load and noise
on a virtual clock; :class:`LiveSource` is the same protocol over the real
runtime and the stand-in loop (:mod:`conduit.scheduling.workload`) on the wall clock.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from fractions import Fraction
from typing import Protocol

import torch

from conduit.core import Schedule
from conduit.scheduling.host import ForeignLoad
from conduit.scheduling.measure import MeasureSettings, measure_delivery, measure_ingestion
from conduit.scheduling.workload import SyntheticWorkload, run_loop, standalone_costs

__all__ = ["CostSource", "LiveSource"]


class CostSource(Protocol):
    """The measurements a profile takes, and the clock and host they are taken on."""

    def alone(self, repeats: int) -> tuple[float, float]:
        """``(T_rollout, T_update)`` of one iteration, each timed alone (medians of ``repeats``)."""
        ...

    def ingestion(self, granularities: Sequence[Fraction]) -> dict[Fraction, float]:
        """Wall time of one ingestion invocation at each granularity."""
        ...

    def delivery(self, granularities: Sequence[Fraction]) -> dict[Fraction, float]:
        """Wall time of one delivery invocation at each granularity."""
        ...

    def loop(self, schedule: Schedule, iterations: int, warmup: int) -> float:
        """Seconds per iteration of the loop under ``schedule`` (whole periods, after ``warmup``)."""
        ...

    def load(self) -> float | None:
        """Other processes' CPU load since the last call, a fraction of the host's CPUs (``None``: unknown)."""
        ...

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass without measuring (a busy host may quieten)."""
        ...

    def now(self) -> float:
        """The clock the budget is kept on (seconds)."""
        ...


class LiveSource:
    """The real thing: the stand-in loop through real runtimes, on this host, on the monotonic clock."""

    def __init__(
        self,
        workload: SyntheticWorkload,
        settings: MeasureSettings = MeasureSettings(),
        g_max: int = 4,
        pool: list[dict[str, torch.Tensor]] | None = None,
    ) -> None:
        self.workload = workload
        self.settings = settings
        self.cfg = workload.config(g_max=g_max)
        self.pool = workload.units() if pool is None else pool
        self.host = ForeignLoad()

    def alone(self, repeats: int) -> tuple[float, float]:
        return standalone_costs(self.workload, repeats)

    def ingestion(self, granularities: Sequence[Fraction]) -> dict[Fraction, float]:
        return measure_ingestion(self.cfg, self.pool, granularities, settings=self.settings)

    def delivery(self, granularities: Sequence[Fraction]) -> dict[Fraction, float]:
        return measure_delivery(self.cfg, self.pool, granularities, settings=self.settings)

    def loop(self, schedule: Schedule, iterations: int, warmup: int) -> float:
        return run_loop(self.workload, schedule, iterations, warmup, pool=self.pool).steady

    def load(self) -> float | None:
        return self.host.read()

    def wait(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def now(self) -> float:
        return time.monotonic()
