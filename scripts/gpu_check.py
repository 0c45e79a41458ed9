"""GPU check for placement (issue 3): profile, migrate GPU -> pinned in the real runtime, gather bandwidth.

    python scripts/gpu_check.py            # ~1 minute on one GPU
    python scripts/gpu_check.py --json out.json

1. Profiles this machine's topology (``profile_topology``) and prints it.
2. Runs the real runtime with a :class:`PlacementPolicy` whose GPU budget is
   capped (``--gpu-budget-gib``, default 1) so that growing the transition
   dimension re-lays the buffer in place on the GPU, then migrates it to pinned
   host memory; every record is checked after each step, and batches pulled on
   the GPU are checked too. Prints measured vs modeled migration times.
3. Measures sharded gather bandwidth onto ``cuda:0`` (batch 512): one GPU,
   pinned host, half GPU / half pinned, and every GPU when there are several.

Exits 0 with a message when CUDA is absent; 1 if any record check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import conduit
from conduit.placement import Node, PlacementPolicy, Topology, profile_topology
from conduit.placement.units import GIB, format_bandwidth, format_bytes
from conduit.spec import ExperienceSpec
from conduit.storage import ShardedStorage, Storage, TensorStorage

FIELDS = ("obs", "next_obs", "action", "reward", "done", "tid")


def unit(first: int, n: int, dim: int) -> dict[str, torch.Tensor]:
    tid = torch.arange(first, first + n, dtype=torch.int64)
    value = (tid + 1).to(torch.float32).unsqueeze(1)
    return {
        "obs": value.expand(-1, dim).clone(), "next_obs": (-value).expand(-1, dim).clone(),
        "action": tid % 7, "reward": tid.to(torch.float32) / 2, "done": tid % 2 == 1, "tid": tid,
    }


def rows_ok(rows: dict[str, torch.Tensor], firsts: list[int], dims: list[int]) -> bool:
    """Every row complete: its own values up to the width it was written at, zeros beyond."""
    tid = rows["tid"]
    dev = tid.device
    width = rows["obs"].shape[1]
    dim = torch.tensor(dims, device=dev)[torch.searchsorted(torch.tensor(firsts, device=dev), tid, right=True) - 1]
    mask = torch.arange(width, device=dev).unsqueeze(0) < dim.unsqueeze(1)
    value = (tid + 1).to(torch.float32).unsqueeze(1)
    return bool(
        torch.equal(rows["obs"], torch.where(mask, value, 0.0))
        and torch.equal(rows["next_obs"], torch.where(mask, -value, 0.0))
        and torch.equal(rows["action"], tid % 7)
        and torch.equal(rows["reward"], tid.to(torch.float32) / 2)
        and torch.equal(rows["done"], tid % 2 == 1)
    )


def print_topology(topo: Topology) -> None:
    node = topo.nodes[0]
    print(f"topology {topo.name}: {len(topo.devices)} devices")
    for d in topo.devices:
        print(f"  {d.id:8s} {d.kind.value:7s} free {format_bytes(d.memory_bytes)}")
    print(f"  host memcpy {format_bandwidth(node.host_memcpy)}")
    for g in range(node.gpu_count):
        pinned = node.pinned_to_gpu[g] if node.pinned_to_gpu else float("nan")
        to_pinned = node.gpu_to_pinned[g] if node.gpu_to_pinned else float("nan")
        print(
            f"  cuda:{g}: local {format_bandwidth(node.gpu_local[g])}, "
            f"host->gpu {format_bandwidth(node.host_to_gpu[g])}, gpu->host {format_bandwidth(node.gpu_to_host[g])}, "
            f"pinned->gpu {format_bandwidth(pinned)}, gpu->pinned {format_bandwidth(to_pinned)}"
        )
        peers = [f"{format_bandwidth(bw)}" for j, bw in enumerate(node.gpu_to_gpu[g]) if j != g]
        if peers:
            print(f"          to peers: {', '.join(peers)}")
    for note in topo.notes:
        print(f"  note: {note}")


def capped(topo: Topology, gpu_budget: int) -> Topology:
    """The same machine with at most ``gpu_budget`` bytes free per GPU."""
    data = topo.nodes[0].model_dump()
    data["gpu_memory_bytes"] = [min(m, gpu_budget) for m in data["gpu_memory_bytes"]]
    return Topology(name=f"{topo.name}-capped", notes=topo.notes, nodes=(Node(**data),))


def migration_check(topo: Topology, capacity: int, unit_rows: int, dims: list[int], budget: int) -> dict[str, Any]:
    policy = PlacementPolicy(
        capped(topo, budget), actors="cpu", learners="cuda:0", capacity=capacity, headroom=0.0,
        kinds=["single_gpu", "cpu_pinned"],
    )
    firsts: list[int] = []
    used: list[int] = []
    ok = True
    tid = 0
    with conduit.Conduit(
        policy="off_policy", train_batch_size=512, capacity=capacity, learner_device="cuda:0", storage=policy,
        growable={"obs", "next_obs"}, seed=0,
    ) as edp:
        for dim in dims:
            for _ in range(max(1, capacity // unit_rows)):
                firsts.append(tid)
                used.append(dim)
                edp.push(unit(tid, unit_rows, dim))
                tid += unit_rows
            edp.flush()
            for _ in range(4):
                batch = edp.pull()
                ok &= batch["obs"].device.type == "cuda" and rows_ok({k: batch[k] for k in FIELDS}, firsts, used)
            buf = edp.buffer
            assert isinstance(buf, conduit.buffer.ReplayBuffer)
            with buf.lock:
                contents = buf.contents()
                ids = torch.from_numpy(buf.ids[: buf.size].copy())
                where = str(policy.active)
            step_ok = torch.equal(contents["tid"].cpu(), ids) and rows_ok(contents, firsts, used)
            ok &= step_ok
            print(f"  dim {dim:6d}: {buf.size} rows on {where}: records {'intact' if step_ok else 'CORRUPT'}")
            del contents
    print(f"  {'from':24s} {'to':24s} {'rows':>7s} {'moved':>10s} {'modeled':>10s} {'measured':>10s} {'total':>10s}")
    history = []
    for h in policy.history:
        moved = h.rows_moved * h.sample_bytes_before
        print(
            f"  {h.source!s:24s} {h.target!s:24s} {h.rows_moved:7d} {format_bytes(moved):>10s} "
            f"{h.modeled_seconds * 1e3:8.2f}ms {h.measured_seconds * 1e3:8.2f}ms {h.total_seconds * 1e3:8.2f}ms"
            f"{'  (in place)' if h.in_place else ''}"
        )
        history.append({
            "source": str(h.source), "target": str(h.target), "rows": h.rows_moved, "bytes": moved,
            "modeled_s": h.modeled_seconds, "measured_s": h.measured_seconds, "total_s": h.total_seconds,
            "in_place": h.in_place,
        })
    changed = [h for h in policy.history if h.changed]
    if not any(h.target.kind.value == "cpu_pinned" and h.source.kind.value == "single_gpu" for h in changed):
        print("  WARNING: no GPU -> pinned migration happened (check the live bandwidths and the budget)")
        ok = False
    return {"ok": ok, "history": history}


def gather_bandwidth(dim: int, rows: int, batch: int, repeats: int) -> list[dict[str, Any]]:
    spec = ExperienceSpec.of(obs=((dim,), "float32"))
    half = rows // 2
    layouts: dict[str, Any] = {
        "cuda:0": lambda: TensorStorage(spec, rows, "cuda:0"),
        "pinned": lambda: TensorStorage(spec, rows, "pinned"),
        "cuda:0 + pinned": lambda: ShardedStorage(spec, rows, [("cuda:0", half), ("pinned", rows - half)]),
    }
    g = torch.cuda.device_count()
    if g > 1:
        counts = [rows // g + (1 if k < rows % g else 0) for k in range(g)]
        layouts[f"{g} GPUs"] = lambda: ShardedStorage(spec, rows, [(f"cuda:{k}", n) for k, n in enumerate(counts)])
    target = torch.device("cuda:0")
    rng = np.random.default_rng(0)
    out = []
    for name, make in layouts.items():
        storage: Storage = make()
        storage.write(0, {"obs": torch.ones(rows, dim)})
        idx = [torch.from_numpy(rng.integers(0, rows, batch)) for _ in range(repeats)]
        for i in idx[:3]:
            storage.gather(i, target)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in idx:
            storage.gather(i, target)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - t0) / repeats
        nbytes = batch * spec.bytes_per_sample
        out.append({"storage": name, "seconds": seconds, "bytes_per_s": nbytes / seconds})
        print(f"  {name:18s} {seconds * 1e3:8.3f} ms / batch   {format_bandwidth(nbytes / seconds):>12s}")
        storage.close()
        del storage
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu-budget-gib", type=float, default=1.0)
    p.add_argument("--capacity", type=int, default=50_000)
    p.add_argument("--unit-rows", type=int, default=10_000)
    p.add_argument("--dims", type=int, nargs="+", default=[1_000, 2_000, 4_000])
    p.add_argument("--gather-dim", type=int, default=5_000)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device on this machine; nothing to check (exit 0)")
        return 0
    started = time.perf_counter()
    print(f"torch {torch.__version__}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
    topo = profile_topology(name="live", time_budget_s=45.0)
    print_topology(topo)
    print(f"\nmigration check: capacity {args.capacity}, GPU budget {args.gpu_budget_gib} GiB, dims {args.dims}")
    migration = migration_check(topo, args.capacity, args.unit_rows, args.dims, int(args.gpu_budget_gib * GIB))
    torch.cuda.empty_cache()
    print(f"\nsharded gather onto cuda:0, batch 512, dim {args.gather_dim}:")
    gather = gather_bandwidth(args.gather_dim, rows=50_000, batch=512, repeats=50)
    elapsed = time.perf_counter() - started
    print(f"\n{'OK' if migration['ok'] else 'FAILED'}: every record {'intact' if migration['ok'] else 'NOT intact'} "
          f"({elapsed:.1f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(
            {"topology": topo.to_dict(), "migration": migration, "gather": gather, "seconds": elapsed}, indent=2
        ))
    return 0 if migration["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
