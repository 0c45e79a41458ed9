"""Constraint-preserving mini-batch admission (KnitTrans): early mini-batches from whole, fresh GRPO groups.

What: :class:`AdmissionController` decides, each time groups finish generating,
whether a mini-batch can be admitted now. An admission is a *unit* of whole
groups whose trajectory count is divisible by both the data-parallel size and
the PPO mini-batch (``lcm(dp, mini_batch_groups·n) / n`` groups), so verl never
pads it. A group older than the staleness bound is never admitted (it is
returned for eviction and refill). The admission is feasible only if, after it,
every remaining per-source quota can still be met from the finished and
in-flight fresh groups; when it cannot, the controller names the deficit so
the caller refills exactly that many prompts instead of waiting forever.

Why: verl's sampler admits the whole train batch when its last group finishes
and pads to divisibility; the long tail of generation then delays every
mini-batch. Admitting units as soon as they are feasible starts updates early
(and bounds staleness) without breaking a GRPO group or the batch's mix.
Pure Python; :mod:`.sampler` plugs it into verl's replay buffer.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["ANY", "Admission", "AdmissionConfig", "AdmissionController", "GroupInfo"]

ANY = "*"


@dataclass(frozen=True)
class GroupInfo:
    """A finished GRPO group: its uid, the policy version it was generated with, its data source."""

    uid: str
    version: int
    source: str = ANY


@dataclass(frozen=True)
class AdmissionConfig:
    """Sizes and bounds of one train batch.

    ``quotas`` maps a data source to its number of groups per train batch (summing
    to ``batch_groups``); ``None`` is one quota for every source.
    """

    group_size: int
    mini_batch_groups: int
    dp_size: int
    batch_groups: int
    max_staleness: int | None = None
    quotas: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
        if min(self.group_size, self.mini_batch_groups, self.dp_size, self.batch_groups) < 1:
            raise ValueError(f"sizes must be positive: {self}")
        if self.batch_groups % self.unit_groups:
            raise ValueError(
                f"a train batch of {self.batch_groups} groups cannot be cut into admissions of {self.unit_groups} "
                f"groups (lcm(dp={self.dp_size}, mini_batch={self.mini_batch_groups}x{self.group_size}) "
                f"trajectories): choose a batch size that is a multiple of it"
            )
        if self.quotas is not None and sum(self.quotas.values()) != self.batch_groups:
            raise ValueError(f"quotas {dict(self.quotas)} do not add up to the batch's {self.batch_groups} groups")

    @property
    def unit_groups(self) -> int:
        """Groups per admission: the smallest whole-group count divisible by dp and by the mini-batch."""
        rows = math.lcm(self.dp_size, self.mini_batch_groups * self.group_size)
        return rows // self.group_size

    def quota(self) -> dict[str, int]:
        return dict(self.quotas) if self.quotas is not None else {ANY: self.batch_groups}


@dataclass
class Admission:
    """One decision: the groups admitted now (one or more units), those evicted as stale, refills needed."""

    admitted: list[GroupInfo] = field(default_factory=list)
    stale: list[GroupInfo] = field(default_factory=list)
    deficit: dict[str, int] = field(default_factory=dict)


class AdmissionController:
    """Admits units of whole fresh groups, keeping every remaining quota satisfiable."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.admitted: Counter[str] = Counter()
        self.total = 0

    def key(self, g: GroupInfo) -> str:
        return g.source if self.config.quotas is not None else ANY

    def need(self) -> dict[str, int]:
        return {s: q - self.admitted[s] for s, q in self.config.quota().items()}

    @property
    def complete(self) -> bool:
        return self.total >= self.config.batch_groups

    def fresh(self, g: GroupInfo, version: int) -> bool:
        bound = self.config.max_staleness
        return bound is None or version - g.version <= bound

    def offer(
        self, finished: Sequence[GroupInfo], inflight: Mapping[str, int], version: int, max_units: int = 1
    ) -> Admission:
        """Decide on the groups finished so far (not yet admitted) at policy ``version``.

        ``inflight`` counts groups still generating, per source (they are at the
        current version, so fresh). Admits at most ``max_units`` units, oldest groups
        first, each only if it keeps the remaining quotas satisfiable.
        """
        out = Admission()
        cfg = self.config
        fresh = []
        for g in finished:
            (fresh if self.fresh(g, version) else out.stale).append(g)
        fresh.sort(key=lambda g: (g.version, g.uid))
        pool = list(fresh)
        for _ in range(max_units):
            if self.complete:
                break
            need = self.need()
            unit: list[GroupInfo] = []
            taken: Counter[str] = Counter()
            for g in pool:
                s = self.key(g)
                if need.get(s, 0) - taken[s] > 0:
                    unit.append(g)
                    taken[s] += 1
                    if len(unit) == cfg.unit_groups:
                        break
            if len(unit) < cfg.unit_groups or not self.feasible(need, taken, pool, inflight):
                break
            ids = {g.uid for g in unit}
            pool = [g for g in pool if g.uid not in ids]
            self.admitted.update(taken)
            self.total += len(unit)
            out.admitted.extend(unit)
        out.deficit = self.deficit(pool, inflight)
        return out

    def supply(self, pool: Sequence[GroupInfo], inflight: Mapping[str, int]) -> Counter[str]:
        have: Counter[str] = Counter(self.key(g) for g in pool)
        for s, k in inflight.items():
            have[s if self.config.quotas is not None else ANY] += k
        return have

    def feasible(
        self, need: Mapping[str, int], taken: Mapping[str, int], pool: Sequence[GroupInfo], inflight: Mapping[str, int]
    ) -> bool:
        """After admitting ``taken``, can every remaining quota still be filled from what is left?"""
        have = self.supply(pool, inflight)
        return all(need[s] - taken.get(s, 0) <= have[s] - taken.get(s, 0) for s in need)

    def deficit(self, pool: Sequence[GroupInfo], inflight: Mapping[str, int]) -> dict[str, int]:
        """Groups per source that must be (re)generated for the remaining quotas to be satisfiable."""
        have = self.supply(pool, inflight)
        return {s: n - have[s] for s, n in self.need().items() if n > have[s]}

    def next_batch(self) -> None:
        """Start the next train batch's quotas."""
        self.admitted.clear()
        self.total = 0
