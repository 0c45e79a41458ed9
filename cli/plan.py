"""``conduit plan``: where the experience buffer should live, for a topology and a workload.

Prints every candidate of Alg. 1 with its modeled per-sample transfer time
(ingest leg, deliver leg, total), the memory it needs against what is usable,
and whether it fits; the chosen placement is highlighted. Then the placement
map over a range of sizes: which placement each region of transition
dimensions (or per-sample bytes) gets, with the modeled makespan (Eq. 3) of
migrating a full buffer into it from the region before. ``--json`` prints the
same as JSON.
Nothing fits -> a message naming the missing bytes, exit code 1.

A transition of dimension ``d`` is ``x = 2*d*4 + 8 + 4 + 1`` bytes (float32
obs and next_obs, int64 action, float32 reward, bool done), as in the paper.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer
from conduit.cli.errors import user_errors
from rich.console import Console
from rich.table import Table

from conduit.errors import PlacementError
from conduit.placement import (
    CandidateEvaluation,
    PlacementKind,
    PlacementMap,
    PlacementRequest,
    Topology,
    build_placement_map,
    builtin_topology,
    evaluate_candidates,
    linear_scan,
    list_builtin_topologies,
    plan_placement_change,
)
from conduit.placement.solver import infeasibility_message
from conduit.placement.units import format_bytes

__all__ = ["plan", "transition_bytes"]

DEFAULT_DIM = 1_000
DEFAULT_MAP_DIMS = (128, 40_000)


def transition_bytes(dim: int) -> int:
    """Bytes of one transition of dimension ``dim`` (see the module docstring)."""
    return 2 * dim * 4 + 8 + 4 + 1


def _dim_at_least(x: int) -> int:
    """The smallest dimension whose transition has at least ``x`` bytes."""
    return max(0, math.ceil((x - transition_bytes(0)) / 8))


def load_topology(spec: str | None) -> tuple[Topology, str]:
    """A builtin name, a ``.json``/``.yaml`` file, or (``None``) this machine, profiled."""
    if spec is None:
        from conduit.placement.policy import this_machine_topology

        return this_machine_topology(), "profiled live"
    path = Path(spec)
    if path.exists():
        return Topology.load(path), f"file {spec}"
    if spec.removesuffix(".yaml") in list_builtin_topologies():  # the shipped file's own name works as its name
        return builtin_topology(spec), "builtin"
    what = "no such file" if path.suffix.lower() in (".json", ".yaml", ".yml") else "not a builtin name or a file"
    raise PlacementError(
        f"--topology {spec!r}: {what}; expected a builtin name ({', '.join(list_builtin_topologies())}) "
        "or the path of a .json/.yaml topology file"
    )


def _split(values: list[str] | None) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def _seconds(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _candidate_json(e: CandidateEvaluation, chosen: CandidateEvaluation | None) -> dict[str, Any]:
    return {
        "placement": str(e.placement),
        "kind": e.placement.kind.value,
        "devices": list(e.placement.devices),
        "shares": list(e.placement.shares),
        "ingest_seconds": e.ingest_seconds,
        "deliver_seconds": e.deliver_seconds,
        "transfer_seconds": e.transfer_seconds,
        "required_bytes": e.required_bytes,
        "usable_bytes": e.usable_bytes,
        "missing_bytes": e.missing_bytes,
        "feasible": e.feasible,
        "chosen": e is chosen,
    }


def _map_json(topo: Topology, m: PlacementMap, by_dim: bool) -> list[dict[str, Any]]:
    """Regions, each with the modeled makespan (Eq. 3) of migrating a full buffer into it from the previous one."""
    out = []
    previous = None
    for r in m.regions:
        migration = None
        if previous is not None and previous.placement is not None and r.placement is not None:
            change = plan_placement_change(topo, previous.placement, r.placement, m.request.capacity, r.lo - 1)
            migration = change.makespan_seconds
        previous = r
        row: dict[str, Any] = {
            "x_min": r.lo,
            "x_max": r.hi - 1,
            "placement": None if r.placement is None else str(r.placement),
            "kind": None if r.placement is None else r.placement.kind.value,
            "devices": None if r.placement is None else list(r.placement.devices),
            "migration_seconds": migration,
        }
        if by_dim:
            lo, hi = _dim_at_least(r.lo), _dim_at_least(r.hi) - 1
            if hi < lo:
                continue  # narrower than one dimension step
            row.update(dim_min=lo, dim_max=hi)
        out.append(row)
    return out


def _candidates_table(evaluations: tuple[CandidateEvaluation, ...], chosen: CandidateEvaluation | None) -> Table:
    table = Table(title="Candidates (Alg. 1): modeled transfer time per sample")
    for name, justify in (
        ("#", "right"), ("placement", "left"), ("ingest", "right"), ("deliver", "right"), ("total", "right"),
        ("needed", "right"), ("usable", "right"), ("fits", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for i, e in enumerate(evaluations):
        fits = "yes" if e.feasible else f"no: {format_bytes(e.missing_bytes)} missing"
        mark = e is chosen
        table.add_row(
            str(i), f"{e.placement}{'  <- chosen' if mark else ''}", _seconds(e.ingest_seconds),
            _seconds(e.deliver_seconds), _seconds(e.transfer_seconds), format_bytes(e.required_bytes),
            format_bytes(e.usable_bytes), fits, style="bold green" if mark else (None if e.feasible else "dim"),
        )
    return table


def _map_table(rows: list[dict[str, Any]], by_dim: bool) -> Table:
    table = Table(title="Placement map M: region -> placement (migration: a full buffer, modeled makespan)")
    if by_dim:
        table.add_column("dim", justify="right")
    table.add_column("bytes / sample", justify="right")
    table.add_column("placement")
    table.add_column("migration into it (Eq. 3)", justify="right")
    for r in rows:
        moved = "" if r["migration_seconds"] is None else _seconds(r["migration_seconds"])
        cells = [f"{r['x_min']} - {r['x_max']}", r["placement"] or "[red]nothing fits[/red]", moved]
        if by_dim:
            cells.insert(0, f"{r['dim_min']} - {r['dim_max']}")
        table.add_row(*cells)
    return table


def plan(
    topology: str | None = typer.Option(
        None, "--topology", "-t", metavar="<name|file>",
        help=f"Builtin topology ({', '.join(list_builtin_topologies())}) or a .json/.yaml file "
        "(default: profile this machine).",
    ),
    capacity: int = typer.Option(1_000_000, "--capacity", "-c", min=1, help="Buffer capacity C_buf, in samples."),
    dim: int | None = typer.Option(None, "--dim", "-d", min=0, help=f"Transition dimension (default {DEFAULT_DIM})."),
    sample_bytes: int | None = typer.Option(None, "--sample-bytes", "-x", min=1, help="Per-sample size x in bytes."),
    actor: list[str] | None = typer.Option(None, "--actor", help="Actor device(s) (default cpu)."),
    learner: list[str] | None = typer.Option(
        None, "--learner", help="Learner device(s), repeated or comma-separated (default cuda:0 if any GPU, else cpu)."
    ),
    headroom: float = typer.Option(0.1, "--headroom", min=0.0, max=0.99, help="Fraction of memory left unused."),
    kind: list[PlacementKind] | None = typer.Option(
        None, "--kind", case_sensitive=False, help="Restrict candidates to these kinds (repeatable)."
    ),
    map_min: int | None = typer.Option(None, "--map-min", min=1, help="Placement map from (a dim, or bytes with -x)."),
    map_max: int | None = typer.Option(None, "--map-max", min=1, help="Placement map up to (a dim, or bytes with -x)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
) -> None:
    """Compute and print the buffer placement for a topology and workload."""
    err = Console(stderr=True)
    if dim is not None and sample_bytes is not None:
        raise typer.BadParameter("give --dim or --sample-bytes, not both")
    by_dim = sample_bytes is None
    d = DEFAULT_DIM if dim is None and by_dim else dim
    x = transition_bytes(d) if d is not None else int(sample_bytes or 0)
    with user_errors():
        topo, source = load_topology(topology)
        learners = _split(learner) or (["cuda:0"] if topo.gpus(0) else ["cpu"])
        request = PlacementRequest(
            actors=_split(actor) or ["cpu"], learners=learners, capacity=capacity, headroom=headroom,
            kinds=frozenset(kind) if kind else None,
        )
        evaluations = evaluate_candidates(topo, request, x)
        if by_dim:
            lo_dim, hi_dim = map_min or DEFAULT_MAP_DIMS[0], map_max or max(DEFAULT_MAP_DIMS[1], 2 * (d or 0))
            x_lo, x_hi = transition_bytes(lo_dim), transition_bytes(hi_dim)
        else:
            x_lo, x_hi = map_min or max(1, x // 100), map_max or x * 100
        if x_hi < x_lo:
            raise typer.BadParameter(f"--map-max ({map_max}) must be >= --map-min ({map_min})")
        placement_map = build_placement_map(topo, request, x_min=x_lo, x_max=x_hi)
    chosen = linear_scan(evaluations)
    error = None if chosen is not None else infeasibility_message(evaluations, request, x)
    regions = _map_json(topo, placement_map, by_dim)
    if as_json:
        doc = {
            "topology": {"name": topo.name, "source": source, "devices": [dv.id for dv in topo.devices]},
            "workload": {
                "capacity": capacity, "dim": d, "sample_bytes": x, "total_bytes": capacity * x,
                "actors": list(request.actors), "learners": list(request.learners), "headroom": headroom,
            },
            "candidates": [_candidate_json(e, chosen) for e in evaluations],
            "chosen": None if chosen is None else _candidate_json(chosen, chosen),
            "error": error,
            "map": regions,
        }
        typer.echo(json.dumps(doc, indent=2))
    else:
        out = Console()
        workload = f"dim {d} -> {x} B/sample" if by_dim else f"{x} B/sample"
        out.print(
            f"[bold]{topo.name}[/bold] ({source}; {len(topo.devices)} devices) | capacity {capacity:,} x {workload} "
            f"= {format_bytes(capacity * x)} | actors {', '.join(request.actors)} -> learners "
            f"{', '.join(request.learners)} | headroom {headroom:.0%}"
        )
        out.print(_candidates_table(evaluations, chosen))
        if chosen is not None:
            out.print(
                f"[bold green]chosen:[/bold green] {chosen.placement}: {_seconds(chosen.transfer_seconds)} per sample "
                f"({_seconds(chosen.transfer_seconds * 512)} per batch of 512)"
            )
        out.print(_map_table(regions, by_dim))
    if error is not None:
        err.print(f"[red]error:[/red] {error}")
        raise typer.Exit(code=1)
