"""``conduit bench``: micro and synthetic benchmarks against the peers, and the cost model's validation.

- ``conduit bench micro`` — ingestion (extend by 256, or ``--chunk`` rows: 1 is
  a loop that adds each environment step) and delivery (a batch of
  512, uniform and prioritized) against TorchRL, cpprb, a numpy ring, plain
  torch ``index_select`` and the memcpy bound, interleaved, medians and ratios.
- ``conduit bench synthetic`` — the paper's synthetic actor/learner loop:
  inline, Reverb-style, GEAR-style, fixed placements and Conduit's plan.
- ``conduit bench validate`` — the cost model against measurement: every
  feasible schedule of the synthetic loop per dimension, predicted vs measured.
- ``conduit bench all`` — all three with their defaults: the one command behind every
  table in BENCHMARKS.md (``--markdown`` writes them, ``--plot-dir`` the figures,
  ``--save-json`` the results).
- ``conduit bench summary RESULTS.json`` — the short page from a saved ``bench all``
  document: one table per question, each figure a median with its spread.

From a source checkout ``python -m benchmarks ...`` runs the same commands.

``--json`` writes machine-readable results to stdout (tables go to stderr),
``--plot out.png`` draws a figure (matplotlib, from the ``bench`` extra),
``--trace out.json`` writes a Chrome/Perfetto timeline of a short traced run.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from benchmarks.document import machine_line, markdown_document
from benchmarks.loop import run_synthetic
from benchmarks.loop_results import SyntheticResult, SyntheticSettings
from benchmarks.micro import ALL_PEERS, MicroResult, MicroSettings, run_micro
from benchmarks.peers import PEERS
from benchmarks.report import TableData, micro_json, micro_tables
from benchmarks.report_loop import loop_json, loop_tables
from benchmarks.summary import summary_markdown
from benchmarks.validate import run_validation, validation_markdown
from benchmarks.validate import validate as validation_sweep
from conduit.core import Policy
from conduit.scheduling.workload import CostKind, SyntheticWorkload
from conduit.trace import Tracer

app = typer.Typer(
    help="Benchmarks of the experience path against the peers, and the cost model against measurement.",
    no_args_is_help=True,
)

POLICIES = {"off": (Policy.OFF_POLICY,), "on": (Policy.ON_POLICY,), "both": (Policy.OFF_POLICY, Policy.ON_POLICY)}
COSTS = {"compute": (CostKind.COMPUTE,), "sleep": (CostKind.SLEEP,), "both": (CostKind.COMPUTE, CostKind.SLEEP)}


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"{option}: expected comma-separated integers, got {text!r}") from exc
    if not values or any(v <= 0 for v in values):
        raise typer.BadParameter(f"{option}: expected positive integers, got {text!r}")
    return values


def _choice(text: str, choices: dict[str, Any], option: str) -> Any:
    if text not in choices:
        raise typer.BadParameter(f"{option} must be one of {sorted(choices)}, got {text!r}")
    return choices[text]


def _peers(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [n for n in names if n not in PEERS]
    if unknown or not names:
        raise typer.BadParameter(f"--peers: unknown {unknown}; expected a subset of {sorted(PEERS)}")
    return names


def _check_plot(*paths: Path | None) -> None:
    if any(p is not None for p in paths):
        from benchmarks.plot import MissingExtra, require_matplotlib

        try:
            require_matplotlib()
        except MissingExtra as exc:
            raise typer.BadParameter(str(exc)) from exc


@contextmanager
def _progress(console: Console, quiet: bool, what: str) -> Iterator[Callable[[int, int, str], None]]:
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=quiet,
    ) as bar:
        task = bar.add_task(what, total=None)

        def update(done: int, total: int, message: str) -> None:
            bar.update(task, completed=done, total=total, description=message)

        yield update


def _render(console: Console, table: TableData) -> None:
    t = Table(title=table.title, title_justify="left", show_lines=False)
    for i, col in enumerate(table.columns):
        t.add_column(col, justify="left" if i == 0 else "right", overflow="fold")
    for row in table.rows:
        style = "bold green" if row[0].startswith("Conduit") else ""
        # cells are plain text: "ingestion[overlap g=1]" is a schedule, not a rich style to swallow
        t.add_row(*[escape(cell).replace("MISSED", "[red]MISSED[/red]") for cell in row], style=style)
    console.print(t)
    for note in table.notes:
        console.print(f"[dim]{escape(note)}[/dim]")


def _emit(console: Console, tables: list[TableData], as_json: bool) -> None:
    if not as_json:
        for table in tables:
            _render(console, table)


def _save_trace(console: Console, tracer: Tracer | None, path: Path | None) -> None:
    if tracer is not None and path is not None:
        tracer.save(path)
        console.print(
            f"[dim]trace: {path} ({len(tracer.spans)} spans; open in ui.perfetto.dev or chrome://tracing)[/dim]"
        )


def micro_settings(
    dims: str,
    capacity: int,
    memory_gib: float,
    repeats: int,
    block_ms: float,
    granularities: str,
    overlap: bool,
    prefetch: int,
    peers: str,
    threads: int,
    chunk: int = 256,
) -> MicroSettings:
    return MicroSettings(
        dims=_ints(dims, "--dims"),
        capacity=capacity,
        chunk=chunk,
        memory_gib=memory_gib,
        repeats=repeats,
        block_s=block_ms / 1e3,
        granularities=_ints(granularities, "--granularities"),
        overlap=overlap,
        prefetch=prefetch,
        peers=_peers(peers),
        threads=threads or None,
    )


def run_micro_cli(console: Console, settings: MicroSettings, quiet: bool, trace: Path | None) -> MicroResult:
    tracer = Tracer(enabled=True) if trace else None
    with _progress(console, quiet, "micro-benchmark") as update:
        result = run_micro(settings, progress=update, tracer=tracer)
    _save_trace(console, tracer, trace)
    return result


@app.command("micro")
def micro(
    dims: str = typer.Option("128,1000,5000", help="Transition dimensions (float32 obs and next_obs)."),
    capacity: int = typer.Option(100_000, min=1, help="Transitions per storage (lowered to fit --memory-gib)."),
    memory_gib: float = typer.Option(6.0, min=0.01, help="Memory budget for all peers' storages of one dimension."),
    chunk: int = typer.Option(
        256, min=1, help="Transitions per ingestion call (extend / add / push); 1: one environment step at a time."
    ),
    repeats: int = typer.Option(9, min=1, help="Interleaved repeats; medians are reported."),
    block_ms: float = typer.Option(50.0, min=0.1, help="Target length of one timed block of operations."),
    granularities: str = typer.Option("1,2,4", help="Conduit granularities to time besides inline g=1."),
    overlap: bool = typer.Option(True, help="Also time Conduit's overlapped schedules."),
    prefetch: int = typer.Option(3, min=0, help="TorchRL's prefetch for its prefetching variant (0: skip)."),
    peers: str = typer.Option(",".join(ALL_PEERS), help=f"Peers to run, a subset of {','.join(PEERS)}."),
    threads: int = typer.Option(1, min=0, help="torch intra-op threads during the run (0: leave torch's default)."),
    as_json: bool = typer.Option(False, "--json", help="Write machine-readable JSON to stdout."),
    plot: Path | None = typer.Option(None, "--plot", dir_okay=False, help="Write a figure (PNG) here."),
    trace: Path | None = typer.Option(None, "--trace", dir_okay=False, help="Write a Chrome/Perfetto trace here."),
    markdown: Path | None = typer.Option(None, "--markdown", dir_okay=False, help="Write the tables as Markdown."),
) -> None:
    """Ingestion and delivery throughput of Conduit and its peers, side by side."""
    settings = micro_settings(
        dims, capacity, memory_gib, repeats, block_ms, granularities, overlap, prefetch, peers, threads, chunk
    )
    _check_plot(plot)
    console = Console(stderr=as_json)
    result = run_micro_cli(console, settings, as_json, trace)
    if not as_json:
        console.print(machine_line(result))
    _emit(console, micro_tables(result), as_json)
    if markdown is not None:
        markdown.write_text(markdown_document(result, None))
    if plot is not None:
        from benchmarks.plot import plot_micro

        console.print(f"[dim]plot: {plot_micro(result, plot)}[/dim]")
    if as_json:
        _dump(micro_json(result))


def synthetic_settings(
    dims: str,
    batch_sizes: str,
    policy: str,
    cost: str,
    rollout_ms: float,
    update_ms: float,
    unit_size: int,
    capacity: int,
    units_per_iteration: int,
    minibatches: int,
    iterations: int,
    warmup: int,
    repeats: int,
    g_max: int,
    threads: int,
) -> SyntheticSettings:
    return SyntheticSettings(
        dims=_ints(dims, "--dims"),
        batch_sizes=_ints(batch_sizes, "--batch-sizes"),
        policies=_choice(policy, POLICIES, "--policy"),
        costs=_choice(cost, COSTS, "--cost"),
        rollout_ms=rollout_ms,
        update_ms=update_ms,
        unit_size=unit_size,
        capacity=capacity,
        units_per_iteration=units_per_iteration,
        num_minibatches=minibatches,
        iterations=iterations,
        warmup=warmup,
        repeats=repeats,
        g_max=g_max,
        threads=threads or None,
    )


def run_synthetic_cli(
    console: Console, settings: SyntheticSettings, quiet: bool, trace: Path | None
) -> SyntheticResult:
    tracer = Tracer(enabled=True) if trace else None
    with _progress(console, quiet, "synthetic loop") as update:
        result = run_synthetic(settings, progress=update, tracer=tracer)
    _save_trace(console, tracer, trace)
    return result


@app.command("synthetic")
def synthetic(
    dims: str = typer.Option("1000,5000,10000", help="Transition dimensions (the paper sweeps 128..20,000)."),
    batch_sizes: str = typer.Option("512", help="Off-policy training batch sizes (the paper: 32..1,024)."),
    policy: str = typer.Option("both", help="off (DQN-like), on (PPO-like) or both."),
    cost: str = typer.Option(
        "both", help="compute (update burns CPU), sleep (update releases it, like a GPU) or both."
    ),
    rollout_ms: float = typer.Option(2.0, min=0, help="Rollout cost per unit (ms)."),
    update_ms: float = typer.Option(8.0, min=0, help="Update cost per training batch / mini-batch (ms)."),
    unit_size: int = typer.Option(256, min=1, help="Transitions per rollout unit (one push)."),
    capacity: int = typer.Option(20_000, min=1, help="Off-policy replay capacity."),
    units_per_iteration: int = typer.Option(4, min=1, help="On-policy rollout units per iteration."),
    minibatches: int = typer.Option(4, min=1, help="On-policy mini-batches per epoch (M)."),
    iterations: int = typer.Option(15, min=1, help="Timed iterations per run."),
    warmup: int = typer.Option(3, min=0, help="Untimed iterations per run."),
    repeats: int = typer.Option(
        SyntheticSettings.repeats, min=1, help="Interleaved repeats of every configuration; medians are reported."
    ),
    g_max: int = typer.Option(4, min=1, max=16, help="Cap on off-policy granularities."),
    threads: int = typer.Option(1, min=0, help="torch intra-op threads of the learner (0: torch's default)."),
    as_json: bool = typer.Option(False, "--json", help="Write machine-readable JSON to stdout."),
    plot: Path | None = typer.Option(None, "--plot", dir_okay=False, help="Write a figure (PNG) here."),
    trace: Path | None = typer.Option(None, "--trace", dir_okay=False, help="Write a Chrome/Perfetto trace here."),
    markdown: Path | None = typer.Option(None, "--markdown", dir_okay=False, help="Write the tables as Markdown."),
) -> None:
    """The paper's synthetic stress test: every configuration through one actor/learner loop."""
    settings = synthetic_settings(
        dims,
        batch_sizes,
        policy,
        cost,
        rollout_ms,
        update_ms,
        unit_size,
        capacity,
        units_per_iteration,
        minibatches,
        iterations,
        warmup,
        repeats,
        g_max,
        threads,
    )
    _check_plot(plot)
    console = Console(stderr=as_json)
    result = run_synthetic_cli(console, settings, as_json, trace)
    _emit(console, loop_tables(result), as_json)
    if markdown is not None:
        markdown.write_text(markdown_document(None, result))
    if plot is not None:
        from benchmarks.plot import plot_synthetic

        console.print(f"[dim]plot: {plot_synthetic(result, plot)}[/dim]")
    if as_json:
        _dump(loop_json(result))


@app.command("validate")
def validate(
    dims: str = typer.Option("128,1000,5000,10000", help="Transition dimensions to validate at."),
    g_max: int = typer.Option(4, min=1, max=16, help="Cap on off-policy granularities."),
    batch_size: int = typer.Option(512, min=1, help="Off-policy training batch size."),
    unit_size: int = typer.Option(256, min=1, help="Transitions per rollout unit (one push)."),
    capacity: int = typer.Option(20_000, min=1, help="Off-policy replay capacity."),
    rollout_ms: float = typer.Option(2.0, min=0, help="Rollout cost per unit (ms)."),
    update_ms: float = typer.Option(8.0, min=0, help="Update cost per training batch (ms)."),
    cost: CostKind = typer.Option(
        CostKind.COMPUTE, help="compute: burn CPU; sleep: release it, as a GPU learner would."
    ),
    as_json: bool = typer.Option(False, "--json", help="Write machine-readable JSON to stdout."),
    markdown: Path | None = typer.Option(None, "--markdown", dir_okay=False, help="Write the table as Markdown."),
) -> None:
    """The cost model against measurement: every feasible schedule of the off-policy loop, predicted vs measured."""
    fields: dict[str, Any] = dict(
        batch_size=batch_size, unit_size=unit_size, capacity=capacity, rollout_ms=rollout_ms, update_ms=update_ms,
        cost=cost,
    )
    console = Console(stderr=as_json)
    dim_list = _ints(dims, "--dims")
    doc = run_validation(console, fields, dim_list, g_max, as_json)
    doc["settings"] = validation_settings(fields, dim_list, g_max)
    if markdown is not None:
        markdown.write_text(validation_markdown(doc))
        console.print(f"[dim]markdown: {markdown}[/dim]")
    if as_json:
        _dump(doc)


def validation_settings(fields: dict[str, Any], dims: tuple[int, ...] | list[int], g_max: int) -> dict[str, Any]:
    """What :func:`run_validation` swept with: the workload's fields (its defaults where absent) and the rounds."""
    w = SyntheticWorkload(policy=Policy.OFF_POLICY, **fields)
    sweep = inspect.signature(validation_sweep).parameters  # run_validation leaves these at their defaults
    return {
        "dims": list(dims),
        "g_max": g_max,
        **{k: getattr(w, k) for k in ("batch_size", "unit_size", "capacity", "rollout_ms", "update_ms")},
        "cost": w.cost.value,
        **{k: sweep[k].default for k in ("iterations", "sweep_rounds", "rematch_rounds", "rematch_top")},
    }


VALIDATION_DIMS, VALIDATION_G_MAX = (128, 1000, 5000, 10000), 3  # what `conduit bench all` validates at


@app.command("all")
def all_(
    markdown: Path | None = typer.Option(None, "--markdown", dir_okay=False, help="Write every table as Markdown."),
    plot_dir: Path | None = typer.Option(
        None, "--plot-dir", file_okay=False, help="Write bench_micro.png and bench_synthetic.png here."
    ),
    as_json: bool = typer.Option(False, "--json", help="Write machine-readable JSON to stdout."),
    trace: Path | None = typer.Option(
        None, "--trace", dir_okay=False, help="Write a Chrome/Perfetto trace of the loop here."
    ),
    validation: bool = typer.Option(
        True, "--validation/--no-validation",
        help="Also validate the cost model (conduit bench validate --g-max 3).",
    ),
    save_json: Path | None = typer.Option(
        None, "--save-json", dir_okay=False,
        help="Also write the --json document here (tables still print): the input of `conduit bench summary`.",
    ),
) -> None:
    """Every benchmark with its defaults: reproduces the micro, synthetic and scheduling tables in BENCHMARKS.md."""
    _check_plot(plot_dir)
    console = Console(stderr=as_json)
    micro_result = run_micro_cli(console, MicroSettings(), as_json, None)
    synthetic_result = run_synthetic_cli(console, SyntheticSettings(), as_json, trace)
    mtables, ltables = micro_tables(micro_result), loop_tables(synthetic_result)
    _emit(console, mtables + ltables, as_json)
    doc = None
    if validation:
        doc = run_validation(console, {}, VALIDATION_DIMS, VALIDATION_G_MAX, as_json)
        doc["settings"] = validation_settings({}, VALIDATION_DIMS, VALIDATION_G_MAX)
    results = {"micro": micro_json(micro_result), "synthetic": loop_json(synthetic_result), "validation": doc}
    if save_json is not None:  # first: a figure that fails to draw must not cost the run's numbers
        save_json.parent.mkdir(parents=True, exist_ok=True)
        with save_json.open("w") as f:
            _dump(results, f)
        console.print(f"[dim]json: {save_json} (conduit bench summary {save_json} renders the short page)[/dim]")
    if markdown is not None:
        text = markdown_document(micro_result, synthetic_result)
        markdown.write_text(text + ("\n" + validation_markdown(doc) if doc is not None else ""))
        console.print(f"[dim]markdown: {markdown}[/dim]")
    if plot_dir is not None:
        from benchmarks.plot import plot_micro, plot_synthetic

        plot_dir.mkdir(parents=True, exist_ok=True)
        plot_micro(micro_result, plot_dir / "bench_micro.png")
        plot_synthetic(synthetic_result, plot_dir / "bench_synthetic.png")
        console.print(f"[dim]plots: {plot_dir}/bench_micro.png, {plot_dir}/bench_synthetic.png[/dim]")
    if as_json:
        _dump(results)


@app.command("summary")
def summary(
    results: Path = typer.Argument(
        ..., exists=True, dir_okay=False, readable=True, metavar="RESULTS.json",
        help="A saved `conduit bench all --json` (or --save-json) document; one command's own --json works too.",
    ),
    out: Path | None = typer.Option(None, "--out", dir_okay=False, help="Write the Markdown here (default: stdout)."),
) -> None:
    """The short page: one table per question, each figure a median over the repeats with its spread."""
    try:
        text = summary_markdown(json.loads(results.read_text()))
    except KeyError as exc:
        raise typer.BadParameter(f"{results}: an incomplete benchmark document (no {exc} field)") from exc
    except (ValueError, TypeError, AttributeError) as exc:  # JSONDecodeError is a ValueError
        raise typer.BadParameter(f"{results}: {exc}") from exc
    if out is None:
        sys.stdout.write(text)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        Console(stderr=True).print(f"[dim]summary: {out}[/dim]")


def _dump(doc: dict[str, Any], stream: TextIO | None = None) -> None:
    stream = sys.stdout if stream is None else stream
    json.dump(doc, stream, indent=2, default=str)
    stream.write("\n")
