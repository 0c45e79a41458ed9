"""Invocation costs of the real graphs: ``T_ing(g)`` and ``T_del(g)`` on scratch runtimes (paper §6.3).

Each granularity's invocations run on a scratch runtime of the same configuration,
hooks and storage as the one being planned, fed units of the real experience spec;
a few warm-up invocations, then the median of the rest. The automatic planner
measures its live runtime's graphs this way, and ``conduit profile`` the stand-in
loop's.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch

from conduit.config import ConduitConfig
from conduit.core import Mode, Policy, Schedule
from conduit.hooks import HookRegistry
from conduit.runtime import Conduit
from conduit.storage.policy import StoragePolicy

__all__ = ["MeasureSettings", "measure_delivery", "measure_ingestion"]


@dataclass(frozen=True)
class MeasureSettings:
    warmup: int = 2  # invocations dropped before timing
    repeats: int = 7  # invocations timed (the median is the cost)
    scratch_bytes: int = 256 << 20  # scratch replay buffers hold at most this much

def _scratch_config(
    cfg: ConduitConfig, bytes_per_sample: int, settings: MeasureSettings, need_rows: int
) -> ConduitConfig:
    if cfg.policy is Policy.ON_POLICY:
        return cfg.model_copy(update={"timeout_s": 60.0})
    assert cfg.capacity is not None
    rows = max(need_rows, min(cfg.capacity, settings.scratch_bytes // max(1, bytes_per_sample)))
    rows = max(rows, cfg.train_batch_size * cfg.g_max)
    return cfg.model_copy(update={"capacity": rows, "min_size_to_sample": None, "timeout_s": 60.0})


def _timings(graph: Any, skip: int) -> float:
    times = [t for t, _ in list(graph.timings)[skip:]]
    if not times:
        raise RuntimeError(f"the {graph.name} graph recorded no invocations to time")
    return statistics.median(times)


def measure_ingestion(
    cfg: ConduitConfig,
    pool: Sequence[dict[str, torch.Tensor]],
    granularities: Sequence[Fraction],
    *,
    registry: HookRegistry | None = None,
    storage: StoragePolicy | None = None,
    settings: MeasureSettings = MeasureSettings(),
) -> dict[Fraction, float]:
    """Median wall time of one ingestion invocation at each granularity."""
    out: dict[Fraction, float] = {}
    unit_rows = int(next(iter(pool[0].values())).shape[0])
    bps = sum(int(v[0].numel() * v.element_size()) for v in pool[0].values())
    for g in granularities:
        invocations = settings.warmup + settings.repeats
        units = invocations * int(g) if g >= 1 else -(-invocations * g.numerator // g.denominator)
        scfg = _scratch_config(cfg, bps, settings, units * unit_rows)
        ing = Mode(g < 1, g)
        dlv = Mode(False, Fraction(1))
        hooks = registry.copy() if registry is not None else None
        with Conduit(scfg.pinned_to(Schedule(ing, dlv)), registry=hooks, storage=storage) as edp:
            for k in range(units):
                edp.push(pool[k % len(pool)])
                if cfg.policy is Policy.ON_POLICY and edp.ready():
                    for _ in edp.minibatches():
                        pass
            edp.flush()
            assert edp.ingestion is not None
            out[g] = _timings(edp.ingestion.graph, settings.warmup)
    return out


def measure_delivery(
    cfg: ConduitConfig,
    pool: Sequence[dict[str, torch.Tensor]],
    granularities: Sequence[Fraction],
    *,
    registry: HookRegistry | None = None,
    storage: StoragePolicy | None = None,
    settings: MeasureSettings = MeasureSettings(),
) -> dict[Fraction, float]:
    """Median wall time of one delivery invocation at each granularity."""
    out: dict[Fraction, float] = {}
    bps = sum(int(v[0].numel() * v.element_size()) for v in pool[0].values())
    for g in granularities:
        scfg = _scratch_config(cfg, bps, settings, 0)
        dlv = Mode(g < 1, g)
        schedule = Schedule(Mode(False, Fraction(1)), dlv)
        hooks = registry.copy() if registry is not None else None
        with Conduit(scfg.pinned_to(schedule), registry=hooks, storage=storage) as edp:
            invocations = settings.warmup + settings.repeats
            if cfg.policy is Policy.OFF_POLICY:
                assert scfg.capacity is not None
                k = 0
                while edp.stats().ingested_rows < scfg.capacity:
                    edp.push(pool[k % len(pool)])
                    k += 1
                for _ in range(invocations * int(g)):
                    edp.pull()
            else:
                k = 0
                assert edp.delivery is not None
                while edp.delivery.graph.invocations < invocations:
                    while not edp.ready():
                        edp.push(pool[k % len(pool)])
                        k += 1
                    for _ in edp.minibatches():
                        pass
            assert edp.delivery is not None
            out[g] = _timings(edp.delivery.graph, settings.warmup)
    return out

