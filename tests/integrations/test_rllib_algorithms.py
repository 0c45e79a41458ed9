"""Real RLlib DQN, SAC and PPO with Conduit switched on: the adapter's paths run, parity holds.

One local Ray session, tiny networks, a few short iterations each.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from conduit.integrations.rllib import (
    BUFFER_COMPONENT,
    ConduitDQN,
    ConduitDQNTorchLearner,
    ConduitPPOTorchLearner,
    ConduitPrioritizedEpisodeReplayBuffer,
    ConduitSAC,
    ConduitSACTorchLearner,
    SampledEpisodes,
    enable_conduit,
    stats,
)
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.utils.metrics import REPLAY_BUFFER_RESULTS

from conduit.errors import ConfigError

from .rllib_configs import tiny_dqn, tiny_ppo, tiny_sac

pytestmark = [pytest.mark.rllib, pytest.mark.usefixtures("ray_session")]


def train(algo, iterations: int) -> None:
    try:
        for _ in range(iterations):
            algo.train()
    except BaseException:
        algo.stop()
        raise


def test_dqn_runs_every_conduit_path():
    algo = enable_conduit(tiny_dqn(), prefetch=True).build_algo()
    train(algo, 2)
    buffer, learner = algo.local_replay_buffer, algo.learner_group._learner
    stats = buffer.conduit_stats()
    algo.stop()
    assert isinstance(algo, ConduitDQN) and isinstance(buffer, ConduitPrioritizedEpisodeReplayBuffer)
    assert isinstance(learner, ConduitDQNTorchLearner)
    assert stats["adds"] == 200 and stats["added_timesteps"] == 200
    assert stats["samples"] > 100 and stats["prefetched_samples"] == stats["samples"]
    assert stats["priority_updates"] == stats["priority_batches_matched"] == stats["samples"]
    assert stats["priority_rows_applied"] + stats["priority_rows_dropped"] == stats["sampled_timesteps"]
    assert stats["staleness_max"] <= 1 and stats["materialized_batches"] == 0
    assert learner.conduit_stats == {"prepared_batches": stats["samples"], "connector_batches": 0}


def test_sac_runs_every_conduit_path():
    algo = enable_conduit(tiny_sac(), prefetch=True).build_algo()
    train(algo, 2)
    buffer, learner = algo.local_replay_buffer, algo.learner_group._learner
    stats = buffer.conduit_stats()
    algo.stop()
    assert isinstance(algo, ConduitSAC) and isinstance(buffer, ConduitPrioritizedEpisodeReplayBuffer)
    assert isinstance(learner, ConduitSACTorchLearner)
    assert stats["adds"] == 128 and stats["samples"] > 50
    assert stats["prefetched_samples"] == stats["samples"] == stats["priority_batches_matched"]
    assert learner.conduit_stats["prepared_batches"] == stats["samples"]


def test_ppo_pipelines_its_minibatches():
    algo = enable_conduit(tiny_ppo()).build_algo()
    train(algo, 2)
    learner = algo.learner_group._learner
    stats = learner.conduit_stats
    algo.stop()
    assert isinstance(learner, ConduitPPOTorchLearner)
    assert stats.updates == 2 and stats.minibatches >= 2 * 3 * (256 // 64)
    assert stats.ready_on_request > 0


def _record_samples(algo, sink: list) -> None:
    """Record every transition `algo`'s buffer hands out (without building Conduit's episodes)."""
    sample = algo.local_replay_buffer.sample

    def recording(*args, **kwargs):
        out = sample(*args, **kwargs)
        if isinstance(out, SampledEpisodes):
            b = out.conduit_batch
            cols = {k: v.cpu().numpy() for k, v in b.columns.items()}
            ex = b.extras
            sink.extend(
                (cols["obs"][i].tobytes(), cols["new_obs"][i].tobytes(), int(cols["actions"][i]),
                 float(ex["returns"][i]), float(ex["weights"][i]), bool(ex["terminated"][i]))
                for i in range(b.size)
            )
        else:
            sink.extend(
                (e.get_observations(0).tobytes(), e.get_observations(1).tobytes(), int(e.get_actions(0)),
                 float(e.get_rewards(0)), float(e.get_extra_model_outputs("weights", 0)), bool(e.is_terminated))
                for e in out
            )
        return out

    algo.local_replay_buffer.sample = recording


def _seed_stock_buffer(*, algorithm, **kwargs):
    algorithm.local_replay_buffer.rng = np.random.default_rng(11)


def test_exact_mode_dqn_samples_what_rllib_samples():
    runs = {}
    for name in ("stock", "conduit"):
        config = tiny_dqn(seed=3)
        if name == "stock":
            config.callbacks(on_algorithm_init=_seed_stock_buffer)
        else:
            enable_conduit(config, staleness="exact", seed=11)
        algo = config.build_algo()
        runs[name] = []
        _record_samples(algo, runs[name])
        train(algo, 2)
        if name == "conduit":
            got = stats(algo)
        algo.stop()
    assert len(runs["stock"]) > 100 * 16
    assert runs["conduit"] == runs["stock"]
    # the hand-off: the learner trained on the buffer's prepared tensors, never on rebuilt episodes
    assert got.buffer is not None and got.runtime is None and got.buffer.materialized_batches == 0
    assert got.learners[0].prepared_batches == got.buffer.samples > 100 and got.learners[0].connector_batches == 0


class RecordingPPOLearner(PPOTorchLearner):
    seen: ClassVar[list] = []

    def _create_iterator_if_necessary(self, **kwargs):
        return _recorded(super()._create_iterator_if_necessary(**kwargs), type(self).seen)


class RecordingConduitPPOLearner(ConduitPPOTorchLearner):
    seen: ClassVar[list] = []

    def _create_iterator_if_necessary(self, **kwargs):
        return _recorded(super()._create_iterator_if_necessary(**kwargs), type(self).seen)


def _recorded(it, sink: list):
    if isinstance(it, dict):
        return it

    def gen():
        for mb in it:
            batch = next(iter(mb.policy_batches.values()))
            sink.append(tuple(batch[k].cpu().numpy().tobytes() for k in ("obs", "actions", "advantages")))
            yield mb

    return gen()


def test_ppo_minibatches_identical_with_and_without_conduit():
    RecordingPPOLearner.seen.clear()
    RecordingConduitPPOLearner.seen.clear()
    stock = tiny_ppo(seed=5).learners(learner_class=RecordingPPOLearner).build_algo()
    train(stock, 2)
    stock.stop()
    ours = enable_conduit(tiny_ppo(seed=5).learners(learner_class=RecordingConduitPPOLearner)).build_algo()
    train(ours, 2)
    pipelined = ours.learner_group._learner.conduit_stats.minibatches
    ours.stop()
    assert len(RecordingPPOLearner.seen) >= 2 * 3 * 4
    assert pipelined == len(RecordingConduitPPOLearner.seen)
    assert RecordingConduitPPOLearner.seen == RecordingPPOLearner.seen


def test_checkpoint_round_trip_restores_the_buffer(tmp_path):
    config = enable_conduit(tiny_dqn())
    algo = config.build_algo()
    train(algo, 1)
    want = algo.local_replay_buffer.contents()
    want_len = len(algo.local_replay_buffer)
    assert BUFFER_COMPONENT in algo.get_state()
    algo.save_to_path(str(tmp_path))
    algo.stop()
    for restore in ("restore_from_path", "from_checkpoint"):
        if restore == "restore_from_path":
            fresh = config.build_algo()
            assert len(fresh.local_replay_buffer) == 0
            fresh.restore_from_path(str(tmp_path))
        else:
            fresh = ConduitDQN.from_checkpoint(str(tmp_path))
        got = fresh.local_replay_buffer.contents()
        got_len = len(fresh.local_replay_buffer)
        train(fresh, 1)  # and training continues from the restored buffer
        fresh.stop()
        assert got_len == want_len > 0 and set(got) == set(want)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_enable_conduit_validates_what_it_is_given():
    with pytest.raises(ConfigError, match="staleness"):
        enable_conduit(tiny_dqn(), staleness="sometimes")
    with pytest.raises(ConfigError, match="random range"):
        enable_conduit(tiny_dqn().training(n_step=(1, 3)))
    with pytest.raises(ConfigError, match="learner_class"):
        enable_conduit(tiny_ppo().learners(learner_class=RecordingPPOLearner))
    with pytest.raises(ConfigError, match="expected a DQNConfig"):
        from ray.rllib.algorithms.appo import APPOConfig

        enable_conduit(APPOConfig())
    with pytest.raises(ConfigError, match="CQLConfig"):  # a SACConfig subclass for another algorithm, whose
        from ray.rllib.algorithms.cql import CQLConfig  # own learner (its loss) was replaced by SAC's

        enable_conduit(CQLConfig())
    with pytest.raises(ConfigError, match="storage_device"):  # at the call, not at the first train()
        enable_conduit(tiny_dqn(), storage_device="tpu")
    config = enable_conduit(tiny_sac())
    assert config.replay_buffer_config["type"] == "PrioritizedEpisodeReplayBuffer"
    assert {"capacity", "alpha", "beta", "conduit"} <= set(config.replay_buffer_config)
    config.validate()  # SAC accepts only stock type names: the swap happens at build time


# -- RLlib's replay-buffer metrics -------------------------------------------------------------

ADDED_AND_SAMPLED = ("num_env_steps_added_lifetime", "num_episodes_added_lifetime", "num_env_steps_sampled_lifetime",
                     "num_agent_steps_added_lifetime/default_agent", "num_module_steps_sampled_lifetime/default_policy")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}/"))
        elif not k.startswith("conduit_"):  # Conduit's own counters, next to RLlib's
            out[f"{prefix}{k}"] = v
    return out


def _buffer_metrics(config, iterations: int = 3) -> list[dict]:
    """``replay_buffer/*`` of every iteration's result."""
    algo = config.build_algo()
    try:
        return [_flat(algo.train()[REPLAY_BUFFER_RESULTS]) for _ in range(iterations)]
    finally:
        algo.stop()


def _small_dqn():
    # capacity 128: episodes are evicted from the second iteration on
    return tiny_dqn(seed=3).training(replay_buffer_config={"capacity": 128})


@pytest.fixture(scope="module")
def stock_dqn_metrics() -> list[dict]:
    return _buffer_metrics(_small_dqn().callbacks(on_algorithm_init=_seed_stock_buffer))


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_exact_mode_dqn_replay_buffer_metrics_equal_rllib_at_every_iteration(stock_dqn_metrics):
    ours = _buffer_metrics(enable_conduit(_small_dqn(), staleness="exact", seed=11))
    assert len(ours) == len(stock_dqn_metrics) == 3
    assert stock_dqn_metrics[-1]["num_env_steps_evicted_lifetime"] > 0
    for it, (want, got) in enumerate(zip(stock_dqn_metrics, ours, strict=True)):
        assert sum(k.endswith("_lifetime") or "_lifetime/" in k for k in want) >= 18  # RLlib 2.60: 18
        assert set(got) == set(want), f"iteration {it}"
        diff = {k: (want[k], got[k]) for k in want if not _same(float(want[k]), float(got[k]))}
        assert diff == {}, f"iteration {it}: (stock, conduit) differ"


def test_bounded_mode_dqn_counts_what_was_added_and_sampled_exactly(stock_dqn_metrics):
    ours = _buffer_metrics(enable_conduit(_small_dqn(), seed=11))
    for want, got in zip(stock_dqn_metrics, ours, strict=True):
        assert {k: got[k] for k in ADDED_AND_SAMPLED} == {k: want[k] for k in ADDED_AND_SAMPLED}
        assert "num_episodes_per_sample" not in got  # not known in this mode (buffer.py says what differs)


def test_buffer_metrics_flush_at_the_iteration_end_however_long_the_interval(monkeypatch):
    monkeypatch.setattr(ConduitDQN, "METRICS_INTERVAL_S", 1e9)  # no flush within an iteration
    algo = enable_conduit(tiny_dqn(), seed=1).build_algo()
    try:
        result = algo.train()
        samples = stats(algo).buffer.samples
    finally:
        algo.stop()
    got = result[REPLAY_BUFFER_RESULTS]
    assert got["num_env_steps_added_lifetime"] == 100
    assert got["num_env_steps_sampled_lifetime"] == samples * 16 > 0


# -- the public stats accessor ---------------------------------------------------------------------

def test_stats_of_a_dqn_with_its_local_learner():
    algo = enable_conduit(tiny_dqn()).build_algo()
    train(algo, 1)
    got = stats(algo)
    algo.stop()
    assert got.buffer is not None and got.buffer.samples > 0 and got.buffer.adds == 100
    assert got.runtime is not None and got.runtime.pulls == got.buffer.samples  # each sample one pull
    assert len(got.learners) == 1 and got.learners[0].prepared_batches == got.buffer.samples
    assert got.learners[0].pipeline is None and got.pipeline is None


def test_stats_of_a_ppo_with_a_local_and_a_remote_learner():
    for num_learners in (0, 1):
        algo = enable_conduit(tiny_ppo().learners(num_learners=num_learners)).build_algo()
        try:
            train(algo, 2)
            got = stats(algo)
        finally:
            algo.stop()  # a remote learner left running would hold the session's Ray CPUs from the next tests
        assert got.buffer is None and got.runtime is None and len(got.learners) == 1, num_learners
        assert got.pipeline is not None and got.pipeline.updates == 2, num_learners
        assert got.pipeline.minibatches >= 2 * 3 * (256 // 64), num_learners


def test_stats_says_what_is_missing():
    from ray.rllib.algorithms.ppo import PPO

    with pytest.raises(TypeError, match="enable_conduit"):
        stats(object.__new__(PPO))


def test_dqn_with_two_learner_actors_and_sharded_false_keeps_the_single_conduit_buffer_in_the_driver(ray_free_cpus):
    """``num_learners=2, sharded=False``: RLlib's DQN ``training_step`` samples ``train_batch_size_per_learner x 2``
    rows in the driver and ``LearnerGroup.update`` splits them over the learner actors; the Conduit buffer serves
    that sample (the default with two learners shards the buffer over them: test_rllib_sharded.py)."""
    ray_free_cpus(1)  # two learner actors of half a CPU each
    algo = enable_conduit(tiny_dqn().learners(num_learners=2, num_cpus_per_learner=0.5), sharded=False).build_algo()
    try:
        results = [algo.train() for _ in range(2)]
        got = stats(algo)
    finally:
        algo.stop()
    assert results[-1]["num_env_steps_sampled_lifetime"] == 200
    assert got.buffer is not None and got.buffer.samples > 0 and got.buffer.adds == 200
    assert got.buffer.sampled_timesteps == 2 * 16 * got.buffer.samples  # one driver-side draw for both learners
    assert all("default_policy" in r["learners"] for r in results)
