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
from conduit.cli.profile_options import PolicyChoice, ProfileOptions
from conduit.cli.profile_report import print_machine, print_profile
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from conduit.core import INLINE, Policy
from conduit.scheduling.kinds import CostKind

if TYPE_CHECKING:
    from conduit.core import Schedule
    from conduit.placement import Topology
    from conduit.scheduling.host import Deadline
    from conduit.scheduling.model import Costs
    from conduit.scheduling.profiler import ProfileResult
    from conduit.scheduling.workload import SyntheticWorkload

CHECK_ROUNDS = 3  # interleaved runs of the plan and of inline in the closing check (medians)
CHECK_SHARE = 0.25  # of each workload's share of the budget, kept for the closing check
TOPOLOGY_SHARE = 0.05  # of the budget, for the machine's topology (copy bandwidths) behind the placement
TOPOLOGY_BYTES = 16 << 20


def _help(name: str) -> str:
    return str(ProfileOptions.model_fields[name].description)


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


def profile(
    ctx: typer.Context,
    policy: PolicyChoice = typer.Option(PolicyChoice.BOTH, help="Which loop to profile: off (DQN-like), on "
                                        "(PPO-like) or both."),
    dim: int = typer.Option(1000, min=1, help=_help("dim")),
    batch_size: int = typer.Option(512, min=1, help=_help("batch_size")),
    unit_size: int = typer.Option(256, min=1, help=_help("unit_size")),
    capacity: int = typer.Option(20_000, min=1, help=_help("capacity")),
    units_per_iteration: int = typer.Option(4, min=1, help=_help("units_per_iteration")),
    minibatches: int = typer.Option(4, min=1, help=_help("minibatches")),
    epochs: int = typer.Option(1, min=1, help=_help("epochs")),
    rollout_ms: float = typer.Option(2.0, min=0, help=_help("rollout_ms")),
    update_ms: float = typer.Option(8.0, min=0, help=_help("update_ms")),
    cost: CostKind = typer.Option(
        CostKind.COMPUTE, help="compute: burn CPU; sleep: release it, as a GPU learner would."
    ),
    g_max: int = typer.Option(4, min=1, max=16, help=_help("g_max")),
    config: Path | None = typer.Option(
        None, exists=True, dir_okay=False,
        help="JSON/YAML file whose keys are these options' names (batch_size: 256); flags given win.",
    ),
    check: bool = typer.Option(True, help="Measure the chosen plan against the inline baseline."),
    budget: float = typer.Option(
        90.0, min=5.0, help="Seconds the profile may take: no run starts that the runs so far say will not fit, "
        "so it ends within the budget unless the host slows down mid-run (then by about one run past it; "
        "Python and torch start-up, about a second, come on top)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Write machine-readable JSON to stdout instead of tables."),
) -> None:
    """Profile hardware and workload, rank candidate schedules, print the chosen plan."""
    from conduit.scheduling.host import Deadline

    deadline = Deadline(budget)
    flags: dict[str, Any] = dict(
        policy=policy, dim=dim, batch_size=batch_size, unit_size=unit_size, capacity=capacity,
        units_per_iteration=units_per_iteration, minibatches=minibatches, epochs=epochs,
        rollout_ms=rollout_ms, update_ms=update_ms, cost=cost, g_max=g_max,
    )
    # click's ParameterSource, read by name: click comes with typer and is not a dependency of ours
    explicit = {k for k in flags if getattr(ctx.get_parameter_source(k), "name", None) == "COMMANDLINE"}
    with user_errors():
        options = ProfileOptions.build(flags, explicit, config)
        workloads = options.workloads()
        g_max = options.g_max
        for workload in workloads:  # a workload the config refuses is the user's mistake, said before profiling
            workload.config(g_max=g_max)
    console = Console(stderr=as_json)
    out: dict[str, Any] = {"machine": machine_info(), "budget_s": budget, "workloads": []}
    if not as_json:
        print_machine(console, out["machine"])
    topology = _topology(deadline)  # inside the budget: placement is part of the plan
    for i, workload in enumerate(workloads):
        share = deadline.share(1.0 / (len(workloads) - i))  # what is left, split over the workloads left
        out["workloads"].append(_profile_one(console, workload, g_max, check, as_json, share, topology, deadline))
    out["seconds"] = deadline.spent
    if as_json:
        json.dump(out, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        console.print(f"\n[dim]profiled in {out['seconds']:.1f} s (budget {budget:.0f} s)[/dim]")


class Steps:
    """What the profile is doing, step by step, and how much of the budget is left: a bar over the budget's
    seconds in a terminal; elsewhere (redirected, CI, ``--json``: on stderr) one line per finished step, so the
    log is never silent for minutes. Steps are numbered as they come, with no total: how many runs a profile
    takes depends on what it measures, and a total that moved would mislead."""

    def __init__(self, console: Console, label: str, deadline: Deadline) -> None:
        self.console, self.label, self.deadline = console, label, deadline
        self.done = 0
        self.current: str | None = None
        self.t_step = time.perf_counter()
        self.live = console.is_terminal
        self.bar = Progress(
            SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[left]:.0f} s left"), console=console, transient=True, disable=not self.live,
        )
        self.task = self.bar.add_task(label, total=deadline.seconds, left=deadline.left)

    def __enter__(self) -> Steps:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._finish()
        self.bar.__exit__(*exc)

    def step(self, what: str) -> None:
        """``what`` starts now (the step before it is done)."""
        self._finish()
        self.current = what
        self.t_step = time.perf_counter()
        self.bar.update(self.task, description=escape(f"{self.label}: {what}"), completed=self.deadline.spent,
                        left=self.deadline.left)

    def _finish(self) -> None:
        if self.current is None:
            return
        self.done += 1
        if not self.live:
            self.console.print(
                f"{self.label}: step {self.done} {self.current} ({time.perf_counter() - self.t_step:.1f} s; "
                f"{self.deadline.left:.0f} s of the {self.deadline.seconds:.0f} s budget left)",
                highlight=False, markup=False, soft_wrap=True,
            )
        self.current = None
        self.bar.update(self.task, completed=self.deadline.spent, left=self.deadline.left)


def _topology(deadline: Deadline) -> Topology:
    """This machine's live topology for the placement decision, within a small share of the budget (copies of
    ``TOPOLOGY_BYTES``: the choice among host, pinned and GPU memory does not need the default 64 MiB)."""
    from conduit.placement import profile_topology

    return profile_topology(name="this_machine", nbytes=TOPOLOGY_BYTES, time_budget_s=deadline.left * TOPOLOGY_SHARE)


def _profile_one(
    console: Console, w: SyntheticWorkload, g_max: int, check: bool, quiet: bool, deadline: Deadline,
    topology: Topology, overall: Deadline,
) -> dict[str, Any]:
    from conduit.scheduling.model import predict
    from conduit.scheduling.profiler import ProfileSettings, profile_workload

    label = "DQN-like off-policy" if w.policy is Policy.OFF_POLICY else "PPO-like on-policy"
    settings = ProfileSettings(budget_s=deadline.left * (1 - CHECK_SHARE if check else 1.0))
    with Steps(console, label, overall) as steps:
        result = profile_workload(w, settings=settings, g_max=g_max, progress=steps.step)
        chosen = result.choice
        baseline = predict(result.costs, INLINE)  # an RLlib-style buffer
        notes = list(result.notes)
        measured = _check(w, result, chosen.schedule, steps, deadline, notes) if check else {}
    kept = INLINE if measured.get("outcome") == "inline" else chosen.schedule
    predicted = chosen if kept == chosen.schedule else baseline
    placement = _placement(w, topology)
    doc = {
        "workload": {k: (v.value if hasattr(v, "value") else v) for k, v in w.__dict__.items()},
        "bytes_per_sample": w.bytes_per_sample,
        # the one answer: what the profile keeps (apply this); everything below is how it got there
        "plan": {
            "schedule": kept.to_json(), "placement": placement["chosen"],
            "predicted_t_iter_s": predicted.t_iter, "predicted_exposed_s": predicted.exposed,
            "why": _why(chosen.schedule, kept, result.model_choice.schedule, bool(measured)),
        },
        "costs": _costs_json(result.costs),
        "calibration": result.calibration,
        "candidates": [p.to_json() for p in result.ranked],
        "model_choice": result.model_choice.to_json(),
        "verified_choice": chosen.to_json(),
        "placement": placement,
        "verified": [{"schedule": s.to_json(), "t_iter_s": v.median, "low_s": v.low, "high_s": v.high,
                      "runs": v.runs} for s, v in result.spreads.items()],
        "baseline": baseline.to_json(),
        "check": measured,
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
    measured["outcome"] = "verified_choice"
    if plan != INLINE and (plan not in spreads or not beats(spreads[plan], spreads[INLINE], result.margin)):
        measured["outcome"] = "inline"
        notes.append("the check did not find the plan faster than inline by more than its noise: inline is kept")
    return measured


def _why(verified: Schedule, kept: Schedule, model: Schedule, checked: bool) -> str:
    """One sentence: how the kept plan relates to the model's and the verified choice."""
    if kept == INLINE and verified != INLINE:
        return "inline: the closing check did not find the verified choice faster than inline by more than its noise"
    if kept == INLINE:
        return "inline: no candidate beat it by more than the noise of its runs"
    how = "the model's choice, confirmed by measured runs" if kept == model else (
        "the fastest of the measured runs (the model ranked another first)")
    return how + ("; the closing check found it faster than inline" if checked else "")


def _placement(w: SyntheticWorkload, topo: Topology) -> dict[str, Any]:
    """Alg. 1 on this machine's live topology for the workload's buffer, rollouts in host memory, the learner
    on ``cuda:0`` where there is a GPU (what the runtime does for such a learner); the loop itself runs on the
    CPU in host memory, as a CPU learner's runtime does."""
    from conduit.placement import PlacementRequest, solve_placement

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


