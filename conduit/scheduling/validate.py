"""Validation of the cost model against measurement (the paper's Fig. 15 and Tab. 4).

For each workload dimension: profile, then run every feasible manual schedule
of the synthetic loop, measure ``T_iter``, and compare with the model's
prediction: Pearson r and MAPE over all configurations, whether the predicted
top-k ordering matches the measured one, and where the automatic choice lands
relative to the best measured configuration (the lower envelope).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from conduit.scheduling.model import Prediction, predict
from conduit.scheduling.profiler import ProfileResult, ProfileSettings, interleaved_medians, profile_workload
from conduit.scheduling.space import Schedule, feasible_schedules
from conduit.synthetic import SyntheticWorkload

__all__ = ["DimensionReport", "ValidationReport", "mape", "pearson", "validate"]


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def mape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    return 100.0 * sum(abs(p - m) / m for p, m in zip(predicted, measured)) / len(measured)


@dataclass
class DimensionReport:
    workload: SyntheticWorkload
    profile: ProfileResult
    rows: list[tuple[Schedule, float, float]] = field(default_factory=list)  # (schedule, predicted, measured)
    auto: Prediction | None = None
    #: interleaved re-measurement of the automatic choice and the sweep's fastest configurations
    rematch: dict[Schedule, float] = field(default_factory=dict)

    @property
    def best_measured(self) -> tuple[Schedule, float]:
        s, _, m = min(self.rows, key=lambda r: r[2])
        return s, m

    @property
    def auto_measured(self) -> float:
        assert self.auto is not None
        return next(m for s, _, m in self.rows if s == self.auto.schedule)

    @property
    def auto_vs_best(self) -> float:
        """Measured T_iter of the automatic choice over the best measured one (1.0 = on the envelope).

        From the interleaved re-measurement when there is one (the minimum of
        a noisy sweep is biased low: the winner's curse), else from the sweep.
        """
        if self.rematch and self.auto is not None:
            return self.rematch[self.auto.schedule] / min(self.rematch.values())
        return self.auto_measured / self.best_measured[1]

    @property
    def model_vs_best(self) -> float:
        """The model's own minimum (before verification), as measured in the sweep, over the sweep's best."""
        s = self.profile.model_choice.schedule
        return next(m for q, _, m in self.rows if q == s) / self.best_measured[1]

    def topk_match(self, k: int = 8) -> bool:
        """Whether the k configurations the model ranks best are, in order, the k measured best."""
        by_pred = [s for s, _, _ in sorted(self.rows, key=lambda r: r[1])][:k]
        by_meas = [s for s, _, _ in sorted(self.rows, key=lambda r: r[2])][:k]
        return by_pred == by_meas

    def topk_overlap(self, k: int = 8) -> float:
        by_pred = {s for s, _, _ in sorted(self.rows, key=lambda r: r[1])[:k]}
        by_meas = {s for s, _, _ in sorted(self.rows, key=lambda r: r[2])[:k]}
        return len(by_pred & by_meas) / max(1, min(k, len(self.rows)))


@dataclass
class ValidationReport:
    dimensions: list[DimensionReport]

    @property
    def predicted(self) -> list[float]:
        return [p for d in self.dimensions for _, p, _ in d.rows]

    @property
    def measured(self) -> list[float]:
        return [m for d in self.dimensions for _, _, m in d.rows]

    @property
    def pearson_r(self) -> float:
        return pearson(self.predicted, self.measured)

    @property
    def mape(self) -> float:
        return mape(self.predicted, self.measured)


def validate(
    workloads: Sequence[SyntheticWorkload],
    *,
    settings: ProfileSettings = ProfileSettings(),
    g_max: int = 4,
    iterations: int = 20,
    sweep_rounds: int = 3,
    rematch_rounds: int = 5,
    rematch_top: int = 3,
    progress: Callable[[str], None] | None = None,
) -> ValidationReport:
    """Profile each workload, measure every feasible manual schedule of its loop (``sweep_rounds``
    interleaved rounds, median), then re-measure the automatic choice against the sweep's
    ``rematch_top`` fastest, interleaved, ``rematch_rounds`` times."""
    reports = []
    for w in workloads:
        prof = profile_workload(w, settings=settings, g_max=g_max, progress=progress)
        cfg = w.config(g_max=g_max)
        schedules = feasible_schedules(cfg.policy, cfg.num_minibatches, g_max, g_max)
        rep = DimensionReport(w, prof, auto=prof.choice)  # the model's shortlist, verified on the loop
        pool = w.units()
        warmup = max(3, iterations // 5)
        sweep = interleaved_medians(
            w, schedules, sweep_rounds, iterations, warmup, pool=pool, progress=progress, label=f"dim {w.dim}: "
        )
        for s in schedules:
            rep.rows.append((s, predict(prof.costs, s).t_iter, sweep[s]))
        if rematch_rounds and rep.auto is not None:
            contenders = [s for s, _, _ in sorted(rep.rows, key=lambda r: r[2])[:rematch_top]]
            if rep.auto.schedule not in contenders:
                contenders.append(rep.auto.schedule)
            rep.rematch = interleaved_medians(
                w, contenders, rematch_rounds, iterations, warmup, pool=pool, progress=progress,
                label=f"dim {w.dim}: re-measuring ",
            )
        reports.append(rep)
    return ValidationReport(reports)
