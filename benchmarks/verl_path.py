"""A model of verl's admission with and without Conduit: simulated generation finish times, no trainer (CPU).

Time to the first mini-batch with whole-train-batch admission (verl's) vs Conduit's
constraint-preserving admission (the core's :class:`conduit.ext.AdmissionController`, which
verl's sampler calls), over simulated long-tailed generation finish times (lognormal),
median over seeds. verl's own trainers against Conduit's, on toy workers, with the
post-generation stages and their overlap: ``python -m benchmarks.verl_trainers``.

    python benchmarks/verl_path.py --repeats 7
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from conduit.ext import AdmissionConfig, AdmissionController, GroupInfo


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


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
        description="a model of verl's admission (simulated finish times, no trainer): whole batch vs Conduit"
    )
    ap.add_argument("--repeats", type=int, default=7, help="seeds of simulated finish times")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = {"first_minibatch": bench_admission(seeds=args.repeats)}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    a = out["first_minibatch"]
    fmt = "{median:.3f} s [{min:.3f}-{max:.3f}]".format
    print(
        f"first mini-batch (sim.)   whole batch {fmt(**a['whole_batch_s'])}  admission {fmt(**a['admission_s'])}"
        f"  change {a['change']:+.1%}"
    )


if __name__ == "__main__":
    main()
