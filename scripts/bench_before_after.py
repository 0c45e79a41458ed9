"""The hot path of two checkouts side by side: Conduit's inline push and pull, old code against new.

    .venv/bin/python scripts/bench_before_after.py OLD_CHECKOUT [NEW_CHECKOUT] [--rounds 7] [--dims 128,1000,5000]

Two versions of one package cannot share a process (both are ``conduit``), so each round runs the
micro-benchmark once per checkout, in a fresh process, in an order that alternates round by round
(old-new, new-old, ...). Each process times Conduit's inline g=1 push and pull and, in the same
interleaved blocks, torch's slice copy and ``index_select(out=)`` on a plain ring: the ratio to that
baseline is what the table compares, so that the host's drift between processes cancels. Prints a
markdown table: per dimension and operation, the median over rounds of each version's ratio with its
spread (min–max), and new/old.

A checkout is a source tree with its C extension built in place (``python setup.py build_ext --inplace``):
the old code's harness is ``conduit.bench.micro``, the new one's ``benchmarks.micro``; both take the same
settings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
try:
    from benchmarks.micro import MicroSettings, run_micro
except ModuleNotFoundError:
    from conduit.bench.micro import MicroSettings, run_micro
import conduit
assert conduit.__file__.startswith(sys.argv[1]), conduit.__file__
dims = tuple(int(d) for d in sys.argv[2].split(","))
r = run_micro(MicroSettings(dims=dims, peers=("conduit", "torch"), overlap=False, repeats=int(sys.argv[3])))
out = {}
for d in r.dims:
    for c in d.cases:
        if c.role.name in ("CONDUIT", "SLICE_COPY", "INDEX_SELECT"):
            out[f"{d.dim}/{c.op.name}/{c.sampling.name}/{c.role.name}"] = c.seconds
print(json.dumps(out))
"""

#: (operation, sampling) -> (label, the baseline it is divided by)
ROWS = {
    ("INGEST", "NONE"): ("push", "SLICE_COPY"),
    ("DELIVER", "UNIFORM"): ("pull", "INDEX_SELECT"),
    ("INGEST", "PRIORITIZED"): ("push, prioritized", "SLICE_COPY"),
    ("DELIVER", "PRIORITIZED"): ("pull, prioritized", "INDEX_SELECT"),
}
BASE_SAMPLING = {"SLICE_COPY": "NONE", "INDEX_SELECT": "UNIFORM"}


def run_once(checkout: Path, dims: str, repeats: int) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(checkout), dims, str(repeats)],
        capture_output=True, text=True, check=True, cwd=checkout,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path, nargs="?", default=Path(__file__).resolve().parents[1])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dims", default="128,1000,5000")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repeats inside each process")
    args = ap.parse_args()
    versions = {"old": args.old.resolve(), "new": args.new.resolve()}
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for i in range(args.rounds):
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        for v in order:
            runs[v].append(run_once(versions[v], args.dims, args.repeats))
            print(f"round {i + 1}/{args.rounds} {v} done", file=sys.stderr)

    print(f"_{args.rounds} rounds, each version in its own process, order alternating; "
          f"ratio = Conduit / torch baseline timed in the same process; median [min–max] over rounds_\n")
    print("| dim | operation | old: time | new: time | old: / baseline | new: / baseline | new / old (ratios) |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for dim in args.dims.split(","):
        for (op, sampling), (label, base) in ROWS.items():
            key, base_key = f"{dim}/{op}/{sampling}/CONDUIT", f"{dim}/{op}/{BASE_SAMPLING[base]}/{base}"
            cells = {}
            for v in ("old", "new"):
                t = [r[key] for r in runs[v]]
                q = [r[key] / r[base_key] for r in runs[v]]
                cells[v] = (t, q)
            row = [dim, f"{label} (/ {base.lower()})"]
            for v in ("old", "new"):
                t = cells[v][0]
                row.append(f"{statistics.median(t) * 1e6:,.0f} µs [{min(t) * 1e6:,.0f}–{max(t) * 1e6:,.0f}]")
            for v in ("old", "new"):
                q = cells[v][1]
                row.append(f"{statistics.median(q):.2f} [{min(q):.2f}–{max(q):.2f}]")
            row.append(f"{statistics.median(cells['new'][1]) / statistics.median(cells['old'][1]):.3f}")
            print("| " + " | ".join(str(c) for c in row) + " |")


if __name__ == "__main__":
    main()
