"""Validation of the cost model against measurement (the paper's Fig. 15 and Tab. 4).

For each workload dimension: profile, then run every feasible manual schedule
of the synthetic loop, measure ``T_iter``, and compare with the model's
prediction: Pearson r and MAPE over all configurations, whether the predicted
top-k ordering matches the measured one, and where the automatic choice lands
relative to the best measured configuration (the lower envelope).

:func:`run_validation` runs the sweep for ``conduit bench validate`` and
``conduit bench all`` (a progress line and a table on a rich console, the
JSON as a dict); :func:`validation_markdown` writes it as BENCHMARKS.md's
scheduling table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conduit.cli.profile import _costs_json
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn
from rich.table import Table

from conduit.core import Policy, Schedule, feasible_schedules
from conduit.scheduling.model import Prediction, predict
from conduit.scheduling.profiler import ProfileResult, ProfileSettings, interleaved_medians, profile_workload
from conduit.scheduling.workload import SyntheticWorkload

__all__ = [
    "DimensionReport",
    "ValidationReport",
    "mape",
    "pearson",
    "run_validation",
    "validate",
    "validation_markdown",
]


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


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def run_validation(
    console: Console, fields: dict[str, Any], dims: Sequence[int], g_max: int, quiet: bool
) -> dict[str, Any]:
    """Validate the cost model on off-policy workloads of ``fields`` at each of ``dims``: the sweep as JSON.

    ``fields`` are :class:`~conduit.scheduling.workload.SyntheticWorkload` fields (its defaults where absent);
    ``quiet`` hides the progress line and the table (``--json``).
    """
    workloads = [SyntheticWorkload(policy=Policy.OFF_POLICY, **{**fields, "dim": d}) for d in dims]
    columns = (SpinnerColumn(), TextColumn("{task.description}"))
    progress = Progress(*columns, console=console, transient=True, disable=quiet)
    with progress as bar:
        task = bar.add_task("validating")
        thorough = ProfileSettings.thorough()  # validation may take minutes
        rep = validate(workloads, settings=thorough, g_max=g_max, progress=lambda m: bar.update(task, description=m))
    rows = []
    for d in rep.dimensions:
        best_s, best = d.best_measured
        rows.append({
            "dim": d.workload.dim, "configs": len(d.rows), "best_schedule": best_s.to_json(), "best_t_iter_s": best,
            "auto_schedule": d.auto.schedule.to_json() if d.auto else None, "auto_t_iter_s": d.auto_measured,
            "auto_vs_best": d.auto_vs_best, "model_schedule": d.profile.model_choice.schedule.to_json(),
            "model_vs_best_in_sweep": d.model_vs_best, "top8_match": d.topk_match(8), "top8_overlap": d.topk_overlap(8),
            "costs": _costs_json(d.profile.costs),
            "rows": [{"schedule": s.to_json(), "predicted_s": p, "measured_s": m} for s, p, m in d.rows],
            "rematch_s": [{"schedule": s.to_json(), "measured_s": m} for s, m in d.rematch.items()],
            "verified_s": [{"schedule": s.to_json(), "measured_s": m} for s, m in d.profile.verified.items()],
        })
    doc = {"pearson_r": rep.pearson_r, "mape_pct": rep.mape, "dimensions": rows}
    if not quiet:
        t = Table(title=f"Cost model vs measurement: Pearson r = {rep.pearson_r:.3f}, MAPE = {rep.mape:.1f}%")
        cols = (
            "dim", "configs", "best measured ms", "auto measured ms", "auto/best", "model's own/best",
            "top-8 order", "top-8 overlap",
        )
        for col in cols:
            t.add_column(col, justify="right")
        for row in rows:
            t.add_row(
                str(row["dim"]), str(row["configs"]), _ms(row["best_t_iter_s"]), _ms(row["auto_t_iter_s"]),
                f"{row['auto_vs_best']:.3f}", f"{row['model_vs_best_in_sweep']:.3f}",
                "yes" if row["top8_match"] else "no", f"{row['top8_overlap']:.0%}",
            )
        console.print(t)
    return doc


def validation_markdown(doc: dict[str, Any]) -> str:
    """The validation as BENCHMARKS.md's scheduling table (``conduit bench all`` writes it)."""

    def sched(x: dict[str, Any]) -> str:
        i, d = x["ingestion"], x["delivery"]
        return (
            f"ingestion {'overlap' if i['overlap'] else 'inline'} g={i['granularity']}, "
            f"delivery {'overlap' if d['overlap'] else 'inline'} g={d['granularity']}"
        )

    lines = [
        "## Scheduling: the cost model against measurement\n",
        f"Pearson r = {doc['pearson_r']:.3f}, MAPE = {doc['mape_pct']:.1f}% over "
        f"{sum(d['configs'] for d in doc['dimensions'])} configurations.\n",
        "| dim | configs | best measured | automatic choice (sweep) | auto/best | model's own/best | top-8 overlap |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in doc["dimensions"]:
        lines.append(
            f"| {d['dim']:,} | {d['configs']} | {sched(d['best_schedule'])}: {d['best_t_iter_s'] * 1e3:.2f} ms | "
            f"{sched(d['auto_schedule'])}: {d['auto_t_iter_s'] * 1e3:.2f} ms | {d['auto_vs_best']:.3f} | "
            f"{d['model_vs_best_in_sweep']:.3f} | {d['top8_overlap']:.0%} |"
        )
    return "\n".join(lines) + "\n"
