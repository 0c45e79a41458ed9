"""``conduit profile``: profile this machine and a workload, print the plan Conduit chooses.

With no arguments it runs the embedded synthetic workload — a DQN-like
off-policy loop and a PPO-like on-policy loop at transition dimension 1,000 —
through the real runtime, and prints the profiled costs, the ranked candidate
schedules with predicted ``T_iter`` and exposed experience-path latency, the
chosen placement + schedule, and a measured check of the choice against the
inline baseline (an RLlib-style buffer). ``--json`` writes the same to stdout
machine-readably. The cost-model validation sweep is a benchmark (``conduit bench validate``).
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import typer
from conduit.cli.errors import user_errors
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from conduit.core import INLINE, Policy
from conduit.errors import ConfigError, closest
from conduit.files import read_mapping
from conduit.samplers import sumtree
from conduit.scheduling.model import Costs, predict
from conduit.scheduling.profiler import ProfileSettings, interleaved_medians, planned_steps, profile_workload
from conduit.scheduling.workload import DRIFT, CostKind, SyntheticWorkload, standalone_costs
from conduit.storage import streaming

POLICIES = {"off": [Policy.OFF_POLICY], "on": [Policy.ON_POLICY], "both": [Policy.OFF_POLICY, Policy.ON_POLICY]}
CHECK_ROUNDS = 3  # interleaved runs of the plan and of inline in the closing check (medians)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def machine_info() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": torch.get_num_threads(),
        "platform": platform.platform(),
        "gpus": gpus,
        "streaming_writes": streaming.AVAILABLE,
        "native_sumtree": sumtree.NATIVE,
    }


def _workloads(policy: str, fields: dict[str, Any], config: Path | None) -> list[SyntheticWorkload]:
    """The workloads to profile: the options, overridden by the ``--config`` file's fields."""
    if config is not None:
        fields = {**fields, **read_mapping(config, "--config file")}
    known = set(SyntheticWorkload.__dataclass_fields__) - {"policy"}
    unknown = sorted(set(fields) - known - {"policy"})
    if unknown:
        close = {k: closest(k, known) for k in unknown}
        hints = ", ".join(f"{k!r}" + (f" (did you mean {c!r}?)" if c else "") for k, c in close.items())
        raise ConfigError(f"--config file {str(config)!r}: unknown field(s) {hints}; valid: {', '.join(sorted(known))}")
    return [SyntheticWorkload(policy=pol, **{k: v for k, v in fields.items() if k != "policy"})
            for pol in POLICIES[policy]]


def profile(
    policy: str = typer.Option("both", help="Which loop to profile: off (DQN-like), on (PPO-like) or both."),
    dim: int = typer.Option(1000, min=1, help="Transition dimension (float32 obs and next_obs)."),
    batch_size: int = typer.Option(512, min=1, help="Off-policy training batch size."),
    unit_size: int = typer.Option(256, min=1, help="Transitions per rollout unit (one push)."),
    capacity: int = typer.Option(20_000, min=1, help="Off-policy replay capacity."),
    units_per_iteration: int = typer.Option(4, min=1, help="On-policy rollout units per iteration."),
    minibatches: int = typer.Option(4, min=1, help="On-policy mini-batches per epoch (M)."),
    epochs: int = typer.Option(1, min=1, help="On-policy epochs per iteration."),
    rollout_ms: float = typer.Option(2.0, min=0, help="Rollout cost per unit (ms)."),
    update_ms: float = typer.Option(8.0, min=0, help="Update cost per training batch / mini-batch (ms)."),
    cost: CostKind = typer.Option(
        CostKind.COMPUTE, help="compute: burn CPU; sleep: release it, as a GPU learner would."
    ),
    g_max: int = typer.Option(4, min=1, max=16, help="Cap on off-policy granularities."),
    config: Path | None = typer.Option(None, exists=True, dir_okay=False, help="JSON/YAML file with these fields."),
    check: bool = typer.Option(True, help="Measure the chosen plan against the inline baseline."),
    as_json: bool = typer.Option(False, "--json", help="Write machine-readable JSON to stdout instead of tables."),
) -> None:
    """Profile hardware and workload, rank candidate schedules, print the chosen plan."""
    if policy not in POLICIES:
        raise typer.BadParameter(f"--policy must be one of {sorted(POLICIES)}, got {policy!r}")
    fields: dict[str, Any] = dict(
        dim=dim, batch_size=batch_size, unit_size=unit_size, capacity=capacity,
        units_per_iteration=units_per_iteration, num_minibatches=minibatches, num_epochs=epochs,
        rollout_ms=rollout_ms, update_ms=update_ms, cost=cost,
    )
    with user_errors():
        workloads = _workloads(policy, fields, config)
    console = Console(stderr=as_json)
    t_start = time.perf_counter()
    out: dict[str, Any] = {"machine": machine_info(), "workloads": []}
    if not as_json:
        _print_machine(console, out["machine"])
    for workload in workloads:
        out["workloads"].append(_profile_one(console, workload, g_max, check, as_json))
    out["seconds"] = time.perf_counter() - t_start
    if as_json:
        json.dump(out, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        console.print(f"\n[dim]profiled in {out['seconds']:.1f} s[/dim]")


class Steps:
    """What the profile is doing, step by step: a progress bar with steps done/total, elapsed and remaining in a
    terminal; elsewhere (redirected, CI) one line per finished step, so the log is never silent for minutes."""

    def __init__(self, console: Console, label: str, total: int, quiet: bool) -> None:
        self.console, self.label, self.total, self.quiet = console, label, total, quiet
        self.done = 0
        self.current: str | None = None
        self.t_start = self.t_step = time.perf_counter()
        self.live = console.is_terminal and not quiet
        self.bar = Progress(
            SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
            MofNCompleteColumn(), TextColumn("steps"), TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
            console=console, transient=True, disable=not self.live,
        )
        self.task = self.bar.add_task(label, total=total)

    def __enter__(self) -> Steps:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._finish()
        self.bar.__exit__(*exc)

    def expect(self, more: int) -> None:
        """Exactly ``more`` steps are left after the current one (the total so far was an estimate)."""
        self.total = self.done + (self.current is not None) + more

    def step(self, what: str) -> None:
        """``what`` starts now (the step before it is done)."""
        self._finish()
        self.current = what
        self.t_step = time.perf_counter()
        self.total = max(self.total, self.done + 1)  # a step the plan did not count (a rematch): the total grows
        self.bar.update(self.task, description=escape(f"{self.label}: {what}"), total=self.total, completed=self.done)

    def _finish(self) -> None:
        if self.current is None:
            return
        self.done += 1
        if not self.live and not self.quiet:
            now = time.perf_counter()
            self.console.print(
                f"{self.label}: step {self.done}/{self.total} {self.current} ({now - self.t_step:.1f} s, "
                f"{now - self.t_start:.0f} s in all)", highlight=False, markup=False, soft_wrap=True,
            )
        self.current = None
        self.bar.update(self.task, completed=self.done)


def _profile_one(console: Console, w: SyntheticWorkload, g_max: int, check: bool, quiet: bool) -> dict[str, Any]:
    label = "DQN-like off-policy" if w.policy is Policy.OFF_POLICY else "PPO-like on-policy"
    settings = ProfileSettings()
    total = planned_steps(w, settings, g_max) + (2 * CHECK_ROUNDS if check else 0)
    with Steps(console, label, total, quiet) as steps:
        check_steps = 2 * CHECK_ROUNDS if check else 0
        result = profile_workload(
            w, settings=settings, g_max=g_max, progress=steps.step, expect=lambda n: steps.expect(n + check_steps)
        )
        ranked, chosen = result.ranked, result.choice
        baseline = predict(result.costs, INLINE)  # an RLlib-style buffer
        measured: dict[str, Any] = {}
        if check:
            checked = list(dict.fromkeys((baseline.schedule, chosen.schedule)))
            steps.expect(len(checked) * CHECK_ROUNDS)
            # interleaved rounds, medians: one run each, back to back, read the machine's drift as a difference.
            # Rollout and update are timed alone in the same rounds: a shared host's speed moves within seconds,
            # and costs profiled a minute earlier would turn such a drift into exposed latency
            alone: list[float] = []
            t_iter = interleaved_medians(
                w, checked, CHECK_ROUNDS, 25, 5, pool=w.units(), progress=steps.step, label="checking ",
                between=lambda: alone.append(sum(standalone_costs(w))),
            )
            t_alone = statistics.median(alone)
            for name, sched in (("inline", baseline.schedule), ("chosen", chosen.schedule)):
                measured[name] = {"t_iter_s": t_iter[sched], "exposed_s": t_iter[sched] - t_alone}
            measured["t_alone_s"] = t_alone  # rollout + update alone, timed in the same rounds
            measured["profiled_alone_s"] = result.costs.t_rollout + result.costs.t_update
            measured["rounds"] = CHECK_ROUNDS
    placement = _placement(w)
    doc = {
        "workload": {k: (v.value if hasattr(v, "value") else v) for k, v in w.__dict__.items()},
        "bytes_per_sample": w.bytes_per_sample,
        "costs": _costs_json(result.costs),
        "calibration": result.calibration,
        "candidates": [p.to_json() for p in ranked],
        "chosen": {"schedule": chosen.schedule.to_json(), "placement": placement["chosen"], **chosen.to_json()},
        "placement": placement,
        "model_choice": result.model_choice.to_json(),
        "verified": [{"schedule": s.to_json(), "t_iter_s": t} for s, t in result.verified.items()],
        "baseline": baseline.to_json(),
        "measured": measured,
        "profile_seconds": result.seconds,
    }
    if not quiet:
        _print_profile(console, label, w, result.costs, ranked, chosen, baseline, measured, result.verified, placement)
    return doc


def _placement(w: SyntheticWorkload) -> dict[str, Any]:
    """Alg. 1 on this machine's live topology for the workload's buffer, rollouts in host memory, the learner
    on ``cuda:0`` where there is a GPU (what the runtime does for such a learner); the loop itself runs on the
    CPU in host memory, as a CPU learner's runtime does."""
    from conduit.placement import PlacementRequest, solve_placement, this_machine_topology

    topo = this_machine_topology()
    learner = "cuda:0" if topo.gpus(0) else "cpu"
    rows = w.config().placement_rows
    result = solve_placement(topo, PlacementRequest(actors="cpu", learners=learner, capacity=rows), w.bytes_per_sample)
    ranked = sorted((e for e in result.evaluations if e.feasible), key=lambda e: e.transfer_seconds)
    return {
        "learner": learner,
        "rows": rows,
        "chosen": str(result.placement),
        "transfer_s_per_sample": result.transfer_seconds,
        "candidates": [
            {"placement": str(e.placement), "transfer_s_per_sample": e.transfer_seconds, "feasible": e.feasible}
            for e in result.evaluations
        ],
        "runner_up": str(ranked[1].placement) if len(ranked) > 1 else None,
        "runner_up_s_per_sample": ranked[1].transfer_seconds if len(ranked) > 1 else None,
    }


def _costs_json(c: Costs) -> dict[str, Any]:
    return {
        "t_rollout_s": c.t_rollout,
        "t_update_s": c.t_update,
        "t_ing_s": {str(g): t for g, t in c.t_ing.items()},
        "t_del_s": {str(g): t for g, t in c.t_del.items()},
        "t_sync_ing_s": c.t_sync_ing,
        "t_sync_del_s": c.t_sync_del,
        "t_sync0_ing_s": c.t_sync0_ing,
        "t_sync0_del_s": c.t_sync0_del,
        "s_ing_s": {str(g): v for g, v in c.s_ing.items()},
        "s_del_s": {str(g): v for g, v in c.s_del.items()},
        "s_both_s": c.s_both,
        "t_other_s": c.t_other,
    }


def _print_machine(console: Console, m: dict[str, Any]) -> None:
    gpus = ", ".join(m["gpus"]) or "none"
    ring = "non-temporal" if m["streaming_writes"] else "cached (conduit._native not built)"
    tree = "C" if m["native_sumtree"] else "numpy (conduit._native not built)"
    console.print(
        f"[bold]Conduit profile[/bold]  torch {m['torch']}, {m['cpu_count']} CPU threads, GPUs: {gpus}; "
        f"replay-ring writes: {ring}; prioritized sum-tree: {tree}"
    )


def _print_profile(console, label, w, costs, ranked, chosen, baseline, measured, verified, placement) -> None:  # type: ignore[no-untyped-def]
    console.print(
        f"\n[bold cyan]{label}[/bold cyan]: dim {w.dim} ({w.bytes_per_sample:,} B/transition), "
        f"unit {w.unit_size}, batch {w.train_batch_size}, cost={w.cost.value}; the actor hands its units over "
        "(copy_on_push=False: the default copies a unit whose write is deferred)"
    )
    t = Table(title="Profiled costs (ms)", show_lines=False)
    t.add_column("term")
    t.add_column("per invocation", justify="right")
    t.add_column("per iteration", justify="right")
    t.add_row("T_rollout", "", _ms(costs.t_rollout))
    t.add_row("T_update", "", _ms(costs.t_update))
    for g, v in costs.t_ing.items():
        t.add_row(f"T_ing(g={g})", _ms(v), _ms(costs.per_iteration_ing(g)))
    for g, v in costs.t_del.items():
        t.add_row(f"T_del(g={g})", _ms(v), _ms(costs.per_iteration_del(g)))
    t.add_row("T_sync ingestion (fitted)", _ms(costs.t_sync_ing), _ms(costs.t_sync0_ing))
    t.add_row("T_sync delivery (fitted)", _ms(costs.t_sync_del), _ms(costs.t_sync0_del))
    for path, measured_s in (("ingestion", costs.s_ing), ("delivery", costs.s_del)):
        for g, v in sorted(measured_s.items()):
            t.add_row(f"overlap cost, {path} g={g} (probed)", "", _ms(v))
    t.add_row("overlap cost, both paths beyond each (probed)", "", _ms(costs.s_both))
    console.print(t)

    r = Table(title="Candidate schedules, best first (model)")
    for col in ("#", "ingestion", "delivery", "T_iter ms", "exposed ms", "verified T_iter ms"):
        r.add_column(col, justify="right" if "ms" in col or col == "#" else "left")
    shown = ranked[:8]
    if baseline.schedule not in [p.schedule for p in shown]:
        shown = [*shown, baseline]
    for p in shown:
        style = "bold green" if p.schedule == chosen.schedule else ("yellow" if p.schedule == baseline.schedule else "")
        idx = next(i for i, q in enumerate(ranked) if q.schedule == p.schedule) + 1
        v = _ms(verified[p.schedule]) if p.schedule in verified else ""
        r.add_row(
            str(idx), str(p.schedule.ingestion), str(p.schedule.delivery), _ms(p.t_iter), _ms(p.exposed), v,
            style=style,
        )
    console.print(r)
    console.print(
        f"[bold green]Plan:[/bold green] placement [bold]{placement['chosen']}[/bold]; "
        f"ingestion [bold]{chosen.schedule.ingestion}[/bold], "
        f"delivery [bold]{chosen.schedule.delivery}[/bold]; predicted exposed {_ms(chosen.exposed)} ms "
        f"vs inline {_ms(baseline.exposed)} ms"
    )
    console.print(_placement_line(placement))
    if measured:
        console.print(_measured_line(measured, same=chosen.schedule == baseline.schedule))


def _placement_line(p: dict[str, Any]) -> str:
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


def _measured_line(measured: dict[str, Any], same: bool) -> str:
    """The check of the plan on the loop; ``same``: the plan is the inline schedule (measured once, not compared)."""
    inl, ch = measured["inline"], measured["chosen"]
    runs = f"median of {measured.get('rounds', 1)} interleaved runs"
    if "t_alone_s" in measured:
        runs += f", rollout + update alone {_ms(measured['t_alone_s'])} ms in the same rounds"
    if same:
        line = (
            f"[bold]Measured:[/bold] the plan is the inline schedule: T_iter {_ms(inl['t_iter_s'])} ms, exposed "
            f"{_ms(inl['exposed_s'])} ms ({runs})"
        )
    else:
        change = ch["exposed_s"] / inl["exposed_s"] - 1 if inl["exposed_s"] > 0 else float("nan")
        line = (
            f"[bold]Measured:[/bold] T_iter {_ms(ch['t_iter_s'])} ms vs inline {_ms(inl['t_iter_s'])} ms; exposed "
            f"{_ms(ch['exposed_s'])} ms vs {_ms(inl['exposed_s'])} ms "
            + (f"({change:+.0%} exposed latency" if change == change else "(inline exposes nothing measurable")
            + f"; {runs})"
        )
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
        f"\n[dim]This machine's speed moved while it was profiled: rollout + update alone took {_ms(then)} ms "
        f"when the costs above were measured and {_ms(now)} ms in the check, so the tables' times and the "
        "check's differ by as much; compare figures measured in the same rounds.[/dim]"
    )
