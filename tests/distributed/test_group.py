"""The distributed experience plane on real torch.distributed groups (gloo over 127.0.0.1), 2 and 4 ranks.

The groups run once per session (``group_runs`` in conftest); each test checks one
property of their results against one buffer's semantics.
"""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch.multiprocessing as mp
from scipy import stats

from conduit.distributed import launch
from tests.distributed import workers

WORLDS = (2, 4)
P_OK = 1e-3  # a correct sampler fails a chi-square test this rarely


def _seen_counts(res: dict) -> tuple[list[int], np.ndarray]:
    tids = sorted(t for r in res["ranks"] for t in r["tids"])
    counts = collections.Counter(t for r in res["ranks"] for t in r["seen"])
    return tids, np.array([counts.get(t, 0) for t in tids], dtype=np.float64)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("routing", ["round_robin", "proportional"])
def test_ingestion_is_exactly_once_under_concurrent_pushes(group_runs, world, routing):
    res = group_runs[world][routing]
    assert res["errors"] == []
    assert res["exactly_once"] and res["in_flight"] == 0
    assert res["pushed"] == res["ingested"] == res["expected"]
    assert sorted(res["tids"]) == list(range(res["expected"]))  # every row in exactly one shard
    rows = np.array(res["shard_rows"], dtype=float)
    if routing == "round_robin":  # units dealt one by one: shards within a few units of each other
        assert rows.max() - rows.min() <= 7 * 3 * world
    else:  # capacity-proportional: shares 1:2:...:world
        share = np.array(res["capacity"], dtype=float) / sum(res["capacity"])
        assert np.allclose(rows / rows.sum(), share, atol=0.03)


@pytest.mark.parametrize("world", WORLDS)
def test_global_uniform_sampling_is_one_buffers_distribution(group_runs, world):
    _, counts = _seen_counts(group_runs[world]["uniform"])
    assert counts.sum() == 40 * workers.BATCH * world
    assert stats.chisquare(counts).pvalue > P_OK  # uniform over every row of every shard


@pytest.mark.parametrize("world", WORLDS)
def test_overlapped_exchanges_keep_one_buffers_distribution_beside_other_collectives(group_runs, world):
    """Exchanges run ahead on the delivery path's worker (g=2; and g=1 prioritized), ``stats()`` called while one
    is in flight: the same distributions, the same weights, exactly once, every batch marked overlapped."""
    uni = group_runs[world]["uniform_overlapped"]
    _, counts = _seen_counts(uni)
    assert counts.sum() == 40 * workers.BATCH * world
    assert stats.chisquare(counts).pvalue > P_OK
    assert uni["modes"] == [[True, 2]] and uni["exactly_once"]  # the first exchange too: queued by the first pull
    pri = group_runs[world]["prioritized_overlapped"]
    tids, counts = _seen_counts(pri)
    a, b, eps = workers.ALPHA, workers.BETA, workers.EPS
    p = (workers.prio(np.array(tids)) + eps) ** a
    assert stats.chisquare(counts, counts.sum() * p / p.sum()).pvalue > P_OK
    assert pri["modes"] == [[True, 1]] and pri["exactly_once"]
    for r in pri["ranks"]:
        for t, w in r["weights"].items():
            assert w == pytest.approx((((workers.prio(int(t)) + eps) / (1 + eps)) ** a) ** -b, rel=1e-5)


@pytest.mark.parametrize("world", WORLDS)
def test_auto_plan_probes_every_candidate_and_every_rank_keeps_the_same_plan(group_runs, world):
    res = group_runs[world]["auto_plan"]
    first = res["ranks"][0]
    assert len(first["plan"]) == 4  # inline and overlapped at g = 1, 2 (g_max=2)
    assert sum(row["chosen"] for row in first["plan"]) == 1
    assert all(row["median_s"] > 0 for row in first["plan"])
    for r in res["ranks"]:
        assert r["chosen"] == first["chosen"] and r["plan"] == first["plan"]  # one decision, the same everywhere
        assert all(m == r["chosen"] for m in r["tail"])  # and every pull after it runs in it


@pytest.mark.parametrize("world", WORLDS)
def test_a_kept_plan_whose_loop_slows_is_probed_again_on_every_rank_at_the_same_pull(group_runs, world):
    ranks = group_runs[world]["auto_replan"]["ranks"]
    first = ranks[0]
    assert first["decided"] and first["replanned_at"] is not None and len(first["replans"]) == 1
    assert first["mode_after"] == [False, 1]  # the probe again, inline g = 1 first
    assert first["plan"] == []  # no plan until the new probe decides
    for r in ranks:
        assert {k: r[k] for k in ("replanned_at", "mode_after", "replans")} == {
            k: first[k] for k in ("replanned_at", "mode_after", "replans")}


@pytest.mark.parametrize("world", WORLDS)
def test_the_group_keeps_one_buffers_sample_insert_ratio(group_runs, world):
    res = group_runs[world]["rate_limited"]
    spi, tol = workers.RATE["samples_per_insert"], res["tolerance"]
    centre = spi * workers.RATE["min_size"]
    pull_rows = world * workers.RATE["batch"]
    for r in res["ranks"]:
        assert r["seen"] == res["ranks"][0]["seen"]  # every rank counts the group alike
        for inserts, samples in r["seen"]:
            assert inserts * spi - samples >= centre - tol  # no pull outran the inserts
            assert inserts * spi - samples <= centre + tol  # no rank's pushes outran the samples
        pushed, samples = r["final"]
        assert pushed * spi - samples <= centre + tol  # the true pushes too, not only the synced ones
        assert samples == 31 * pull_rows  # 30 pulls, and the exchange drawn ahead after the last
        # restored onto the same ranks: the group's counts go on, the exchange drawn ahead included (the checkpoint
        # holds its batches, handed out first after the restore)
        assert r["carried"] == [r["carried"][2], 31 * pull_rows, r["carried"][2]]
    # non-blocking: each rank pushed its part of the first room, then was refused; the group pulled what those
    # inserts admit and was refused at the same pull everywhere
    first = res["ranks"][0]
    inserted = sum(r["pushed"] for r in res["ranks"])
    assert inserted * spi <= centre + tol and all(r["pushed"] > 0 for r in res["ranks"])
    assert all(r["pulls"] == first["pulls"] and r["refused"] for r in res["ranks"])
    assert "sample/insert ratio" in first["refused"]
    assert first["ready"] == [True] * first["pulls"] + [False]  # ready() said which pull the ratio would refuse
    assert inserted * spi - first["pulls"] * pull_rows >= centre - tol > inserted * spi - (first["pulls"] + 1) * pull_rows


@pytest.mark.parametrize("world", WORLDS)
def test_local_sampling_is_not_one_buffers_distribution_on_unequal_shards(group_runs, world):
    """What ``sampling="local"`` changes (documented): each learner draws its own shard only."""
    _, counts = _seen_counts(group_runs[world]["uniform_local"])
    assert stats.chisquare(counts).pvalue < 1e-6


@pytest.mark.parametrize("world", WORLDS)
def test_global_prioritized_sampling_follows_the_global_priority_mass(group_runs, world):
    tids, counts = _seen_counts(group_runs[world]["prioritized"])
    p = (workers.prio(np.array(tids)) + workers.EPS) ** workers.ALPHA
    expected = counts.sum() * p / p.sum()
    assert stats.chisquare(counts, expected).pvalue > P_OK


@pytest.mark.parametrize("world", WORLDS)
def test_importance_weights_equal_a_single_buffers(group_runs, world):
    res = group_runs[world]["prioritized"]
    got = {int(t): w for r in res["ranks"] for t, w in r["weights"].items()}
    a, b, eps = workers.ALPHA, workers.BETA, workers.EPS
    for t, w in got.items():  # (p_i / p_min)^-beta over the global minimum: max weight 1
        assert w == pytest.approx((((workers.prio(t) + eps) / (1 + eps)) ** a) ** -b, rel=1e-5)
    ref = {int(t): w for t, w in res["reference"].items()}
    common = set(ref) & set(got)
    assert len(common) > 20
    assert all(got[t] == pytest.approx(ref[t], rel=1e-5) for t in common)


@pytest.mark.parametrize("world", WORLDS)
def test_priority_updates_land_on_the_rank_that_holds_the_row(group_runs, world):
    landed = group_runs[world]["prioritized"]["cross_rank"]["landed"]  # rank 0's rows others re-prioritized
    assert landed
    for leaf, p in landed.values():
        assert leaf == pytest.approx((p + workers.EPS) ** workers.ALPHA, rel=1e-9)


@pytest.mark.parametrize("world", WORLDS)
def test_on_policy_shares_are_disjoint_complete_and_fresh(group_runs, world):
    res = group_runs[world]["on_policy"]
    by_key: dict[tuple[int, int, int], list[list[int]]] = collections.defaultdict(list)
    for learner in res["learners"]:
        assert sum(b["last"] for b in learner) == 2  # one last mini-batch per iteration
        for b in learner:
            by_key[(b["iteration"], b["epoch"], b["minibatch"])].append(b["tids"])
    for it in (0, 1):
        size = [13 * (r + 1) + 3 for r in range(world)] if it == 0 else [7 * (r + 2) for r in range(world)]
        pushed = sorted(r * 10_000 + it * 100_000 + i for r in range(world) for i in range(size[r]))
        for epoch in (0, 1):
            epoch_rows: list[int] = []
            for m in range(4):
                parts = by_key[(it, epoch, m)]
                assert len(parts) == world and all(parts)  # every learner has a part of every mini-batch
                flat = [t for p in parts for t in p]
                assert len(flat) == len(set(flat))  # the learners' parts are disjoint
                epoch_rows += flat
            assert sorted(epoch_rows) == pushed  # complete, once per epoch, and only this iteration's rows


def test_save_on_four_ranks_restores_on_two_and_continues(group_runs):
    saved, res = group_runs[4]["save"], group_runs[2]["restore"]
    restored = [(int(t), leaf) for rank in res["restored"] for t, leaf in rank]
    tids = [t for t, _ in restored]
    assert sorted(tids) == sorted(int(t) for t in saved["leaves"])  # every row, exactly once
    leaves = dict(restored)
    assert all(leaves[int(t)] == pytest.approx(v, rel=1e-12) for t, v in saved["leaves"].items())
    assert res["exactly_once"] and res["pushed"] == saved["pushed"]
    assert res["after_exactly_once"]
    assert any(t >= 500_000 for t in res["seen"]) and any(t < 500_000 for t in res["seen"])
    assert res["max_weight"] <= 1.0 + 1e-6


@pytest.mark.parametrize("world", WORLDS)
def test_a_timeout_every_rank_reached_goes_to_the_overlapped_pull_and_the_group_goes_on(group_runs, world):
    """The exchange runs on the path's worker; its ``GroupTimeout`` is the waiting pull's to raise, on every rank,
    not a failure latched on the rank: the next pulls, and a collective of the learner's own, are served."""
    for r, res in enumerate(group_runs[world]["group_timeout"]):
        assert res["first"] == "GroupTimeout", (r, res)
        assert res["waited_s"] < 20, (r, res)  # the pull's 0.5 s and the group's give-up, not the 30 s timeout
        assert res["then"] == [True, True, True] and res["stats_rows"] == 64 * world, (r, res)


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_rank_killed_or_stalled_makes_the_others_raise_naming_it(tmp_path: Path, how: str):
    """SIGKILL: the process is gone. SIGSTOP: alive but silent, the others' exchanges overlapped on their lanes."""
    world, victim, timeout = 3, 2, 4.0
    ctx = mp.start_processes(workers.killed, args=(world, launch.free_port(), str(tmp_path), victim, how),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + 90
    others = [p for r, p in enumerate(ctx.processes) if r != victim]
    for p in others:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in ctx.processes:
        if p.is_alive():  # the stopped victim (and, on a hang, the others: fail, but leave nothing behind)
            p.kill()
            p.join(5)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world) if r != victim]
    named = f"[{victim}] died" if how == "kill" else f"[{victim}] did not answer"
    for rep in reports:
        assert rep["raised"] == "RankFailed", rep
        assert victim in rep["ranks"], rep
        assert named in rep["message"], rep
        assert rep["seconds"] < timeout + 3, rep  # the collective's timeout, the short diagnosis, slack
        assert rep["second"] is not None and rep["second"] < timeout  # latched: raises without another wait


def test_learners_as_ray_actors_form_the_group(ray_session):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(workers)  # the actors need not import the test tree
    results = launch.ray_learners(workers.ray_rank, 2, num_cpus=1)
    rr = results[0]["round_robin"]
    assert rr["exactly_once"] and sorted(rr["tids"]) == list(range(rr["expected"]))
    res = results[0]["prioritized"]
    tids, counts = _seen_counts(res)
    p = (workers.prio(np.array(tids)) + workers.EPS) ** workers.ALPHA
    assert stats.chisquare(counts, counts.sum() * p / p.sum()).pvalue > P_OK
    ref = {int(t): w for t, w in res["reference"].items()}
    got = {int(t): w for r in res["ranks"] for t, w in r["weights"].items()}
    assert all(got[t] == pytest.approx(ref[t], rel=1e-5) for t in set(ref) & set(got))
