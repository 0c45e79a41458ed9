"""The RLlib examples run with tiny budgets, with and without Conduit, and report their numbers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray.rllib")

pytestmark = [pytest.mark.rllib, pytest.mark.usefixtures("ray_session")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def check(results: dict, labels: set[str], iterations: int) -> None:
    assert set(results) == labels
    for rows in results.values():
        assert len(rows) == iterations
        for row in rows:
            assert row["wall_s"] > 0 and 0 <= row["share"] <= 1 and row["experience_s"] > 0


def test_dqn_cartpole_example():
    results = load("rllib_dqn_cartpole").main(iterations=2, compare=True, verbose=False)
    check(results, {"rllib", "conduit"}, 2)
    assert "buffer.sample" in results["conduit"][-1]["parts"]


def test_ppo_cartpole_example():
    results = load("rllib_ppo_cartpole").main(iterations=2, compare=True, verbose=False)
    check(results, {"rllib", "conduit"}, 2)
    assert results["conduit"][-1]["parts"]["minibatch_wait"] >= 0


def test_large_obs_example_compares_side_by_side(capsys):
    module = load("rllib_large_obs")
    results = module.main(iterations=2, obs_dim=1024, verbose=True)
    check(results, {"rllib", "conduit"}, 2)
    out = capsys.readouterr().out
    assert "| rllib |" in out and "| conduit |" in out
