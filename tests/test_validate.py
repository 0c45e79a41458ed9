"""Validation of the cost model against measurement: the statistics, and one small end-to-end sweep."""

from __future__ import annotations

import json

import pytest
from conduit.cli.main import app
from typer.testing import CliRunner

from benchmarks.validate import mape, pearson, validate, validation_markdown
from conduit.core import Policy, feasible_schedules
from conduit.scheduling.profiler import ProfileSettings
from conduit.scheduling.workload import CostKind, SyntheticWorkload

FAST = ProfileSettings(warmup=1, repeats=2, loop_iterations=6, loop_warmup=2, calibration_rounds=1, verify_rounds=1)


def test_pearson_and_mape_match_their_definitions():
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert mape([110, 90], [100, 100]) == pytest.approx(10.0)


def test_a_small_sweep_reports_every_configuration_and_where_the_plan_lands():
    w = SyntheticWorkload(
        policy=Policy.OFF_POLICY, dim=8, unit_size=16, batch_size=16, capacity=512, rollout_ms=0.2, update_ms=0.4,
        cost=CostKind.SLEEP,
    )
    rep = validate([w], settings=FAST, g_max=2, iterations=6, sweep_rounds=2, rematch_rounds=2, rematch_top=2)
    (d,) = rep.dimensions
    assert {s for s, _, _ in d.rows} == set(feasible_schedules(Policy.OFF_POLICY, 1, 2, 2))
    assert all(p > 0 and m > 0 for _, p, m in d.rows)
    assert d.auto is not None and d.auto.schedule in d.profile.verified  # the plan is a verified one
    assert d.auto.schedule in d.rematch and len(d.rematch) >= 2
    assert d.auto_vs_best >= 1.0 and d.model_vs_best >= 1.0
    assert -1.0 <= rep.pearson_r <= 1.0 and rep.mape >= 0.0


def test_bench_validate_json_carries_the_rows():
    tiny = ["--unit-size", "16", "--batch-size", "16", "--capacity", "512", "--rollout-ms", "0.2",
            "--update-ms", "0.4", "--g-max", "2", "--cost", "sleep"]
    result = CliRunner().invoke(app, ["bench", "validate", "--json", "--dims", "8", *tiny])
    assert result.exit_code == 0, result.output
    v = json.loads(result.stdout)
    (d,) = v["dimensions"]
    assert len(d["rows"]) == d["configs"] == 16
    assert {"pearson_r", "mape_pct"} <= set(v) and d["auto_vs_best"] >= 1.0
    table = validation_markdown(v)  # what `conduit bench all` writes into BENCHMARKS.md
    assert "Pearson r = " in table and table.count("\n| 8 | 16 |") == 1
