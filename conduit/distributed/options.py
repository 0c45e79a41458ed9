"""What a sharded runtime can be asked for: where batches are drawn from, where units go, its counters, and
the configs it refuses (with why), kept apart from :mod:`conduit.distributed.runtime`'s moving parts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from conduit.config import ConduitConfig
from conduit.core import Policy, SamplerKind, as_granularity
from conduit.distributed.sampling import shard_capacities
from conduit.errors import ConfigError

__all__ = ["DistributedStats", "Routing", "Sampling", "validate", "validate_local", "validate_rate"]


class Sampling(str, Enum):
    """Where a learner's batch is drawn from: every shard (one buffer's distribution) or its own shard."""

    GLOBAL = "global"
    LOCAL = "local"


class Routing(str, Enum):
    """Which shard a pushed unit goes to."""

    LOCAL = "local"
    ROUND_ROBIN = "round_robin"
    PROPORTIONAL = "proportional"


@dataclass(frozen=True)
class DistributedStats:
    """Counters over the whole group (rows as pushed, before any ingestion hook), per rank."""

    pushed_rows: tuple[int, ...]
    ingested_rows: tuple[int, ...]
    refused_rows: tuple[int, ...]
    in_flight_rows: tuple[int, ...]
    shard_rows: tuple[int, ...]
    shard_capacity: tuple[int, ...]

    @property
    def exactly_once(self) -> bool:
        """Every pushed row was ingested by exactly one shard, refused, or is still routed in flight."""
        return sum(self.pushed_rows) == sum(self.ingested_rows) + sum(self.refused_rows) + sum(self.in_flight_rows)


def validate(cfg: ConduitConfig, routing: Routing) -> None:
    """Raise ``ConfigError`` for a config a sharded buffer cannot run (before the group forms)."""
    if cfg.policy is Policy.OFF_POLICY:
        if cfg.sampler not in (SamplerKind.UNIFORM, SamplerKind.PRIORITIZED):
            raise ConfigError(f"sampler={cfg.sampler.value!r}: a sharded buffer samples uniform or prioritized")
        for name in ("max_times_sampled", "count_replays"):
            if getattr(cfg, name) is not None:
                raise ConfigError(f"{name}: not supported across ranks yet (a single-process runtime has it)")
    elif routing is not Routing.LOCAL:
        raise ConfigError(f"routing={routing.value!r}: on-policy units stay on the rank that pushed them")
    if cfg.rate_limit is not None and cfg.rate_limit.tolerance is None:
        raise ConfigError("rate_limit: a band given as min_diff/max_diff (RateLimit.queue) is one process's; the "
                          "group shares its room as ± tolerance: give tolerance")
    if cfg.growable:  # each shard would grow its own layout, and the ranks would no longer agree on one
        raise ConfigError(f"growable={list(cfg.growable)}: not supported across ranks yet (every shard lays rows out "
                          "alike); declare each field at its largest shape (a single-process runtime grows them)")


def validate_rate(cfg: ConduitConfig, sampling: Sampling, world: int) -> None:
    """Raise ``ConfigError`` for a ``rate_limit`` the group could never keep (:mod:`conduit.distributed.ratelimit`)."""
    if cfg.rate_limit is None:
        return
    if sampling is Sampling.LOCAL:
        raise ConfigError("rate_limit needs sampling='global': the group's samples are counted where the ranks draw "
                          "together, and local pulls never meet")
    if not cfg.rate_limit.block and cfg.pinned.delivery_overlap:
        raise ConfigError("rate_limit.block=False with delivery_overlap pinned on: a draw the ratio refuses must "
                          "raise RateLimited in the learner's pull, not on the collective thread drawing ahead")
    g = cfg.pinned.delivery_granularity
    g = max(1, math.ceil(as_granularity(g))) if g is not None else 1  # unpinned: the planner tries only g that fit
    assert cfg.rate_limit.tolerance is not None  # (validate refused a band given by its edges)
    if cfg.rate_limit.tolerance < world * g * cfg.train_batch_size:
        raise ConfigError(
            f"rate_limit.tolerance={cfg.rate_limit.tolerance} is smaller than one exchange of the group ({world} "
            f"learners x delivery granularity {g} x train_batch_size={cfg.train_batch_size} rows): no pull could "
            f"ever keep the ratio"
        )


def validate_local(cfg: ConduitConfig, sampling: Sampling, world: int, shares: Sequence[float] | None) -> None:
    """Raise ``ConfigError`` where local sampling could not draw a batch from a shard (each learner pulls whole
    batches from its own shard, through that shard's delivery path); the same shards on every rank."""
    if sampling is not Sampling.LOCAL or cfg.policy is not Policy.OFF_POLICY:
        return
    assert cfg.capacity is not None
    capacities = shard_capacities(cfg.capacity, world, shares)
    if min(capacities) >= cfg.train_batch_size:
        return
    small = min(range(len(capacities)), key=lambda r: capacities[r])
    raise ConfigError(
        f"sampling='local': rank {small}'s shard holds {capacities[small]} rows at most, fewer than a batch "
        f"(train_batch_size={cfg.train_batch_size}); raise capacity or sample globally"
    )
