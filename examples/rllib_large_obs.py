"""DQN with large observations, where the experience path matters: RLlib alone vs with Conduit.

CartPole's dynamics behind an 84x84x3-float observation (84.7 KB per step: the
four state variables tiled and lightly noised), the scale of visual RL (the
paper's Meta-World ~48 KB, OXE ~192 KB per sample). Every transition RLlib's
stock buffer stores is an episode object it deep-copies on add, slices into
one-step episodes on sample and stacks again in the learner connector; Conduit
writes it once into columnar storage and gathers batches straight into tensors.

By default both run, one after the other, and a side-by-side table of iteration
time and exposed experience-path latency is printed.

Run: ``python examples/rllib_large_obs.py [--iterations N] [--no-conduit] [--obs-dim D] [--learners N]``
(needs ``pip install ".[rllib]"`` in a clone of Conduit).
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import ray
from conduit.integrations.rllib import enable_conduit, measure_iterations, quiet_ray_startup, summary_table
from ray.rllib.algorithms.dqn import DQNConfig
from ray.tune.registry import register_env

OBS_DIM = 84 * 84 * 3


class LargeObsCartPole(gym.Env):
    """CartPole whose observation is its state tiled to ``obs_dim`` float32 values (plus noise)."""

    def __init__(self, config: dict | None = None) -> None:
        config = config or {}
        self.obs_dim = int(config.get("obs_dim", OBS_DIM))
        self.inner = gym.make("CartPole-v1")
        self.action_space = self.inner.action_space
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self.obs_dim,), np.float32)
        self.rng = np.random.default_rng(config.get("seed", 0))
        self.reps = -(-self.obs_dim // 4)

    def _obs(self, state: np.ndarray) -> np.ndarray:
        tiled = np.tile(state.astype(np.float32), self.reps)[: self.obs_dim]
        return tiled + self.rng.standard_normal(self.obs_dim, dtype=np.float32) * 0.01

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        state, info = self.inner.reset(seed=seed, options=options)
        return self._obs(state), info

    def step(self, action):
        state, reward, terminated, truncated, info = self.inner.step(action)
        return self._obs(state), reward, terminated, truncated, info


def build(use_conduit: bool, obs_dim: int, seed: int, prefetch: bool | None, learners: int = 0):
    register_env("LargeObsCartPole", lambda cfg: LargeObsCartPole(cfg))
    config = (
        DQNConfig()
        .environment("LargeObsCartPole", env_config={"obs_dim": obs_dim, "seed": seed})
        .env_runners(num_env_runners=0)
        .training(
            lr=5e-4, train_batch_size_per_learner=32, num_steps_sampled_before_learning_starts=200,
            target_network_update_freq=200, replay_buffer_config={"capacity": 2000},
        )
        .rl_module(model_config={"fcnet_hiddens": [32], "head_fcnet_hiddens": [32]})
        .reporting(min_sample_timesteps_per_iteration=200, min_time_s_per_iteration=None)
        .debugging(seed=seed)
    )
    if learners:  # both runs side by side on Ray's 2 CPUs: each learner actor takes a share
        config.learners(num_learners=learners, num_cpus_per_learner=1 / learners)
    if use_conduit:
        config = enable_conduit(config, prefetch=prefetch)
    return config.build_algo()


def main(iterations: int = 3, conduit: bool = True, obs_dim: int = OBS_DIM, prefetch: bool | None = None,
         seed: int = 0, verbose: bool = True, learners: int = 0) -> dict[str, list[dict]]:
    if not ray.is_initialized():
        quiet_ray_startup()  # Ray's start-up warnings about its own defaults (conduit.integrations.rllib.quiet)
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    runs = [("rllib", False), ("conduit", True)] if conduit else [("rllib", False)]
    algos = {label: build(use_conduit, obs_dim, seed, prefetch, learners) for label, use_conduit in runs}
    try:
        results = measure_iterations(algos, iterations, verbose)  # interleaved: A, B, A, B, ...
    finally:
        for algo in algos.values():
            algo.stop()
    if verbose:
        print(f"observation: {obs_dim} float32 ({obs_dim * 4 / 1024:.1f} KiB per step)")
        print(summary_table(results))
    return results


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--no-conduit", dest="conduit", action="store_false", help="stock RLlib only")
    p.add_argument("--obs-dim", type=int, default=OBS_DIM)
    p.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=None,
                   help="force (or forbid) prefetching; default: Conduit's schedule decides")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--learners", type=int, default=0,
                   help="learner actors (0: in the driver); with 2 or more Conduit shards the buffer over them")
    main(**vars(p.parse_args()))
