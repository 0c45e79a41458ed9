"""The GPU checks script and the planner sweep run (and answer) on a machine without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    """A module of scripts/ (they import each other by name, as when run from there)."""
    import importlib

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_the_planner_sweep_measures_every_feasible_candidate_and_gives_a_verdict(tmp_path) -> None:
    planner_sweep = _script("planner_sweep")
    out = tmp_path / "sweep.json"
    assert planner_sweep.main(["--dims", "8", "64", "10000000", "--capacity", "2048", "--measure-rows", "1024",
                               "--repeats", "3", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["verdict"].startswith("planner choice = fastest measured candidate at every dim: ")
    feasible = [d for d in doc["dims"] if d["chosen"] is not None]
    assert [d["dim"] for d in feasible] == [8, 64]
    assert "no feasible placement" in doc["dims"][2]["infeasible"]  # 80 MB rows x 2,048: said, not counted
    for d in feasible:
        assert d["candidates"] and d["fastest_measured"] in [c["placement"] for c in d["candidates"]]
        for c in d["candidates"]:
            assert c["measured_s"] > 0 and c["model_s"] > 0 and c["model_over_measured"] > 0
    assert doc["agree"] == all(d["agree"] for d in feasible)
    if not torch.cuda.is_available():  # the host tiers: pageable host memory is the one candidate
        assert doc["agree"] and {c["kind"] for d in feasible for c in d["candidates"]} == {"cpu_pageable"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only answer; on a GPU the script runs the checks")
def test_gpu_checks_without_cuda_says_so_and_exits_0(tmp_path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-checks.sh"), str(tmp_path / "logs")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "no CUDA device here" in done.stdout


def test_the_scaling_table_predicts_every_count_next_to_the_papers_figures(tmp_path) -> None:
    scaling_table = _script("scaling_table")
    out = tmp_path / "scaling.json"
    assert scaling_table.main(["--setup", "a100", "--json", str(out)]) == 0
    (doc,) = json.loads(out.read_text())
    rows = {r["gpus"]: r for r in doc["rows"]}
    assert sorted(rows) == [1, 2, 4, 8, 16] and rows[16]["nodes"] == 2
    assert rows[1]["t_iter_adaptive_s"] * 1e3 == pytest.approx(95.0)  # the calibration point is the paper's
    assert rows[16]["paper_ms"] == 15.0 and "Gear 35" in rows[16]["paper_other"]
    for r in rows.values():  # adaptive is the best candidate under the model, so never behind the fixed spread
        assert 0 < r["path_adaptive_s"] <= r["path_fixed_s"] and r["path_adaptive_s"] <= r["paths_s"]["Alg. 1"]
    times = [rows[n]["t_iter_adaptive_s"] for n in sorted(rows)]
    assert times == sorted(times, reverse=True)  # strong scaling: more GPUs, less time per iteration
