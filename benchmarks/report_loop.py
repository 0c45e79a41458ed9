"""Tables and targets of the synthetic loop benchmark: pure functions over its results."""

from __future__ import annotations

from typing import Any

from benchmarks.loop_results import ConfigResult, SyntheticResult, WorkloadResult
from benchmarks.report import TableData, Target
from conduit.core import Policy
from conduit.scheduling.workload import DRIFT, CostKind

__all__ = ["LOOP_QUESTION", "loop_json", "loop_tables", "loop_targets"]

#: the question the synthetic loop's targets answer
LOOP_QUESTION = "The synthetic loop's exposed latency"

COST_LABEL = {
    CostKind.COMPUTE: "update burns the CPU (torch matmuls)",
    CostKind.SLEEP: "update releases the CPU, as a GPU learner would (sleep)",
}
POLICY_LABEL = {Policy.OFF_POLICY: "off-policy (DQN-like)", Policy.ON_POLICY: "on-policy (PPO-like, M mini-batches)"}


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1e3:.2f}"


def _scope(w: WorkloadResult) -> str:
    wl = w.workload
    return f"dim {wl.dim:,}, batch {wl.train_batch_size}"


def loop_targets(result: SyntheticResult) -> list[Target]:
    """The automatic plan's exposed-latency cut vs inline (>= 70% off-policy at dim >= 1,000)."""
    out = []
    for w in result.workloads:
        wl = w.workload
        auto = w.config("auto")
        value = auto.reduction if auto is not None else None
        if wl.policy is Policy.OFF_POLICY:
            name = f"off-policy, {COST_LABEL[wl.cost]}: exposed-latency cut >= 70% vs inline"
            threshold = 0.70 if wl.dim >= 1000 else None
        else:
            name = f"on-policy, {COST_LABEL[wl.cost]}: exposed-latency cut vs inline (paper: up to 97%)"
            threshold = None
        out.append(Target(LOOP_QUESTION, name, _scope(w), value, threshold, False, "reduction"))
    return out


def loop_json(result: SyntheticResult) -> dict[str, Any]:
    """The synthetic loop's JSON: the result's records and the targets."""
    doc = result.to_json()
    doc["targets"] = [t.to_json() for t in loop_targets(result)]
    return doc


def _cell(c: ConfigResult | None) -> str:
    if c is None:
        return "–"
    if c.unavailable:
        return "unavailable"
    cut = "" if c.reduction is None or c.kind == "inline" else f" ({-c.reduction:+.0%})"
    return f"{_ms(c.t_iter)} / {_ms(c.exposed)}{cut}"


def _spread_note(ws: list[WorkloadResult]) -> list[str]:
    """How noisy the repeats were: max/min of each configuration's per-run time per iteration."""
    spreads = [
        (max(c.samples) / min(c.samples), c.name, w)
        for w in ws
        for c in w.configs
        if len(c.samples) > 1 and min(c.samples) > 0
    ]
    if not spreads:
        return []
    spreads.sort(key=lambda x: x[0])
    mid, (worst, name, w) = spreads[len(spreads) // 2][0], spreads[-1]
    return [
        f"T_iter spread over the {len(spreads[0][2].configs[0].samples)} repeats "
        f"(max/min of the per-run times per iteration): median {mid:.2f}, worst {worst:.2f} ({name}, {_scope(w)})"
    ]


def _drift_note(ws: list[WorkloadResult]) -> list[str]:
    """Where the compute burn measured alone strayed from its target: the machine's speed moved during the run.

    The burn is calibrated at the start of each workload, so a host that has since slowed down or
    sped up (measured here: 0.21 against 0.33 ms per matmul, switching within seconds)
    gives an update of other than the workload's cost. The rollout is the clean
    probe: the update's figure also holds reading the batch.
    """
    strays = []
    for w in ws:
        wl = w.workload
        if wl.cost is not CostKind.COMPUTE or wl.rollout_ms <= 0:
            continue
        target = wl.rollout_ms * wl.rollouts_per_iteration / 1e3
        if abs(w.t_rollout / target - 1) > DRIFT:
            strays.append(f"{_scope(w)}: {_ms(w.t_rollout)} ms for {_ms(target)}")
    if not strays:
        return []
    return [
        "the rollout's burn measured alone strayed from its target (" + "; ".join(strays) + "): the machine's "
        "speed moved between the burn's calibration (at the workload's start) and these runs, so the update is "
        "not the workload's cost either; compare the rows of one column"
    ]


def loop_tables(result: SyntheticResult) -> list[TableData]:
    tables = []
    groups: dict[tuple[Policy, CostKind], list[WorkloadResult]] = {}
    for w in result.workloads:
        groups.setdefault((w.workload.policy, w.workload.cost), []).append(w)
    for (policy, cost), ws in groups.items():
        names: list[str] = []
        for w in ws:
            for c in w.configs:
                if c.name not in names:
                    names.append(c.name)
        rows = [
            ["T_rollout + T_update, alone", *(f"{_ms(w.t_rollout)} + {_ms(w.t_update)}" for w in ws)],
            *([n, *(_cell(next((c for c in w.configs if c.name == n), None)) for w in ws)] for n in names),
            [
                "Conduit's schedule (model's exposed ms)",
                *(f"{w.chosen.schedule} ({_ms(w.chosen.exposed)})" for w in ws),
            ],
        ]
        unavailable = {c.name: c.unavailable for w in ws for c in w.configs if c.unavailable}
        notes = [f"{n}: {why}" for n, why in unavailable.items()]
        notes.append(
            "exposed: each run's time per iteration less rollout + update measured alone right before and right "
            "after it, the median over the runs (the first row: the medians of all those alone measurements)"
        )
        notes += _spread_note(ws)
        notes += _drift_note(ws)
        wl = ws[0].workload
        title = (
            f"{POLICY_LABEL[policy]}, {COST_LABEL[cost]} — rollout {wl.rollout_ms:g} ms/unit, update "
            f"{wl.update_ms:g} ms/batch: T_iter / exposed ms (change in exposed vs inline)"
        )
        tables.append(TableData(title, ["configuration", *(_scope(w) for w in ws)], rows, notes))
    targets = loop_targets(result)
    placements = result.machine.get("placements")
    notes = (
        [
            f"placements on this machine: {', '.join(placements)}; a fixed-placement row runs Conduit's schedule on "
            "each placement other than the one Conduit auto uses"
        ]
        if placements
        else []
    )
    tables.append(
        TableData(
            "Targets: Conduit auto vs inline, exposed experience-path latency",
            ["question", "criterion", "workload", "cut", "verdict"],
            [
                [t.question, t.name, t.scope, "–" if t.value is None else f"{t.value:.0%}", t.verdict]
                for t in targets
            ],
            notes,
        )
    )
    return tables
