"""A synthetic :class:`~conduit.scheduling.source.CostSource` for the profiler's tests: scripted or modeled
measurements on a virtual clock, with foreign load and noise injected (no wall clock anywhere)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from fractions import Fraction

from conduit.core import Schedule
from conduit.scheduling.model import Costs, predict


class FakeSource:
    """Measurements from functions (``loop(schedule) -> s/iteration``, ``alone() -> (rollout, update)``).

    The clock advances by what each measurement would take on a real host; ``loads`` are the foreign loads read
    one after another (the last one repeats). ``calls`` records what ran, in order.
    """

    def __init__(
        self,
        loop: Callable[[Schedule], float],
        alone: Callable[[], tuple[float, float]],
        t_ing: dict[Fraction, float] | None = None,
        t_del: dict[Fraction, float] | None = None,
        loads: Sequence[float | None] = (0.0,),
    ) -> None:
        self._loop, self._alone = loop, alone
        self.t_ing, self.t_del = t_ing or {}, t_del or {}
        self.loads = list(loads)
        self.clock = 0.0
        self.calls: list[object] = []

    def alone(self, repeats: int) -> tuple[float, float]:
        r, u = self._alone()
        self.calls.append("alone")
        self.clock += (r + u) * (repeats + 1)
        return r, u

    def ingestion(self, granularities: Sequence[Fraction]) -> dict[Fraction, float]:
        self.clock += 0.05 * len(granularities)
        return {g: self.t_ing.get(g, 1e-3) for g in granularities}

    def delivery(self, granularities: Sequence[Fraction]) -> dict[Fraction, float]:
        self.clock += 0.05 * len(granularities)
        return {g: self.t_del.get(g, 1e-3) for g in granularities}

    def loop(self, schedule: Schedule, iterations: int, warmup: int) -> float:
        t = self._loop(schedule)
        self.calls.append(schedule)
        self.clock += max(t, 1e-4) * (iterations + warmup) + 0.05  # a runtime's start and close
        return t

    def load(self) -> float | None:
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]

    def wait(self, seconds: float) -> None:
        self.calls.append(("wait", seconds))
        self.clock += seconds

    def now(self) -> float:
        return self.clock


class ModeledHost(FakeSource):
    """A host that runs each schedule as ``truth`` predicts, slowed by foreign ``load`` and scattered by ``noise``
    (each measurement times a random factor in ``[1 - noise, 1 + noise]``), the same for every schedule."""

    def __init__(self, truth: Costs, *, load: float = 0.0, noise: float = 0.0, seed: int = 0) -> None:
        rng = random.Random(seed)
        slow = 1.0 + load  # the other job takes that much of the cores

        def jitter() -> float:
            return slow * (1.0 + rng.uniform(-noise, noise))

        super().__init__(
            loop=lambda s: predict(truth, s).t_iter * jitter(),
            alone=lambda: (truth.t_rollout * jitter(), truth.t_update * jitter()),
            t_ing={g: v * slow for g, v in truth.t_ing.items()},
            t_del={g: v * slow for g, v in truth.t_del.items()},
            loads=(load,),
        )
