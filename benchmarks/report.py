"""Ratios, targets and tables from benchmark results: pure functions, no I/O.

Times are medians over interleaved repeats. A ratio ``a/b`` divides the time of
``a`` by the time of ``b``: for a bound (``index_select``, memcpy, slice copy)
lower is better and 1.0 is the bound; against a peer (``TorchRL/pull``) higher
is better — it is how many times faster Conduit is. Tables are plain data
(:class:`TableData`), rendered as Markdown here and as rich tables by the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchmarks.micro import CaseResult, DimResult, MicroResult
from benchmarks.peers import Op, Role, Sampling

__all__ = [
    "MEMORY_BOUND_QUESTION",
    "PEERS_QUESTION",
    "TableData",
    "Target",
    "fmt_ratio",
    "micro_json",
    "micro_ratios",
    "micro_tables",
    "micro_targets",
    "to_markdown",
]

#: the questions the micro-benchmark's targets answer (each target names its question)
MEMORY_BOUND_QUESTION = "Delivery and ingestion vs the memory-bound limit"
PEERS_QUESTION = "Delivery and ingestion vs the peers"


@dataclass(frozen=True)
class TableData:
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Target:
    """One "done means" criterion, evaluated on a measurement; ``question`` names what it answers."""

    question: str
    name: str
    scope: str
    value: float | None
    threshold: float | None  # None: a figure to report, not a target
    at_most: bool  # met when value <= threshold (else value >= threshold)
    detail: str = ""

    @property
    def met(self) -> bool | None:
        if self.value is None or self.threshold is None:
            return None
        return self.value <= self.threshold if self.at_most else self.value >= self.threshold

    @property
    def verdict(self) -> str:
        if self.threshold is None and self.value is not None:
            return "reported"
        return {True: "met", False: "MISSED", None: "n/a"}[self.met]

    def to_json(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "name": self.name,
            "scope": self.scope,
            "value": self.value,
            "threshold": self.threshold,
            "at_most": self.at_most,
            "met": self.met,
            "detail": self.detail,
        }


def _ratio(a: CaseResult | None, b: CaseResult | None) -> float | None:
    return a.seconds / b.seconds if a is not None and b is not None else None


def micro_ratios(d: DimResult) -> dict[str, float | None]:
    """Time ratios at one dimension (see the module docstring for which way is better)."""
    U, P = Sampling.UNIFORM, Sampling.PRIORITIZED
    pull = d.find(Op.DELIVER, Role.CONDUIT)
    best_pull = d.best_conduit(Op.DELIVER)
    push = d.find(Op.INGEST, Role.CONDUIT)
    best_push = d.best_conduit(Op.INGEST)
    isel, memcpy = d.find(Op.DELIVER, Role.INDEX_SELECT), d.find(Op.DELIVER, Role.MEMCPY)
    isel_same = d.find(Op.DELIVER, Role.INDEX_SELECT_SAME)
    trl, trl_pf = d.find(Op.DELIVER, Role.TORCHRL), d.find(Op.DELIVER, Role.TORCHRL_PREFETCH)
    cp, npr = d.find(Op.DELIVER, Role.CPPRB), d.find(Op.DELIVER, Role.NUMPY)
    slice_copy = d.find(Op.INGEST, Role.SLICE_COPY)
    pull_p = d.find(Op.DELIVER, Role.CONDUIT, P)
    pooled = d.find(Op.DELIVER, Role.CONDUIT_POOLED)
    return {
        "pull/index_select": _ratio(pull, isel),
        "gather_op/index_select": _ratio(d.find(Op.DELIVER, Role.CONDUIT_GATHER, U), isel),
        "pull/index_select_same_storage": _ratio(pull, isel_same),
        "gather_op/index_select_same_storage": _ratio(d.find(Op.DELIVER, Role.CONDUIT_GATHER, U), isel_same),
        "index_select/index_select_same_storage": _ratio(isel, isel_same),
        "pooled_pull/index_select": _ratio(pooled, isel),
        "best_pull/index_select": _ratio(best_pull, isel),
        "pull/memcpy": _ratio(pull, memcpy),
        "best_pull/memcpy": _ratio(best_pull, memcpy),
        "index_select/memcpy": _ratio(isel, memcpy),
        "torchrl/pull": _ratio(trl, pull),
        "torchrl_prefetch/pull": _ratio(trl_pf, pull),
        "torchrl_best/pull": _ratio(d.best_torchrl(), pull),
        "cpprb/pull": _ratio(cp, pull),
        "torchrl_best/pooled_pull": _ratio(d.best_torchrl(), pooled),
        "cpprb/pooled_pull": _ratio(cp, pooled),
        "numpy/pull": _ratio(npr, pull),
        "push/slice_copy": _ratio(push, slice_copy),
        "best_push/slice_copy": _ratio(best_push, slice_copy),
        "torchrl_extend/push": _ratio(d.find(Op.INGEST, Role.TORCHRL), push),
        "cpprb_add/push": _ratio(d.find(Op.INGEST, Role.CPPRB), push),
        "numpy/push": _ratio(d.find(Op.INGEST, Role.NUMPY), push),
        "prioritized: torchrl/pull": _ratio(d.find(Op.DELIVER, Role.TORCHRL, P), pull_p),
        "prioritized: cpprb/pull": _ratio(d.find(Op.DELIVER, Role.CPPRB, P), pull_p),
    }


#: (ingestion chunk, training batch) the targets are set for
TARGET_SHAPE = (256, 512)

_BOUND, _PEERS = MEMORY_BOUND_QUESTION, PEERS_QUESTION

#: (question, name, ratio key, threshold, at_most)
MICRO_TARGETS: tuple[tuple[str, str, str, float, bool], ...] = (
    (_BOUND, "delivery: pull (inline g=1) within 1.25x of index_select", "pull/index_select", 1.25, True),
    (_BOUND, "delivery: gather operator within 1.25x of index_select", "gather_op/index_select", 1.25, True),
    (_BOUND, "ingestion: push within 1.25x of a slice copy", "push/slice_copy", 1.25, True),
    (_BOUND, "delivery within 1.3x of the memcpy-bound time", "pull/memcpy", 1.3, True),
    (_PEERS, "delivery >= 2x faster than TorchRL (its faster variant)", "torchrl_best/pull", 2.0, False),
    (_PEERS, "delivery no slower than cpprb", "cpprb/pull", 1.0, False),
    (_PEERS, "ingestion >= 2x TorchRL's extend", "torchrl_extend/push", 2.0, False),
)


def micro_targets(result: MicroResult) -> list[Target]:
    out = []
    for question, name, key, threshold, at_most in MICRO_TARGETS:
        for d in result.dims:
            out.append(Target(question, name, f"dim {d.dim:,}", micro_ratios(d)[key], threshold, at_most, key))
    return out


def micro_json(result: MicroResult) -> dict[str, Any]:
    """The micro-benchmark's JSON: the result's records, each dimension's ratios and the targets."""
    doc = result.to_json()
    for d, out in zip(result.dims, doc["dims"]):
        out["ratios"] = micro_ratios(d)
    doc["targets"] = [t.to_json() for t in micro_targets(result)]
    return doc


def fmt_ratio(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def _cell(c: CaseResult | None, with_name: bool = False) -> str:
    if c is None:
        return "missing"
    s = f"{c.ms:.3f} ms · {c.gbps:.2f} GB/s"
    return f"{s} ({c.name.split('(', 1)[-1].rstrip(')')})" if with_name else s


def _case_rows(result: MicroResult, op: Op, sampling: Sampling) -> list[list[str]]:
    seen: dict[str, Role] = {}
    for d in result.dims:
        for c in d.cases:
            if c.op is op and c.sampling is sampling and c.role is not Role.CONDUIT_VARIANT:
                seen.setdefault(c.name, c.role)
    rows = []
    for name, role in seen.items():
        rows.append([name, *(_cell(next((c for c in d.cases if c.name == name), None)) for d in result.dims)])
        if role is Role.CONDUIT and sampling is not Sampling.PRIORITIZED:
            rows.append(["Conduit, best schedule", *(_cell(d.best_conduit(op), True) for d in result.dims)])
    return rows


RATIO_TITLE = (
    "Ratios of median times (a/b; vs a bound lower is better, 1.0 = the bound; vs a peer higher = Conduit faster)"
)


def _transitions(n: int) -> str:
    return "1 transition" if n == 1 else f"{n:,} transitions"


def micro_tables(result: MicroResult) -> list[TableData]:
    dims = [f"dim {d.dim:,}" for d in result.dims]
    caps = ", ".join(f"{d.dim:,}: {d.capacity:,}" for d in result.dims)
    s = result.settings
    notes = [f"capacity per storage (dim: rows): {caps}"]
    notes += [d.capacity_note for d in result.dims if d.capacity_note]
    missing = {(m.name, m.reason) for d in result.dims for m in d.missing}
    notes += [f"missing: {name} — {reason}" for name, reason in sorted(missing)]
    spreads = sorted((c.stat.high / c.stat.low, c.name, d.dim) for d in result.dims for c in d.cases if c.stat.low > 0)
    if spreads:
        worst = spreads[-1]
        notes.append(
            f"spread over the {s.repeats} repeats (max/min per case): median {spreads[len(spreads) // 2][0]:.2f}, "
            f"worst {worst[0]:.2f} ({worst[1]}, dim {worst[2]:,})"
        )
    tables = [
        TableData(
            f"Ingestion: extend by {_transitions(s.chunk)} (median time per chunk · throughput)",
            ["peer", *dims],
            _case_rows(result, Op.INGEST, Sampling.NONE),
            notes,
        ),
        TableData(
            f"Delivery, uniform: a training batch of {s.batch} (median time per batch · throughput)",
            ["peer", *dims],
            _case_rows(result, Op.DELIVER, Sampling.UNIFORM),
        ),
        TableData(
            f"Prioritized: extend by {_transitions(s.chunk)} / sample {s.batch}",
            ["peer", *dims],
            _case_rows(result, Op.INGEST, Sampling.PRIORITIZED) + _case_rows(result, Op.DELIVER, Sampling.PRIORITIZED),
        ),
    ]
    keys = list(micro_ratios(result.dims[0])) if result.dims else []
    ratios = [micro_ratios(d) for d in result.dims]
    tables.append(
        TableData(
            RATIO_TITLE,
            ["ratio", *dims],
            [[k, *(fmt_ratio(r[k]) for r in ratios)] for k in keys],
        )
    )
    targets = micro_targets(result)
    rows = []
    for question, name, key, threshold, at_most in MICRO_TARGETS:
        ts = [t for t in targets if t.detail == key and t.name == name]
        rows.append(
            [
                question,
                name,
                f"{key} {'≤' if at_most else '≥'} {threshold:g}",
                *(f"{fmt_ratio(t.value)} {t.verdict}" for t in ts),
            ]
        )
    title = "Targets"
    if (s.chunk, s.batch) != TARGET_SHAPE:
        title += (
            f" (set for chunks of {TARGET_SHAPE[0]} and batches of {TARGET_SHAPE[1]}; "
            f"this run's chunks of {s.chunk:,} and batches of {s.batch:,} read them for reference only)"
        )
    tables.append(TableData(title, ["question", "target", "criterion", *dims], rows))
    return tables


def to_markdown(table: TableData, level: int = 4) -> str:
    lines = [f"{'#' * level} {table.title}", ""]
    lines.append("| " + " | ".join(table.columns) + " |")
    lines.append("|" + "|".join("---" for _ in table.columns) + "|")
    for row in table.rows:
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    for note in table.notes:
        lines.append("")
        lines.append(f"_{note}_")
    lines.append("")
    return "\n".join(lines)
