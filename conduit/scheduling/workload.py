"""The stand-in training loop ``conduit profile`` measures: an actor/learner loop of configurable size and cost.

``conduit profile`` answers "which schedule does this machine want" without a
user's loop, so it needs a loop to run schedules on. This one is kept in the
library on purpose — a plain install must be able to profile — and it is small:
the workload record, a calibrated compute burn, and the loop itself. The
benchmark harness (``benchmarks/``, in a source checkout) builds its comparisons
with Reverb-, GEAR- and RLlib-style buffers on the same loop; the runtime's own
planner (:mod:`conduit.scheduling.auto`) profiles the user's live loop instead.

Transitions are float32 ``obs``/``next_obs`` of a configurable dimension, an
int64 ``action``, a float32 ``reward`` and a bool ``done`` (the paper's synthetic
stress test, after Reverb's). Rollout and update costs are configurable:
``compute`` burns CPU with torch matmuls (a learner update on a CPU competes with
Conduit's workers for the cores) and ``sleep`` releases the CPU the way a GPU
learner or a remote actor would.

Off-policy, each iteration rolls out one unit, pushes it, pulls one batch and
updates on it; on-policy, each iteration rolls out ``U`` units, then updates on
every mini-batch. An iteration's wall time, minus the rollout and update costs
measured alone, is the exposed experience-path latency (docs/design.md §4). Making each
pushed unit unique (:func:`_stamped`) is the loop's own bookkeeping, neither
rollout nor experience path, so its time is left out of every iteration's.

The stand-in actor builds fresh arrays every rollout, so it hands its units over
(``copy_on_push=False``): :func:`run_loop` restamps a unit of its pool only once the
unit has certainly been ingested.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypeVar

import torch

from conduit.config import ConduitConfig
from conduit.core import Policy, Schedule
from conduit.runtime import Conduit
from conduit.scheduling.kinds import DRIFT, CostKind
from conduit.scheduling.steady import period, steady_time
from conduit.spec import ExperienceSpec

__all__ = [
    "DRIFT",
    "Burner",
    "CostKind",
    "LoopResult",
    "SyntheticWorkload",
    "bracketed_exposed",
    "run_loop",
    "standalone_costs",
]

K = TypeVar("K")

class Burner:
    """Spends a calibrated number of milliseconds of torch compute (or sleeps).

    The compute is a chain of ``size x size`` matmuls: op granularity like a
    learner's layers, so the loop hands the GIL back and forth as often as a real
    update does, not every few microseconds.
    """

    _calibration: ClassVar[dict[int, float]] = {}

    def __init__(self, kind: CostKind = CostKind.COMPUTE, size: int = 256) -> None:
        self.kind = kind
        self.size = size
        self._a = torch.randn(size, size)
        self._b = torch.randn(size, size)
        if kind is CostKind.COMPUTE and size not in Burner._calibration:
            Burner._calibration[size] = self._calibrate()

    @classmethod
    def recalibrate(cls, size: int = 256) -> None:
        """Measure a matmul's cost again: a shared host's speed moves within seconds, and a burn calibrated once
        per process drifts from its target for good. A sweep calls this before each workload."""
        cls._calibration.pop(size, None)
        Burner(CostKind.COMPUTE, size)

    def _calibrate(self, window: float = 0.02, windows: int = 7) -> float:
        for _ in range(10):
            torch.mm(self._a, self._b)
        per_op = []
        for _ in range(windows):  # the median window: one hiccup must not skew every later burn
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < window:
                torch.mm(self._a, self._b)
                n += 1
            per_op.append((time.perf_counter() - t0) / n)
        return statistics.median(per_op)

    def burn(self, ms: float) -> None:
        if ms <= 0:
            return
        if self.kind is CostKind.SLEEP:
            time.sleep(ms / 1e3)
            return
        for _ in range(max(1, round(ms / 1e3 / Burner._calibration[self.size]))):
            torch.mm(self._a, self._b)


@dataclass(frozen=True)
class SyntheticWorkload:
    """A DQN-like (off-policy) or PPO-like (on-policy) loop of configurable size and cost."""

    policy: Policy = Policy.OFF_POLICY
    dim: int = 1000
    unit_size: int = 256
    batch_size: int = 512
    capacity: int = 20_000
    units_per_iteration: int = 4
    num_minibatches: int = 4
    num_epochs: int = 1
    rollout_ms: float = 2.0
    update_ms: float = 8.0
    cost: CostKind = CostKind.COMPUTE
    seed: int = 0

    @property
    def spec(self) -> ExperienceSpec:
        return ExperienceSpec.of(
            obs=((self.dim,), "float32"),
            next_obs=((self.dim,), "float32"),
            action=((), "int64"),
            reward=((), "float32"),
            done=((), "bool"),
        )

    @property
    def bytes_per_sample(self) -> int:
        return self.spec.bytes_per_sample

    @property
    def rollouts_per_iteration(self) -> int:
        """Rollout units (pushes) per iteration: one off-policy, ``U`` on-policy."""
        return 1 if self.policy is Policy.OFF_POLICY else self.units_per_iteration

    @property
    def train_batch_size(self) -> int:
        return self.batch_size if self.policy is Policy.OFF_POLICY else self.unit_size * self.units_per_iteration

    def config(self, **overrides: Any) -> ConduitConfig:
        if self.policy is Policy.OFF_POLICY:
            base: dict[str, Any] = dict(
                policy=self.policy, train_batch_size=self.batch_size, capacity=self.capacity,
                rollout_unit_size=self.unit_size, seed=self.seed,
            )
        else:
            base = dict(
                policy=self.policy, train_batch_size=self.train_batch_size, rollout_unit_size=self.unit_size,
                num_minibatches=self.num_minibatches, num_epochs=self.num_epochs, seed=self.seed,
            )
        base["copy_on_push"] = False  # the stand-in actor hands its units over (module docstring)
        base.update(overrides)
        return ConduitConfig(**base)

    def with_(self, **changes: Any) -> SyntheticWorkload:
        return replace(self, **changes)

    def units(self, count: int = 4) -> list[dict[str, torch.Tensor]]:
        """A small pool of random rollout units, reused round-robin (generation is not rollout cost)."""
        g = torch.Generator().manual_seed(self.seed)
        n = self.unit_size
        return [
            {
                "obs": torch.randn(n, self.dim, generator=g),
                "next_obs": torch.randn(n, self.dim, generator=g),
                "action": torch.randint(0, 16, (n,), generator=g),
                "reward": torch.randn(n, generator=g),
                "done": torch.rand(n, generator=g) < 0.01,
            }
            for _ in range(count)
        ]


@dataclass
class LoopResult:
    """Per-iteration timings of one run of the loop (seconds)."""

    schedule: Schedule
    t_iter: list[float] = field(default_factory=list)
    push_s: float = 0.0
    pull_s: float = 0.0
    #: iterations after which the schedule's invocations repeat (:func:`~conduit.scheduling.steady.period`)
    period: int = 1
    #: time spent making pushed units unique (:func:`_stamped`) in the timed iterations, not in ``t_iter``
    stamping_s: float = 0.0

    @property
    def steady(self) -> float:
        """Time per iteration: the median over whole periods of their mean (see :mod:`conduit.scheduling.steady`).

        Not the median iteration: with ``g > 1`` that drops the iterations that do the work.
        """
        return steady_time(self.t_iter, self.period)

    def exposed(self, t_rollout: float, t_update: float) -> float:
        return self.steady - t_rollout - t_update


def _stamped(pool: list[dict[str, torch.Tensor]], k: int) -> dict[str, torch.Tensor]:
    """The pool's next unit with its first observation column set to ``k``: every pushed row differs.

    A ring of byte-identical repeated units gathers far slower on a VM whose host
    merges identical pages; real rollouts never repeat, so neither does this one.
    """
    unit = pool[k % len(pool)]
    unit["obs"][:, 0] = float(k)
    return unit


def _touch(batch: Any) -> None:
    """What every learner does first: read the batch."""
    for v in batch.values():
        if v.dtype.is_floating_point:
            v.sum()


def run_loop(
    workload: SyntheticWorkload,
    schedule: Schedule,
    iterations: int = 30,
    warmup: int = 5,
    *,
    rollout: Callable[[], None] | None = None,
    update: Callable[[Any], None] | None = None,
    runtime_factory: Callable[[ConduitConfig, Schedule], Conduit] | None = None,
    pool: list[dict[str, torch.Tensor]] | None = None,
    tracer: Any = None,
) -> LoopResult:
    """Run the actor/learner loop through a real runtime with ``schedule``.

    ``iterations`` are timed after ``warmup``, rounded up to whole periods of
    the schedule so that :attr:`LoopResult.steady` sees every burst.
    """
    burner = Burner(workload.cost)
    rollout = rollout or (lambda: burner.burn(workload.rollout_ms))
    update_fn = update or (lambda b: (burner.burn(workload.update_ms), _touch(b)))
    pool = pool or workload.units()
    # units are handed over: at most g are pending when the next is stamped, so g + 1 units never touch one
    g = schedule.ingestion.granularity
    need = (int(g) if g >= 1 else 1) + 1
    if len(pool) < need:  # grown in place: callers share one pool across runs, so it is generated once
        pool.extend(workload.with_(seed=workload.seed + 1).units(need - len(pool)))
    cfg = workload.config(timeout_s=120.0)
    edp = runtime_factory(cfg, schedule) if runtime_factory else Conduit(cfg.pinned_to(schedule), tracer=tracer)
    result = LoopResult(schedule, period=period(schedule, workload.policy))
    iterations = -(-max(1, iterations) // result.period) * result.period
    k = 0
    with edp:
        if workload.policy is Policy.OFF_POLICY:
            while edp.stats().ingested_rows < cfg.sample_min:  # prefill: learning starts
                edp.push(_stamped(pool, k))
                edp.flush()
                k += 1
        units = workload.rollouts_per_iteration
        for i in range(warmup + iterations):
            t0 = time.perf_counter()
            stamping = 0.0  # the benchmark's, not the loop's: left out of the iteration's time
            for _ in range(units):
                rollout()
                ts = time.perf_counter()
                unit = _stamped(pool, k)
                stamping += time.perf_counter() - ts
                edp.push(unit)
                k += 1
            if workload.policy is Policy.OFF_POLICY:
                update_fn(edp.pull())
            else:
                for mb in edp.minibatches():
                    update_fn(mb)
            if i >= warmup:
                result.t_iter.append(time.perf_counter() - t0 - stamping)
                result.stamping_s += stamping
        st = edp.stats()
        result.push_s, result.pull_s = st.push_s, st.pull_s
    return result


def standalone_costs(workload: SyntheticWorkload, repeats: int = 15) -> tuple[float, float]:
    """``(T_rollout, T_update)`` per iteration, each measured alone (medians)."""
    burner = Burner(workload.cost)
    rows = (
        workload.batch_size if workload.policy is Policy.OFF_POLICY
        else workload.train_batch_size // workload.num_minibatches
    )
    batch = workload.with_(unit_size=rows).units(1)[0]

    def timed(fn: Callable[[], None]) -> float:
        fn()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    steps = 1 if workload.policy is Policy.OFF_POLICY else workload.num_minibatches * workload.num_epochs
    t_r = timed(lambda: [burner.burn(workload.rollout_ms) for _ in range(workload.rollouts_per_iteration)])
    t_u = timed(lambda: [(burner.burn(workload.update_ms), _touch(batch)) for _ in range(steps)])
    return t_r, t_u


def bracketed_exposed(runs: Sequence[tuple[K, float]], alone: Sequence[float]) -> dict[K, list[float]]:
    """Each run's exposed latency against the rollout + update measured alone right before and right after it.

    ``runs`` are ``(configuration, time per iteration)`` in the order they ran (a configuration is any key) and
    ``alone[i]``, ``alone[i + 1]`` the alone costs measured just before and just
    after run ``i`` (so ``len(alone) == len(runs) + 1``). A shared host's speed moves
    within seconds by more than a compute-bound loop's exposed latency, and alone
    costs taken once per repeat would charge a run made in a slow stretch to the
    experience path.
    """
    if len(alone) != len(runs) + 1:
        raise ValueError(f"{len(runs)} runs need {len(runs) + 1} alone measurements around them, got {len(alone)}")
    out: dict[K, list[float]] = {}
    for i, (name, t) in enumerate(runs):
        out.setdefault(name, []).append(t - (alone[i] + alone[i + 1]) / 2)
    return out
