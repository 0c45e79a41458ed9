"""DQN with prioritized replay through Conduit, on a tiny vectorized corridor.

The paper's hook interface, a real Q-learning update, and a loop a person can
read top to bottom. Run: ``python examples/dqn_corridor.py --iterations 300``.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import conduit

N_STATES, N_ENVS, HORIZON = 10, 16, 30


class Corridor:
    """Walk left/right along a corridor; reward 1 for reaching the right end."""

    def __init__(self, n_envs: int, seed: int) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.pos = torch.zeros(n_envs, dtype=torch.int64)
        self.t = torch.zeros(n_envs, dtype=torch.int64)

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        obs = self.pos.clone()
        self.pos = (self.pos + 2 * action - 1).clamp(0, N_STATES - 1)
        self.t += 1
        reward = (self.pos == N_STATES - 1).float()
        done = (self.pos == N_STATES - 1) | (self.t >= HORIZON)
        next_obs = self.pos.clone()
        self.pos[done] = 0
        self.t[done] = 0
        return obs, next_obs, reward, done


def one_hot(states: torch.Tensor) -> torch.Tensor:
    return nn.functional.one_hot(states, N_STATES).float()


def main(iterations: int = 300, seed: int = 0, verbose: bool = True) -> float:
    torch.manual_seed(seed)
    q = nn.Sequential(nn.Linear(N_STATES, 64), nn.ReLU(), nn.Linear(64, 2))
    target = nn.Sequential(nn.Linear(N_STATES, 64), nn.ReLU(), nn.Linear(64, 2))
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    env = Corridor(N_ENVS, seed)

    edp = conduit.Conduit(
        policy="off_policy", train_batch_size=64, capacity=20_000, min_size_to_sample=256,
        sampler="prioritized", seed=seed,
    )

    @edp.register_ingestion(input="Actor", output="ExperienceBuffer")
    def ingestion(actor_in, exp_out):
        d = actor_in.read()  # rollout data, granularity chosen by Conduit
        exp_out.write({**d, "reward": d["reward"].clamp(-1, 1)})  # the framework's own logic

    @edp.register_delivery(input="ExperienceBuffer", output="Learner")
    def delivery(exp_in, learn_out):
        d = exp_in.read()  # a sampled batch, from the buffer
        learn_out.write({**d, "obs": one_hot(d["obs"]), "next_obs": one_hot(d["next_obs"])})

    returns, episode_return = [], torch.zeros(N_ENVS)
    t0 = time.perf_counter()
    with edp:
        for it in range(iterations):
            eps = max(0.05, 1.0 - it / (0.5 * iterations))
            obs = env.pos.clone()
            with torch.no_grad():
                greedy = q(one_hot(obs)).argmax(1)
            action = torch.where(torch.rand(N_ENVS) < eps, torch.randint(0, 2, (N_ENVS,)), greedy)
            o, o2, r, done = env.step(action)
            episode_return += r
            returns.extend(episode_return[done].tolist())
            episode_return[done] = 0
            edp.push({"obs": o, "action": action, "reward": r, "next_obs": o2, "done": done})
            if not edp.ready():
                continue
            batch = edp.pull()
            with torch.no_grad():
                best = target(batch["next_obs"]).max(1).values
                y = batch["reward"] + 0.9 * best * (~batch["done"]).float()
            pred = q(batch["obs"]).gather(1, batch["action"].unsqueeze(1)).squeeze(1)
            td = y - pred
            loss = (batch.weights * td.pow(2)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            edp.update_priorities(batch, td.detach().abs())  # lands only on rows still in the buffer
            if it % 50 == 0:
                target.load_state_dict(q.state_dict())
        stats = edp.stats()
    recent = sum(returns[-50:]) / max(1, len(returns[-50:]))
    if verbose:
        print(
            f"{iterations} iterations in {time.perf_counter() - t0:.1f}s; mean return (last 50 episodes) {recent:.2f}; "
            f"push {stats.push_s * 1e3:.0f} ms, pull {stats.pull_s * 1e3:.0f} ms in total; "
            f"{stats.ingested_rows} transitions ingested, {stats.pulls} batches delivered"
        )
    return recent


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    main(**vars(p.parse_args()))
