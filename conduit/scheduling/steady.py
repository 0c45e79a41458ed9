"""The steady-state iteration time of a schedule, from per-iteration samples (pure).

A schedule with ``g > 1`` does its work in bursts: inline ingestion at
``g = 3`` ingests on every third iteration, so a loop's per-iteration times
repeat with a period. The cost model predicts the *mean* (``n(g) = 1/g``
invocations per iteration), and what a user pays is the mean too. The median of
such a series drops the long iterations altogether, which would bias every
comparison toward coarse granularities.

So: the mean over whole periods, made robust to the machine's hiccups by
taking the median over consecutive windows of one period each (a hiccup
lands in one window). With period 1 this is the plain median.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from conduit.core import Policy, Schedule

__all__ = ["period", "steady_time"]


def period(schedule: Schedule, policy: Policy) -> int:
    """Iterations after which ``schedule``'s invocations repeat (≥ 1).

    Off-policy, an iteration pushes one rollout unit and pulls one batch (the
    cost model's iteration): ingestion at ``g`` runs every ``g`` iterations,
    delivery at ``g`` every ``g``, and the pattern repeats after their least
    common multiple. On-policy, granularities are fractions of one iteration,
    so every iteration is alike.
    """
    if policy is Policy.ON_POLICY:
        return 1
    # a path invoked every a/b iterations (in lowest terms) completes whole invocations every a iterations
    return max(1, math.lcm(schedule.ingestion.granularity.numerator, schedule.delivery.granularity.numerator))


def steady_time(times: Sequence[float], period: int = 1) -> float:
    """Median over consecutive windows of ``period`` samples of each window's mean.

    Trailing samples that do not fill a window are left out (a partial window
    over- or under-counts the burst); with fewer samples than one period, the
    mean of all of them.
    """
    if not times:
        raise ValueError("no iteration times to summarise")
    p = max(1, int(period))
    if p == 1:
        return statistics.median(times)
    windows = [statistics.fmean(times[i : i + p]) for i in range(0, len(times) - p + 1, p)]
    return statistics.median(windows) if windows else statistics.fmean(times)
