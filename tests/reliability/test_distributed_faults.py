"""How soon a stalled rank is named (issue #47): within the bound the docs give, ``timeout_s`` plus the
diagnosis window (:attr:`conduit.distributed.group.RankGroup.failure_bound_s`), whichever rank stalled, the
rank hosting the group's store included.

A 3-rank gloo group (:func:`tests.distributed.promises.stalled_save`, run once per session): rank 0 stops itself
(SIGSTOP) in the middle of a collective save; the others must raise RankFailed naming it.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.distributed.conftest import run_groups

#: what a loaded 2-core host may add to the bound (process scheduling, the save's own file writes)
SLACK_S = 1.5


@pytest.fixture(scope="module")
def stalled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_groups(tmp_path_factory)["stalled"]


def test_a_stalled_rank_is_named_within_the_documented_bound(stalled):
    timeout = stalled["timeout"]
    bound = timeout + min(1.0, max(0.1, 0.25 * timeout))  # the documented formula
    assert len(stalled["reports"]) == stalled["world"] - 1
    for rep in stalled["reports"]:
        assert rep["raised"] == "RankFailed", rep
        assert rep["ranks"] == [0], rep
        assert rep["bound"] == pytest.approx(bound), rep
        assert rep["seconds"] < bound + SLACK_S, rep  # never a speed: an upper bound with slack
