"""A push into the sharded buffer keeps the core's promise (issue #47): a bad write raises ``SpecError`` at the
offending push and changes nothing, on every rank, under every routing; the group holds one spec.

Real gloo groups of 2 and 4 ranks over 127.0.0.1 (the session's spawned runs,
:func:`tests.distributed.conftest.run_groups`); the scenarios are in :mod:`tests.distributed.promises`.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import conduit
from tests.distributed.conftest import run_groups
from tests.distributed.promises import ROUTINGS

WORLDS = (2, 4)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    return run_groups(tmp_path_factory)["worlds"]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("declared", [True, False], ids=["declared", "inferred"])
def test_a_bad_push_raises_spec_error_at_the_push_and_changes_nothing(worlds, world, routing, declared):
    ranks = worlds[world]["push_checks"][f"{routing}/{'declared' if declared else 'inferred'}"]
    expected = {"complex", "missing_field", "leading_dims", "list", "empty"} | ({"nan_finite"} if declared else set())
    for r, res in enumerate(ranks):
        assert "error" not in res, res
        assert set(res["bad"]) == expected
        assert res["bad"] == {name: "SpecError" for name in expected}, f"rank {r}: {res['bad']}"
        assert res["counters_unchanged"], f"rank {r}: a refused push was counted"
    first = ranks[0]
    assert first["pushed"] == [8] * world  # two good units of 4 rows per rank, nothing else
    assert sum(first["ingested"]) == 8 * world
    assert first["refused"] == [0] * world and first["in_flight"] == [0] * world and first["exactly_once"]
    assert sum(first["shard_rows"]) == 8 * world
    tids = sorted(t for shard in first["shards"] for t in shard)
    assert tids == sorted(r * 1000 + i for r in range(world) for i in range(8))  # each good row once
    if routing == "round_robin":  # a refused push did not move the routing on: unit k of rank r on r + k + 1
        for s, shard in enumerate(first["shards"]):
            assert all((t // 1000 + t % 1000 // 4 + 1) % world == s for t in shard), (s, shard)
    if routing == "proportional":  # equal shares: every rank's first unit on shard 0, its second on shard 1
        for s, shard in enumerate(first["shards"]):
            assert all(t % 1000 // 4 == s for t in shard), (s, shard)


@pytest.mark.parametrize("world", WORLDS)
def test_ranks_whose_first_units_disagree_get_one_spec_and_an_error_at_the_push(worlds, world):
    """Rank 0's first unit has 5 columns where the others' have 3: no spec declared, push never joins a
    collective. The group takes one layout; a push of the other raises SpecError at that push, and every pull
    after it is served (not one SpecError per pull, for ever)."""
    ordered = worlds[world]["diverge"]["ordered"]  # the others pushed first: rank 0's unit is the odd one
    for r, res in enumerate(ordered):
        assert "error" not in res, res
        assert res["first"] == ("SpecError" if r == 0 else "accepted"), (r, res)
        assert res["pulls"] == ["accepted"] * 3, (r, res)
        assert res["spec"] == [3]
    concurrent = worlds[world]["diverge"]["concurrent"]  # everyone at once: whichever layout came first
    spec = concurrent[0]["spec"]
    assert spec in ([3], [5])
    for r, res in enumerate(concurrent):
        assert "error" not in res, res
        cols = 5 if r == 0 else 3
        assert res["first"] == ("accepted" if [cols] == spec else "SpecError"), (r, res)
        assert res["pulls"] == ["accepted"] * 3, (r, res)
        assert res["spec"] == spec


@pytest.mark.parametrize("world", WORLDS)
def test_a_bad_push_raises_at_the_push_with_an_ingestion_hook_and_on_policy(worlds, world):
    """Round-robin with a hook: what a push checks is the hook's input (the hook runs where the unit lands).
    On-policy: units stay on their rank, checked against the group's one spec."""
    for case in ("hooked_round_robin", "on_policy"):
        ranks = worlds[world]["push_checks_more"][case]
        for r, res in enumerate(ranks):
            assert "error" not in res, (case, res)
            assert set(res["bad"].values()) == {"SpecError"}, (case, r, res["bad"])
            assert res["counters_unchanged"], (case, r)
        if case == "on_policy":
            got = sorted(t for res in ranks for t in res["rows"])
            assert got == sorted(r * 1000 + i for r in range(world) for i in range(8))
        else:
            first = ranks[0]
            assert first["pushed"] == first["ingested"] == 8 * world and first["refused"] == 0
    # an on-policy ingestion hook runs as one process's: HookFailed, not an attachment dropped without a word
    assert worlds[world]["push_checks_more"]["on_policy_attach"] == "HookFailed"


@pytest.mark.parametrize("world", WORLDS)
def test_a_delivery_hook_across_ranks_runs_as_one_processs_does(worlds, world):
    """The hook reads its batch's facts (global importance weights, slots, ids and the ranks holding the rows; local
    sampling: the shard's own delivery path's; on-policy the mini-batch's rows); dropping a row or failing raises
    on every rank, as a single-process delivery path does."""
    cases = worlds[world]["delivery_hooks"]
    for case in ("facts", "facts_local", "facts_on_policy"):
        for r, res in enumerate(cases[case]):
            assert "error" not in res, (case, r, res)
            assert res["ids_seen"], (case, r)
            assert res.get("weights_seen", True), (case, r)
            assert res.get("owners_seen", case != "facts"), (case, r)
    for r, res in enumerate(cases["pool_local"]):  # local sampling: g batches drawn before any is handed out
        assert res == {"rows_match": True}, (r, res)
    alone = {case: _one_process_hook_failure(case) for case in ("drops", "fails")}
    for case in ("drops", "fails", "fails_overlapped"):
        first, again = alone[case.removesuffix("_overlapped")]
        for r, res in enumerate(cases[case]):  # latched: the next pull raises it again, the hook not run again
            assert res["error"].split(":")[0] == first and res["again"] == again and res["runs"] == 1, (case, r, res)
    for r, res in enumerate(cases["drops"]):
        assert "one output row per input row" in res["error"], (r, res)
    for r, res in enumerate(cases["fails"] + cases["fails_overlapped"]):
        assert "the learner's hook failed" in res["error"], (r, res)


def _one_process_hook_failure(case: str) -> tuple[str, str]:
    """What one process raises at the pull whose delivery hook drops a row or fails, and at the next pull."""
    edp = conduit.Conduit(policy="off_policy", train_batch_size=8, capacity=100, sampler="prioritized", seed=11)

    @edp.register_delivery()
    def hook(exp_in: Any, learn_out: Any) -> None:
        if case == "fails":
            raise ValueError("the learner's hook failed")
        learn_out.write({k: v[1:] for k, v in exp_in.read().items()})

    edp.push({"obs": torch.zeros(8, 3), "tid": torch.arange(8)})
    outcomes = []
    for _ in range(2):
        try:
            edp.pull()
            outcomes.append("accepted")
        except Exception as e:
            outcomes.append(type(e).__name__)
    edp.close()
    return outcomes[0], outcomes[1]


@pytest.mark.parametrize("world", WORLDS)
def test_the_learner_side_keeps_one_processs_promises(worlds, world):
    """A bad priority (NaN, on a row another rank holds) raises ValueError at update_priorities and the group goes
    on (not a RankFailed at the next collective); new rows enter every shard at the group's max priority, and an
    update for rows overwritten since their draw raises no max; after close, a push (routed or not) and a priority
    update raise RuntimeClosed and count nothing; an ingestion hook that fails on a unit routed to another rank
    raises HookFailed, naming it, on every rank at the same sync (not a stall on the pushing rank); a local
    pull waits for an actor's late push; a push that timed out taking nothing changes nothing: the group's counts
    still add up."""
    side = worlds[world]["learner_side"]
    for r, res in enumerate(side["bad_priorities"]):
        assert res == {"nan_update": "ValueError", "then": "accepted"}, (r, res)
    assert side["local_waits"] == "accepted"
    # rank 0 fed back 100: every shard's new rows entered at the group's max priority, as one buffer's would
    top = round((100.0 + 1e-6) ** 0.6, 6)
    assert side["new_rows"] == [{"leaves": [top], "max": 100.0}] * world, side["new_rows"]
    # an update for rows overwritten since their draw is dropped by their shard: it raises no max, there or anywhere
    assert side["stale_update"] == [{"leaves": [1.0], "max": 1.0}] * world, side["stale_update"]
    closed = {"push": ["RuntimeClosed"] * 2, "update": "RuntimeClosed", "counts_kept": True}
    assert side["after_close"] == [closed] * world, side["after_close"]
    failed = {"pushes": "accepted", "pull": "HookFailed", "named": True, "again": "HookFailed"}
    assert side["routed_hook_fails"] == [failed] * world, side["routed_hook_fails"]
    assert side["timed_out"] == "ConduitTimeout"
    assert side["counts"] == {"exactly_once": True, "pushed": [4] * world, "rows": 4 * world}, side["counts"]


@pytest.mark.parametrize("world", WORLDS)
def test_a_restore_onto_the_same_ranks_hands_out_the_batches_drawn_ahead_first(worlds, world):
    """Saved with a batch drawn ahead (g = 2) and priorities fed back, restored onto as many ranks: the next
    batches are the ones the saved run would have delivered, rows and importance weights alike."""
    res = worlds[world]["restore_ahead"]
    assert res["same"], res


@pytest.mark.parametrize("world", WORLDS)
def test_on_policy_keeps_one_processs_promises(worlds, world):
    """``ready()`` says whether rows wait; an iteration too small for its mini-batches is refused on every rank and
    keeps its rows; ``minibatches()`` seals at the call; batches name their learner; the counters count; a
    checkpoint mid-iteration is refused, one between iterations restores the iteration number; a failed ingestion
    hook is latched (the rank's next push raises it again)."""
    res = worlds[world]["on_policy_promises"]
    for r, got in enumerate(res["iterate"]):
        assert got == {"ready_before": False, "ready_after": True, "too_few": "SemanticsError",
                       "save_mid": "SemanticsError", "iteration0": True, "info": [[0, r]],
                       "pushed": [8] * world}, (r, got)
    assert all(g["iterations"] == [1] for g in res["restored"]), res["restored"]  # the numbers go on
    assert sum(g["rows"] for g in res["restored"]) == 4 * world, res["restored"]  # the rows after the last seal
    for got in res["hook_latched"]:
        assert got == {"pushes": ["accepted", "HookFailed", "HookFailed"]}, got


@pytest.mark.parametrize("world", WORLDS)
def test_a_checkpoint_taken_while_actors_push_restores_counts_that_add_up(worlds, world):
    """Saved while every rank's actor pushes, units in flight between ranks: restored, every row counted pushed
    was ingested or refused (what was in flight when it was taken is neither in it nor counted)."""
    assert worlds[world]["save_under_pushes"] == [{"exactly_once": True, "in_flight": 0, "rows": True}] * world
