"""Every example runs, with a tiny budget, and its learner actually learns."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_dqn_corridor_learns_to_reach_the_goal():
    assert load("dqn_corridor").main(iterations=400, verbose=False) > 0.5


def test_ppo_corridor_improves_over_a_random_policy():
    ex = load("ppo_corridor")
    before = ex.main(iterations=1, verbose=False)
    after = ex.main(iterations=25, verbose=False)
    assert after > before
