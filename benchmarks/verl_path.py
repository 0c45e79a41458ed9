"""A model of verl's experience path with and without Conduit: simulated stage latencies, no trainer (CPU).

Not a trainer run: it calls the ingestion functions Conduit's trainers are built
on, with sleeps for the worker stages. verl's own trainers against Conduit's, on
toy workers, are ``python -m benchmarks.verl_trainers``. What it measures:

1. Exposed experience-path latency per iteration (post-generation stages up to
   the advantage): verl's serial order vs the Conduit-scheduled graph. The stages
   are verl's functions (``extract_reward``, ``apply_kl_penalty``, GRPO
   ``compute_advantage``) on random GRPO batches; the worker-side stages (colocated
   reward model, old and reference log-prob, each on its own pool) sleep their
   simulated latency. Median [min-max] over ``--repeats`` iterations, after one
   warm-up iteration that profiles the stage costs.
2. Time to the first mini-batch with whole-train-batch admission (verl's) vs
   Conduit's constraint-preserving admission, over simulated long-tailed
   generation finish times (lognormal), median over seeds.

    python benchmarks/verl_path.py --repeats 7
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid

import numpy as np
import torch
from conduit.integrations.verl.ingest import AdvantageSpec, StageFns, run_conduit, run_serial
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo import core_algos

from conduit.ext import AdmissionConfig, AdmissionController, GroupInfo, StageProfile, StageRunner


def grpo_batch(seed: int, groups: int, n: int, resp: int = 64) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    b = groups * n
    lengths = torch.randint(1, resp + 1, (b,), generator=g)
    mask = (torch.arange(resp)[None, :] < lengths[:, None]).long()
    uids = np.array([uuid.UUID(int=seed * 10_000 + i).hex for i in range(groups) for _ in range(n)], dtype=object)
    return DataProto.from_single_dict(
        {
            "responses": torch.randint(0, 100, (b, resp), generator=g),
            "attention_mask": torch.cat([torch.ones(b, 16, dtype=torch.long), mask], 1),
            "response_mask": mask,
            "uid": uids,
        }
    )


def sleeping_fns(reward_s: float, logp_s: float, ref_s: float) -> StageFns:
    def reward(batch: DataProto) -> DataProto:
        time.sleep(reward_s)
        r, m = batch.batch["responses"], batch.batch["response_mask"]
        rm = torch.zeros(r.shape)
        rm[torch.arange(r.shape[0]), m.sum(-1) - 1] = ((r * m).sum(-1) % 2 == 0).float()
        return DataProto.from_dict({"rm_scores": rm})

    def logp(key: str, seconds: float, salt: int):
        def fn(batch: DataProto) -> DataProto:
            time.sleep(seconds)
            gen = torch.Generator().manual_seed(int(batch.batch["responses"].sum()) + salt)
            return DataProto.from_dict({key: -torch.rand(batch.batch["responses"].shape, generator=gen)})

        return fn

    return StageFns(
        old_log_prob=logp("old_log_probs", logp_s, 1),
        reward=reward,
        ref_log_prob=logp("ref_log_prob", ref_s, 2),
        groups={"reward": "rm_pool", "old_log_prob": "actor_pool", "ref_log_prob": "ref_pool"},
    )


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def bench_exposed(args: argparse.Namespace) -> dict:
    n, groups = 8, 16
    algo = OmegaConf.create({"adv_estimator": "grpo", "use_kl_in_reward": True, "norm_adv_by_std_in_grpo": True})
    spec = AdvantageSpec("grpo", num_repeat=n, use_kl_in_reward=True, algorithm=algo)
    fns = sleeping_fns(args.reward_s, args.logp_s, args.ref_s)
    profile, runner = StageProfile(), StageRunner()
    serial, conduit, plan = [], [], ""
    try:
        run_conduit(grpo_batch(0, groups, n), fns, spec, core_algos.FixedKLController(0.001), profile, runner)
        for i in range(args.repeats):  # interleaved: the host's drift hits both alike
            t0 = time.perf_counter()
            a, _ = run_serial(grpo_batch(i + 1, groups, n), fns, spec, core_algos.FixedKLController(0.001))
            serial.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            b, _, p = run_conduit(
                grpo_batch(i + 1, groups, n), fns, spec, core_algos.FixedKLController(0.001), profile, runner
            )
            conduit.append(time.perf_counter() - t0)
            plan = p.describe()
            assert torch.equal(a.batch["advantages"], b.batch["advantages"])
    finally:
        runner.close()
    s, c = summary(serial), summary(conduit)
    return {
        "stage_latency_s": {"reward": args.reward_s, "old_log_prob": args.logp_s, "ref": args.ref_s},
        "serial_s": s,
        "conduit_s": c,
        "change": c["median"] / s["median"] - 1,
        "plan": plan,
    }


def bench_admission(seeds: int = 7, groups: int = 32, n: int = 8, dp: int = 4, mini: int = 8) -> dict:
    whole, early = [], []
    for seed in range(seeds):
        rng = random.Random(seed)
        finish = sorted((rng.lognormvariate(0.0, 0.8), f"g{i}") for i in range(groups))
        whole.append(finish[-1][0])  # verl: the batch is admitted when its last group finished
        ctl = AdmissionController(AdmissionConfig(n, mini, dp, groups, max_staleness=1))
        done: list[GroupInfo] = []
        for k, (t, uid) in enumerate(finish):
            done.append(GroupInfo(uid, 0))
            if ctl.offer(done, {"*": groups - k - 1}, version=0).admitted:
                early.append(t)
                break
    w, e = summary(whole), summary(early)
    return {
        "groups": groups,
        "unit_groups": AdmissionConfig(n, mini, dp, groups).unit_groups,
        "whole_batch_s": w,
        "admission_s": e,
        "change": e["median"] / w["median"] - 1,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description="a model of verl's experience path (simulated latencies, no trainer): serial vs Conduit"
    )
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--reward-s", type=float, default=0.4, help="colocated reward model stage (own pool)")
    ap.add_argument("--logp-s", type=float, default=0.5, help="old log-prob stage")
    ap.add_argument("--ref-s", type=float, default=0.4, help="reference log-prob stage (own pool)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = {"exposed_path": bench_exposed(args), "first_minibatch": bench_admission()}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    e, a = out["exposed_path"], out["first_minibatch"]
    fmt = "{median:.3f} s [{min:.3f}-{max:.3f}]".format
    print(
        f"exposed path / iteration  serial {fmt(**e['serial_s'])}  conduit {fmt(**e['conduit_s'])}"
        f"  change {e['change']:+.1%}  plan {e['plan']}"
    )
    print(
        f"first mini-batch (sim.)   whole batch {fmt(**a['whole_batch_s'])}  admission {fmt(**a['admission_s'])}"
        f"  change {a['change']:+.1%}"
    )


if __name__ == "__main__":
    main()
