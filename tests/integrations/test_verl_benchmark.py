"""``python -m benchmarks.verl_trainers`` runs, smallest settings: every trainer pair reports its figures.

verl's own trainers and Conduit's on the example's toy workers (one repeat, one timed step each). Only that it
runs and reports every row with numbers: no speed is asserted (a shared 2-core host).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

ROOT = Path(__file__).resolve().parents[2]


def test_the_verl_trainers_benchmark_reports_every_trainer_pair(tmp_path):
    out = tmp_path / "verl_trainers.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.verl_trainers", "--repeats", "1", "--steps", "1", "--latency", "0.05",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("| V")]
    labels = ("V1 `sync` → `conduit_sync`", "V1 `separate_async` → `conduit_separate_async`",
              "V0 `RayPPOTrainer` → `ConduitRayPPOTrainer`")
    assert [row.split(" | ")[0].removeprefix("| ") for row in table] == list(labels)
    figure = re.compile(r"^\d+\.\d{3} \[\d+\.\d{3}–\d+\.\d{3}\]( \([+−]\d+%\))?$")  # median [min–max] (change)
    for row in table:
        cells = [c.strip() for c in row.strip("|").split("|")[1:]]
        assert len(cells) == 4 and all(figure.match(c) for c in cells), row
    result = json.loads(out.read_text())
    assert set(result["rows"]) == {"v1_sync", "v1_separate_async", "v0"}
    for row in result["rows"].values():
        for side in ("verl", "conduit"):
            assert len(row[side]["runs"]) == 1 and len(row[side]["runs"][0]["step_s"]) == 1
            for measure in ("step_s", "exposed_s"):
                figure = row[side][measure]["median"]
                assert math.isfinite(figure) and figure > 0
            assert row[side]["exposed_s"]["median"] <= row[side]["step_s"]["median"]
