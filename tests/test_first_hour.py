"""What a new user meets first: every error names their key or value and what is allowed; output is readable."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from conduit.cli.main import app
from typer.testing import CliRunner

import conduit

WIDE = {"COLUMNS": "200"}


def test_plan_with_a_misspelled_topology_key_names_it_once_in_the_files_units(tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text(
        "name: t\nnodes:\n  - gpus: 8\n    host_memroy_gib: 1800\n    gpu_memory_gib: -79\n"
        "    host_memcpy_gb_per_s: 14\n    gpu_local_gb_per_s: 800\n    host_to_gpu_gb_per_s: 11\n"
        "    gpu_to_host_gb_per_s: 10\n"
    )
    result = CliRunner().invoke(app, ["plan", "-t", str(bad)], env=WIDE)
    out = result.output
    assert result.exit_code == 2 and "Traceback" not in out
    assert "host_memroy_gib: not a known key; did you mean 'host_memory_gib'?" in out
    assert out.count("gpu_memory_gib") == 1 and "(received -79)" in out
    assert "host_memroy_bytes" not in out and "84825604096" not in out


def test_plan_kind_is_a_choice_listed_in_help_and_errors():
    result = CliRunner().invoke(app, ["plan", "--kind", "bogus"], env=WIDE)
    assert result.exit_code == 2 and "cpu_pageable" in result.output and "single_gpu" in result.output
    help_text = CliRunner().invoke(app, ["plan", "--help"], env=WIDE).output
    assert "cpu_pinned" in help_text


@pytest.mark.parametrize("command", [["profile", "--config"], ["plan", "-t"]], ids=["profile", "plan"])
def test_a_malformed_yaml_file_is_one_clean_error_for_every_command(tmp_path, command):
    bad = tmp_path / "bad.yaml"
    bad.write_text("dim: [1, 2\n  oops")
    result = CliRunner().invoke(app, [*command, str(bad)], env=WIDE)
    assert result.exit_code == 2, result.output
    assert "not valid YAML (line 2" in result.output and "Traceback" not in result.output


def test_profile_config_with_an_unknown_field_suggests_the_right_one(tmp_path):
    cfg = tmp_path / "w.yaml"
    cfg.write_text("dimm: 64\n")
    result = CliRunner().invoke(app, ["profile", "--config", str(cfg)], env=WIDE)
    assert result.exit_code == 2 and "dimm: not a setting (got 64); did you mean 'dim'?" in result.output


def test_an_invalid_config_is_a_config_error_listing_each_field():
    with pytest.raises(conduit.ConfigError) as err:
        conduit.ConduitConfig(policy="off_policy", train_batch_size=0, capacity=10, sampler="prioritised")
    text = str(err.value)
    assert isinstance(err.value, ValueError) and "2 problems" in text
    assert "train_batch_size: Input should be greater than 0 (got 0)" in text
    assert "'fifo' or 'lifo' (got 'prioritised')" in text


def test_a_failing_hook_is_logged_once_readably(caplog):
    edp = conduit.Conduit(policy="off_policy", train_batch_size=2, capacity=10)

    @edp.register_ingestion()
    def parse(actor_in, exp_out):
        raise ValueError("the env returned\nsomething odd")

    with caplog.at_level(logging.ERROR, logger="conduit"), pytest.raises(conduit.HookFailed):
        edp.push({"x": np.zeros((2, 2), np.float32)})
    records = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(records) == 1
    line = records[0].getMessage()
    assert "\\n" not in line and "\n" not in line and "parse'" in line and "re-raised" in line
    edp.close()


def test_an_on_policy_push_longer_than_the_iteration_is_said_once(caplog):
    with caplog.at_level(logging.WARNING, logger="conduit"):
        with conduit.Conduit(policy="on_policy", train_batch_size=64, num_minibatches=4) as edp:
            for _ in range(3):
                edp.push({"x": np.zeros((100, 2), np.float32)})
                assert sum(len(b["x"]) for b in edp.minibatches()) == 100
    said = [r for r in caplog.records if "not train_batch_size=64" in r.getMessage()]
    assert len(said) == 1 and "never split across iterations" in said[0].getMessage()


def test_batch_info_prints_short_and_describes_in_full():
    with conduit.Conduit(policy="off_policy", train_batch_size=256, capacity=1000, sampler="prioritized") as edp:
        edp.push({"x": np.zeros((512, 2), np.float32)})
        info = edp.pull().info
    text = repr(info)
    assert len(text) < 200 and "256 rows" in text and "weighted" in text
    full = info.describe()
    assert len(full["ids"]) == 256 and full["weights"].shape == (256,)


def test_profile_output_redirected_says_each_finished_step():
    tiny = ["--dim", "16", "--unit-size", "32", "--batch-size", "32", "--capacity", "2048", "--rollout-ms", "0.2",
            "--update-ms", "0.5", "--policy", "off"]
    result = CliRunner().invoke(app, ["profile", *tiny], env=WIDE)
    assert result.exit_code == 0, result.output
    steps = [line for line in result.output.splitlines() if ": step " in line]
    assert len(steps) > 10 and steps[0].startswith("DQN-like off-policy: step 1 ")
    numbers = [int(line.split(": step ")[1].split()[0]) for line in steps]
    assert numbers == list(range(1, len(steps) + 1))  # consecutive: no totals that jump
    left = [float(line.split("; ")[-1].split(" s of the ")[0]) for line in steps]
    assert left == sorted(left, reverse=True)  # time left never grows
    assert "checking" in steps[-1]  # the last step is the closing check
