"""Figures of the benchmark results.

matplotlib earns its place only here, and only from the optional ``bench``
extra: it is imported when a plot is asked for, with the Agg backend (no
display needed), and a clear error names the extra when it is missing.
Figures are sized to stay small enough to commit (a few tens of KB).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.peers import INSTALL_HINT, Op, Role, Sampling

if TYPE_CHECKING:
    from benchmarks.loop_results import SyntheticResult
    from benchmarks.micro import CaseResult, DimResult, MicroResult

__all__ = ["MissingExtra", "plot_micro", "plot_synthetic", "require_matplotlib"]


class MissingExtra(ImportError):
    """An optional dependency of the benchmarks is not installed."""


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or :class:`MissingExtra` saying what to install."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingExtra(f"--plot needs matplotlib: {INSTALL_HINT}") from exc
    return plt


#: one colour per peer in every panel (Conduit in blues, bounds in greys)
COLORS = {
    "Conduit push (inline g=1)": "#1f4e9c",
    "Conduit pull (inline g=1)": "#1f4e9c",
    "Conduit, best schedule": "#4f8fdc",
    "Conduit gather op": "#9cc3f0",
    "torch slice copy": "#555555",
    "torch index_select": "#555555",
    "memcpy bound": "#aaaaaa",
    "numpy ring": "#2ca02c",
    "cpprb": "#ff7f0e",
    "TorchRL": "#d62728",
    "TorchRL prefetch": "#f2a0a0",
}


def _series(d: DimResult, op: Op) -> list[tuple[str, CaseResult | None]]:
    if op is Op.INGEST:
        return [
            ("Conduit push (inline g=1)", d.find(op, Role.CONDUIT)),
            ("Conduit, best schedule", d.best_conduit(op)),
            ("torch slice copy", d.find(op, Role.SLICE_COPY)),
            ("numpy ring", d.find(op, Role.NUMPY)),
            ("cpprb", d.find(op, Role.CPPRB)),
            ("TorchRL", d.find(op, Role.TORCHRL)),
        ]
    return [
        ("Conduit pull (inline g=1)", d.find(op, Role.CONDUIT)),
        ("Conduit, best schedule", d.best_conduit(op)),
        ("Conduit gather op", d.find(op, Role.CONDUIT_GATHER, Sampling.UNIFORM)),
        ("torch index_select", d.find(op, Role.INDEX_SELECT)),
        ("memcpy bound", d.find(op, Role.MEMCPY)),
        ("numpy ring", d.find(op, Role.NUMPY)),
        ("cpprb", d.find(op, Role.CPPRB)),
        ("TorchRL", d.find(op, Role.TORCHRL)),
        ("TorchRL prefetch", d.find(op, Role.TORCHRL_PREFETCH)),
    ]


def _bars(ax: Any, groups: list[str], series: dict[str, list[float]], ylabel: str, title: str) -> None:
    n = max(1, len(series))
    width = 0.8 / n
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=label, color=COLORS.get(label))
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)


def plot_micro(result: MicroResult, path: str | Path) -> Path:
    """Ingestion and uniform delivery throughput (GB/s) per peer and dimension."""
    plt = require_matplotlib()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), dpi=80)
    groups = [f"dim {d.dim:,}" for d in result.dims]
    for ax, op, title in (
        (axes[0], Op.INGEST, f"Ingestion: extend by {result.settings.chunk}"),
        (axes[1], Op.DELIVER, f"Delivery: uniform batch of {result.settings.batch}"),
    ):
        series: dict[str, list[float]] = {}
        for d in result.dims:
            for label, case in _series(d, op):
                series.setdefault(label, []).append(case.gbps if case is not None else 0.0)
        _bars(ax, groups, series, "GB/s (higher is better)", title)
        ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)
    threads = result.machine.get("torch_threads")
    fig.suptitle(f"conduit bench micro — {result.machine.get('cpu_model')}, torch threads {threads}", fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_synthetic(result: SyntheticResult, path: str | Path) -> Path:
    """Exposed experience-path latency per configuration, one panel per (policy, cost kind)."""
    plt = require_matplotlib()
    panels: dict[Any, list[Any]] = {}
    for w in result.workloads:
        panels.setdefault((w.workload.policy, w.workload.cost), []).append(w)
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.2 * max(1, len(panels)), 4.4), dpi=80, squeeze=False)
    for ax, ((policy, cost), ws) in zip(axes[0], panels.items()):
        groups = [f"{w.workload.dim:,}" for w in ws]
        series: dict[str, list[float]] = {}
        for w in ws:
            for c in w.configs:
                if c.unavailable is None and c.exposed is not None:
                    series.setdefault(c.name.split(" (")[0], []).append(max(0.0, c.exposed * 1e3))
        series = {k: v for k, v in series.items() if len(v) == len(ws)}
        cost_label = "update burns CPU" if cost.value == "compute" else "update releases CPU"
        _bars(ax, groups, series, "exposed ms (lower is better)", f"{policy.value}, {cost_label}")
        ax.set_xlabel("transition dimension")
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    fig.suptitle("conduit bench synthetic — exposed experience-path latency", fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out
