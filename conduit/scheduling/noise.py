"""What a few noisy measurements can decide (pure): spreads, and whether one time beats another.

A shared host's speed moves within seconds, so every time the profiler and the
automatic planner measure is a handful of runs, kept as a :class:`Spread`
(median and range), never a bare number. :func:`pick` is the one rule every
decision is made by -- the live planner's (:mod:`~conduit.scheduling.planner`, for one
process and for a sharded group) and the model's settling (:mod:`~conduit.scheduling.fit`):
a candidate counts only where it beats the inline baseline by more than the noise the two measurements show
(:func:`beats`), and of those the finest within the noise of the fastest wins.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Spread", "beats", "noise", "pick"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Spread:
    """A measured time: the median of its runs, the lowest and highest run, how many runs."""

    median: float
    low: float
    high: float
    runs: int = 1

    @classmethod
    def of(cls, samples: Iterable[float], floor: float | None = None) -> Spread:
        """The spread of ``samples``; with ``floor``, each sample first raised to at least it (a cost that noise
        pushed below what is physically possible, such as a negative time)."""
        xs = [max(x, floor) if floor is not None else x for x in samples]
        if not xs:
            raise ValueError("a spread needs at least one sample")
        return cls(statistics.median(xs), min(xs), max(xs), len(xs))

    @property
    def half_width(self) -> float:
        """Half the range of the runs: how far the median may sit from the truth, as far as these runs show."""
        return (self.high - self.low) / 2

    def shifted(self, by: float) -> Spread:
        """The same runs, each ``by`` seconds later."""
        return Spread(self.median + by, self.low + by, self.high + by, self.runs)

    def to_json(self) -> dict[str, float]:
        return {"median_s": self.median, "low_s": self.low, "high_s": self.high, "runs": self.runs}


def noise(a: Spread, b: Spread, margin: float) -> float:
    """The difference between ``a`` and ``b`` that their runs cannot tell from noise.

    The larger of ``margin`` of the larger median (a few short runs on a shared
    host never resolve a difference of a few percent) and the two half ranges
    together (what these runs themselves show).
    """
    return max(margin * max(abs(a.median), abs(b.median)), a.half_width + b.half_width)


def beats(candidate: Spread, baseline: Spread, margin: float) -> bool:
    """Whether ``candidate`` is faster than ``baseline`` by more than the measured noise (see :func:`noise`)."""
    return candidate.median < baseline.median - noise(candidate, baseline, margin)


def pick(measured: Mapping[K, Spread], order: Callable[[K], Any], margin: float, baseline: K | None = None) -> K:
    """The plan among ``measured`` candidates (pure: the same figures give the same plan on every rank).

    Where ``baseline`` (inline) was measured, a candidate counts only if it :func:`beats` it -- one that buys
    nothing measurable still costs a worker -- and the baseline always counts. Of those, candidates within the
    noise of the fastest (:func:`noise`) are ties, a difference that small not being a measurement's to decide,
    and the plan is the finest of them (the smallest ``order``: a finer plan is less stale). A finer candidate
    that does not beat inline never hides a coarser one that does.
    """
    if not measured:
        raise ValueError("nothing measured to pick from")
    counted = [k for k in measured if baseline not in measured or k == baseline
               or beats(measured[k], measured[baseline], margin)]
    fastest = min(counted, key=lambda k: (measured[k].median, order(k)))
    near = [k for k in counted if measured[k].median - measured[fastest].median
            <= noise(measured[k], measured[fastest], margin)]
    return min(near, key=order)
