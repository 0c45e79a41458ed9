"""The Conduit replay buffers against RLlib's own, on real CartPole episode chunks (no algorithm).

Parity: in ``exact`` mode the Conduit buffers (RLlib's own buffer inside) return the
transitions RLlib's stock buffers return, with the same weights, draw for draw,
through evictions, for fixed and random n-step; the priority trees stay equal. The
prepared batch equals what RLlib's learner connector builds from the same
episodes. Bounded mode: lazy episodes, generation-checked priority updates, state
round trips.
"""

from __future__ import annotations

import gc
import pickle
import threading
import time

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from conduit.integrations.rllib import (
    ConduitEpisodeReplayBuffer,
    ConduitPrioritizedEpisodeReplayBuffer,
    SampledEpisodes,
)
from ray.rllib.utils.replay_buffers import EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer

from conduit.errors import ConfigError, RuntimeClosed, SemanticsError

pytestmark = pytest.mark.rllib

SAMPLE = dict(gamma=0.99, beta=0.4, sample_episodes=True, batch_length_T=0, lookback=0, min_batch_length_T=0)


def transitions(episodes) -> list[tuple]:
    return [
        (
            e.get_observations(0).tobytes(), e.get_observations(1).tobytes(), int(e.get_actions(0)),
            float(e.get_rewards(0)), int(e.get_extra_model_outputs("n_step", 0)),
            float(e.get_extra_model_outputs("weights", 0)), bool(e.is_terminated), bool(e.is_truncated),
        )
        for e in episodes
    ]


@pytest.mark.parametrize(
    ("prioritized", "n_step"), [(True, 1), (True, 3), (True, (1, 4)), (False, 1), (False, 2)]
)
def test_exact_mode_matches_rllib_draw_for_draw(cartpole_chunks, prioritized, n_step):
    stock = PrioritizedEpisodeReplayBuffer(capacity=200, alpha=0.6) if prioritized else EpisodeReplayBuffer(200)
    cls = ConduitPrioritizedEpisodeReplayBuffer if prioritized else ConduitEpisodeReplayBuffer
    ours = cls(capacity=200, alpha=0.6, conduit={"staleness": "exact"})
    stock.rng, ours.rng = np.random.default_rng(1234), np.random.default_rng(1234)
    td = np.random.default_rng(7)
    for _ in range(16):
        chunks = cartpole_chunks(25)
        stock.add(chunks)
        ours.add(chunks)
        assert len(ours) == len(stock)
        expected = transitions(stock.sample(num_items=24, n_step=n_step, **SAMPLE))
        assert transitions(ours.sample(num_items=24, n_step=n_step, **SAMPLE)) == expected
        if prioritized:
            priorities = np.abs(td.normal(size=24))
            stock.update_priorities(priorities, "default_policy")
            ours.update_priorities(priorities, "default_policy")
            mine, theirs = ours.get_state()["store"]["rllib"], stock.get_state()
            for tree in ("_sum_segment", "_min_segment"):
                np.testing.assert_array_equal(mine[tree], theirs[tree])
    assert stock.get_num_episodes_evicted() > 0
    assert ours.get_num_episodes_evicted() == stock.get_num_episodes_evicted()
    assert ours.get_num_episodes() == stock.get_num_episodes()
    assert ours.get_added_timesteps() == stock.get_added_timesteps()


def test_prepared_batch_equals_rllib_learner_connector_output(cartpole_chunks):
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core import DEFAULT_MODULE_ID

    config = DQNConfig().environment("CartPole-v1").rl_module(
        model_config={"fcnet_hiddens": [8], "head_fcnet_hiddens": [8]}
    )
    chunks = cartpole_chunks(200)
    learner = config.build_learner(
        env=None, spaces={DEFAULT_MODULE_ID: (chunks[0].observation_space, chunks[0].action_space)}
    )
    for n_step in (1, 3):
        buf = ConduitPrioritizedEpisodeReplayBuffer(
            capacity=500, alpha=0.6, conduit={"staleness": "exact", "prepared_batches": True}
        )
        buf.add(chunks)
        episodes = buf.sample(num_items=32, n_step=n_step, **SAMPLE)
        assert isinstance(episodes, SampledEpisodes) and not episodes.materialized
        prepared = episodes.conduit_batch.columns
        built = learner._learner_connector(
            rl_module=learner.module, batch={}, episodes=list(episodes), shared_data={}, metrics=learner.metrics
        )[DEFAULT_MODULE_ID]
        assert episodes.materialized
        assert set(built) == set(prepared)
        for key, value in built.items():
            assert value.dtype == prepared[key].dtype, key
            assert value.shape == prepared[key].shape, key
            assert bool((value == prepared[key]).all()), key


def test_bounded_mode_hands_out_prefetched_batches_and_checks_generations(cartpole_chunks):
    buf = ConduitPrioritizedEpisodeReplayBuffer(
        capacity=120, alpha=0.6, conduit={"n_step": 1, "prefetch": True, "prepared_batches": True, "seed": 0}
    )
    try:
        buf.add(cartpole_chunks(100))
        episodes = buf.sample(num_items=32, n_step=1, **SAMPLE)
        assert len(episodes) == 32 and not episodes.materialized
        buf.add(cartpole_chunks(200))  # overwrites most of the ring before the update lands
        applied = buf.update_priorities(np.ones(32), "default_policy")
        stats = buf.conduit_stats()
        assert applied < 32 and stats["priority_rows_dropped"] == 32 - applied
        for _ in range(5):
            buf.sample(num_items=32, n_step=1, **SAMPLE)
            buf.update_priorities(np.ones(32))
            buf.add(cartpole_chunks(4))
        stats = buf.conduit_stats()
        assert stats["prefetched_samples"] == 6 and stats["priority_batches_matched"] == 6
        assert stats["staleness_max"] <= 1
        with pytest.raises(SemanticsError):
            buf.update_priorities(np.ones(32))  # the last batch already got its priorities
        with pytest.raises(ConfigError):
            buf.sample(num_items=32, n_step=3, **SAMPLE)  # rows were folded with n_step=1
    finally:
        buf.close()


@pytest.mark.parametrize("staleness", ["exact", "bounded"])
def test_state_and_pickle_round_trip(cartpole_chunks, staleness):
    opts = {"staleness": staleness, "n_step": 3, "seed": 3}
    a = ConduitPrioritizedEpisodeReplayBuffer(capacity=150, alpha=0.6, conduit=opts)
    b = ConduitPrioritizedEpisodeReplayBuffer(capacity=150, alpha=0.6, conduit=opts)
    try:
        for _ in range(4):
            a.add(cartpole_chunks(60))
            a.sample(num_items=16, n_step=3, **SAMPLE)
            a.update_priorities(np.arange(1, 17, dtype=np.float64))
        b.set_state(a.get_state())
        c = pickle.loads(pickle.dumps(a))
        want = a.contents()
        for other in (b, c):
            got = other.contents()
            assert set(got) == set(want) and len(other) == len(a)
            for key in want:
                np.testing.assert_array_equal(got[key], want[key])
        if staleness == "exact":  # same rng state and trees: the next draws agree
            assert transitions(b.sample(num_items=16, n_step=3, **SAMPLE)) == transitions(
                a.sample(num_items=16, n_step=3, **SAMPLE)
            )
    finally:
        for buf in (a, b):
            buf.close()


def test_unsupported_requests_fail_clearly(cartpole_chunks):
    chunks = cartpole_chunks(20)
    bounded = ConduitPrioritizedEpisodeReplayBuffer(capacity=100, conduit={"n_step": 1})
    try:
        bounded.add(chunks)
        with pytest.raises(NotImplementedError, match="include_infos"):
            bounded.sample(num_items=4, n_step=1, include_infos=True)
    finally:
        bounded.close()
    exact = ConduitPrioritizedEpisodeReplayBuffer(capacity=100, conduit={"staleness": "exact", "prepared_batches": True})
    exact.add(chunks)  # the exact mode is RLlib's buffer: what RLlib's sample() takes, it takes
    episodes = exact.sample(num_items=4, n_step=1, include_infos=True, **SAMPLE)
    assert not isinstance(episodes, SampledEpisodes) and len(episodes) == 4  # RLlib's list, no prepared batch
    with pytest.raises(SemanticsError):
        ConduitPrioritizedEpisodeReplayBuffer(capacity=100, conduit={"staleness": "exact"}).update_priorities([1.0])
    with pytest.raises(ConfigError, match="staleness"):
        ConduitPrioritizedEpisodeReplayBuffer(capacity=100, conduit={"staleness": "eventually"})
    with pytest.raises(ConfigError, match="random n-step"):
        ConduitPrioritizedEpisodeReplayBuffer(capacity=100, conduit={"n_step": (1, 3)})


def test_a_bounded_state_restores_into_another_capacity_and_batch_size(cartpole_chunks):
    """The state is rows oldest first and their priorities (read from Conduit's checkpoint): a smaller ring keeps
    the newest rows with their priorities, a batch drawn ahead before the save is not handed out after it (the
    restored buffer draws the batch size it is asked for), and rows added before the first sample join them."""
    a = ConduitPrioritizedEpisodeReplayBuffer(capacity=150, alpha=0.6, conduit={"n_step": 1, "seed": 5, "prefetch": True})
    b = ConduitPrioritizedEpisodeReplayBuffer(capacity=100, alpha=0.6, conduit={"n_step": 1, "seed": 5, "prefetch": True})
    try:
        a.add(cartpole_chunks(140))
        a.sample(num_items=16, n_step=1, **SAMPLE)  # and the next batch of 16 is drawn ahead
        a.update_priorities(np.arange(1, 17, dtype=np.float64))
        state = a.get_state()
        want = a.contents()
        b.set_state(state)
        leaves = np.asarray(state["store"]["restore"]["leaves"])
        assert leaves.size == len(want["rewards"]) > 100
        b.add(cartpole_chunks(10))  # before the first sample: pending beside the restored rows
        added = b.get_state()["store"]["rows_total"] - state["store"]["rows_total"]
        assert len(b.sample(num_items=32, n_step=1, **SAMPLE)) == 32
        after = b.get_state()["store"]
        kept = 100 - added  # the newest restored rows, then the ones added
        assert len(after["rows"]["rewards"]) == 100 and 0 < added < 100
        for k in want:
            np.testing.assert_array_equal(after["rows"][k][:kept], want[k][-kept:])
        np.testing.assert_array_equal(np.asarray(after["restore"]["leaves"])[:kept], leaves[-kept:])
    finally:
        for buf in (a, b):
            buf.close()



def test_the_uniform_buffer_keeps_rllibs_defaults(cartpole_chunks):
    """``EpisodeReplayBuffer``'s defaults are RLlib's: ``batch_length_T=64`` and ``sample()`` returning the
    ``[B, T]`` sequence batch. Exact mode returns RLlib's own; bounded mode (one-step rows) refuses it by name."""
    chunks = cartpole_chunks(200)
    stock = EpisodeReplayBuffer(capacity=1000, batch_size_B=4, batch_length_T=8)
    ours = ConduitEpisodeReplayBuffer(capacity=1000, batch_size_B=4, batch_length_T=8, conduit={"staleness": "exact"})
    stock.rng, ours.rng = np.random.default_rng(1), np.random.default_rng(1)
    stock.add(chunks)
    ours.add(chunks)
    for kwargs in ({}, {"batch_size_B": 2, "batch_length_T": 3}):
        want, got = stock.sample(**kwargs), ours.sample(**kwargs)
        assert isinstance(got, dict) and set(got) == set(want)
        for key in ("obs", "actions", "rewards", "is_first"):
            np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]))
    assert ConduitEpisodeReplayBuffer().batch_length_T == EpisodeReplayBuffer().batch_length_T == 64
    assert ConduitPrioritizedEpisodeReplayBuffer().batch_length_T == PrioritizedEpisodeReplayBuffer().batch_length_T
    bounded = ConduitEpisodeReplayBuffer(capacity=1000, conduit={"n_step": 1})
    try:
        bounded.add(chunks)
        with pytest.raises(NotImplementedError, match="sample_episodes=False"):
            bounded.sample()
    finally:
        bounded.close()


@pytest.mark.parametrize("prioritized", [True, False])
def test_exact_mode_shows_rllibs_public_attributes_as_rllib_keeps_them(cartpole_chunks, prioritized):
    stock = PrioritizedEpisodeReplayBuffer(capacity=500) if prioritized else EpisodeReplayBuffer(500)
    cls = ConduitPrioritizedEpisodeReplayBuffer if prioritized else ConduitEpisodeReplayBuffer
    ours = cls(capacity=500, conduit={"staleness": "exact"})
    stock.rng, ours.rng = np.random.default_rng(2), np.random.default_rng(2)
    chunks = cartpole_chunks(100)
    for buf in (stock, ours):
        buf.add(chunks)
        buf.sample(num_items=8, n_step=1, **SAMPLE)
    assert len(ours.episodes) == len(stock.episodes) > 0
    assert list(ours.episode_id_to_index) == list(stock.episode_id_to_index)
    assert ours.sampled_timesteps == stock.sampled_timesteps == 8


def test_a_stopped_bounded_buffer_still_saves_and_refuses_adds_without_counting_them(cartpole_chunks):
    """RLlib saves an algorithm after ``stop()``: the closed buffer keeps its state (the runtime released its
    rows), and an ``add`` after close raises before it changes a count."""
    buf = ConduitPrioritizedEpisodeReplayBuffer(capacity=200, alpha=0.6, conduit={"n_step": 1, "prefetch": True})
    buf.add(cartpole_chunks(80))
    buf.sample(num_items=16, n_step=1, **SAMPLE)
    want = buf.contents()
    buf.close()
    sizes = (len(buf), buf.get_added_timesteps(), buf.get_num_episodes())
    with pytest.raises(RuntimeClosed):
        buf.add(cartpole_chunks(30))
    assert (len(buf), buf.get_added_timesteps(), buf.get_num_episodes()) == sizes
    again = pickle.loads(pickle.dumps(buf))
    try:
        for other in (again.contents(), buf.contents()):
            for key in want:
                np.testing.assert_array_equal(other[key], want[key])
        assert len(again.sample(num_items=16, n_step=1, **SAMPLE)) == 16
    finally:
        again.close()


def test_a_dropped_bounded_buffer_stops_its_delivery_worker(cartpole_chunks):
    """RLlib never closes a buffer it drops (a rebuilt algorithm, a test): the runtime's workers stop with it."""
    def workers() -> int:
        return sum(t.name.startswith("conduit") for t in threading.enumerate())

    before = workers()
    for _ in range(3):
        buf = ConduitPrioritizedEpisodeReplayBuffer(capacity=200, conduit={"n_step": 1, "prefetch": True})
        buf.add(cartpole_chunks(40))
        buf.sample(num_items=8, n_step=1, **SAMPLE)
        assert workers() > before
        del buf
    deadline = time.monotonic() + 10
    while workers() > before and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert workers() == before, [t.name for t in threading.enumerate()]


@pytest.mark.parametrize("prioritized", [True, False])
def test_the_bounded_buffers_draw_with_the_rng_rllib_sets_and_saves(cartpole_chunks, prioritized):
    """As RLlib's buffers: ``buffer.rng`` decides the draws, and a copy made from the state draws what the original
    draws next (the uniform sampler's own generator ignored both)."""
    cls = ConduitPrioritizedEpisodeReplayBuffer if prioritized else ConduitEpisodeReplayBuffer
    chunks = cartpole_chunks(150)

    def draws(seed: int, copy: bool = False) -> list[tuple]:
        buf = cls(capacity=500, conduit={"n_step": 1, "prefetch": False})
        buf.rng = np.random.default_rng(seed)
        buf.add(chunks)
        buf.sample(num_items=8, n_step=1, **SAMPLE)
        if copy:
            other = pickle.loads(pickle.dumps(buf))
            got = [transitions(b.sample(num_items=8, n_step=1, **SAMPLE)) for b in (buf, other)]
            other.close()
        else:
            got = [transitions(buf.sample(num_items=8, n_step=1, **SAMPLE))]
        buf.close()
        return got

    assert draws(1) == draws(1) != draws(2)
    mine, copied = draws(3, copy=True)
    assert mine == copied
