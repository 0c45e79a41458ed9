"""``conduit plan`` through typer's CliRunner: the tables, the JSON (the paper's MI250X result), errors."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import typer
from conduit.cli.plan import plan, transition_bytes
from typer.testing import CliRunner

import conduit.placement.policy as placement_policy
from conduit.placement import Topology, builtin_topology

WIDE = {"COLUMNS": "220"}


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    """The real ``conduit`` app when all its commands import, else one registering only ``plan``."""
    try:
        from conduit.cli.main import app as main_app
    except ImportError:  # sibling commands still being written
        local = typer.Typer()
        local.command("plan")(plan)

        @local.callback()
        def _root() -> None:
            """Keep ``plan`` a subcommand, as in the real app."""

        return local
    return main_app


def run(app: typer.Typer, *args: str) -> Any:
    return CliRunner().invoke(app, ["plan", *args], env=WIDE)


def run_json(app: typer.Typer, *args: str, code: int = 0) -> dict[str, Any]:
    result = run(app, *args, "--json")
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


def test_transition_bytes_is_the_papers_synthetic_transition() -> None:
    assert transition_bytes(1_000) == 8_013 and transition_bytes(20_000) == 160_013


def test_table_lists_every_candidate_marks_the_choice_and_prints_the_map(app: typer.Typer) -> None:
    result = run(app, "--topology", "mi250x_8gcd", "--dim", "20000")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Candidates (Alg. 1)" in out and "Placement map" in out
    for column in ("ingest", "deliver", "total", "needed", "usable", "fits"):
        assert column in out
    assert "shared_gpu(cuda:0, cuda:1, cuda:6)  <- chosen" in out
    assert out.count("<- chosen") == 1
    assert "no: " in out and "missing" in out  # single GPUs do not fit at dim 20,000
    assert "128 - " in out  # the map's first region starts at the default dim 128
    assert "chosen: shared_gpu(cuda:0, cuda:1, cuda:6)" in out


def test_json_reproduces_the_mi250x_result(app: typer.Typer) -> None:
    small = run_json(app, "-t", "mi250x_8gcd", "--dim", "1000", "--capacity", "1000000")
    assert small["workload"]["sample_bytes"] == 8_013 and small["workload"]["learners"] == ["cuda:0"]
    assert small["chosen"]["kind"] == "single_gpu" and small["chosen"]["devices"] == ["cuda:0"]
    assert small["error"] is None
    assert sum(c["chosen"] for c in small["candidates"]) == 1
    assert {c["kind"] for c in small["candidates"]} >= {"cpu_pageable", "cpu_pinned", "single_gpu", "shared_gpu"}
    for c in small["candidates"]:
        assert c["transfer_seconds"] == pytest.approx(c["ingest_seconds"] + c["deliver_seconds"])
        assert c["feasible"] == (c["required_bytes"] <= c["usable_bytes"] or c["missing_bytes"] == 0)

    wide = run_json(app, "-t", "mi250x_8gcd", "--dim", "20000", "--capacity", "1000000")
    chosen = wide["chosen"]
    assert chosen["kind"] == "shared_gpu" and chosen["devices"][:2] == ["cuda:0", "cuda:1"]
    assert "cuda:6" in chosen["devices"] and "cuda:7" not in chosen["devices"]  # the 200 GB/s link over 100

    every = run_json(app, "-t", "mi250x_8gcd", "--dim", "20000", "--learner", ",".join(f"cuda:{i}" for i in range(8)))
    assert every["chosen"]["kind"] == "shared_gpu"
    assert set(every["chosen"]["devices"]) <= {"cuda:0", "cuda:2", "cuda:4", "cuda:6"}  # the fast ranks

    regions = wide["map"]
    assert regions[0]["dim_min"] == 128 and regions[0]["kind"] == "single_gpu"
    assert any(r["kind"] == "shared_gpu" and r["dim_min"] <= 20_000 <= r["dim_max"] for r in regions)
    assert all(a["x_max"] + 1 == b["x_min"] for a, b in itertools.pairwise(regions))
    assert all(r["dim_max"] >= 5_000 for r in regions if r["kind"] == "single_gpu")  # fits through dim 5,000
    assert regions[0]["migration_seconds"] is None  # Eq. 3 makespan of moving a full buffer in, per boundary
    assert all(r["migration_seconds"] > 0 for r in regions[1:] if r["placement"] is not None)


def test_no_feasible_placement_exits_1_saying_what_is_missing(app: typer.Typer) -> None:
    result = run(app, "-t", "mi250x_8gcd", "--dim", "20000", "--capacity", "10000000")
    assert result.exit_code == 1
    assert "no feasible placement" in result.stderr and "missing" in result.stderr
    assert "B (" in result.stderr  # the bytes, and the same in readable units
    doc = run_json(app, "-t", "mi250x_8gcd", "--dim", "20000", "--capacity", "10000000", code=1)
    assert doc["chosen"] is None and "missing" in doc["error"]
    assert all(not c["feasible"] for c in doc["candidates"])


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_topology_file_sample_bytes_and_map_range(app: typer.Typer, tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"machine{suffix}"
    builtin_topology("a100_8x_nvlink").model_copy(update={"name": "saved"}).save(path)
    doc = run_json(app, "-t", str(path), "--sample-bytes", "4096", "--capacity", "1000", "--map-min", "1000",
                   "--map-max", "10000000000")
    assert doc["topology"]["name"] == "saved" and doc["workload"]["dim"] is None
    assert doc["chosen"]["devices"] == ["cuda:0"]
    assert doc["map"][0]["x_min"] == 1000 and doc["map"][-1]["x_max"] == 10**10
    assert doc["map"][-1]["placement"] is None  # 10 GB per sample x 1000 fits nowhere
    assert [r["kind"] for r in doc["map"][:2]] == ["single_gpu", "shared_gpu"]
    assert "dim_min" not in doc["map"][0]


def test_bad_arguments_are_usage_errors(app: typer.Typer) -> None:
    both = run(app, "-t", "mi250x_8gcd", "--dim", "10", "--sample-bytes", "10")
    assert both.exit_code == 2 and "not both" in both.output
    unknown = run(app, "-t", "no_such_machine")
    assert unknown.exit_code == 2 and "mi250x_8gcd" in unknown.stderr
    device = run(app, "-t", "mi250x_8gcd", "--learner", "cuda:9")
    assert device.exit_code == 2 and "cuda:9" in device.stderr


def test_default_topology_profiles_this_machine(app: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake(refresh: bool = False) -> Topology:
        calls.append(refresh)
        return builtin_topology("a100_8x_nvlink")

    monkeypatch.setattr(placement_policy, "this_machine_topology", fake)
    doc = run_json(app, "--dim", "128")
    assert calls and doc["topology"]["source"] == "profiled live"
    assert doc["workload"]["learners"] == ["cuda:0"] and doc["chosen"]["kind"] == "single_gpu"
