"""Promise: ``save()`` replaces only a previous Conduit checkpoint; anything else at the path is refused.

A save writes a temporary sibling and renames it into place, setting the previous checkpoint aside first.
What it sets aside and removes must be a checkpoint: a user's directory or file at the path is refused with
:class:`CheckpointError` naming the path, and left as it was. The path is resolved once, so ``..`` and a
symbolic link lead where the user meant: through a link, the checkpoint it points to is replaced and the link
stays a link.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conduit import CheckpointError, Conduit
from conduit.checkpoint import read_manifest
from tests.helpers import transitions


def _runtime(rows: int) -> Conduit:
    edp = Conduit(policy="off_policy", train_batch_size=4, capacity=64, seed=0)
    edp.push(transitions(rows))
    edp.flush()
    return edp


def _inserted(path: Path) -> int:
    return int(read_manifest(path)[1]["buffer"]["inserted"])


def test_a_directory_that_is_not_a_checkpoint_is_refused_and_kept(tmp_path):
    target = tmp_path / "ck"
    target.mkdir()
    (target / "model.bin").write_bytes(b"weights")
    with _runtime(8) as edp:
        with pytest.raises(CheckpointError, match=rf"{target}.*not a Conduit checkpoint.*model\.bin"):
            edp.save(target)
        assert (target / "model.bin").read_bytes() == b"weights"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temporary, nothing set aside
        (target / "model.bin").unlink()
        edp.save(target)  # an empty directory holds nothing to lose: the checkpoint goes there
    assert _inserted(target) == 8


def test_a_checkpoint_holding_a_file_no_save_wrote_is_refused_and_kept(tmp_path):
    target = tmp_path / "ck"
    with _runtime(8) as edp:
        edp.save(target)
        (target / "notes.txt").write_text("mine")
        with pytest.raises(CheckpointError, match=r"notes\.txt"):
            edp.save(target)
    assert (target / "notes.txt").read_text() == "mine" and _inserted(target) == 8


def test_a_file_at_the_path_is_refused_and_kept(tmp_path):
    target = tmp_path / "ck"
    target.write_text("not a checkpoint")
    with _runtime(8) as edp:
        with pytest.raises(CheckpointError, match=rf"{target} is a file"):
            edp.save(target)
    assert target.read_text() == "not a checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_a_path_through_dotdot_saved_twice_replaces_the_checkpoint(tmp_path):
    through = f"{tmp_path}/ck/../ck"
    with _runtime(8) as edp:
        edp.save(through)
        edp.push(transitions(8, start=8))
        edp.flush()
        edp.save(through)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # nothing stranded, nothing set aside
    assert _inserted(tmp_path / "ck") == 16


def test_a_relative_path_is_resolved_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    with _runtime(8) as edp:
        written = edp.save("sub/../ck")
        edp.save("ck")
    assert written == tmp_path.resolve() / "ck"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "sub"]


def test_saving_through_a_symlink_replaces_the_checkpoint_it_points_to_and_keeps_the_link(tmp_path):
    real, link = tmp_path / "ck-0001", tmp_path / "latest"
    with _runtime(8) as edp:
        edp.save(real)
        link.symlink_to(real.name)
        edp.push(transitions(8, start=8))
        edp.flush()
        edp.save(link)
    assert link.is_symlink() and os.readlink(link) == real.name
    assert _inserted(link) == _inserted(real) == 16
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck-0001", "latest"]  # no set-aside copy left behind


def test_a_symlink_to_a_directory_that_is_not_a_checkpoint_is_refused(tmp_path):
    mine, link = tmp_path / "mine", tmp_path / "link"
    mine.mkdir()
    (mine / "model.bin").write_bytes(b"weights")
    link.symlink_to(mine)
    with _runtime(8) as edp:
        with pytest.raises(CheckpointError, match="not a Conduit checkpoint"):
            edp.save(link)
    assert link.is_symlink() and (mine / "model.bin").read_bytes() == b"weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "mine"]
