"""Alg. 1's placement against the measured time of every candidate, per transition dimension, on this machine.

    python scripts/planner_sweep.py [--dims 128 1000 5000 20000] [--capacity 1000000] [--json out.json]

For each dimension: Alg. 1 (``solve_placement``) on this machine's live profile chooses a placement for
``--capacity`` transitions, rollouts made in pageable host memory and the learner on ``cuda:0`` where there
is a GPU (else the CPU). Every feasible candidate is then run in the real runtime, its storage forced to the
candidate's kind (``PlacementPolicy(kinds=[kind])``) on a ring of ``--measure-rows`` (the time of a push or a
pull does not depend on the ring's length, the memory it takes does): a DQN-like experience path, a unit of
256 transitions pushed and a batch of 512 pulled per iteration, inline, synchronized; medians of
``--repeats``. Beside each, the model's time for the same iteration (``256 x T_ingest + 512 x T_deliver`` per
sample at the host rates measured at this row size, plus the runtime's fixed cost per push and pull) and its
ratio to the measured one. The closing line is the verdict:
``planner choice = fastest measured candidate at every dim: yes/no`` (a dimension at which nothing holds
``--capacity`` transitions on this machine is reported and left out). Runs on any machine: on a CPU-only
one the host tiers are the candidates (here, pageable host memory alone).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from gpu_check import push_pull, unit  # the same unit and timing as the GPU check's per-placement table

import conduit
from conduit.errors import PlacementError
from conduit.placement import PlacementPolicy, PlacementRequest, profile_topology, solve_placement
from conduit.scheduling.calls import runtime_call_costs

UNIT, BATCH = 256, 512


def row_bytes(dim: int) -> list[int]:
    """The bytes of one transition's row in each column (each is written and gathered by its own call)."""
    return [int(v[0].numel() * v.element_size()) for v in unit(0, 1, dim).values()]


def sample_bytes(dim: int) -> int:
    return sum(row_bytes(dim))


def measure(topo: Any, kind: Any, learner: str, dim: int, rows: int, repeats: int) -> dict[str, Any]:
    """Push + pull medians of the real runtime with its storage forced to ``kind``."""
    policy = PlacementPolicy(topo, actors="cpu", learners=learner, capacity=rows, kinds=[kind])
    sync = torch.cuda.synchronize if learner.startswith("cuda") else (lambda: None)
    with conduit.Conduit(
        conduit.ConduitConfig(policy="off_policy", train_batch_size=BATCH, capacity=rows, learner_device=learner,
                              seed=0, min_size_to_sample=BATCH),
        storage=policy,
    ) as edp:
        pool = [unit(k * UNIT, UNIT, dim) for k in range(4)]
        for k in range(rows // UNIT + 1):
            edp.push(pool[k % len(pool)])
        edp.flush()
        pushes, pulls = push_pull(edp, pool, repeats, sync)
        placed = str(getattr(policy, "active", None) or policy)
    push, pull = statistics.median(pushes), statistics.median(pulls)
    return {"placed": placed, "push_s": push, "pull_s": pull, "measured_s": push + pull,
            "spread_s": [min(a + b for a, b in zip(pushes, pulls)), max(a + b for a, b in zip(pushes, pulls))]}


def sweep(dims: list[int], capacity: int, rows: int, repeats: int) -> dict[str, Any]:
    topo = profile_topology(name="this_machine", calls=runtime_call_costs)
    learner = "cuda:0" if topo.gpus(0) else "cpu"
    out: list[dict[str, Any]] = []
    agree = True
    for dim in dims:
        x = sample_bytes(dim)
        try:
            request = PlacementRequest(actors="cpu", learners=learner, capacity=capacity)
            result = solve_placement(topo, request, x, row_bytes=row_bytes(dim))
        except PlacementError as exc:  # nothing holds capacity x sample size here: said, not counted
            out.append({"dim": dim, "sample_bytes": x, "chosen": None, "infeasible": str(exc)})
            print(f"dim {dim:6d} ({x:,} B): no placement holds {capacity:,} of them on this machine")
            continue
        candidates = []
        for e in result.evaluations:
            if not e.feasible:
                continue
            m = measure(topo, e.placement.kind, learner, dim, rows, repeats)
            model = e.iteration_seconds(UNIT, BATCH)
            model_push = UNIT * e.ingest_seconds + e.push_call_seconds
            candidates.append({"placement": str(e.placement), "kind": e.placement.kind.value, "model_s": model,
                               "model_push_s": model_push, "model_pull_s": model - model_push,
                               "model_over_measured": model / m["measured_s"], **m})
            if learner.startswith("cuda"):
                torch.cuda.empty_cache()
        fastest = min(candidates, key=lambda c: c["measured_s"])
        chosen = str(result.placement)
        ok = fastest["placement"] == chosen
        agree &= ok
        out.append({"dim": dim, "sample_bytes": x, "chosen": chosen, "fastest_measured": fastest["placement"],
                    "agree": ok, "candidates": candidates})
        print(f"dim {dim:6d} ({x:,} B): Alg. 1 chose {chosen}; fastest measured {fastest['placement']}")
        for c in candidates:
            print(f"    {c['placement']:28s} measured {c['measured_s'] * 1e3:8.3f} ms "
                  f"[{c['spread_s'][0] * 1e3:.3f}-{c['spread_s'][1] * 1e3:.3f}] (push {c['push_s'] * 1e3:.3f}, "
                  f"pull {c['pull_s'] * 1e3:.3f}); model {c['model_s'] * 1e3:8.3f} ms (push "
                  f"{c['model_push_s'] * 1e3:.3f}, pull {c['model_pull_s'] * 1e3:.3f}), "
                  f"model/measured {c['model_over_measured']:.2f}")
    verdict = f"planner choice = fastest measured candidate at every dim: {'yes' if agree else 'no'}"
    print(verdict)
    return {"learner": learner, "capacity": capacity, "measure_rows": rows, "topology": topo.to_dict(),
            "dims": out, "agree": agree, "verdict": verdict}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", type=int, nargs="+", default=[128, 1_000, 5_000, 20_000])
    p.add_argument("--capacity", type=int, default=1_000_000)
    p.add_argument("--measure-rows", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    doc = sweep(args.dims, args.capacity, args.measure_rows, args.repeats)
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
