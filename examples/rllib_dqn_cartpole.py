"""DQN on CartPole, RLlib's new API stack, with Conduit as its replay buffer.

One call switches Conduit on: ``enable_conduit(config)``. RLlib keeps its control
flow (sample -> add -> sample -> learner update -> priority update); Conduit holds
the transitions in columnar storage, draws the batches and hands the learner ready
tensors. Prints iteration time and the share of it the experience path costs.

Run: ``python examples/rllib_dqn_cartpole.py [--iterations N] [--no-conduit] [--compare]``
(needs ``pip install ".[rllib]"`` in a clone of Conduit).
"""

from __future__ import annotations

import argparse

import ray
from conduit.integrations.rllib import enable_conduit, measure_iterations, quiet_ray_startup, stats, summary_table
from ray.rllib.algorithms.dqn import DQNConfig


def build(use_conduit: bool, seed: int, staleness: str, prefetch: bool | None):
    config = (
        DQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(
            lr=5e-4, train_batch_size_per_learner=32, num_steps_sampled_before_learning_starts=200,
            target_network_update_freq=200, replay_buffer_config={"capacity": 5000},
        )
        .rl_module(model_config={"fcnet_hiddens": [32], "head_fcnet_hiddens": [32]})
        .reporting(min_sample_timesteps_per_iteration=200, min_time_s_per_iteration=None)
        .debugging(seed=seed)
    )
    if use_conduit:
        config = enable_conduit(config, staleness=staleness, prefetch=prefetch)
    return config.build_algo()


def main(iterations: int = 3, conduit: bool = True, compare: bool = False, staleness: str = "bounded",
         prefetch: bool | None = None, seed: int = 0, verbose: bool = True) -> dict[str, list[dict]]:
    if not ray.is_initialized():
        quiet_ray_startup()  # Ray's start-up warnings about its own defaults (conduit.integrations.rllib.quiet)
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    runs = [("rllib", False), ("conduit", True)] if compare else [("conduit" if conduit else "rllib", conduit)]
    algos = {label: build(use_conduit, seed, staleness, prefetch) for label, use_conduit in runs}
    try:
        results = measure_iterations(algos, iterations, verbose)  # interleaved: A, B, A, B, ...
        if verbose and "conduit" in algos:
            print(f"[conduit] buffer: {stats(algos['conduit']).buffer}")
    finally:
        for algo in algos.values():
            algo.stop()
    if verbose:
        print(summary_table(results))
    return results


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--no-conduit", dest="conduit", action="store_false", help="stock RLlib only")
    p.add_argument("--compare", action="store_true", help="stock RLlib and Conduit, side by side")
    p.add_argument("--staleness", choices=["bounded", "exact"], default="bounded")
    p.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=None,
                   help="bounded mode: force (or forbid) prefetching; default: Conduit's schedule decides")
    p.add_argument("--seed", type=int, default=0)
    main(**vars(p.parse_args()))
