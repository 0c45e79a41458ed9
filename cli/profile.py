"""``conduit profile``: profile this machine and a workload, print the plan Conduit chooses.

With no arguments it runs the embedded synthetic workload — a DQN-like
off-policy loop and a PPO-like on-policy loop at transition dimension 1,000 —
through the real runtime, and prints the profiled costs, the ranked candidate
schedules with predicted and measured ``T_iter`` and exposed experience-path
latency, the chosen placement + schedule, and a measured check of the choice
against the inline baseline (an RLlib-style buffer): the plan it keeps is
inline unless the choice beat inline by more than the check's noise.
``--budget`` bounds the whole command (default 90 s); on a host other
processes keep busy it waits a little, measures more rounds, and says so.
``--json`` writes the same to stdout machine-readably. The cost-model
validation sweep is a benchmark (``conduit bench validate``).

torch is imported inside the command, not by this module, so that
``conduit profile --help`` answers at once.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from conduit.cli.errors import user_errors
from conduit.cli.profile_report import print_machine, print_profile
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

from conduit.core import INLINE, Policy
from conduit.errors import ConfigError, closest
from conduit.files import read_mapping
from conduit.scheduling.kinds import CostKind

if TYPE_CHECKING:
    from conduit.core import Schedule
    from conduit.scheduling.host import Deadline
    from conduit.scheduling.model import Costs
    from conduit.scheduling.profiler import ProfileResult
    from conduit.scheduling.workload import SyntheticWorkload

POLICIES = {"off": [Policy.OFF_POLICY], "on": [Policy.ON_POLICY], "both": [Policy.OFF_POLICY, Policy.ON_POLICY]}
CHECK_ROUNDS = 3  # interleaved runs of the plan and of inline in the closing check (medians)
CHECK_SHARE = 0.25  # of each workload's share of the budget, kept for the closing check


def machine_info() -> dict[str, Any]:
    import torch

    from conduit.samplers import sumtree
    from conduit.storage import streaming

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
    from conduit.scheduling.workload import SyntheticWorkload

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
    budget: float = typer.Option(
        90.0, min=5.0, help="Seconds the whole profile may take (a hard bound: no run starts that it cannot afford)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Write machine-readable JSON to stdout instead of tables."),
) -> None:
    """Profile hardware and workload, rank candidate schedules, print the chosen plan."""
    from conduit.scheduling.host import Deadline

    if policy not in POLICIES:
        raise typer.BadParameter(f"--policy must be one of {sorted(POLICIES)}, got {policy!r}")
    deadline = Deadline(budget)
    fields: dict[str, Any] = dict(
        dim=dim, batch_size=batch_size, unit_size=unit_size, capacity=capacity,
        units_per_iteration=units_per_iteration, num_minibatches=minibatches, num_epochs=epochs,
        rollout_ms=rollout_ms, update_ms=update_ms, cost=cost,
    )
    with user_errors():
        workloads = _workloads(policy, fields, config)
    console = Console(stderr=as_json)
    out: dict[str, Any] = {"machine": machine_info(), "budget_s": budget, "workloads": []}
    if not as_json:
        print_machine(console, out["machine"])
    for i, workload in enumerate(workloads):
        share = deadline.share(1.0 / (len(workloads) - i))  # what is left, split over the workloads left
        out["workloads"].append(_profile_one(console, workload, g_max, check, as_json, share))
    out["seconds"] = deadline.spent
    if as_json:
        json.dump(out, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        console.print(f"\n[dim]profiled in {out['seconds']:.1f} s (budget {budget:.0f} s)[/dim]")


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


def _profile_one(
    console: Console, w: SyntheticWorkload, g_max: int, check: bool, quiet: bool, deadline: Deadline
) -> dict[str, Any]:
    from conduit.scheduling.model import predict
    from conduit.scheduling.profiler import ProfileSettings, planned_steps, profile_workload

    label = "DQN-like off-policy" if w.policy is Policy.OFF_POLICY else "PPO-like on-policy"
    check_steps = 2 * CHECK_ROUNDS if check else 0
    settings = ProfileSettings(budget_s=deadline.left * (1 - CHECK_SHARE if check else 1.0))
    with Steps(console, label, planned_steps(w, settings, g_max) + check_steps, quiet) as steps:
        result = profile_workload(
            w, settings=settings, g_max=g_max, progress=steps.step, expect=lambda n: steps.expect(n + check_steps)
        )
        chosen = result.choice
        baseline = predict(result.costs, INLINE)  # an RLlib-style buffer
        notes = list(result.notes)
        measured = _check(w, result, chosen.schedule, steps, deadline, notes) if check else {}
    kept = chosen.schedule
    if measured.get("kept") == "inline":
        kept = INLINE
    placement = _placement(w)
    doc = {
        "workload": {k: (v.value if hasattr(v, "value") else v) for k, v in w.__dict__.items()},
        "bytes_per_sample": w.bytes_per_sample,
        "costs": _costs_json(result.costs),
        "calibration": result.calibration,
        "candidates": [p.to_json() for p in result.ranked],
        "chosen": {"schedule": chosen.schedule.to_json(), "placement": placement["chosen"], **chosen.to_json()},
        "kept": kept.to_json(),
        "placement": placement,
        "model_choice": result.model_choice.to_json(),
        "verified": [{"schedule": s.to_json(), "t_iter_s": v.median, "low_s": v.low, "high_s": v.high,
                      "runs": v.runs} for s, v in result.spreads.items()],
        "baseline": baseline.to_json(),
        "measured": measured,
        "load": result.load,
        "notes": notes,
        "profile_seconds": result.seconds,
    }
    if not quiet:
        print_profile(console, label, w, result, chosen, baseline, measured, placement, notes)
    return doc


def _check(
    w: SyntheticWorkload, result: ProfileResult, plan: Schedule, steps: Steps, deadline: Deadline, notes: list[str]
) -> dict[str, Any]:
    """The plan against inline on the loop, interleaved rounds, rollout and update timed alone in the same rounds
    (a shared host's speed moves within seconds, and costs profiled a minute earlier would turn such a drift into
    exposed latency). The plan kept is inline unless the plan beat it by more than the noise of these rounds."""
    from conduit.scheduling.noise import beats
    from conduit.scheduling.profiler import interleaved
    from conduit.scheduling.source import LiveSource

    checked = list(dict.fromkeys((INLINE, plan)))
    steps.expect(len(checked) * CHECK_ROUNDS)
    source = LiveSource(w)
    alone: list[float] = []
    spreads = interleaved(
        source, checked, CHECK_ROUNDS, 25, 5, progress=steps.step, label="checking ",
        between=lambda: alone.append(sum(source.alone(15))), deadline=deadline, note=notes.append,
    )
    if INLINE not in spreads:
        return {}
    t_alone = statistics.median(alone) if alone else result.costs.t_rollout + result.costs.t_update
    measured: dict[str, Any] = {"t_alone_s": t_alone, "profiled_alone_s": result.costs.t_rollout
                                + result.costs.t_update, "rounds": spreads[INLINE].runs}
    for name, sched in (("inline", INLINE), ("chosen", plan)):
        if sched in spreads:
            v = spreads[sched]
            measured[name] = {
                "t_iter_s": v.median, "low_s": v.low, "high_s": v.high,
                "exposed_s": max(0.0, v.median - t_alone),  # a run below the costs alone is noise, not a gain
            }
    measured["kept"] = "chosen"
    if plan != INLINE and (plan not in spreads or not beats(spreads[plan], spreads[INLINE], result.margin)):
        measured["kept"] = "inline"
        notes.append("the check did not find the plan faster than inline by more than its noise: inline is kept")
    return measured


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


