"""Configuration, built from what RL frameworks already expose.

pydantic (v2) earns its place here: typed, frozen models with field-level
validation, plus JSON round-trips for checkpoints and the CLI. Its errors are
turned into one :class:`~conduit.errors.ConfigError` (a ``ValueError``) whose
message lists each bad field as the user wrote it, what it got and what is
allowed (:func:`explain`).

Users give the RL configuration they have (off- or on-policy, batch sizes,
``M`` mini-batches, capacity). Granularities, overlap and placement are chosen
by Conduit; they may be *pinned* here for experiments.
"""

from __future__ import annotations

import warnings
from fractions import Fraction
from typing import Annotated, Any, Literal

import torch
from pydantic import ConfigDict, Field, field_validator, model_validator

from conduit.config_models import PrioritizedReplay, RateLimit, _Config, explain
from conduit.core import (
    Mode,
    Policy,
    RemoverKind,
    SamplerKind,
    Schedule,
    as_granularity,
    delivery_space,
    ingestion_space,
    is_feasible_mode,
)
from conduit.errors import UnevenMinibatches

__all__ = [
    "ConduitConfig",
    "Policy",
    "PrioritizedReplay",
    "RateLimit",
    "RemoverKind",
    "SamplerKind",
    "SchedulePin",
    "Tuning",
    "explain",
]


class SchedulePin(_Config):
    """Pin overlap/granularity for experiments; ``None`` leaves a knob to Conduit.

    ``SchedulePin.of(schedule)`` pins all four knobs to a :class:`~conduit.core.Schedule`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    ingestion_overlap: bool | None = None
    ingestion_granularity: str | float | int | None = None
    delivery_overlap: bool | None = None
    delivery_granularity: str | float | int | None = None

    @classmethod
    def of(cls, schedule: Schedule) -> SchedulePin:
        """Every knob pinned to ``schedule``."""
        return cls(
            ingestion_overlap=schedule.ingestion.overlap,
            ingestion_granularity=str(schedule.ingestion.granularity),
            delivery_overlap=schedule.delivery.overlap,
            delivery_granularity=str(schedule.delivery.granularity),
        )

    @field_validator("ingestion_granularity", "delivery_granularity")
    @classmethod
    def _parse_g(cls, v: Any) -> Any:
        if v is None:
            return v
        try:
            return str(as_granularity(v))
        except (ValueError, ZeroDivisionError) as e:
            raise ValueError(f"granularity must be a positive number or fraction like '1/4', got {v!r}") from e


class Tuning(_Config):
    """Hot-path knobs a user should never need: the defaults are what the benchmarks measure fastest.

    Attributes:
        batch_pool: off-policy: gather batches into a ring of this many preallocated
            buffers per learner, so a batch stays valid for ``batch_pool - 1`` further pulls
            and is then overwritten. It bounds memory, not time: 0 (the default) recycles
            only memory the learner has dropped (``recycle_batches``).
        recycle_batches: host learners: the memory of a pulled batch's large fields (1 MiB
            and up, where a fresh allocation is a new mapping whose pages fault in one by one)
            goes back to a free list once every reference to it (batch, tensor, view, numpy
            array) is gone, and the next batch is gathered into it; nothing alive is ever
            overwritten. The same holds for ``edp.buffer.sample(n)`` called directly.
            ``False``: fresh memory every pull.
        presort: on-policy: each iteration's rows are stored in the order of its last epoch's
            shuffled mini-batches, so that epoch reaches the learner as views of the store
            instead of gathered copies (with one epoch an iteration's rows are moved once).
            The store is reused only once no view of it is alive; a kept view keeps its whole
            store alive (``clone()`` a mini-batch to keep it alone). Host stores only.
            The mini-batches are the same either way; ``False`` gathers every one.
        time_major: host learners with recycled memory: every field whose rows have at least
            one axis is taken as ``[B, T, ...]`` (a time axis first), gathered straight into a
            ``[T, B, ...]`` block and delivered as that block's transposed view. The values are the
            same; ``batch[k].transpose(0, 1)`` is contiguous, so a time-major learner (an RNN,
            SRL's trainers) reads it without a second copy, while ``batch[k]`` itself is not
            contiguous (``.view()`` on it fails; ``.reshape()`` copies). Use it where every
            non-scalar field has a time axis.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    batch_pool: Annotated[int, Field(ge=0)] = 0
    recycle_batches: bool = True
    presort: bool = True
    time_major: bool = False

    @field_validator("batch_pool")
    @classmethod
    def _check_pool(cls, v: int) -> int:
        if v == 1:
            raise ValueError(
                "batch_pool=1 would overwrite a batch on the very next pull while the learner may still read it; "
                "use 0 (recycle dropped memory) or at least 2"
            )
        return v


class ConduitConfig(_Config):
    """Everything the runtime needs, validated at construction.

    Attributes:
        policy: ``off_policy`` (replay) or ``on_policy`` (fresh data per iteration).
        train_batch_size: off-policy: rows per training batch; on-policy: rows per
            iteration (one update's data, split into ``num_minibatches``).
        rollout_unit_size: rows an actor pushes per call, when known (the
            profiler and on-policy fractional ingestion use it).
        capacity: off-policy replay capacity in transitions.
        num_minibatches: ``M``, on-policy mini-batches per epoch.
        num_epochs: on-policy passes over an iteration's data.
        num_learners: data-parallel learners; each pulls its own batch.
        learner_device: device(s) batches are delivered to; one per learner or one for all.
        storage_device: pins the buffer placement (``"cpu"``, ``"pinned"``, ``"cuda:0"``);
            ``None`` lets Conduit decide.
        growable: fields whose trailing shape may grow during the run (longer sequences,
            larger observations) when the spec is inferred from the first push: growth
            re-lays the buffer out instead of raising ``SpecError``.
        sampler / prioritized: off-policy selection (uniform, prioritized, fifo, lifo).
        remover: which rows a full buffer evicts (fifo ring by default).
        max_times_sampled: evict a row once learners received it this many times.
        count_replays: count how many batches drew each row, at the draw (``"draw"``) or at the batch's
            priority update (``"feedback"``, prioritized replay); ``batch.info.times_sampled`` reads them.
        rate_limit: samples-per-insert ratio with a tolerance band (off-policy).
        copy_on_push: when a push's write is deferred (overlapped ingestion, or ``g > 1``
            gathering several units per invocation), push first copies the unit, so an actor
            may write into its arrays again as soon as push returns, as with any replay
            buffer's ``add``. ``False`` hands the arrays over instead: no copy on the actor's
            thread, but the actor must not write into a pushed unit before it is ingested
            (``flush()``). ``push(..., copy=...)`` decides per call.
        min_size_to_sample: off-policy rows required before sampling (default: a batch).
        g_max: cap on off-policy granularities (both paths).
        max_staleness: cap on off-policy delivery granularity (batches a prefetched
            batch may lag an inline sample by).
        max_ingest_lag: cap on ingestion granularity (units ingestion may lag rollouts by).
        memory_headroom: fraction of device memory placement keeps free.
        pinned: knobs of the schedule pinned for experiments (:class:`SchedulePin`;
            ``SchedulePin.of(schedule)`` pins a whole :class:`~conduit.core.Schedule`).
        tuning: hot-path knobs (:class:`Tuning`); the defaults are right for nearly everyone.
        seed: seeds Conduit's samplers (``None``: nondeterministic). Seeded, an inline delivery draws the same
            batches run after run and after a restore; an overlapped one draws when its worker runs, between
            pushes as they happen to come, so its batches may differ from run to run.
        timeout_s: default timeout of every blocking call.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    policy: Policy
    train_batch_size: Annotated[int, Field(gt=0)]
    rollout_unit_size: Annotated[int, Field(gt=0)] | None = None
    capacity: Annotated[int, Field(gt=0)] | None = None
    num_minibatches: Annotated[int, Field(gt=0)] = 1
    num_epochs: Annotated[int, Field(gt=0)] = 1
    num_learners: Annotated[int, Field(gt=0)] = 1
    learner_device: str | list[str] = "cpu"
    storage_device: str | None = None
    growable: tuple[str, ...] = ()
    sampler: SamplerKind = SamplerKind.UNIFORM
    prioritized: PrioritizedReplay = PrioritizedReplay()
    remover: RemoverKind = RemoverKind.FIFO
    max_times_sampled: Annotated[int, Field(gt=0)] | None = None
    count_replays: Literal["draw", "feedback"] | None = None
    rate_limit: RateLimit | None = None
    copy_on_push: bool = True
    min_size_to_sample: Annotated[int, Field(gt=0)] | None = None
    g_max: Annotated[int, Field(gt=0, le=64)] = 4
    max_staleness: Annotated[int, Field(gt=0)] | None = None
    max_ingest_lag: Annotated[int, Field(gt=0)] | None = None
    memory_headroom: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1
    pinned: SchedulePin = SchedulePin()
    tuning: Tuning = Tuning()
    seed: Annotated[int, Field(ge=0)] | None = None
    timeout_s: Annotated[float, Field(gt=0.0)] = 60.0

    # -- field validators ---------------------------------------------------
    @field_validator("pinned", mode="before")
    @classmethod
    def _pin_schedule(cls, v: Any) -> Any:
        return SchedulePin.of(v) if isinstance(v, Schedule) else v  # a whole schedule pins every knob

    @field_validator("growable", mode="before")
    @classmethod
    def _field_names(cls, v: Any) -> Any:
        if isinstance(v, str):
            return (v,)
        return tuple(sorted(set(v))) if v is not None else ()

    @field_validator("learner_device")
    @classmethod
    def _check_devices(cls, v: str | list[str]) -> str | list[str]:
        for d in [v] if isinstance(v, str) else v:
            _parse_device("learner_device", d)
        if isinstance(v, list) and not v:
            raise ValueError("learner_device: expected a device or a non-empty list, got []")
        return v

    @field_validator("storage_device")
    @classmethod
    def _check_storage(cls, v: str | None) -> str | None:
        if v is not None and v != "pinned":
            _parse_device("storage_device", v)
        return v

    # -- cross-field rules --------------------------------------------------
    @model_validator(mode="after")
    def _check_policy_rules(self) -> ConduitConfig:
        if self.policy is Policy.OFF_POLICY:
            if self.capacity is None:
                raise ValueError("capacity: off-policy replay needs a capacity (transitions), got None")
            if self.capacity < self.train_batch_size:
                raise ValueError(
                    f"capacity={self.capacity} is smaller than train_batch_size={self.train_batch_size}: "
                    "a batch could never be sampled"
                )
            if self.min_size_to_sample is not None and self.min_size_to_sample > self.capacity:
                raise ValueError(
                    f"min_size_to_sample={self.min_size_to_sample} exceeds capacity={self.capacity}: "
                    "sampling would never start"
                )
            if self.num_minibatches != 1 or self.num_epochs != 1:
                raise ValueError(
                    f"num_minibatches={self.num_minibatches}, num_epochs={self.num_epochs}: mini-batches and "
                    "epochs are on-policy settings; off-policy delivers train_batch_size rows per pull"
                )
            if self.remover is RemoverKind.PRIORITIZED and self.sampler is not SamplerKind.PRIORITIZED:
                raise ValueError("remover='prioritized' evicts by priority and needs sampler='prioritized'")
            if self.count_replays == "feedback" and self.sampler is not SamplerKind.PRIORITIZED:
                raise ValueError("count_replays='feedback' counts at update_priorities and needs sampler='prioritized'")
            rate = self.rate_limit
            if rate is not None and rate.tolerance is not None and rate.tolerance < self.train_batch_size:
                raise ValueError(
                    f"rate_limit.tolerance={rate.tolerance} is smaller than one batch "
                    f"(train_batch_size={self.train_batch_size}): no batch could ever be sampled"
                )
            if rate is not None and rate.tolerance is None and rate.width < self.train_batch_size:
                raise ValueError(
                    f"rate_limit: max_diff - min_diff = {rate.width:g} is smaller than one batch "
                    f"(train_batch_size={self.train_batch_size}): no batch could ever be sampled"
                )
        else:
            if self.tuning.batch_pool:
                raise ValueError("tuning.batch_pool: an off-policy setting; on-policy mini-batches are fresh memory")
            for name in ("max_times_sampled", "rate_limit", "count_replays"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: an off-policy replay setting; on-policy data is used once per epoch")
            if self.remover is not RemoverKind.FIFO:
                raise ValueError(f"remover={self.remover.value!r}: an off-policy replay setting")
            if self.capacity is not None:
                raise ValueError(
                    f"capacity={self.capacity}: on-policy stores exactly one iteration "
                    "(train_batch_size rows); leave capacity unset"
                )
            if self.sampler is not SamplerKind.UNIFORM:
                raise ValueError(
                    f"sampler={self.sampler.value!r}: on-policy delivery shuffles the iteration into "
                    "mini-batches; prioritized sampling is off-policy only"
                )
            if self.num_minibatches > self.train_batch_size:
                raise ValueError(
                    f"num_minibatches={self.num_minibatches} exceeds train_batch_size={self.train_batch_size}: "
                    "some mini-batches would be empty"
                )
            if self.train_batch_size // self.num_minibatches < self.num_learners:
                raise ValueError(
                    f"num_learners={self.num_learners}: each mini-batch of "
                    f"{self.train_batch_size // self.num_minibatches} rows must give every learner at least one row"
                )
            if self.train_batch_size % self.num_minibatches:
                rows, m = self.train_batch_size, self.num_minibatches
                small, n_big = divmod(rows, m)
                big = small + 1
                even = (small * m, big * m)
                warnings.warn(
                    f"train_batch_size={self.train_batch_size} does not split evenly into num_minibatches="
                    f"{self.num_minibatches}: {n_big} mini-batch(es) of {big} rows and "
                    f"{self.num_minibatches - n_big} of {small} (every row once per epoch); for equal sizes use a "
                    f"multiple of {self.num_minibatches}, e.g. train_batch_size={even[0]} or {even[1]}",
                    UnevenMinibatches, stacklevel=2,
                )
        devices = self.learner_devices
        if len(devices) != self.num_learners:
            raise ValueError(
                f"learner_device lists {len(devices)} devices but num_learners={self.num_learners}; "
                "give one device for all learners or one per learner"
            )
        self._check_schedule_pin()
        return self

    def _check_schedule_pin(self) -> None:
        pin = self.pinned
        for path, g, space in (
            ("ingestion", pin.ingestion_granularity, self.ingestion_space),
            ("delivery", pin.delivery_granularity, self.delivery_space),
        ):
            if g is not None and as_granularity(g) not in space:
                raise ValueError(
                    f"pinned.{path}_granularity={g}: not in the feasible space "
                    f"{[str(x) for x in space]} for {self.policy.value}"
                )
        for path, mode, _ in self.infeasible(self.default_schedule()):
            raise ValueError(
                f"pinned: the pinned {path} mode ({mode}) breaks {self.policy.value} semantics; "
                "on-policy admits only (overlap=False, g=1) and (overlap=True, 0<g<1), "
                "and 0<g<1 needs num_minibatches > 1"
            )

    def infeasible(self, schedule: Schedule) -> list[tuple[str, Mode, tuple[Fraction, ...]]]:
        """Each path of ``schedule`` whose mode breaks this policy's semantics or leaves its feasible space:
        (path, mode, the path's space)."""
        paths = (("ingestion", schedule.ingestion, self.ingestion_space),
                 ("delivery", schedule.delivery, self.delivery_space))
        return [(p, m, space) for p, m, space in paths if not is_feasible_mode(self.policy, m, space)]

    # -- derived ------------------------------------------------------------
    @property
    def learner_devices(self) -> tuple[str, ...]:
        d = self.learner_device
        if isinstance(d, str):
            return (d,) * self.num_learners
        return tuple(d)

    @property
    def sample_min(self) -> int:
        return self.min_size_to_sample or self.train_batch_size

    @property
    def ingestion_space(self) -> tuple[Fraction, ...]:
        cap = min(self.g_max, self.max_ingest_lag or self.g_max)
        return ingestion_space(self.policy, self.num_minibatches, cap)

    @property
    def delivery_space(self) -> tuple[Fraction, ...]:
        cap = min(self.g_max, self.max_staleness or self.g_max)
        return delivery_space(self.policy, self.num_minibatches, cap)

    @property
    def storage_rows(self) -> int:
        """Rows the store preallocates: the replay capacity, or one on-policy iteration plus a unit of slack."""
        if self.policy is Policy.OFF_POLICY:
            assert self.capacity is not None
            return self.capacity
        return self.train_batch_size + (self.rollout_unit_size or self.train_batch_size)

    @property
    def placement_rows(self) -> int:
        """Rows the placement plans room for: the replay capacity, or two on-policy stores (one filling while
        the learner reads the other)."""
        return self.storage_rows if self.policy is Policy.OFF_POLICY else 2 * self.storage_rows

    def pinned_to(self, schedule: Schedule) -> ConduitConfig:
        """This config with every knob pinned to ``schedule`` (validated: an infeasible one raises)."""
        return type(self).model_validate({**self.model_dump(), "pinned": SchedulePin.of(schedule).model_dump()})

    def default_schedule(self) -> Schedule:
        """The schedule used when nothing was profiled: the pinned knobs, else a measured prior.

        Learners on a GPU: overlap both paths (off-policy g=1, one-step overlap
        like SRL/Ape-X; on-policy delivery pipelined at g=1/M), because side-stream
        copies and host work then run beside GPU compute. Learners on the CPU:
        inline, because a worker thread competes with the learner's own threads
        for the cores and the GIL (BENCHMARKS.md, "The synthetic loop"). The profiler and
        optimizer in :mod:`conduit.scheduling` replace this prior with a plan.
        """
        pin = self.pinned
        gpu = any(d.startswith("cuda") for d in self.learner_devices)
        one = Fraction(1)
        if self.policy is Policy.OFF_POLICY:
            ing = dlv = Mode(gpu, one)
        else:
            ing = Mode(False, one)
            m = self.num_minibatches
            dlv = Mode(True, Fraction(1, m)) if gpu and m > 1 else Mode(False, one)
        ing = _apply_pin(self.policy, ing, pin.ingestion_overlap, pin.ingestion_granularity, self.ingestion_space)
        dlv = _apply_pin(self.policy, dlv, pin.delivery_overlap, pin.delivery_granularity, self.delivery_space)
        return Schedule(ing, dlv)


def _apply_pin(
    policy: Policy, mode: Mode, overlap: bool | None, g: str | float | int | None, space: tuple[Fraction, ...]
) -> Mode:
    """Apply pinned knobs; a half-pinned on-policy mode takes the only partner that keeps it feasible."""
    new_overlap = mode.overlap if overlap is None else overlap
    new_g = mode.granularity if g is None else as_granularity(g)
    if policy is Policy.ON_POLICY:
        if overlap is not None and g is None:
            new_g = Fraction(1) if not overlap else min(space)
        elif g is not None and overlap is None:
            new_overlap = new_g < 1
    return Mode(new_overlap, new_g)


def _parse_device(field: str, value: str) -> torch.device:
    try:
        return torch.device(value)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"{field}={value!r} is not a torch device string (e.g. 'cpu', 'cuda:0'): {e}") from e
