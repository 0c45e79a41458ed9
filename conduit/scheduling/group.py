"""The delivery schedule of a sharded buffer: pinned, the prior, or chosen by measuring the running loop.

Across ranks the exchange is the delivery path's transfer operator. At
granularity ``g`` one exchange draws ``g`` batches for each learner, each its own
draw, so a batch is at most ``g - 1`` pulls older than an inline one; overlapped,
the next exchange runs on the rank's collective lane while the learner computes,
so a batch is one exchange older. What either buys depends on a collective's
cost against the learner's compute and on how many ranks share the cores, which
only the running loop shows. So ``plan="auto"`` measures it, as the automatic
planner does on one process (:mod:`conduit.scheduling.auto`):

1. every candidate (:func:`candidates`: each power-of-two ``g`` up to ``g_max`` and
   ``max_staleness``, inline and overlapped, within the config's pins) runs one
   unmeasured window and then ``windows`` measured windows of ``window_pulls``
   pulls, a multiple of every candidate's ``g`` so that each window holds whole
   exchanges; a window's figure is its seconds per pull, the learner's compute
   between pulls included;
2. the ranks all-gather their windows once, and every rank applies the same rule
   (:func:`choose`) to the same matrix, so all of them switch to the same mode
   at the same pull: the group's figure of a window is the mean over ranks, and
   the plan is the planners' one rule over those figures
   (:func:`conduit.scheduling.noise.pick`, the rule one process's planner settles
   by): of the candidates that beat inline ``g = 1`` by more than the noise of
   the two, the finest within the noise of the fastest; where none does, inline.

Every rank switches candidates at the same pull indices, because pulls are
collective: the sequence of collectives stays the same on every rank.

3. after the decision the plan is watched, as one process's planner watches its
   own: after one unmeasured window, every ``windows`` windows of the chosen mode
   the ranks all-gather them (at the same pull everywhere) and every rank applies
   :func:`drifted` to the same matrix; where the group's seconds per pull moved
   from what the probe measured by more than ``drift`` and more than the noise
   (the learner's compute or the host changed, and with it what overlap and
   ``g`` buy), the group probes again from inline ``g = 1``, and the new plan
   must beat inline again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from conduit.config import ConduitConfig
from conduit.core import as_granularity
from conduit.scheduling.noise import Spread, noise, pick

__all__ = ["DeliveryMode", "DeliveryPlanner", "candidates", "choose", "drifted", "group_spread"]


@dataclass(frozen=True)
class DeliveryMode:
    """How a rank's exchanges run: overlapped on the lane or inline, ``g`` batches per learner each."""

    overlap: bool
    g: int

    def __str__(self) -> str:
        return f"{'overlapped' if self.overlap else 'inline'} g={self.g}"


def _order(mode: DeliveryMode) -> tuple[int, int]:
    """Finer first, then inline before overlapped (the single-process planner's tie order)."""
    return (mode.g, int(mode.overlap))


def candidates(config: ConduitConfig) -> tuple[DeliveryMode, ...]:
    """The delivery modes the config admits off-policy, finest and simplest first: inline and overlapped, at each
    power-of-two ``g`` in its space (a probe window holds whole exchanges of every ``g``, so odd ones would
    lengthen every window)."""
    pin = config.pinned
    gs = [int(g) for g in config.delivery_space if g.denominator == 1 and not int(g) & (int(g) - 1)]
    if pin.delivery_granularity is not None:
        gs = [int(as_granularity(pin.delivery_granularity))]
    overlaps = [False, True] if pin.delivery_overlap is None else [bool(pin.delivery_overlap)]
    return tuple(sorted({DeliveryMode(o, g) for o in overlaps for g in gs}, key=_order))


def group_spread(windows: np.ndarray) -> Spread:
    """The group's spread of ``windows[rank, window]`` (seconds per pull): each window's mean over ranks."""
    return Spread.of(np.asarray(windows, dtype=np.float64).mean(axis=0).tolist())


def choose(modes: tuple[DeliveryMode, ...], windows: np.ndarray, margin: float) -> tuple[int, list[Spread]]:
    """The plan's index among ``modes``, and each mode's spread, from ``windows[rank, mode, window]`` (seconds per
    pull). Pure: the same matrix gives the same answer on every rank."""
    spreads = [group_spread(np.asarray(windows)[:, i]) for i in range(len(modes))]
    # the baseline is the finest, simplest candidate: inline g=1 unless pinned away
    return pick(dict(enumerate(spreads)), lambda i: _order(modes[i]), margin, baseline=0), spreads


def drifted(planned: Spread, windows: np.ndarray, drift: float, margin: float) -> bool:
    """Whether the chosen mode's watched ``windows[rank, window]`` (seconds per pull) left ``planned``, its probe's
    figure, by more than ``drift`` of it and more than the noise of the two. Pure, as :func:`choose`."""
    recent = group_spread(windows)
    gap = abs(recent.median - planned.median)
    return gap > drift * planned.median and gap > noise(recent, planned, margin)


class DeliveryPlanner:
    """``plan="auto"``'s probe: which mode each pull runs in until the decision (see the module docstring).

    Args:
        modes: the candidates (:func:`candidates`), the baseline first.
        windows: measured windows per candidate.
        window_pulls: pulls per window (rounded up to a multiple of every candidate's ``g``).
        margin: the smallest relative gain that counts (:func:`conduit.scheduling.noise.noise`).
        drift: the relative move of the plan's seconds per pull that makes the group probe again (:func:`drifted`).
    """

    def __init__(self, modes: tuple[DeliveryMode, ...], windows: int = 3, window_pulls: int = 16,
                 margin: float = 0.05, drift: float = 0.25) -> None:
        if not modes:
            raise ValueError("no delivery mode to choose from")
        if windows < 1 or window_pulls < 1 or drift <= 0:
            raise ValueError(f"expected windows >= 1, window_pulls >= 1 and drift > 0, received {windows}, "
                             f"{window_pulls}, {drift}")
        period = math.lcm(*(m.g for m in modes))
        self.modes = modes
        self.windows = windows
        self.window_pulls = -(-window_pulls // period) * period
        self.margin = margin
        self.drift = drift
        self.chosen: int | None = None
        self.spreads: list[Spread] = []
        self.replans: list[str] = []  # why the group probed again, oldest first
        self._restart()

    def _restart(self) -> None:
        """Back to the start of the probe (construction, and a re-plan)."""
        self.pulls = 0
        self.times = np.zeros((len(self.modes), self.windows), dtype=np.float64)
        self.watched = np.zeros(self.windows, dtype=np.float64)  # the chosen mode's last windows, once decided
        self._window_start: float | None = None
        self._due = False
        self._check = False
        self.chosen = None
        self.spreads = []

    @property
    def probe_pulls(self) -> int:
        """Pulls the probe takes: one unmeasured and ``windows`` measured windows per candidate."""
        return len(self.modes) * (self.windows + 1) * self.window_pulls

    @property
    def deciding(self) -> bool:
        """Whether the group decides at this pull (the probe is over, nothing decided yet)."""
        return self.chosen is None and self._due

    @property
    def checking(self) -> bool:
        """Whether the group checks the plan for drift at this pull (:meth:`recheck`)."""
        return self.chosen is not None and self._check

    def tick(self, now: float) -> DeliveryMode:
        """At the start of each pull: close the window that ends here (if measured); this pull's mode."""
        if self.chosen is not None:
            self._watch(now)
            return self.modes[self.chosen]
        p, per_mode = self.pulls, self.windows + 1
        if p % self.window_pulls == 0:
            prev = p // self.window_pulls - 1  # the window that ends here, counted over the whole probe
            if prev >= 0 and prev % per_mode and self._window_start is not None:
                self.times[prev // per_mode, prev % per_mode - 1] = (now - self._window_start) / self.window_pulls
            self._window_start = now
        if p >= self.probe_pulls:
            self._due = True  # every window is closed: the caller decides now (:attr:`deciding`)
            return self.modes[-1]
        self.pulls += 1
        return self.modes[p // (per_mode * self.window_pulls)]

    def _watch(self, now: float) -> None:
        """Count a pull of the plan: after one unmeasured window, close each window; every ``windows`` of them
        the group checks (:attr:`checking`)."""
        p = self.pulls - self.window_pulls  # pulls since the unmeasured window after the decision
        if p >= 0 and p % self.window_pulls == 0:
            closed = p // self.window_pulls
            if closed and self._window_start is not None:
                self.watched[(closed - 1) % self.windows] = (now - self._window_start) / self.window_pulls
                self._check = closed % self.windows == 0
            self._window_start = now
        self.pulls += 1

    def decide(self, windows: np.ndarray) -> DeliveryMode:
        """Apply :func:`choose` to the group's gathered ``windows[rank, mode, window]`` and keep the plan."""
        self.chosen, self.spreads = choose(self.modes, windows, self.margin)
        self.pulls, self._window_start = 1, None  # this pull runs the plan: the first of its unmeasured window
        return self.modes[self.chosen]

    def recheck(self, windows: np.ndarray, now: float) -> bool:
        """Apply :func:`drifted` to the group's gathered ``windows[rank, window]`` of the plan; where it drifted,
        start the probe again (this pull's mode is then :meth:`tick`'s) and return True. ``now``: when the
        check's collective ended (the next window starts there)."""
        assert self.chosen is not None
        self._check = False
        planned = self.spreads[self.chosen]
        if not drifted(planned, windows, self.drift, self.margin):
            self._window_start = now
            return False
        recent = group_spread(windows).median
        self.replans.append(f"{self.modes[self.chosen]} measured {recent * 1e3:.3f} ms/pull against the probe's "
                            f"{planned.median * 1e3:.3f}")
        self._restart()
        return True

    def report(self) -> list[dict[str, object]]:
        """Each candidate's measured seconds per pull (median, range) and whether it is the plan."""
        return [{"mode": str(m), "overlap": m.overlap, "g": m.g, **s.to_json(), "chosen": i == self.chosen}
                for i, (m, s) in enumerate(zip(self.modes, self.spreads, strict=False))]

