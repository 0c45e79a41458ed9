"""The distributed checkpoint's lifecycle is the core's (issue #47): a refused restore changes nothing on any
rank, nothing is read from outside the checkpoint, and the next save removes what a killed one left.

Real gloo groups (the session's spawned runs, :func:`tests.distributed.conftest.run_groups`): a 3-rank save
stalled, then killed, on rank 0; a 4-rank group saving where it left its temporary and restoring damaged
copies of its checkpoint; a 2-rank group restoring them onto another rank count.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.distributed.conftest import run_groups


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_groups(tmp_path_factory)


def test_the_next_save_removes_the_temporary_a_killed_save_left(runs):
    assert runs["stalled"]["left"], "the killed save left no temporary (the scenario did not reach its shards)"
    saved = runs["worlds"][4]
    assert saved["leftovers_before"] == runs["stalled"]["left"]
    assert saved["leftovers_after"] == []


@pytest.mark.parametrize("world", [4, 2], ids=["same-ranks", "re-sharded"])
@pytest.mark.parametrize("which", ["damaged", "escape"])
def test_a_refused_restore_changes_nothing_on_any_rank(runs, world, which):
    """``damaged``: one shard's file no longer matches its checksum. ``escape``: the manifest points that shard
    outside the checkpoint's directory (at an intact copy): refused, nothing read from there."""
    ranks = runs["worlds"][world]["restore_refusals"]["ranks"]
    for r, res in enumerate(ranks):
        got = res["refused"][which]
        assert got["raised"] == "CheckpointError", (r, got)
        assert got["after"] == res["before"], f"rank {r} changed: {got['after']} != {res['before']}"
        if which == "escape":
            assert "outside" in got["message"], got["message"]


@pytest.mark.parametrize("world", [4, 2], ids=["same-ranks", "re-sharded"])
def test_a_good_restore_after_refused_ones_loads_every_row_once(runs, world):
    saved = runs["worlds"][4]["save"]
    ranks = runs["worlds"][world]["restore_refusals"]["ranks"]
    for res in ranks:
        assert res["good"]["raised"] is None, res["good"]
    tids = sorted(t for res in ranks for t in res["good"]["tids"])
    assert tids == sorted(int(t) for t in saved["leaves"])
    assert ranks[0]["good"]["pushed"] == saved["pushed"] and ranks[0]["good"]["exactly_once"]
