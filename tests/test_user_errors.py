"""A user's mistakes are told in the user's words: each message names the field or file and says what to do.

Each case below was once a traceback from deep inside (``torch.cuda.Stream``, a utf-8 decoder, a bare
``KeyError``) or a silent acceptance; the tests pin the message's two halves: *what* was wrong, and the fix.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conduit.cli.main import app
from typer.testing import CliRunner

import conduit
from conduit.errors import ConfigError, UnevenMinibatches

WIDE = {"COLUMNS": "250"}
TINY = ["--dim", "8", "--unit-size", "16", "--batch-size", "16", "--capacity", "256", "--budget", "5"]


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- devices ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["learner_device", "storage_device"])
def test_a_cuda_device_on_a_machine_without_cuda_is_refused_naming_the_field(monkeypatch, field):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as err:
        conduit.Conduit(policy="off_policy", capacity=64, train_batch_size=8, **{field: "cuda:0"})
    text = str(err.value)
    assert f"{field}='cuda:0'" in text and "no CUDA device" in text and f"{field}='cpu'" in text


def test_a_cuda_index_past_the_machines_gpus_is_refused_listing_the_ones_there(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"learner_device='cuda:3'.*2 CUDA device\(s\) \(cuda:0\.\.cuda:1\)"):
        conduit.Conduit(policy="off_policy", capacity=64, train_batch_size=8, learner_device="cuda:3")


# -- conduit profile --config -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("dim: big\n", "dim: Input should be a valid integer (got 'big')"),
        ("dim: -5\n", "dim: Input should be greater than or equal to 1 (got -5)"),
        ("num_minibatches: 3\n", "num_minibatches: not a setting (got 3); did you mean 'minibatches'?"),
        ("policy: sideways\n", "policy: Input should be 'off', 'on' or 'both'"),
    ],
)
def test_profile_config_is_checked_as_the_flags_are_and_names_the_file_and_key(tmp_path, text, expected):
    path = tmp_path / "workload.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["profile", "--config", str(path), *TINY], env=WIDE)
    assert result.exit_code == 2, result.output
    out = _one_line(result.output)
    assert f"--config file {str(path)!r}" in out and expected in out
    assert "Traceback" not in result.output


def test_profile_config_keys_are_the_flags_names_and_a_flag_given_wins(tmp_path):
    from conduit.cli.profile_options import ProfileOptions

    path = tmp_path / "workload.json"
    path.write_text('{"minibatches": 2, "batch_size": 64, "dim": 12}')
    defaults = {name: field.default for name, field in ProfileOptions.model_fields.items()}
    options = ProfileOptions.build({**defaults, "dim": 33}, {"dim"}, path)
    assert (options.minibatches, options.batch_size, options.dim) == (2, 64, 33)
    assert [w.num_minibatches for w in options.workloads()] == [2, 2]


# -- conduit plan --topology --------------------------------------------------------------------------------------
def test_a_topology_file_missing_name_and_nodes_is_told_those_keys(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("description: my cluster\n")
    result = CliRunner().invoke(app, ["plan", "-t", str(path), "-d", "10"], env=WIDE)
    assert result.exit_code == 2
    out = _one_line(result.output)
    assert str(path) in out
    assert "name: required, not given; add it to the file" in out
    assert "nodes: required, not given; add it to the file" in out
    assert "_gb_per_s" not in out


def test_a_binary_topology_file_is_named_and_called_not_text(tmp_path):
    path = tmp_path / "weights.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    result = CliRunner().invoke(app, ["plan", "-t", str(path), "-d", "10"], env=WIDE)
    assert result.exit_code == 2
    assert f"topology file {str(path)!r}: not a text file (expected UTF-8 JSON or YAML)" in _one_line(result.output)


def test_a_shipped_topology_answers_to_its_files_name_too():
    by_name = CliRunner().invoke(app, ["plan", "-t", "a100_8x_nvlink", "-d", "10", "--json"], env=WIDE)
    by_file = CliRunner().invoke(app, ["plan", "-t", "a100_8x_nvlink.yaml", "-d", "10", "--json"], env=WIDE)
    assert by_name.exit_code == 0 and by_file.exit_code == 0, by_file.output
    assert by_name.stdout == by_file.stdout


def test_a_topology_that_is_neither_a_file_nor_a_name_lists_the_names():
    result = CliRunner().invoke(app, ["plan", "-t", "a100_9x.yaml", "-d", "10"], env=WIDE)
    assert result.exit_code == 2
    out = _one_line(result.output)
    assert "--topology 'a100_9x.yaml': no such file" in out and "a100_8x_nvlink" in out


# -- batches and priorities ---------------------------------------------------------------------------------------
def _replay(**fields) -> conduit.Conduit:
    edp = conduit.Conduit(policy="off_policy", capacity=64, train_batch_size=8, **fields)
    edp.push({"obs": torch.zeros(16, 3), "reward": torch.zeros(16)})
    return edp


def test_a_missing_batch_field_lists_the_fields_there():
    edp = _replay()
    try:
        batch = edp.pull()
        with pytest.raises(KeyError) as err:
            batch["observations"]
        assert "batch has no field 'observations'" in str(err.value) and "its fields: obs, reward" in str(err.value)
        with pytest.raises(KeyError, match="did you mean 'reward'"):
            batch["rewards"]
        assert "obs" in batch and "observations" not in batch and batch.get("observations") is None
    finally:
        edp.close()


def test_batch_clone_owns_its_memory_and_keeps_its_info():
    edp = _replay()
    try:
        batch = edp.pull()
        kept = batch.clone()
        assert set(kept) == set(batch) and kept.info == batch.info
        for name in batch:
            assert torch.equal(kept[name], batch[name])
            assert kept[name].untyped_storage().data_ptr() != batch[name].untyped_storage().data_ptr()
    finally:
        edp.close()


def test_negative_priorities_are_refused_naming_the_position_and_the_fix():
    edp = _replay(sampler="prioritized")
    try:
        batch = edp.pull()
        priorities = np.ones(batch.size)
        priorities[3] = -0.5
        with pytest.raises(ValueError, match=r"priorities must be >= 0, got -0.5 at position 3.*abs\(\)"):
            edp.update_priorities(batch, priorities)
        assert edp.update_priorities(batch, np.abs(priorities)) == batch.size  # nothing was half-applied
    finally:
        edp.close()


def test_uneven_minibatches_are_said_with_their_sizes_and_an_even_choice():
    with pytest.warns(UnevenMinibatches) as caught:
        conduit.ConduitConfig(policy="on_policy", train_batch_size=100, num_minibatches=3)
    text = str(caught[0].message)
    assert "1 mini-batch(es) of 34 rows and 2 of 33" in text and "train_batch_size=99 or 102" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnevenMinibatches)
        conduit.ConduitConfig(policy="on_policy", train_batch_size=99, num_minibatches=3)  # even: no word


def test_a_path_given_to_from_checkpoint_that_is_a_file_is_told_so(tmp_path: Path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"\0" * 8)
    with pytest.raises(conduit.errors.CheckpointError) as err:
        conduit.Conduit.from_checkpoint(path)
    text = str(err.value)
    assert str(path) in text and "is a file" in text and "directory" in text


@pytest.mark.parametrize("bad", [[1, 2, 3], 5, "obs"])
def test_a_push_that_is_not_a_mapping_is_told_what_a_write_is(bad):
    """The first push infers the spec: a list there was an AttributeError from deep inside spec.py."""
    edp = conduit.Conduit(policy="off_policy", train_batch_size=4, capacity=64)
    try:
        with pytest.raises(conduit.errors.SpecError, match=r"a write must be a mapping of field -> array or tensor"):
            edp.push(bad)
        assert edp.stats().pushed_rows == 0
    finally:
        edp.close()
