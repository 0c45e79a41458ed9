"""Which components a configuration asks for: storage policy, buffer, delivery path.

The runtime (:mod:`conduit.runtime`) wires what these return; the choice of a
class by policy, sampler or device is made here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from conduit.buffers.base import ExperienceBuffer
from conduit.buffers.iterations import IterationBuffer
from conduit.buffers.replay import ReplayBuffer
from conduit.config import ConduitConfig
from conduit.core import Mode, Policy, SamplerKind, Schedule
from conduit.errors import ConfigError
from conduit.executor import FailureBox
from conduit.paths.delivery import DeliveryPath
from conduit.paths.minibatch import MinibatchDelivery
from conduit.paths.replay import ReplayDelivery
from conduit.ratelimit import RateLimiter
from conduit.samplers import FifoSampler, LifoSampler, PrioritizedSampler, UniformSampler
from conduit.samplers.base import Sampler
from conduit.slots import make_remover
from conduit.spec import ExperienceSpec
from conduit.storage import FixedStorage, StoragePolicy
from conduit.trace import Tracer

__all__ = ["buffer", "check_devices", "delivery", "sampler", "storage_policy", "stream_device"]

_SAMPLERS: dict[SamplerKind, type[Sampler]] = {
    SamplerKind.UNIFORM: UniformSampler, SamplerKind.FIFO: FifoSampler, SamplerKind.LIFO: LifoSampler,
}


def check_devices(cfg: ConduitConfig) -> None:
    """Every CUDA device the config names exists here (a config may be written on a machine without GPUs and
    sent to one with them, so this is checked where a runtime is built, not where the config is)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    named = [("learner_device", d) for d in cfg.learner_devices]
    if cfg.storage_device is not None and cfg.storage_device != "pinned":
        named.append(("storage_device", cfg.storage_device))
    for field, name in named:
        device = torch.device(name)
        if device.type != "cuda":
            continue
        if count == 0:
            raise ConfigError(
                f"{field}={name!r}, but this machine has no CUDA device (torch.cuda.is_available() is False): "
                f"use {field}='cpu' here, or run where a GPU is and torch is a CUDA build"
            )
        if (device.index or 0) >= count:
            raise ConfigError(
                f"{field}={name!r}, but this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1}): "
                "name one of those"
            )


def storage_policy(cfg: ConduitConfig) -> StoragePolicy:
    """A pinned ``storage_device`` wins; with a learner on a GPU, Alg. 1 on the profiled machine; else host memory.

    Learners on the CPU keep the buffer in pageable host memory without profiling: a GPU or pinned buffer
    between CPU actors and CPU learners adds a copy each way (a pageable copy to or from a GPU is itself a
    host memcpy into the driver's staging memory plus a DMA), so Eq. 1 cannot prefer one unless the
    profile is noise, and profiling would cost every such runtime seconds at construction.
    """
    if cfg.storage_device is not None:
        return FixedStorage(cfg.storage_device)
    if not torch.cuda.is_available() or not any(d.startswith("cuda") for d in cfg.learner_devices):
        return FixedStorage("cpu")  # no GPU, or no learner on one
    from conduit.placement.policy import PlacementPolicy  # scipy and the planner, only when they can matter

    return PlacementPolicy.for_this_machine(
        learners=list(cfg.learner_devices), capacity=cfg.placement_rows, headroom=cfg.memory_headroom
    )


def stream_device(cfg: ConduitConfig) -> torch.device:
    """The device whose stream ingestion copies run on: the storage GPU, else the first GPU learner."""
    d = cfg.storage_device
    if d is not None and d.startswith("cuda"):
        return torch.device(d)
    gpus = [x for x in cfg.learner_devices if x.startswith("cuda")]
    return torch.device(gpus[0]) if gpus else torch.device("cpu")


def sampler(cfg: ConduitConfig) -> Sampler:
    """The off-policy selector (Reverb's): uniform, prioritized, fifo, lifo."""
    assert cfg.capacity is not None
    if cfg.sampler is SamplerKind.PRIORITIZED:
        p = cfg.prioritized
        return PrioritizedSampler(cfg.capacity, p.alpha, p.beta, p.eps, p.max_priority)
    return _SAMPLERS[cfg.sampler](cfg.capacity)


def buffer(cfg: ConduitConfig, storage: StoragePolicy, spec: ExperienceSpec | None) -> ExperienceBuffer:
    """The policy's Experience Buffer: a replay ring off-policy, one store per iteration on-policy."""
    growable = frozenset(cfg.growable)
    if cfg.policy is Policy.ON_POLICY:
        return IterationBuffer(
            cfg.storage_rows, storage, num_minibatches=cfg.num_minibatches, num_epochs=cfg.num_epochs,
            num_learners=cfg.num_learners, spec=spec, seed=cfg.seed, growable=growable,
            expected_rows=cfg.train_batch_size, presort=cfg.tuning.presort,
        )
    assert cfg.capacity is not None
    rl = cfg.rate_limit
    limiter = RateLimiter(min_size=cfg.sample_min) if rl is None else RateLimiter(
        min_size=cfg.sample_min, samples_per_insert=rl.samples_per_insert,
        tolerance=rl.tolerance if rl.tolerance is not None else float("inf"), min_diff=rl.min_diff,
        max_diff=rl.max_diff,
    )
    return ReplayBuffer(
        cfg.capacity, storage, sampler(cfg), spec=spec, seed=cfg.seed, growable=growable,
        remover=make_remover(cfg.remover.value), max_times_sampled=cfg.max_times_sampled,
        count_replays=cfg.count_replays, recycle_batches=cfg.tuning.recycle_batches, limiter=limiter,
        block=rl.block if rl is not None else True,
    )


def delivery(
    cfg: ConduitConfig,
    buf: ExperienceBuffer,
    mode: Mode,
    hook: Callable[..., Any] | None,
    tracer: Tracer,
    failure: FailureBox,
) -> DeliveryPath:
    """The policy's delivery path over ``buf`` (made by :func:`buffer` from the same config)."""
    common: dict[str, Any] = dict(
        mode=mode, hook=hook, tracer=tracer, failure=failure, timeout=cfg.timeout_s,
        learner_devices=[torch.device(d) for d in cfg.learner_devices], recycle_batches=cfg.tuning.recycle_batches,
        time_major=cfg.tuning.time_major,
    )
    if cfg.policy is Policy.ON_POLICY:
        assert isinstance(buf, IterationBuffer)
        return MinibatchDelivery(buffer=buf, **common)
    assert isinstance(buf, ReplayBuffer)
    return ReplayDelivery(buffer=buf, batch_size=cfg.train_batch_size, batch_pool=cfg.tuning.batch_pool, **common)


def checked_schedule(cfg: ConduitConfig, schedule: Schedule) -> Schedule:
    """``schedule``, refused with the reason where it is not a Schedule or not feasible for ``cfg``."""
    if not isinstance(schedule, Schedule):
        raise TypeError(
            f"schedule={schedule!r}: expected a conduit.Schedule (e.g. Schedule(Mode(False, 1), Mode(True, 2))); "
            "to pin knobs from configuration use ConduitConfig(pinned={'delivery_overlap': True, ...})"
        )
    for path, mode, space in cfg.infeasible(schedule):
        raise ConfigError(
            f"schedule: {path} mode ({mode}) is not feasible for {cfg.policy.value} "
            f"(granularities {[str(g) for g in space]}; on-policy admits only inline g=1 and overlapped 0<g<1)"
        )
    return schedule
