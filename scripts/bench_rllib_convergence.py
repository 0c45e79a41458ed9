"""Convergence with and without Conduit (the paper's Fig. 17): DQN on CartPole to the same return.

Two DQN runs with the same config and seed, one on RLlib's stock prioritized
buffer and one with ``enable_conduit`` (bounded mode by default), trained
*interleaved* (one iteration of each in turn) so both see the same machine load.
Each stops when its mean episode return reaches ``--threshold`` (or at the
budget). Wall-clock is each run's own time inside ``train()``.

Prints markdown: a summary (iterations, env steps and seconds to the threshold,
iteration time, exposed experience-path share) and reward-vs-iteration /
reward-vs-wall-clock tables; ``--json PATH`` also writes every iteration.
Not a CI test: ``python scripts/bench_rllib_convergence.py [--threshold 150]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import ray
from conduit.integrations.rllib import ExperiencePathTimer, enable_conduit, quiet_ray_startup
from ray.rllib.algorithms.dqn import DQNConfig


def dqn_config(seed: int, learners: int = 0) -> DQNConfig:
    config = (
        DQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(
            lr=5e-4, train_batch_size_per_learner=32, n_step=3, double_q=True, dueling=True,
            num_steps_sampled_before_learning_starts=1000, target_network_update_freq=500,
            epsilon=[(0, 1.0), (10_000, 0.02)],
            replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 50_000, "alpha": 0.6,
                                  "beta": 0.4},
        )
        .rl_module(model_config={"fcnet_hiddens": [64], "fcnet_activation": "tanh", "head_fcnet_hiddens": [64]})
        .reporting(min_sample_timesteps_per_iteration=1000, min_time_s_per_iteration=None,
                   metrics_num_episodes_for_smoothing=20)
        .debugging(seed=seed)
    )
    if learners:  # two algorithms run side by side on Ray's 2 CPUs: each learner actor takes a share
        config.learners(num_learners=learners, num_cpus_per_learner=1 / learners)
    return config


def run(args: argparse.Namespace, seed: int, deadline: float) -> dict[str, list[dict[str, Any]]]:
    """One seed: both runs, interleaved, each until it reaches the threshold (or the budget)."""
    labels = {"rllib": dqn_config(seed, args.learners)}
    labels["conduit"] = enable_conduit(dqn_config(seed, args.learners), staleness=args.staleness,
                                       prefetch=args.prefetch)
    algos = {label: cfg.build_algo() for label, cfg in labels.items()}
    timers = {label: ExperiencePathTimer(algo) for label, algo in algos.items()}
    history: dict[str, list[dict[str, Any]]] = {label: [] for label in algos}
    done: set[str] = set()
    try:
        for it in range(args.max_iterations):
            for label, algo in algos.items():
                if label in done:
                    continue
                timers[label].reset()
                t0 = time.perf_counter()
                result = algo.train()
                wall = time.perf_counter() - t0
                prev = history[label][-1]["wall_total_s"] if history[label] else 0.0
                ret = result["env_runners"].get("episode_return_mean")
                row = {
                    "iteration": it + 1, "wall_s": wall, "wall_total_s": prev + wall,
                    "env_steps": result["env_runners"].get("num_env_steps_sampled_lifetime"),
                    "return_mean": ret, "experience_s": timers[label].total,
                }
                history[label].append(row)
                print(f"[seed {seed} {label}] iter {it + 1}: return {ret if ret is None else round(ret, 1)}, "
                      f"{wall:.2f}s (total {row['wall_total_s']:.0f}s)", file=sys.stderr, flush=True)
                if ret is not None and ret >= args.threshold:
                    done.add(label)
            if len(done) == len(algos) or time.monotonic() > deadline:
                break
    finally:
        for timer in timers.values():
            timer.close()
        for algo in algos.values():
            algo.stop()
    return history


def first_reaching(rows: list[dict[str, Any]], threshold: float) -> dict[str, Any] | None:
    return next((r for r in rows if r["return_mean"] is not None and r["return_mean"] >= threshold), None)


def summary(histories: dict[int, dict[str, list[dict[str, Any]]]], threshold: float) -> str:
    out = [f"DQN CartPole-v1 to mean return >= {threshold:g} (per seed, then the median over seeds)", "",
           "| seed | run | iterations to threshold | env steps to threshold | wall-clock to threshold (s) "
           "| iteration time (s, median) | exposed experience path (share, median) |",
           "|---|---|---|---|---|---|---|"]
    per_run: dict[str, list[tuple[Any, ...]]] = {}
    for seed, history in histories.items():
        for label, rows in history.items():
            hit = first_reaching(rows, threshold)
            learn = rows[1:] or rows
            it_time = statistics.median(r["wall_s"] for r in learn)
            share = statistics.median(r["experience_s"] / r["wall_s"] for r in learn)
            per_run.setdefault(label, []).append((hit, it_time, share))
            hit_cols = (f"{hit['iteration']} | {int(hit['env_steps'])} | {hit['wall_total_s']:.1f}" if hit
                        else f"not reached in {len(rows)} | - | -")
            out.append(f"| {seed} | {label} | {hit_cols} | {it_time:.2f} | {share:.1%} |")
    for label, entries in per_run.items():
        hits = [h for h, _, _ in entries if h is not None]
        cols = "- | - | -"
        if hits:
            med = {k: statistics.median(h[k] for h in hits) for k in ("iteration", "env_steps", "wall_total_s")}
            cols = f"{med['iteration']:g} | {med['env_steps']:g} | {med['wall_total_s']:.1f}"
        out.append(f"| median ({len(hits)}/{len(entries)} reached) | {label} | {cols} | "
                   f"{statistics.median(e[1] for e in entries):.2f} | {statistics.median(e[2] for e in entries):.1%} |")
    return "\n".join(out)


def curves(seed: int, history: dict[str, list[dict[str, Any]]], every: int) -> str:
    labels = list(history)
    out = [f"Seed {seed}: reward vs iteration and vs each run's wall-clock:", "",
           "| iteration | " + " | ".join(f"{lb} return | {lb} wall (s)" for lb in labels) + " |",
           "|---|" + "---|---|" * len(labels)]
    longest = max(len(rows) for rows in history.values())
    marks = sorted(set(range(every - 1, longest, every)) | {len(rows) - 1 for rows in history.values()})
    for i in marks:
        cells = []
        for lb in labels:
            rows = history[lb]
            if i < len(rows):
                r = rows[i]
                ret = "n/a" if r["return_mean"] is None else f"{r['return_mean']:.1f}"
                cells.append(f"{ret} | {r['wall_total_s']:.1f}")
            else:
                cells.append("(reached) | ")
        out.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threshold", type=float, default=150.0)
    p.add_argument("--max-iterations", type=int, default=30, help="per run")
    p.add_argument("--max-minutes", type=float, default=10.0, help="budget for all runs together")
    p.add_argument("--staleness", choices=["bounded", "exact"], default="bounded")
    p.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--learners", type=int, default=0,
                   help="learner actors (0: in the driver); with 2 or more Conduit shards the buffer over them")
    p.add_argument("--every", type=int, default=5, help="rows of the reward tables: every N iterations")
    p.add_argument("--json", default=None, help="also write the per-iteration history here")
    args = p.parse_args()
    if not ray.is_initialized():
        quiet_ray_startup()  # Ray's start-up warnings about its own defaults (conduit.integrations.rllib.quiet)
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    deadline = time.monotonic() + 60 * args.max_minutes
    histories = {}
    for seed in args.seeds:
        if time.monotonic() > deadline:
            print(f"budget spent: seed {seed} and later skipped")
            break
        histories[seed] = run(args, seed, deadline)
    print(summary(histories, args.threshold))
    for seed, history in histories.items():
        print()
        print(curves(seed, history, args.every))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "histories": histories}, f, indent=1)


if __name__ == "__main__":
    main()
