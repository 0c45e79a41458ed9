"""Real RLlib DQN with two learner actors (gloo): the buffer sharded over them.

Every env step reaches exactly one shard; a learner's global draw has one buffer's
distribution over every shard's rows (chi-square), a local draw does not when shards
differ; checkpoints restore the shards (onto four learners too); a learner actor that
dies fails the algorithm with an error naming it, within the timeout.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from conduit.integrations.rllib import enable_conduit, stats
from conduit.integrations.rllib.sharded import SHARD
from scipy import stats as scipy_stats

from conduit.errors import ConfigError, RuntimeFailed

from .rllib_configs import tiny_dqn

pytestmark = [pytest.mark.rllib, pytest.mark.usefixtures("ray_session")]


def sharded_dqn(learners: int = 2, prioritized: bool = True, **options):
    config = tiny_dqn().learners(num_learners=learners, num_cpus_per_learner=2 / learners)
    config.training(replay_buffer_config={
        "type": "PrioritizedEpisodeReplayBuffer" if prioritized else "EpisodeReplayBuffer", "capacity": 4000,
    })
    return enable_conduit(config, timeout_s=20.0, **options)


# -- learner-side probes (run in the learner actors through RLlib's public foreach_learner) ----------------------
def _extra_rows(learner, per_rank: list[int]) -> int:
    """Push ``per_rank[rank]`` rows of a fixed shape into this learner's shard only (uneven shards)."""
    shard = learner.__dict__[SHARD]
    n = per_rank[shard.rank]
    if n:
        import torch

        spec = shard.edp.spec  # the layout the shards settled on (the folded rows')
        shard.edp.push({k: torch.zeros((n, *f.shape), dtype=f.dtype) for k, f in spec.fields.items()})
    return n


def _draws(learner, pulls: int) -> np.ndarray:
    """Rows (shard, slot) of ``pulls`` batches this learner pulls, no update in between."""
    edp = learner.__dict__[SHARD].edp
    out = []
    for _ in range(pulls):
        b = edp.pull()
        out.append(np.stack([b.owners, b.info.indices], axis=1))
    return np.concatenate(out)


def _die(learner) -> None:
    os._exit(1)


def counts(algo) -> tuple[int, ...]:
    return stats(algo).shards[0].group.shard_rows


@pytest.fixture(autouse=True)
def _learners_fit(ray_free_cpus):
    """Every test here starts learner actors that take the session's two CPUs between them: an earlier test's
    actors must have given theirs back (a bounded wait that names the holders, never a silent one)."""
    ray_free_cpus(2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, ray_free_cpus):
    """Two learners, prioritized, three iterations: the results, the stats, a checkpoint; then learner 1 dies and
    the algorithm is asked to train on (one algorithm for all of it: each build starts learner actors)."""
    ray_free_cpus(2)  # built before the autouse wait above (a module fixture comes first)
    path = tmp_path_factory.mktemp("sharded") / "ckpt"
    algo = sharded_dqn().build_algo()
    out = {}
    try:
        out["no_driver_buffer"] = algo.conduit_shards is not None and algo.local_replay_buffer is None
        out["results"] = [algo.train() for _ in range(3)]
        out["stats"] = stats(algo)
        out["path"] = algo.save_to_path(path)
        ids = [r.actor_id for r in algo.learner_group.foreach_learner(lambda learner: None)]
        algo.learner_group.foreach_learner(_die, remote_actor_ids=[ids[1]], timeout_seconds=0)
        start = time.monotonic()
        try:
            for _ in range(3):
                algo.train()
        except Exception as exc:  # (asserted by the test that reads it)
            out["failure"] = exc
        out["failed_after_s"] = time.monotonic() - start
        out["dead"] = ids[1]
    finally:
        try:
            algo.stop()
        except Exception:  # (stopping a group that lost an actor)
            pass
    return out


def test_two_learners_shard_the_buffer_and_ingest_every_env_step_once(trained):
    results, got = trained["results"], trained["stats"]
    assert trained["no_driver_buffer"]
    sampled = results[-1]["env_runners"]["num_env_steps_sampled_lifetime"]
    shard = got.shards[0].group
    assert sampled == 300
    # n_step=1: one row per env step, each pushed once, on one shard, all ingested
    assert sum(shard.pushed_rows) == sum(shard.ingested_rows) == sum(shard.shard_rows) == sampled
    assert shard.shard_rows == (150, 150)  # dealt round-robin
    # RLlib's buffer keys, reduced as RLlib's buffer reduces them: per iteration (what the env runners sampled
    # in it: n_step=1) and lifetime sums; the rows stored now
    for result in results:
        rb = result["replay_buffer"]
        assert rb["num_env_steps_added"] == result["env_runners"]["num_env_steps_sampled"] == 100
    rb = results[-1]["replay_buffer"]
    assert rb["num_env_steps_added_lifetime"] == rb["num_env_steps_stored"] == sampled
    # each learner pulled train_batch_size_per_learner rows per update
    assert rb["num_env_steps_sampled_lifetime"] == sum(s.sampled for s in got.shards) > 0
    assert sum(r["replay_buffer"].get("num_env_steps_sampled", 0) for r in results) == sum(s.sampled for s in got.shards)
    assert all(s.sampled % 16 == 0 and s.sampled > 0 for s in got.shards)
    assert "default_policy" in results[-1]["learners"]
    # RLlib's buffer timers, as its own training_step logs them
    assert {"replay_buffer_sampling_timer", "replay_buffer_update_prios_timer"} <= set(results[-1]["timers"])


def test_a_learner_actor_that_dies_fails_the_algorithm_naming_it_within_the_timeout(trained):
    failure = trained.get("failure")
    assert isinstance(failure, RuntimeFailed), failure
    assert f"learner actor(s) [{trained['dead']}]" in str(failure)
    assert trained["failed_after_s"] < 2 * 20.0 + 30.0, trained["failed_after_s"]


@pytest.mark.parametrize("sampling", ["global", "local"])
def test_a_global_draw_has_one_buffers_distribution_over_uneven_shards(sampling):
    """Shard 0 holds 100 + 300 extra rows, shard 1 100: a global draw is uniform over all 500 rows (chi-square),
    a local one over-draws shard 1's rows (the same test rejects it)."""
    algo = sharded_dqn(prioritized=False, sampling=sampling).build_algo()
    try:
        algo.train()  # 100 env steps: 50 rows on each shard
        algo.learner_group.foreach_learner(_extra_rows, per_rank=[300, 0])
        rows = np.concatenate([r.get() for r in algo.learner_group.foreach_learner(_draws, pulls=250)])
        sizes = counts(algo)
    finally:
        algo.stop()
    assert sizes == (350, 50)
    ids = rows[:, 0] * 10_000 + rows[:, 1]
    seen = np.bincount(np.unique(ids, return_inverse=True)[1])
    observed = np.concatenate([seen, np.zeros(sum(sizes) - len(seen))])  # rows never drawn count too
    p = scipy_stats.chisquare(observed).pvalue
    if sampling == "global":
        assert p > 1e-3, p
    else:
        assert p < 1e-6, p


def test_checkpoint_restores_every_shard_and_training_continues(trained):
    before = trained["stats"].shards[0].group.shard_rows
    path = trained["path"]
    assert (Path(path) / "conduit_shards").is_dir()
    again = sharded_dqn().build_algo()
    try:
        again.restore_from_path(path)
        assert counts(again) == before
        result = again.train()
        after = counts(again)
        again.restore_from_path(path)  # in place, onto learners that trained since: as stock RLlib restores
        in_place = counts(again)
        result_in_place = again.train()
    finally:
        again.stop()
    assert result["env_runners"]["num_env_steps_sampled_lifetime"] == 400
    assert sum(after) == sum(before) + 100
    assert in_place == before
    # the sampled counts go on from the checkpoint's: a positive count per iteration, a lifetime sum that grows
    saved = trained["results"][-1]["replay_buffer"]["num_env_steps_sampled_lifetime"]
    for got in (result, result_in_place):
        rb = got["replay_buffer"]
        assert rb["num_env_steps_sampled"] > 0 and rb["num_env_steps_sampled_lifetime"] > saved, rb

    four = sharded_dqn(learners=4).build_algo()
    try:
        four.restore_from_path(path)
        resharded = counts(four)
        four.train()
    finally:
        four.stop()
    assert len(resharded) == 4 and sum(resharded) == sum(before)


def test_the_driver_buffers_checkpoint_and_the_shards_do_not_load_into_each_other(trained, tmp_path):
    """One learner keeps the buffer in the driver, two shard it: a checkpoint of either is refused by the other
    by name, before anything is loaded (it dropped the rows, or failed deep in the buffer's state)."""
    one = sharded_dqn(learners=1).build_algo()
    try:
        assert one.conduit_shards is None
        with pytest.raises(ConfigError, match="do not load into each other"):
            one.restore_from_path(trained["path"])
        one.train()
        saved = one.save_to_path(tmp_path / "one")
    finally:
        one.stop()
    two = sharded_dqn().build_algo()
    try:
        with pytest.raises(ConfigError, match="do not load into each other"):
            two.restore_from_path(saved)
    finally:
        two.stop()


def test_sharding_is_refused_where_it_cannot_hold():
    with pytest.raises(ConfigError, match="staleness='bounded'"):
        enable_conduit(tiny_dqn().learners(num_learners=2), sharded=True, staleness="exact")
    config = enable_conduit(tiny_dqn(), sharded=True)
    with pytest.raises(ConfigError, match="num_learners >= 2"):
        config.build_algo()


def test_exact_mode_with_two_learners_keeps_rllibs_one_buffer():
    from conduit.integrations.rllib.sharded import wants_shards

    assert not wants_shards(enable_conduit(tiny_dqn().learners(num_learners=2), staleness="exact"))
    assert wants_shards(enable_conduit(tiny_dqn().learners(num_learners=2)))


def test_sac_shards_its_buffer_the_same_way():
    from .rllib_configs import tiny_sac

    algo = enable_conduit(tiny_sac().learners(num_learners=2, num_cpus_per_learner=1)).build_algo()
    try:
        results = [algo.train() for _ in range(2)]
        got = stats(algo)
    finally:
        algo.stop()
    group = got.shards[0].group
    assert results[-1]["env_runners"]["num_env_steps_sampled_lifetime"] == sum(group.shard_rows) == 128
    assert group.shard_rows == (64, 64) and all(s.sampled > 0 for s in got.shards)
    assert "qf_loss" in results[-1]["learners"]["default_policy"]
