"""The profiler: measures the costs the scheduler's model needs (paper §6.3).

- ``T_ing(g)`` / ``T_del(g)``: the wall time of one invocation of the real
  ingestion / delivery graph (the registered hooks included) at each feasible
  granularity, on data of the real experience spec, in a scratch runtime on the
  chosen storage; warm-up, repeats, medians.
- ``T_rollout`` / ``T_update``: supplied, or measured from the loop alone.
- ``T_sync``: what overlapping a path costs beyond the work it hides —
  hand-off and, on a CPU, contention with the compute it overlaps. It is
  calibrated from short runs of the real loop: all-inline, then each path
  overlapped at ``g = 1`` (or the smallest fraction on-policy); the difference
  between measured and modeled-without-sync time is ``T_sync``. The all-inline
  run also calibrates ``t_other``, the loop's own per-iteration bookkeeping.
  ``T_sync`` is per invocation (see :mod:`conduit.scheduling.model`): the
  probe's excess divided by the invocations it ran per iteration.
- **Verification**: the model ranks every feasible schedule, but on a loaded
  machine schedules within a few percent of each other are inside the noise of
  any one estimate. :func:`verify` runs the model's few best on the real loop,
  interleaved, and the plan is the fastest measured of them: the model prunes
  dozens of candidates to a handful, measurement settles the rest.

Everything is bounded: a handful of invocations per granularity and a few dozen
loop iterations per calibration run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import torch

from conduit.config import ConduitConfig
from conduit.hooks import HookRegistry
from conduit.runtime import Conduit
from conduit.scheduling.model import Costs, Prediction, predict, rank
from conduit.scheduling.space import Mode, Policy, Schedule, feasible_schedules
from conduit.storage.policy import StoragePolicy
from conduit.synthetic import SyntheticWorkload, run_loop, standalone_costs

__all__ = [
    "ProfileResult",
    "ProfileSettings",
    "calibrate",
    "fit_sync",
    "measure_delivery",
    "measure_ingestion",
    "probe_schedules",
    "profile_workload",
    "shortlist",
    "verify",
]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ProfileSettings:
    warmup: int = 2
    repeats: int = 7
    loop_iterations: int = 20
    loop_warmup: int = 4
    verify_top: int = 3  # the model's best this many are measured on the loop (0: trust the model)
    verify_rounds: int = 3
    scratch_bytes: int = 256 << 20  # scratch replay buffers hold at most this much


@dataclass(frozen=True)
class ProfileResult:
    costs: Costs
    calibration: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    #: every feasible schedule under the fitted model, best first
    ranked: list[Prediction] = field(default_factory=list)
    #: measured median T_iter of the model's shortlist (empty when verification is off)
    verified: dict[Schedule, float] = field(default_factory=dict)

    @property
    def model_choice(self) -> Prediction:
        """Eq. 2's answer: the model's minimum."""
        return self.ranked[0]

    @property
    def choice(self) -> Prediction:
        """The plan: the fastest measured of the shortlist, else the model's minimum."""
        if not self.verified:
            return self.ranked[0]
        best = min(self.verified, key=lambda s: self.verified[s])
        return next(p for p in self.ranked if p.schedule == best)


def _scratch_config(
    cfg: ConduitConfig, bytes_per_sample: int, settings: ProfileSettings, need_rows: int
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
    settings: ProfileSettings = ProfileSettings(),
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
        with Conduit(scfg, schedule=Schedule(ing, dlv), registry=_copy(registry), storage=storage) as edp:
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
    settings: ProfileSettings = ProfileSettings(),
) -> dict[Fraction, float]:
    """Median wall time of one delivery invocation at each granularity."""
    out: dict[Fraction, float] = {}
    bps = sum(int(v[0].numel() * v.element_size()) for v in pool[0].values())
    for g in granularities:
        scfg = _scratch_config(cfg, bps, settings, 0)
        dlv = Mode(g < 1, g)
        schedule = Schedule(Mode(False, Fraction(1)), dlv)
        with Conduit(scfg, schedule=schedule, registry=_copy(registry), storage=storage) as edp:
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


def _copy(registry: HookRegistry | None) -> HookRegistry | None:
    """A fresh registry with the same hooks (a started runtime freezes its registry)."""
    if registry is None:
        return None
    fresh = HookRegistry()
    fresh._hooks = dict(registry._hooks)
    return fresh


def probe_schedules(policy: Policy, num_minibatches: int) -> dict[str, Schedule]:
    """The short runs that calibrate ``t_other`` and ``T_sync``: all inline, then each path overlapped."""
    one = Fraction(1)
    base = Schedule(Mode(False, one), Mode(False, one))
    probes = {"base": base}
    if policy is Policy.OFF_POLICY:
        probes["ingestion"] = Schedule(Mode(True, one), Mode(False, one))
        probes["delivery"] = Schedule(Mode(False, one), Mode(True, one))
    elif num_minibatches > 1:
        frac = Fraction(1, num_minibatches)
        probes["ingestion"] = Schedule(Mode(True, frac), Mode(False, one))
        probes["delivery"] = Schedule(Mode(False, one), Mode(True, frac))
    return probes


def fit_sync(costs: Costs, measured: dict[str, float], probes: dict[str, Schedule]) -> Costs:
    """``t_other`` from the all-inline run, ``T_sync`` per path and invocation from its overlapped probe (pure)."""
    bare = replace(costs, t_other=0.0, t_sync_ing=0.0, t_sync_del=0.0)  # refitting starts from scratch
    base = replace(bare, t_other=measured["base"] - predict(bare, probes["base"]).t_iter)
    sync = {}
    for path in ("ingestion", "delivery"):
        if path in measured:
            probe = probes[path]
            n = (
                base.ingestion_invocations(probe.ingestion.granularity)
                if path == "ingestion"
                else base.delivery_invocations(probe.delivery.granularity)
            )
            sync[path] = (measured[path] - predict(base, probe).t_iter) / n
    return replace(base, t_sync_ing=sync.get("ingestion", 0.0), t_sync_del=sync.get("delivery", 0.0))


def calibrate(
    workload: SyntheticWorkload,
    costs: Costs,
    settings: ProfileSettings = ProfileSettings(),
    progress: Progress | None = None,
) -> tuple[Costs, dict[str, float]]:
    """Fit ``t_other`` and ``T_sync`` per path from short runs of the synthetic loop."""
    pool = workload.units()
    probes = probe_schedules(workload.policy, workload.num_minibatches)
    measured = {}
    for name, schedule in probes.items():
        if progress:
            progress(f"calibrating {schedule}")
        measured[name] = run_loop(workload, schedule, settings.loop_iterations, settings.loop_warmup, pool=pool).median
    fitted = fit_sync(costs, measured, probes)
    return fitted, {f"t_iter_{k}": v for k, v in measured.items()} | {"t_other": fitted.t_other}


def profile_workload(
    workload: SyntheticWorkload,
    *,
    settings: ProfileSettings = ProfileSettings(),
    g_max: int = 4,
    progress: Progress | None = None,
) -> ProfileResult:
    """Profile the synthetic workload end to end: rollout/update, T_ing(g), T_del(g), T_sync."""
    t0 = time.perf_counter()
    cfg = workload.config(g_max=g_max)
    pool = workload.units()
    if progress:
        progress("rollout and update alone")
    t_rollout, t_update = standalone_costs(workload)
    if progress:
        progress("ingestion granularities")
    t_ing = measure_ingestion(cfg, pool, cfg.ingestion_space, settings=settings)
    if progress:
        progress("delivery granularities")
    t_del = measure_delivery(cfg, pool, cfg.delivery_space, settings=settings)
    costs = Costs(
        policy=workload.policy, t_rollout=t_rollout, t_update=t_update, t_ing=t_ing, t_del=t_del,
        units_per_iteration=workload.units_per_iteration, num_minibatches=workload.num_minibatches,
        num_epochs=workload.num_epochs,
    )
    costs, calib = calibrate(workload, costs, settings, progress)
    ranked = rank(costs, feasible_schedules(cfg.policy, cfg.num_minibatches, g_max, g_max))
    top = shortlist(ranked, settings.verify_top)
    verified = verify(workload, top, settings=settings, progress=progress, pool=pool) if len(top) > 1 else {}
    return ProfileResult(costs, calib, time.perf_counter() - t0, ranked, verified)


def shortlist(ranked: Sequence[Prediction], top: int) -> list[Schedule]:
    """The model's ``top`` best schedules (pure; ``ranked`` best first)."""
    return [p.schedule for p in ranked[: max(0, top)]]


def verify(
    workload: SyntheticWorkload,
    schedules: Sequence[Schedule],
    *,
    settings: ProfileSettings = ProfileSettings(),
    progress: Progress | None = None,
    pool: list[dict[str, torch.Tensor]] | None = None,
) -> dict[Schedule, float]:
    """Median ``T_iter`` of each schedule on the real loop, ``verify_rounds`` interleaved rounds.

    The order alternates from round to round so slow drift of the machine
    (a neighbour's job starting) does not favour whichever runs first.
    """
    pool = workload.units() if pool is None else pool
    samples: dict[Schedule, list[float]] = {s: [] for s in schedules}
    for r in range(settings.verify_rounds):
        for s in schedules if r % 2 == 0 else list(reversed(schedules)):
            if progress:
                progress(f"verifying {s}")
            samples[s].append(run_loop(workload, s, settings.loop_iterations, settings.loop_warmup, pool=pool).median)
    return {s: statistics.median(v) for s, v in samples.items() if v}
