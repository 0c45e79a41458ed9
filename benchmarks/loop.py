"""``conduit bench synthetic``: the paper's synthetic stress test, every configuration through one loop.

Each workload (policy, cost kind, transition dimension, batch size) is
profiled once and Conduit's plan is chosen as ``conduit profile`` chooses it
(profile -> rank by the cost model -> verify the model's shortlist on the loop); then every configuration runs the same
actor/learner loop (:func:`conduit.scheduling.workload.run_loop`) in interleaved repeats:

- **inline** — an RLlib-style buffer: ingest right after rollout, sample right
  before update, pageable CPU (``inline g=1`` on both paths), a fresh batch
  per sample (RLlib's buffers concatenate into new arrays), every on-policy
  mini-batch gathered (RLlib's mini-batch iterator: ``presort=False``);
- **Reverb-style** — request-driven, pageable CPU, fresh batches: inline ``g=1`` with one
  extra copy of every inserted unit and every sampled batch (the serialize /
  deserialize hop of a buffer server). A lower bound: real Reverb adds gRPC
  and protobuf time on top (30-50 ms per sample on this class of machine,
  docs/design.md §7);
- **GEAR-style** — inline ``g=1`` on pinned host memory (needs CUDA);
- **inline, Conduit's batch memory** — the inline schedule with Conduit's
  default batch memory (dropped batches recycled; on-policy, the store laid
  out in mini-batch order and the last epoch's mini-batches handed out as
  views): the memory's share of the cut, apart from the schedule's;
- **overlap g=1** — both paths overlapped at the smallest granularity (the
  paper's Fig. 14 "Conduit with overlap");
- **fixed placement p** — Conduit's schedule on each placement this machine
  has other than the one the planner picked;
- **Conduit auto** — the planner's placement and the cost model's schedule.

Exposed experience-path latency is ``T_iter - T_rollout - T_update`` with the
rollout and update costs measured alone (``standalone_costs``) right before and
right after each run (:func:`~conduit.scheduling.workload.bracketed_exposed`: the
host's speed moves within seconds), the median over a configuration's runs.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import torch

from benchmarks.loop_results import (
    ConfigResult,
    LoopConfig,
    SyntheticResult,
    SyntheticSettings,
    WorkloadResult,
    workloads,
)
from benchmarks.timing import torch_threads
from conduit.config import ConduitConfig
from conduit.core import Mode, Policy, Schedule
from conduit.runtime import Conduit
from conduit.scheduling.model import predict
from conduit.scheduling.profiler import ProfileSettings, profile_workload
from conduit.scheduling.workload import (
    Burner,
    CostKind,
    SyntheticWorkload,
    bracketed_exposed,
    run_loop,
    standalone_costs,
)
from conduit.storage import FixedStorage, StoragePolicy
from conduit.trace import Tracer

# the settings and result records live in benchmarks.loop_results
__all__ = [
    "auto_storage",
    "run_synthetic",
    "run_workload",
]

Progress = Callable[[int, int, str], None]

#: repeats of each alone measurement of rollout and update (one before every run and one after)
ALONE_REPEATS = 9


def auto_storage() -> tuple[StoragePolicy, str]:
    """The planner's storage policy for this machine (falls back to pageable CPU, saying why)."""
    try:
        from conduit.placement import PlacementPolicy

        return PlacementPolicy.for_this_machine(), "planner"
    except Exception as exc:  # the planner is optional for this benchmark
        return FixedStorage("cpu"), f"cpu (planner unavailable: {type(exc).__name__}: {exc})"


def _placements() -> list[str]:
    if not torch.cuda.is_available():
        return ["cpu"]
    return ["cpu", "pinned", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]


def _overlap_schedule(w: SyntheticWorkload) -> Schedule:
    g = Fraction(1) if w.policy is Policy.OFF_POLICY else Fraction(1, w.num_minibatches)
    return Schedule(Mode(True, g), Mode(True, g))


def build_configs(
    w: SyntheticWorkload, chosen: Schedule, auto_placement: str
) -> tuple[list[LoopConfig], list[ConfigResult]]:
    """The configurations to run, and those this machine cannot run (with the reason)."""
    one = Mode(False, 1)
    inline = Schedule(one, one)
    run = [
        LoopConfig("inline (RLlib-style)", "inline", "cpu", inline, fresh_batches=True),
        LoopConfig(
            "Reverb-style (request-driven, +copy hop)", "reverb", "cpu", inline, copy_hop=True, fresh_batches=True
        ),
    ]
    unavailable = []
    if torch.cuda.is_available():
        run.append(LoopConfig("GEAR-style (pinned CPU)", "gear", "pinned", inline))
    else:
        unavailable.append(
            ConfigResult(
                "GEAR-style (pinned CPU)",
                "gear",
                "pinned",
                inline,
                unavailable="pinned host memory needs CUDA; this machine has none",
            )
        )
    # the inline schedule with Conduit's batch memory: the memory's share of the cut, apart from the schedule's
    run.append(LoopConfig("inline, Conduit's batch memory", "inline_recycled", "cpu", inline))
    run.append(LoopConfig(f"overlap ({_overlap_schedule(w).delivery})", "overlap", "cpu", _overlap_schedule(w)))
    for p in _placements():
        if p != auto_placement:
            run.append(LoopConfig(f"fixed {p} + Conduit schedule", "placement", p, chosen))
    run.append(LoopConfig("Conduit auto", "auto", auto_placement, chosen, auto_placement=True))
    return run, unavailable


def _touch(batch: Any) -> None:
    """What every learner does first: read the batch (as ``conduit.scheduling.workload`` does)."""
    for v in batch.values():
        if v.dtype.is_floating_point:
            v.sum()


def loop_callables(w: SyntheticWorkload, tracer: Tracer | None) -> tuple[Callable[[], None], Callable[[Any], None]]:
    """Rollout and update of the workload, recorded as ``loop`` spans when tracing."""
    burner = Burner(w.cost)

    def rollout() -> None:
        burner.burn(w.rollout_ms)

    def update(batch: Any) -> None:
        burner.burn(w.update_ms)
        _touch(batch)

    if tracer is None or not tracer.enabled:
        return rollout, update

    def traced_rollout() -> None:
        with tracer.span("rollout", cat="loop"):
            rollout()

    def traced_update(batch: Any) -> None:
        with tracer.span("update", cat="loop", rows=len(next(iter(batch.values())))):
            update(batch)

    return traced_rollout, traced_update


def _copy_hop(edp: Conduit) -> None:
    """Reverb-style: a serialize/deserialize copy on insert and on sample (registered hooks)."""

    @edp.register_ingestion(input="Actor", output="ExperienceBuffer")
    def _insert(actor_in: Any, exp_out: Any) -> None:
        exp_out.write({k: v.clone() for k, v in actor_in.read().items()})

    @edp.register_delivery(input="ExperienceBuffer", output="Learner")
    def _sample(exp_in: Any, learn_out: Any) -> None:
        learn_out.write({k: v.clone() for k, v in exp_in.read().items()})


def runtime_factory(
    c: LoopConfig, auto: StoragePolicy, tracer: Tracer | None
) -> Callable[[ConduitConfig, Schedule], Conduit]:
    learner = "cuda:0" if torch.cuda.is_available() else "cpu"

    def make(cfg: ConduitConfig, schedule: Schedule) -> Conduit:
        update: dict[str, Any] = {"learner_device": learner}
        if c.fresh_batches:  # a fresh batch per sample, every mini-batch gathered: what the baselines do
            update["tuning"] = cfg.tuning.model_copy(update={"recycle_batches": False, "presort": False})
        cfg = cfg.model_copy(update=update).pinned_to(schedule)
        storage = auto if c.auto_placement else FixedStorage(c.placement)
        edp = Conduit(cfg, storage=storage, tracer=tracer or Tracer(enabled=False))
        if c.copy_hop:
            _copy_hop(edp)
        return edp

    return make


def run_config(
    w: SyntheticWorkload,
    c: LoopConfig,
    settings: SyntheticSettings,
    auto: StoragePolicy,
    pool: list[dict[str, torch.Tensor]],
    tracer: Tracer | None = None,
    iterations: int | None = None,
) -> float:
    """Steady time per iteration of one run of the loop under ``c`` (whole periods of its schedule)."""
    rollout, update = loop_callables(w, tracer)
    res = run_loop(
        w,
        c.schedule,
        iterations or settings.iterations,
        settings.warmup,
        rollout=rollout,
        update=update,
        runtime_factory=runtime_factory(c, auto, tracer),
        pool=pool,
    )
    gc.collect()  # a closed runtime's buffer sits in reference cycles: free its storage before the next run
    return res.steady


def run_workload(
    w: SyntheticWorkload,
    settings: SyntheticSettings,
    *,
    auto: StoragePolicy | None = None,
    auto_placement: str = "cpu",
    progress: Callable[[str], None] | None = None,
    tracer: Tracer | None = None,
) -> WorkloadResult:
    """Profile, plan, then run every configuration in interleaved repeats."""
    t0 = time.perf_counter()
    say = progress or (lambda _m: None)
    auto = auto or FixedStorage("cpu")
    if w.cost is CostKind.COMPUTE:
        Burner.recalibrate()  # the host's speed has moved since the last workload's calibration
    say("profiling")
    thorough = ProfileSettings.thorough()  # as `conduit bench validate` plans
    prof = profile_workload(w, settings=thorough, g_max=settings.g_max)
    chosen = prof.choice  # the model's shortlist, verified on the loop (as conduit profile plans)
    configs, unavailable = build_configs(w, chosen.schedule, auto_placement)
    pool = w.units()
    runs: list[tuple[str, float]] = []  # in the order they ran
    alone: list[tuple[float, float]] = [standalone_costs(w, ALONE_REPEATS)]  # before the first run, after each
    for r in range(settings.repeats):
        k = r % len(configs)
        for c in configs[k:] + configs[:k]:
            say(f"repeat {r + 1}/{settings.repeats}: {c.name}")
            runs.append((c.name, run_config(w, c, settings, auto, pool)))
            alone.append(standalone_costs(w, ALONE_REPEATS))
    t_r = statistics.median(a for a, _ in alone)
    t_u = statistics.median(b for _, b in alone)
    sums = [a + b for a, b in alone]
    result = WorkloadResult(w, t_r, t_u, chosen, run_order=tuple(name for name, _ in runs), alone=tuple(sums))
    exposed = bracketed_exposed(runs, sums)
    inline_exposed = statistics.median(exposed[configs[0].name])
    for c in configs:
        samples = tuple(t for name, t in runs if name == c.name)
        e = statistics.median(exposed[c.name])
        result.configs.append(
            ConfigResult(
                c.name,
                c.kind,
                c.placement,
                c.schedule,
                statistics.median(samples),
                e,
                1 - e / inline_exposed if inline_exposed > 0 else None,
                predict(prof.costs, c.schedule).exposed if not c.copy_hop else None,
                samples,
                tuple(exposed[c.name]),
            )
        )
    result.configs.extend(unavailable)
    if tracer is not None:
        for c in configs:
            with tracer.span(c.name, cat="bench", schedule=str(c.schedule), placement=c.placement):
                run_config(w, c, settings, auto, pool, tracer=tracer, iterations=8)
    result.seconds = time.perf_counter() - t0
    return result


def run_synthetic(
    settings: SyntheticSettings = SyntheticSettings(),
    *,
    progress: Progress | None = None,
    tracer: Tracer | None = None,
) -> SyntheticResult:
    from benchmarks.machine import machine_info

    t0 = time.perf_counter()
    with torch_threads(settings.threads):
        result = SyntheticResult(settings, machine_info())
        auto, how = auto_storage()
        # without CUDA the planner's only candidate is pageable CPU; with it, the planner decides
        auto_placement = "planner" if torch.cuda.is_available() and how == "planner" else "cpu"
        result.machine["auto_placement"] = how
        result.machine["placements"] = _placements()
        ws = workloads(settings)
        for i, w in enumerate(ws):
            label = f"{w.policy.value} {w.cost.value} dim {w.dim:,} batch {w.train_batch_size}"

            def say(msg: str, i: int = i, label: str = label) -> None:
                if progress is not None:
                    progress(i, len(ws), f"{label}: {msg}")

            result.workloads.append(
                run_workload(
                    w,
                    settings,
                    auto=auto,
                    auto_placement=auto_placement,
                    progress=say,
                    tracer=tracer if i == 0 else None,
                )
            )
            if progress is not None:
                progress(i + 1, len(ws), f"{label}: done")
    result.seconds = time.perf_counter() - t0
    return result
