"""What ``conduit profile`` prints: the machine line, the costs, the candidates, the plan and its check.

Every figure printed is a cost or a time, never below zero (the profiler's fit and
check guarantee it; :func:`ms` would show a negative one as it is, so a test can
tell); each measured time comes with the range of its runs.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from conduit.core import INLINE
from conduit.scheduling.kinds import DRIFT

__all__ = ["measured_line", "ms", "placement_line", "print_machine", "print_profile"]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _ranged(median: float, low: float, high: float) -> str:
    return f"{ms(median)} [{ms(low)}–{ms(high)}]"


def print_machine(console: Console, m: dict[str, Any]) -> None:
    gpus = ", ".join(m["gpus"]) or "none"
    ring = "non-temporal" if m["streaming_writes"] else "cached (conduit._native not built)"
    tree = "C" if m["native_sumtree"] else "numpy (conduit._native not built)"
    console.print(
        f"[bold]Conduit profile[/bold]  torch {m['torch']}, {m['cpu_count']} CPU threads, GPUs: {gpus}; "
        f"replay-ring writes: {ring}; prioritized sum-tree: {tree}"
    )


def _table(title: str) -> Table:
    """A table that fits 80 columns: no outer frame, two spaces between columns."""
    return Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0), title_justify="left")


def _costs_table(costs: Any) -> Table:
    t = _table("Profiled costs, ms (fitted overlap costs lie between 0 and the work they overlap)")
    t.add_column("term")
    t.add_column("per call", justify="right")
    t.add_column("per iteration", justify="right")
    t.add_row("T_rollout", "", ms(costs.t_rollout))
    t.add_row("T_update", "", ms(costs.t_update))
    for g, v in costs.t_ing.items():
        t.add_row(f"T_ing(g={g})", ms(v), ms(costs.per_iteration_ing(g)))
    for g, v in costs.t_del.items():
        t.add_row(f"T_del(g={g})", ms(v), ms(costs.per_iteration_del(g)))
    t.add_row("T_sync ingestion (fitted)", ms(costs.t_sync_ing), ms(costs.t_sync0_ing))
    t.add_row("T_sync delivery (fitted)", ms(costs.t_sync_del), ms(costs.t_sync0_del))
    for path, probed in (("ingestion", costs.s_ing), ("delivery", costs.s_del)):
        for g, v in sorted(probed.items()):
            t.add_row(f"overlap cost, {path} g={g}", "", ms(v))
    t.add_row("overlap cost, both paths", "", ms(costs.s_both))
    t.add_row("t_other (the loop's own, fitted)", "", ms(costs.t_other))
    return t


def _candidates_table(result: Any, chosen: Any, baseline: Any, kept: Any) -> Table:
    """The model's best eight, and always the verified choice and inline, each with predicted and measured times;
    ``#`` is the model's rank (a gap in it is marked), the last column marks the plan kept (``◀ plan``) and a
    verified choice the closing check did not keep (``verified``). Inline is the row "inline g=1, inline g=1"."""
    ranked = result.ranked
    r = _table("Candidate schedules by the model's rank, ms; measured: median \\[lowest–highest run]")
    r.add_column("#", justify="right", no_wrap=True)
    r.add_column("ingestion", no_wrap=True)
    r.add_column("delivery", no_wrap=True)
    r.add_column("model", justify="right", no_wrap=True)
    r.add_column("exposed", justify="right", no_wrap=True)
    r.add_column("measured", justify="right", no_wrap=True)
    r.add_column("", no_wrap=True)
    shown = [p.schedule for p in ranked[:8]]
    for must in (chosen.schedule, baseline.schedule):
        if must not in shown:
            shown.append(must)
    last = 0
    for idx, p in enumerate(ranked, start=1):
        if p.schedule not in shown:
            continue
        if idx > last + 1:
            r.add_row("…", "", "", "", "", "", "")
        last = idx
        role = "◀ plan" if p.schedule == kept else ("verified" if p.schedule == chosen.schedule else "")
        v = result.spreads.get(p.schedule)
        measured = _ranged(v.median, v.low, v.high) if v is not None else "not run"
        style = "bold green" if p.schedule == kept else ("yellow" if p.schedule == INLINE else "")
        r.add_row(
            str(idx), str(p.schedule.ingestion), str(p.schedule.delivery), ms(p.t_iter), ms(p.exposed), measured,
            role, style=style,
        )
    return r


def print_profile(
    console: Console, label: str, w: Any, result: Any, chosen: Any, baseline: Any, measured: dict[str, Any],
    placement: dict[str, Any], notes: list[str],
) -> None:
    console.print(
        f"\n[bold cyan]{label}[/bold cyan]: dim {w.dim} ({w.bytes_per_sample:,} B/transition), "
        f"unit {w.unit_size}, batch {w.train_batch_size}, cost={w.cost.value}; the actor hands its units over "
        "(copy_on_push=False: the default copies a unit whose write is deferred)"
    )
    load = result.load
    console.print(
        "[dim]Other processes' CPU load at the start: "
        + ("unknown" if load is None else f"{load:.0%} of this host's CPUs")
        + f"; profiled in {result.seconds:.1f} s[/dim]"
    )
    console.print(_costs_table(result.costs))
    kept = INLINE if measured.get("outcome") == "inline" else chosen.schedule
    console.print(_candidates_table(result, chosen, baseline, kept))
    console.print(
        f"[bold green]Plan:[/bold green] placement [bold]{placement['chosen']}[/bold]; "
        f"ingestion [bold]{kept.ingestion}[/bold], delivery [bold]{kept.delivery}[/bold]; "
        f"predicted exposed {ms(chosen.exposed if kept == chosen.schedule else baseline.exposed)} ms "
        f"vs inline {ms(baseline.exposed)} ms"
    )
    console.print(placement_line(placement))
    if measured and "inline" in measured:
        console.print(measured_line(measured, same=chosen.schedule == baseline.schedule))
    for n in notes:
        console.print(f"[dim]Note: {n}.[/dim]", highlight=False)


def placement_line(p: dict[str, Any]) -> str:
    """Where Alg. 1 puts this buffer, and what the loop above ran on."""
    line = (
        f"[dim]Placement: Alg. 1 on this machine's profile, {p['rows']:,} rows, rollouts in host memory, learner on "
        f"{p['learner']}: {p['chosen']} ({p['transfer_s_per_sample'] * 1e6:.3f} us per transition modeled"
    )
    if p["runner_up"] is not None:
        line += f"; next {p['runner_up']}, {p['runner_up_s_per_sample'] * 1e6:.3f} us"
    line += ")"
    if p["learner"] != "cpu":
        line += (
            ". The loop above ran in host memory with a CPU learner; a runtime whose learner is on the GPU places "
            "its buffer as here unless storage_device pins one"
        )
    return line + ".[/dim]"


def _time(m: dict[str, Any]) -> str:
    if "low_s" in m:
        return f"{_ranged(m['t_iter_s'], m['low_s'], m['high_s'])} ms"
    return f"{ms(m['t_iter_s'])} ms"


def measured_line(measured: dict[str, Any], same: bool) -> str:
    """The check of the plan on the loop; ``same``: the plan is the inline schedule (measured once, not compared)."""
    inl = measured["inline"]
    runs = f"median of {measured.get('rounds', 1)} interleaved runs"
    if "t_alone_s" in measured:
        runs += f", rollout + update alone {ms(measured['t_alone_s'])} ms in the same rounds"
    if same or "chosen" not in measured:
        line = (
            f"[bold]Measured:[/bold] the plan is the inline schedule: T_iter {_time(inl)}, exposed "
            f"{ms(inl['exposed_s'])} ms ({runs})"
        )
    else:
        ch = measured["chosen"]
        change = ch["exposed_s"] / inl["exposed_s"] - 1 if inl["exposed_s"] > 0 else float("nan")
        line = (
            f"[bold]Measured:[/bold] T_iter {_time(ch)} vs inline {_time(inl)}; exposed "
            f"{ms(ch['exposed_s'])} ms vs {ms(inl['exposed_s'])} ms "
            + (f"({change:+.0%} exposed latency" if change == change else "(inline exposes nothing measurable")
            + f"; {runs})"
        )
        if measured.get("outcome") == "inline":
            line += "; kept: inline (the plan did not beat it by more than the runs' noise)"
    return line + _drift_note(measured)


def _drift_note(measured: dict[str, Any]) -> str:
    """A sentence when the machine's speed moved between profiling and the check (else nothing).

    The tables above were measured in the earlier state, the check in the later one: without the
    note a reader sees one schedule at two quite different times in one printout and cannot tell why.
    """
    then, now = measured.get("profiled_alone_s"), measured.get("t_alone_s")
    if not then or not now or abs(now / then - 1) <= DRIFT:
        return ""
    return (
        f"\n[dim]This machine's speed moved while it was profiled: rollout + update alone took {ms(then)} ms "
        f"when the costs above were measured and {ms(now)} ms in the check, so the tables' times and the "
        "check's differ by as much; compare figures measured in the same rounds.[/dim]"
    )
