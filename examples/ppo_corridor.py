"""PPO through Conduit: the ingestion hook computes returns, delivery serves shuffled mini-batches.

On-policy: each iteration's rollouts become one iteration of the buffer;
the learner runs ``epochs`` passes of ``M`` mini-batches over it, never mixing
iterations. Run: ``python examples/ppo_corridor.py --iterations 40``.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import conduit

N_STATES, N_ENVS, T = 10, 16, 32
GAMMA = 0.95


def one_hot(s: torch.Tensor) -> torch.Tensor:
    return nn.functional.one_hot(s, N_STATES).float()


def rollout(policy: nn.Module, g: torch.Generator) -> dict[str, torch.Tensor]:
    """T steps of N_ENVS corridor walkers; a rollout unit of T*N_ENVS transitions, time-major."""
    pos = torch.zeros(N_ENVS, dtype=torch.int64)
    obs, act, rew, done, logp = [], [], [], [], []
    for t in range(T):
        with torch.no_grad():
            dist = torch.distributions.Categorical(logits=policy(one_hot(pos)))
        a = dist.sample()
        obs.append(pos.clone())
        act.append(a)
        logp.append(dist.log_prob(a))
        pos = (pos + 2 * a - 1).clamp(0, N_STATES - 1)
        d = (pos == N_STATES - 1) | torch.full((N_ENVS,), t == T - 1)
        rew.append((pos == N_STATES - 1).float())
        done.append(d)
        pos = torch.where(d, torch.zeros_like(pos), pos)
    return {
        "obs": torch.stack(obs).flatten(), "action": torch.stack(act).flatten(), "reward": torch.stack(rew).flatten(),
        "done": torch.stack(done).flatten(), "logp": torch.stack(logp).flatten(),
    }


def main(iterations: int = 40, epochs: int = 4, minibatches: int = 4, seed: int = 0, verbose: bool = True) -> float:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    policy = nn.Sequential(nn.Linear(N_STATES, 64), nn.Tanh(), nn.Linear(64, 2))
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    edp = conduit.Conduit(
        policy="on_policy", train_batch_size=T * N_ENVS, num_minibatches=minibatches, num_epochs=epochs, seed=seed,
    )

    @edp.register_ingestion(input="Actor", output="ExperienceBuffer")
    def ingestion(actor_in, exp_out):
        d = actor_in.read()  # one time-major rollout unit
        r, dn = d["reward"].view(T, N_ENVS), d["done"].view(T, N_ENVS).float()
        ret, acc = torch.zeros_like(r), torch.zeros(N_ENVS)
        for t in reversed(range(T)):  # discounted return-to-go within each episode
            acc = r[t] + GAMMA * acc * (1 - dn[t])
            ret[t] = acc
        adv = (ret - ret.mean()) / (ret.std() + 1e-8)
        exp_out.write({**d, "advantage": adv.flatten()})

    mean_return = 0.0
    t0 = time.perf_counter()
    with edp:
        for _ in range(iterations):
            unit = rollout(policy, g)
            mean_return = float(unit["reward"].sum()) / N_ENVS
            edp.push(unit)  # one unit == one iteration here (train_batch_size = T * N_ENVS)
            for mb in edp.minibatches():  # M shuffled mini-batches x epochs, this iteration only
                dist = torch.distributions.Categorical(logits=policy(one_hot(mb["obs"])))
                ratio = (dist.log_prob(mb["action"]) - mb["logp"]).exp()
                clipped = torch.clamp(ratio, 0.8, 1.2) * mb["advantage"]
                loss = -torch.min(ratio * mb["advantage"], clipped).mean() - 0.01 * dist.entropy().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        stats = edp.stats()
    if verbose:
        print(
            f"{iterations} iterations in {time.perf_counter() - t0:.1f}s; episodes reaching the goal per env in the "
            f"last rollout: {mean_return:.2f}; {stats.pulls} mini-batches delivered, push {stats.push_s * 1e3:.0f} ms, "
            f"pull {stats.pull_s * 1e3:.0f} ms in total"
        )
    return mean_return


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--minibatches", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    main(**vars(p.parse_args()))
