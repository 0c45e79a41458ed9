"""``python -m benchmarks.srl_buffer`` runs without an SRL checkout (its notes-based stand-ins), small sizes.

Only that it runs and reports every case: no figure is asserted (a shared 2-core host).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_srl_benchmark_runs_without_an_srl_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CONDUIT_SRL_SRC"}
    out = tmp_path / "srl.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.srl_buffer", "--size", "small", "--repeats", "5", "--steps", "2",
         "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no SRL checkout" in done.stdout
    result = json.loads(out.read_text())
    assert result["shape"] == {"T": 4, "B": 8, "obs": 16, "capacity": 64}
    assert set(result["exposed"]) == {
        f"{kind}/{case}" for kind in ("replay", "queue") for case in ("srl inline", "srl + prefetch", "conduit")
    }
    assert all(len(s["samples_s"]) >= 5 for s in result["exposed"].values())  # a median of >= 5 repeats
