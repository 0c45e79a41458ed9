"""Settings and results of the synthetic loop benchmark: plain records, JSON-ready.

Kept apart from :mod:`benchmarks.loop`, which runs the loop, so reports and
tests can build and read results without running anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conduit.core import Policy, Schedule
from conduit.scheduling.model import Prediction
from conduit.scheduling.workload import CostKind, SyntheticWorkload

__all__ = [
    "ConfigResult",
    "LoopConfig",
    "SyntheticResult",
    "SyntheticSettings",
    "WorkloadResult",
    "workloads",
]


@dataclass(frozen=True)
class SyntheticSettings:
    dims: tuple[int, ...] = (1000, 5000, 10000)
    batch_sizes: tuple[int, ...] = (512,)
    policies: tuple[Policy, ...] = (Policy.OFF_POLICY, Policy.ON_POLICY)
    costs: tuple[CostKind, ...] = (CostKind.COMPUTE, CostKind.SLEEP)
    rollout_ms: float = 2.0
    update_ms: float = 8.0
    unit_size: int = 256
    capacity: int = 20_000
    units_per_iteration: int = 4
    num_minibatches: int = 4
    iterations: int = 15
    warmup: int = 3
    #: 15: at dim 1,000 a run's exposed latency scatters by +-2 ms around a difference of ~1.2 ms between inline and
    #: overlap (the host's speed moves within a run); with 5 the "overlap g=1" row's median cut 0-71% over four runs
    #: (the plan's 44-114%), with 15 77-87% over three, then 4-85% over four more in a noisier hour: fewer repeats
    #: than this leave the median to chance, more would not make this host quiet
    repeats: int = 15
    g_max: int = 4
    seed: int = 0
    #: torch intra-op threads. 1 by default: the learner's compute on one core, the other free for Conduit's
    #: workers; two OpenMP threads next to a worker thread (or a neighbour's job) spin-wait and swamp the signal
    threads: int | None = 1

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            out[k] = [getattr(x, "value", x) for x in v] if isinstance(v, tuple) else v
        return out


def workloads(s: SyntheticSettings) -> list[SyntheticWorkload]:
    """Every workload of the sweep (on-policy ignores the batch size: one iteration is ``U`` units)."""
    out = []
    for policy in s.policies:
        for cost in s.costs:
            for dim in s.dims:
                for batch in s.batch_sizes if policy is Policy.OFF_POLICY else s.batch_sizes[:1]:
                    out.append(
                        SyntheticWorkload(
                            policy=policy,
                            dim=dim,
                            unit_size=s.unit_size,
                            batch_size=batch,
                            capacity=s.capacity,
                            units_per_iteration=s.units_per_iteration,
                            num_minibatches=s.num_minibatches,
                            rollout_ms=s.rollout_ms,
                            update_ms=s.update_ms,
                            cost=cost,
                            seed=s.seed,
                        )
                    )
    return out


@dataclass(frozen=True)
class LoopConfig:
    name: str
    kind: str  # inline | reverb | gear | overlap | placement | auto
    placement: str
    schedule: Schedule
    copy_hop: bool = False
    auto_placement: bool = False
    # a fresh batch per sample, every on-policy mini-batch gathered: as RLlib's and Reverb's buffers hand them out
    fresh_batches: bool = False


@dataclass(frozen=True)
class ConfigResult:
    name: str
    kind: str
    placement: str
    schedule: Schedule | None
    t_iter: float | None = None  # median over repeats of each run's steady time per iteration
    exposed: float | None = None
    reduction: float | None = None  # 1 - exposed / exposed(inline)
    predicted_exposed: float | None = None
    samples: tuple[float, ...] = ()
    exposed_samples: tuple[float, ...] = ()  # per run: its time per iteration less the alone costs around it
    unavailable: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "placement": self.placement,
            "schedule": self.schedule.to_json() if self.schedule else None,
            "t_iter_s": self.t_iter,
            "exposed_s": self.exposed,
            "reduction_vs_inline": self.reduction,
            "predicted_exposed_s": self.predicted_exposed,
            "samples_s": list(self.samples),
            "exposed_samples_s": list(self.exposed_samples),
            "unavailable": self.unavailable,
        }


@dataclass
class WorkloadResult:
    workload: SyntheticWorkload
    t_rollout: float
    t_update: float
    chosen: Prediction
    configs: list[ConfigResult] = field(default_factory=list)
    seconds: float = 0.0
    #: every run's configuration in the order they ran, and rollout + update alone before the first and after each
    #: (so both estimators of exposed latency can be recomputed from the JSON)
    run_order: tuple[str, ...] = ()
    alone: tuple[float, ...] = ()

    def config(self, kind: str) -> ConfigResult | None:
        return next((c for c in self.configs if c.kind == kind and c.unavailable is None), None)

    def to_json(self) -> dict[str, Any]:
        w = self.workload
        return {
            "policy": w.policy.value,
            "cost": w.cost.value,
            "dim": w.dim,
            "batch_size": w.train_batch_size,
            "bytes_per_sample": w.bytes_per_sample,
            "rollout_ms": w.rollout_ms,
            "update_ms": w.update_ms,
            "t_rollout_s": self.t_rollout,
            "t_update_s": self.t_update,
            "chosen": self.chosen.to_json(),
            "configs": [c.to_json() for c in self.configs],
            "run_order": list(self.run_order),
            "alone_s": list(self.alone),
            "seconds": self.seconds,
        }


@dataclass
class SyntheticResult:
    settings: SyntheticSettings
    machine: dict[str, Any]
    workloads: list[WorkloadResult] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The measured records; :func:`benchmarks.report_loop.loop_json` adds the targets."""
        return {
            "settings": self.settings.to_json(),
            "machine": self.machine,
            "seconds": self.seconds,
            "workloads": [w.to_json() for w in self.workloads],
        }
