"""The Markdown behind BENCHMARKS.md: every table of one ``conduit bench all`` run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from benchmarks.report import micro_tables, to_markdown
from benchmarks.report_loop import loop_tables

if TYPE_CHECKING:
    from benchmarks.loop_results import SyntheticResult
    from benchmarks.micro import MicroResult

__all__ = ["machine_line", "markdown_document"]


def machine_line(micro: MicroResult) -> str:
    m = micro.machine
    load = (m.get("load_avg") or [float("nan")])[0]
    memcpy = "–" if micro.memcpy_gbps is None else f"{micro.memcpy_gbps:.1f}"
    return (
        f"Machine: {m.get('nproc')} CPUs ({m.get('cpu_model')}), torch {m.get('torch')}, torch threads "
        f"{micro.settings.threads}, memcpy {memcpy} GB/s (one 128 MiB copy); "
        f"1-minute load average at the start: {load:.1f}"
    )


def markdown_document(micro: MicroResult | None, synthetic: SyntheticResult | None) -> str:
    """``## Micro-benchmarks`` and ``## Synthetic loop`` sections, tables in the order the CLI prints them."""
    parts = []
    if micro is not None:
        parts.append("## Micro-benchmarks\n\n" + machine_line(micro) + "\n\n")
        parts += [to_markdown(t) + "\n" for t in micro_tables(micro)]
    if synthetic is not None:
        parts.append("## Synthetic loop\n\n")
        parts += [to_markdown(t) + "\n" for t in loop_tables(synthetic)]
    return "".join(parts)
