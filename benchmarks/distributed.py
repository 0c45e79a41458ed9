"""Rows/s delivered per learner at 2 and 4 learner ranks: global sampling over a sharded buffer vs an
RLlib-style central buffer vs local sampling, side by side in one run.

- **global** — ``conduit.distributed.Conduit`` on each rank (gloo over 127.0.0.1), each rank's shard
  filled by its own actors; each learner pulls its batch drawn over every shard (``all_to_all`` of rows).
- **global g=4** — the same, with delivery granularity 4 (``pinned={"delivery_granularity": 4}``, as on
  one process): one exchange draws four batches per learner, each its own draw, at most four pulls stale.
- **global, planned** — the same, ``plan="auto"``: the ranks measure every delivery mode (inline or
  overlapped on the delivery path's worker, ``g`` in 1, 2, 4) on this loop and keep the one that beats inline
  ``g = 1`` by more than the noise (:mod:`conduit.scheduling.planner`); the windows start after that
  decision, and the table says what it kept.
- with ``--train``, learners that train (an SGD step of a small MLP on every batch) rather than only read
  their batch, inline ``g = 1`` against overlapped ``g = 1`` and planned: what overlap hides when there is
  compute to hide the exchange behind (ms per iteration).
- **local** — the same group, ``sampling="local"``: each learner samples its own shard, no exchange.
- **central** — the RLlib shape with ``num_learners=N``: one buffer (a single-process
  ``conduit.Conduit``, the fastest one here) in the driver samples every learner's batch, ``ray.put``s it
  and each learner actor receives it through Ray's object store.

Each learner touches every byte of its batch (a sum), as a learner's first layer would. Each
configuration runs ``--repeats`` timed windows of ``--iters`` batches per learner after a warm-up; a
window's figure is the mean over learners of batch rows x batches / seconds; the table shows the median
over windows with [min-max]. Every process shares this machine's cores, so the ranks compete with each
other as they would on an oversubscribed node: read the ratios, not the absolute rates.

::

    python -m benchmarks.distributed                     # 2 and 4 ranks, table to stdout
    python -m benchmarks.distributed --json out.json     # and every window's figure
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["main", "run_central", "run_group"]

DIM = 256  # float32 observation features per row (1 KiB rows, plus action and reward)


def _rows(n: int, start: int) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + n)
    return {
        "obs": np.random.default_rng(start).standard_normal((n, DIM), dtype=np.float32),
        "action": (ids % 4).astype(np.int64),
        "reward": np.ones(n, dtype=np.float32),
    }


def _touch(batch: Any) -> float:
    return float(sum(float(torch.as_tensor(v).float().sum()) for v in batch.values()))


def _trainer() -> Any:
    """A learner that trains: one SGD step of a 256-512-512-1 MLP on the batch's observations per pull."""
    net = torch.nn.Sequential(torch.nn.Linear(DIM, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                              torch.nn.Linear(512, 1))
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)

    def update(batch: Any) -> float:
        loss = net(torch.as_tensor(batch["obs"])).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    return update


def _rank(rank: int, world: int, port: int, args: dict[str, Any], out: str) -> None:
    import conduit.distributed as cd
    from conduit.distributed import launch

    faulthandler.enable(all_threads=True)  # a rank that dies says where, with every thread's stack
    torch.set_num_threads(1)
    launch.init_process_group(rank, world, port, timeout_s=120)
    auto = args.get("plan") == "auto"
    pinned = {} if auto else {"delivery_granularity": args.get("g", 1), "delivery_overlap": args.get("overlap", False)}
    learn = _trainer() if args.get("train") else _touch
    edp = cd.Conduit(policy="off_policy", train_batch_size=args["batch"], capacity=args["rows"] * world,
                     sampler=args["sampler"], sampling=args["sampling"], seed=rank, timeout_s=120,
                     plan="auto" if auto else "prior", pinned=pinned)
    for start in range(0, args["rows"], 1000):
        edp.push(_rows(min(1000, args["rows"] - start), rank * args["rows"] + start))
    while auto and not edp.delivery_plan():  # the probe: every mode measured, one kept by the whole group
        learn(edp.pull())
    for _ in range(args["warmup"]):
        learn(edp.pull())
    windows = []
    for _ in range(args["repeats"]):
        edp.group.barrier("bench: window start")
        t0 = time.perf_counter()
        for _ in range(args["iters"]):
            learn(edp.pull())
        windows.append(args["batch"] * args["iters"] / (time.perf_counter() - t0))
    every = edp.group.gather_object(windows, "bench: results")
    if rank == 0:
        Path(out).write_text(json.dumps({"windows": every, "mode": str(edp.delivery_mode),
                                         "plan": edp.delivery_plan()}))
    edp.close()
    dist.destroy_process_group()


def run_group(world: int, sampling: str, args: dict[str, Any], g: int = 1, plan: str = "prior",
              overlap: bool = False, train: bool = False) -> dict[str, Any]:
    """Per window: rows/s per learner (mean over the ranks) of ``world`` spawned ranks; the mode it ran in.
    ``train``: each learner runs an SGD step on every batch (:func:`_trainer`) instead of only reading it."""
    from conduit.distributed import launch

    run = {**args, "sampling": sampling, "g": g, "plan": plan, "overlap": overlap, "train": train}
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        mp.spawn(_rank, args=(world, launch.free_port(), run, out), nprocs=world)
        got = json.loads(Path(out).read_text())
    windows = [float(np.mean(w)) for w in zip(*got["windows"], strict=True)]
    return {"windows": windows, "mode": got["mode"], "plan": got["plan"]}


def run_central(world: int, args: dict[str, Any]) -> dict[str, Any]:
    """Per window: rows/s per learner with one driver-side buffer shipping batches through Ray's object store."""
    import ray

    import conduit

    @ray.remote(num_cpus=0.01)
    class Learner:
        def __init__(self) -> None:
            torch.set_num_threads(1)

        def update(self, batch: dict[str, np.ndarray]) -> float:
            return _touch(batch)

    torch.set_num_threads(1)
    edp = conduit.Conduit(policy="off_policy", train_batch_size=args["batch"], capacity=args["rows"] * world,
                          sampler=args["sampler"], seed=0)
    learners = [Learner.remote() for _ in range(world)]
    with edp:
        for start in range(0, args["rows"] * world, 1000):
            edp.push(_rows(min(1000, args["rows"] * world - start), start))

        def step() -> None:
            refs = []
            for lr in learners:  # RLlib's driver: sample, put, hand each learner its batch
                batch = edp.pull()
                refs.append(lr.update.remote(ray.put({k: v.numpy() for k, v in batch.items()})))
            ray.get(refs)

        for _ in range(args["warmup"]):
            step()
        windows = []
        for _ in range(args["repeats"]):
            t0 = time.perf_counter()
            for _ in range(args["iters"]):
                step()
            windows.append(args["batch"] * args["iters"] / (time.perf_counter() - t0))
    for lr in learners:
        ray.kill(lr)
    return {"windows": windows, "mode": "central", "plan": []}


def _summary(windows: list[float]) -> dict[str, float]:
    return {"median": statistics.median(windows), "min": min(windows), "max": max(windows)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rows", type=int, default=20_000, help="rows per rank's shard (central: rows x ranks)")
    p.add_argument("--sampler", default="uniform", choices=["uniform", "prioritized"])
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--g", type=int, default=4, help="batches per exchange of the 'global g=' column")
    p.add_argument("--train", action="store_true", help="also: learners that train an MLP on each batch, inline vs "
                   "overlapped vs planned (ms per iteration)")
    p.add_argument("--json", type=Path, default=None)
    ns = p.parse_args(argv)
    args = {k: getattr(ns, k) for k in ("batch", "rows", "sampler", "iters", "repeats", "warmup")}
    import ray

    ray.init(address="local", num_cpus=max(ns.worlds) + 1, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    results: dict[str, Any] = {"args": args, "cpus": os.cpu_count(), "worlds": {}}
    try:
        for world in ns.worlds:
            res = {"central": run_central(world, args), "global": run_group(world, "global", args),
                   "global planned": run_group(world, "global", args, plan="auto"),
                   f"global g={ns.g}": run_group(world, "global", args, ns.g),
                   "local": run_group(world, "local", args)}
            results["worlds"][world] = {k: {**v, **_summary(v["windows"])} for k, v in res.items()}
            if ns.train:
                trained = {"inline g=1": run_group(world, "global", args, train=True),
                           "overlapped g=1": run_group(world, "global", args, overlap=True, train=True),
                           "planned": run_group(world, "global", args, plan="auto", train=True)}
                results.setdefault("training", {})[world] = {k: {**v, **_summary(v["windows"])}
                                                             for k, v in trained.items()}
    finally:
        ray.shutdown()
    print(f"rows/s delivered per learner; batch {ns.batch}, rows of {DIM * 4 + 12} B, {ns.sampler}; "
          f"median [min-max] of {ns.repeats} windows x {ns.iters} batches; {os.cpu_count()} cores")
    cols = list(next(iter(results["worlds"].values())))
    print(" | ".join([f"{'ranks':>5}", *(f"{c:>30}" for c in cols), "ratios (median / central)"]))
    for world, r in results["worlds"].items():
        cells = [f"{r[k]['median']:>9,.0f} [{r[k]['min']:,.0f}-{r[k]['max']:,.0f}]" for k in cols]
        ratios = ", ".join(f"{k} {r[k]['median'] / r['central']['median']:.2f}x" for k in cols[1:])
        print(" | ".join([f"{world:>5}", *(f"{c:>30}" for c in cells), ratios]))
        print(f"      planned: kept {r['global planned']['mode']}; probe (ms per pull): "
              + ", ".join(f"{p['mode']} {float(p['median_s']) * 1e3:.2f}" for p in r["global planned"]["plan"]))
    for world, r in results.get("training", {}).items():  # ms per iteration: batch rows / (rows/s)
        cells = ", ".join(f"{k} {ns.batch / v['median'] * 1e3:.2f} ms [{ns.batch / v['max'] * 1e3:.2f}-"
                          f"{ns.batch / v['min'] * 1e3:.2f}]" for k, v in r.items())
        print(f"training learners, {world} ranks (ms per iteration): {cells}; planned kept {r['planned']['mode']}")
    if ns.json is not None:
        ns.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
