"""PPO on CartPole, RLlib's new API stack, with Conduit pipelining the mini-batches.

``enable_conduit(config)`` gives PPO a learner that prepares mini-batch k+1 on a
worker (a dedicated CUDA stream on a GPU) while mini-batch k trains. The
mini-batches are RLlib's own, in RLlib's order: on-policy data never crosses an
iteration, and GAE still runs with the current weights. Prints iteration time and
the share of it the experience path (learner connector + waiting for mini-batches)
costs.

Run: ``python examples/rllib_ppo_cartpole.py [--iterations N] [--no-conduit] [--compare]``
(needs ``pip install ".[rllib]"`` in a clone of Conduit).
"""

from __future__ import annotations

import argparse

import ray
from conduit.integrations.rllib import enable_conduit, measure_iterations, quiet_ray_startup, stats, summary_table
from ray.rllib.algorithms.ppo import PPOConfig


def build(use_conduit: bool, seed: int):
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(train_batch_size_per_learner=512, minibatch_size=64, num_epochs=4, lr=3e-4)
        .rl_module(model_config={"fcnet_hiddens": [32]})
        .debugging(seed=seed)
    )
    if use_conduit:
        config = enable_conduit(config)
    return config.build_algo()


def main(iterations: int = 3, conduit: bool = True, compare: bool = False, seed: int = 0,
         verbose: bool = True) -> dict[str, list[dict]]:
    if not ray.is_initialized():
        quiet_ray_startup()  # Ray's start-up warnings about its own defaults (conduit.integrations.rllib.quiet)
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    runs = [("rllib", False), ("conduit", True)] if compare else [("conduit" if conduit else "rllib", conduit)]
    algos = {label: build(use_conduit, seed) for label, use_conduit in runs}
    try:
        results = measure_iterations(algos, iterations, verbose)  # interleaved: A, B, A, B, ...
        if verbose and "conduit" in algos:
            print(f"[conduit] pipeline: {stats(algos['conduit']).pipeline}")
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
    p.add_argument("--seed", type=int, default=0)
    main(**vars(p.parse_args()))
