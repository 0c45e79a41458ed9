"""The one live planner: measures candidate schedules on the running loop, decides, and watches the plan.

Whatever the model predicts, what a schedule buys on a shared host shows only on
the user's own loop. So every planner that decides a running schedule does it the
same way, with :class:`LivePlanner`:

1. **probe** -- the candidates run one after another, each for ``skip`` unmeasured
   units (its first invocations), then measured windows of whole periods of it (a
   window holds whole bursts of a coarse granularity, :mod:`~conduit.scheduling.steady`);
   a window's figure is its seconds per unit, whatever the loop did in it included;
2. **decide** -- the windows are gathered (one process: its own; a sharded group:
   every rank's, all-gathered once, so each rank decides on the same matrix and all
   switch at the same pull), each window's figure is its mean over the ranks, and
   the plan is the one rule (:func:`~conduit.scheduling.noise.pick`): of the
   candidates that beat the baseline (inline) by more than the noise of the two,
   the finest within the noise of the fastest; where none does, the baseline;
3. **watch** -- after one unmeasured stretch, the plan's windows are gathered every
   ``watch_span`` units; where the figure moved from the plan's probe by more than
   ``drift`` and more than the noise (the learner's compute or the host changed, and
   with it what overlap buys), the probe starts again from the baseline.

A *unit* is what the caller ticks: one process's planner (:mod:`~conduit.scheduling.auto`)
ticks each training iteration and chooses among the model's shortlist; a sharded
buffer (:mod:`conduit.distributed`) ticks each pull and chooses among the
:class:`DeliveryMode`\\s its config admits (:func:`candidates`). Pure: no threads
and no clock of its own (every tick is handed the time), so it is tested on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from conduit.config import ConduitConfig
from conduit.core import as_granularity
from conduit.scheduling.noise import Spread, noise, pick

__all__ = [
    "DeliveryMode", "LivePlanner", "candidates", "choose", "drifted", "group_planner", "group_spread", "spreads_of",
]

K = TypeVar("K", bound=Hashable)


def group_spread(windows: np.ndarray) -> Spread:
    """The group's spread of ``windows[rank, window]`` (seconds per unit): each window's mean over ranks (a
    window a candidate did not run, ``NaN``, is left out)."""
    means = np.asarray(windows, dtype=np.float64).mean(axis=0)
    return Spread.of(means[~np.isnan(means)].tolist())


def spreads_of(windows: np.ndarray) -> list[Spread]:
    """Each candidate's spread from ``windows[rank, key, window]`` (:func:`group_spread`)."""
    w = np.asarray(windows)
    return [group_spread(w[:, i]) for i in range(w.shape[1])]


def choose(keys: Sequence[K], windows: np.ndarray, margin: float,
           order: Callable[[K], Any] = lambda k: 0) -> tuple[int, list[Spread]]:
    """The plan's index among ``keys`` (the baseline first), and each one's spread, from
    ``windows[rank, key, window]`` (seconds per unit). Pure: the same matrix gives the same answer on every rank."""
    spreads = spreads_of(windows)
    return pick(dict(enumerate(spreads)), lambda i: (order(keys[i]), i), margin, baseline=0), spreads


def drifted(planned: Spread, windows: np.ndarray, drift: float, margin: float) -> bool:
    """Whether the plan's watched ``windows[rank, window]`` (seconds per unit) left ``planned``, its probe's figure,
    by more than ``drift`` of it and more than the noise of the two. Pure, as :func:`choose`."""
    recent = group_spread(windows)
    gap = abs(recent.median - planned.median)
    return gap > drift * planned.median and gap > noise(recent, planned, margin)


class LivePlanner(Generic[K]):
    """Probe, decide, watch (see the module docstring). The caller ticks it at every unit boundary.

    Args:
        keys: the candidates, the baseline (inline) first.
        period: units after which a candidate's invocations repeat; its windows hold whole periods.
        order: finer first (:func:`~conduit.scheduling.noise.pick`'s tie order); the index breaks ties.
        window: units per window at least (rounded up to whole periods of each candidate).
        span: measured units per candidate at least (rounded up to whole windows).
        skip: unmeasured units after each switch (default one window).
        watch_span: units between two checks of the plan (default ``span``).
        margin: the smallest relative gain that counts (:func:`~conduit.scheduling.noise.noise`).
        drift: the relative move of the plan's figure that makes the planner probe again (:func:`drifted`).
        describe: what :meth:`report` says of a candidate.
    """

    def __init__(self, keys: Sequence[K], *, period: Callable[[K], int] = lambda k: 1,
                 order: Callable[[K], Any] = lambda k: 0, window: int = 16, span: int = 48, skip: int | None = None,
                 watch_span: int | None = None, margin: float = 0.05, drift: float = 0.25,
                 describe: Callable[[K], dict[str, object]] = lambda k: {"candidate": str(k)}) -> None:
        if not keys:
            raise ValueError("no candidate to choose from")
        if window < 1 or span < 1 or drift <= 0 or (skip is not None and skip < 0):
            raise ValueError(f"expected window >= 1, span >= 1, skip >= 0 and drift > 0, received {window}, {span}, "
                             f"{skip}, {drift}")
        self.keys = tuple(keys)
        self.period, self.order, self.describe = period, order, describe
        self.window, self.span, self.margin, self.drift = window, span, margin, drift
        self._skip = skip
        self.watch_span = span if watch_span is None else watch_span
        self.replans: list[str] = []  # why the planner probed again, oldest first
        self._restart()

    # -- shape of the probe (pure) -----------------------------------------------
    def length(self, key: K) -> int:
        """Units in one of ``key``'s windows: ``window`` rounded up to its whole periods."""
        p = max(1, int(self.period(key)))
        return -(-self.window // p) * p

    def windows_of(self, key: K, span: int | None = None) -> int:
        return max(1, -(-(self.span if span is None else span) // self.length(key)))

    def skip(self, key: K) -> int:
        return self.length(key) if self._skip is None else self._skip

    @property
    def probe_units(self) -> int:
        """Units the whole probe takes."""
        return sum(self.skip(k) + self.windows_of(k) * self.length(k) for k in self.keys)

    # -- state ---------------------------------------------------------------------
    def _restart(self) -> None:
        """Back to the start of the probe (construction, and a re-plan)."""
        most = max(self.windows_of(k) for k in self.keys)
        self.times = np.full((len(self.keys), most), np.nan)  # seconds per unit of each measured window
        self.at = 0  # the candidate being probed
        self.units = 0  # units begun under it (or under the plan)
        self.chosen: int | None = None
        self.planned: Spread | None = None  # the plan's probe figure, what the watch compares with
        self.spreads: list[Spread] = []
        self.watched = np.zeros(0)
        self.deciding = False  # the probe is over, nothing decided: the caller decides at this tick
        self.checking = False  # the plan is due for a check at this tick (:meth:`recheck`)
        self._start: float | None = None

    def tick(self, now: float) -> K:
        """At a unit boundary (before the unit runs): close the window that ends here; the candidate it runs."""
        if self.chosen is not None:
            return self._watch(now)
        if self.deciding:
            return self.keys[-1]
        key = self.keys[self.at]
        n, measured = self.length(key), self.units - self.skip(key)
        if measured >= 0 and measured % n == 0:
            if measured and self._start is not None:
                self.times[self.at, measured // n - 1] = (now - self._start) / n
            self._start = now
            if measured == self.windows_of(key) * n:  # every window of this candidate is closed
                self.at, self.units, self._start = self.at + 1, 0, None
                if self.at == len(self.keys):
                    self.deciding = True
                    return key
                return self.tick(now)
        self.units += 1
        return key

    def _watch(self, now: float) -> K:
        key = self.keys[self.chosen]  # type: ignore[index]
        n, measured = self.length(key), self.units - self.skip(key)
        if measured >= 0 and measured % n == 0:
            closed = measured // n
            if closed and self._start is not None:
                self.watched[(closed - 1) % len(self.watched)] = (now - self._start) / n
                self.checking = closed % len(self.watched) == 0
            self._start = now
        self.units += 1
        return key

    def decide(self, windows: np.ndarray) -> K:
        """Apply :func:`choose` to the gathered ``windows[rank, key, window]`` and keep the plan."""
        chosen, spreads = choose(self.keys, windows, self.margin, self.order)
        self.keep(chosen, spreads[chosen])
        self.spreads = spreads
        return self.keys[chosen]

    def keep(self, chosen: int, planned: Spread) -> None:
        """Run ``keys[chosen]`` from this tick on and watch it against ``planned`` (a caller that decides by its own
        rule, over several probes, keeps its plan here)."""
        self.chosen, self.planned, self.deciding = chosen, planned, False
        self.watched = np.zeros(self.windows_of(self.keys[chosen], self.watch_span))
        self.units, self._start = 1, None  # this tick's unit runs the plan: the first of its unmeasured stretch

    def recheck(self, windows: np.ndarray, now: float) -> bool:
        """Apply :func:`drifted` to the gathered ``windows[rank, window]`` of the plan; where it drifted, start the
        probe again (the next tick is its first) and return True. ``now``: when the check ended (the next window
        starts there)."""
        assert self.chosen is not None and self.planned is not None
        self.checking = False
        if not drifted(self.planned, windows, self.drift, self.margin):
            self._start = now
            return False
        recent = group_spread(windows).median
        self.replans.append(f"{self.keys[self.chosen]} measured {recent * 1e3:.3f} ms per unit against the probe's "
                            f"{self.planned.median * 1e3:.3f}")
        self._restart()
        return True

    def report(self) -> list[dict[str, object]]:
        """Each candidate's measured seconds per unit (median, range) and whether it is the plan."""
        return [{**self.describe(k), **s.to_json(), "chosen": i == self.chosen}
                for i, (k, s) in enumerate(zip(self.keys, self.spreads, strict=False))]


@dataclass(frozen=True)
class DeliveryMode:
    """How a rank's exchanges run: overlapped on its delivery worker or inline, ``g`` batches per learner each."""

    overlap: bool
    g: int

    def __str__(self) -> str:
        return f"{'overlapped' if self.overlap else 'inline'} g={self.g}"

    def order(self) -> tuple[int, int]:
        """Finer first, then inline before overlapped (one process's tie order)."""
        return (self.g, int(self.overlap))

    def describe(self) -> dict[str, object]:
        return {"mode": str(self), "overlap": self.overlap, "g": self.g}


def candidates(config: ConduitConfig) -> tuple[DeliveryMode, ...]:
    """The delivery modes the config admits off-policy, finest and simplest first: inline and overlapped, at each
    power-of-two ``g`` in its space (a window holds whole exchanges of each, so odd ones would lengthen them)."""
    pin = config.pinned
    gs = [int(g) for g in config.delivery_space if g.denominator == 1 and not int(g) & (int(g) - 1)]
    if pin.delivery_granularity is not None:
        gs = [int(as_granularity(pin.delivery_granularity))]
    overlaps = [False, True] if pin.delivery_overlap is None else [bool(pin.delivery_overlap)]
    return tuple(sorted({DeliveryMode(o, g) for o in overlaps for g in gs}, key=DeliveryMode.order))


def group_planner(modes: Sequence[DeliveryMode], windows: int = 3, window: int = 16, margin: float = 0.05,
                  drift: float = 0.25) -> LivePlanner[DeliveryMode]:
    """A sharded buffer's planner over ``modes`` (:func:`candidates`): pulls are the units, a window holds whole
    exchanges (``g`` pulls each), ``windows`` measured windows per mode, one unmeasured window after each switch."""
    if windows < 1:
        raise ValueError(f"expected windows >= 1, received {windows}")
    whole = math.lcm(*(m.g for m in modes)) if modes else 1
    window = -(-window // whole) * whole  # the same windows for every mode: every rank's probe lasts as long
    return LivePlanner(modes, period=lambda m: m.g, order=DeliveryMode.order, window=window, span=windows * window,
                       margin=margin, drift=drift, describe=DeliveryMode.describe)
