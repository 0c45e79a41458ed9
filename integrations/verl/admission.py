"""Constraint-preserving mini-batch admission (KnitTrans): whole, right-sized GRPO groups, each once, by verl's rules.

What: :class:`AdmissionController` decides, each time groups finish generating,
which of them a sample call hands to the trainer. Its invariants:

- **exactly once per uid**: a uid is admitted or evicted at most once in the
  controller's life; an offer that repeats a uid, or re-offers one already
  decided, is refused (``ValueError``), never delivered twice;
- **verl's staleness**: a group submitted at step ``g`` has, at step ``s``, the
  span ``s - g + 1`` (verl's ``ReplayBufferAsync``); with
  ``max_staleness`` (verl's ``max_off_policy_threshold``) and strategy ``drop``
  a finished group whose span exceeds the bound is evicted (and refilled), with
  ``wait`` (verl's dropless mode) nothing is evicted for staleness and no
  admission happens while an in-flight group's span has reached the bound;
- **whole, right-sized groups** (async): a group is admitted only with exactly
  ``group_size`` (rollout.n) trajectories; a failed group or one with fewer
  is evicted and refilled (verl's async rule for failed groups), one with more
  is refused as a configuration error (``group_size`` is not rollout.n, or the
  agent loop writes several trajectories per session);
- **units**: an admission is made of units of whole groups whose trajectory
  count is divisible by both the data-parallel size and the PPO mini-batch
  (``lcm(dp, mini_batch_groups·n) / n`` groups), so verl never pads it; a unit
  is admitted only if every remaining per-source quota (Conduit's optional
  mix) stays satisfiable from the finished and in-flight groups, and the
  controller names a source's deficit so the caller refills that many prompts
  instead of waiting forever; without quotas the only refills are verl's.

``on_policy`` is verl's sync trainer: there the step's whole batch is handed
over at once as verl's own ``ReplayBuffer`` does (no staleness, no eviction,
no refill: verl's sync trainer pads a failed group downstream, and cannot
refill fewer prompts than a train batch), see :mod:`.sampler`.

Why: verl's sampler admits a batch when its last group finished and pads to
divisibility; admitting whole units as soon as they are feasible starts the
async trainers' mini-batches early without breaking a GRPO group, the batch's
mix or verl's off-policy bound. Pure Python; :mod:`.sampler` maps verl's
TransferQueue state onto it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["ANY", "STRATEGIES", "Admission", "AdmissionConfig", "AdmissionController", "GroupInfo"]

ANY = "*"
#: verl's ``max_off_policy_strategy`` values
STRATEGIES = ("drop", "wait")


@dataclass(frozen=True)
class GroupInfo:
    """A terminal GRPO group: its uid, the step its prompt was submitted at, its data source, its trajectories.

    ``size`` is the number of trajectories found (``None``: the configured
    group size); ``failed`` is verl's ``failure`` status.
    """

    uid: str
    version: int
    source: str = ANY
    size: int | None = None
    failed: bool = False


@dataclass(frozen=True)
class AdmissionConfig:
    """Sizes and bounds of one train batch.

    ``quotas`` maps a data source to its number of groups per train batch (summing
    to ``batch_groups``); ``None`` is one quota for every source. ``max_staleness``
    and ``strategy`` are verl's ``max_off_policy_threshold`` / ``_strategy``;
    ``on_policy`` is verl's sync trainer.
    """

    group_size: int
    mini_batch_groups: int
    dp_size: int
    batch_groups: int
    max_staleness: int | None = None
    quotas: Mapping[str, int] | None = None
    strategy: str = "drop"
    on_policy: bool = False

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
        if self.max_staleness is not None and (not isinstance(self.max_staleness, int) or self.max_staleness < 1):
            raise ValueError(f"max_staleness {self.max_staleness!r} must be an integer >= 1 or None (as verl's)")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy {self.strategy!r} is not one of verl's {STRATEGIES}")
        if self.on_policy and self.quotas is not None:
            raise ValueError(
                "per-source quotas need an async trainer: verl's sync trainer hands over the step's whole batch "
                "and cannot refill a missing source"
            )

    @property
    def unit_groups(self) -> int:
        """Groups per admission: the smallest whole-group count divisible by dp and by the mini-batch."""
        rows = math.lcm(self.dp_size, self.mini_batch_groups * self.group_size)
        return rows // self.group_size

    def quota(self) -> dict[str, int]:
        return dict(self.quotas) if self.quotas is not None else {ANY: self.batch_groups}


@dataclass
class Admission:
    """One decision: groups admitted now, evicted as stale or misfit (failed / wrong size), refills needed.

    The caller refills each evicted group one for one (verl's rule); ``deficit``
    is what the quotas need beyond those replacements.

    ``blocked`` says verl's ``wait`` strategy held the admission back (an
    in-flight group reached the staleness bound).
    """

    admitted: list[GroupInfo] = field(default_factory=list)
    stale: list[GroupInfo] = field(default_factory=list)
    misfit: list[GroupInfo] = field(default_factory=list)
    deficit: dict[str, int] = field(default_factory=dict)
    blocked: bool = False


class AdmissionController:
    """Admits units of whole fresh groups, each uid once, keeping every remaining quota satisfiable."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.admitted: Counter[str] = Counter()
        self.total = 0
        #: every uid admitted / evicted in this controller's life (exactly once)
        self.delivered: set[str] = set()
        self.evicted: set[str] = set()

    def key(self, g: GroupInfo) -> str:
        return g.source if self.config.quotas is not None else ANY

    def need(self) -> dict[str, int]:
        return {s: q - self.admitted[s] for s, q in self.config.quota().items()}

    @property
    def remaining(self) -> int:
        return self.config.batch_groups - self.total

    @property
    def complete(self) -> bool:
        return self.total >= self.config.batch_groups

    @staticmethod
    def span(g: GroupInfo, version: int) -> int:
        """verl's staleness: the number of policy versions from the prompt's submission to ``version``, inclusive."""
        return version - g.version + 1

    def stale(self, g: GroupInfo, version: int) -> bool:
        """Evicted for staleness: verl's ``drop`` rule (``span > threshold``); never on-policy or under ``wait``."""
        cfg = self.config
        if cfg.on_policy or cfg.max_staleness is None or cfg.strategy != "drop":
            return False
        return self.span(g, version) > cfg.max_staleness

    def fresh(self, g: GroupInfo, version: int) -> bool:
        return not self.stale(g, version)

    def misfit(self, g: GroupInfo) -> bool:
        """A failed group or one short of ``group_size`` trajectories (async only: verl's sync trainer pads it)."""
        if self.config.on_policy:
            return False
        size = self.config.group_size if g.size is None else g.size
        if size > self.config.group_size:
            raise ValueError(
                f"group {g.uid} has {size} trajectories, more than group_size={self.config.group_size}: set "
                f"group_size to rollout.n; admission needs one trajectory per session"
            )
        return g.failed or size < self.config.group_size

    def blocked(self, oldest_inflight: int | None, version: int) -> bool:
        """verl's ``wait`` (dropless) rule: no sampling while an in-flight group's span reached the bound."""
        cfg = self.config
        if cfg.on_policy or cfg.max_staleness is None or cfg.strategy != "wait" or oldest_inflight is None:
            return False
        return version - oldest_inflight + 1 >= cfg.max_staleness

    def check_once(self, groups: Sequence[GroupInfo]) -> None:
        """Refuse a uid repeated within one offer, or one already admitted or evicted."""
        seen: Counter[str] = Counter(g.uid for g in groups)
        twice = sorted(u for u, k in seen.items() if k > 1)
        if twice:
            raise ValueError(f"uids offered twice in one offer: {twice}")
        again = sorted(u for u in seen if u in self.delivered or u in self.evicted)
        if again:
            raise ValueError(f"uids already admitted or evicted, offered again (each is decided once): {again}")

    def offer(
        self,
        finished: Sequence[GroupInfo],
        inflight: Mapping[str, int],
        version: int,
        max_units: int = 1,
        *,
        want: int | None = None,
        oldest_inflight: int | None = None,
    ) -> Admission:
        """Decide on the terminal groups not yet admitted, at policy ``version`` (verl's global step).

        ``inflight`` counts groups still generating, per source; ``oldest_inflight``
        is the oldest step among them (verl's ``wait`` rule reads it). An offer
        that evicts admits nothing (verl evicts, refills, then selects on a fresh
        snapshot). Without ``want``, admits up to ``max_units`` units, oldest
        groups first, each only if it keeps the remaining quotas satisfiable.
        With ``want`` (groups), admits exactly that many or none: on-policy, the
        oldest ``want`` terminal groups as verl's sync sampler; otherwise
        ``want / unit`` feasible units.
        """
        self.check_want(want)
        self.check_once(finished)
        out = Admission()
        pool = []
        for g in finished:
            if self.misfit(g):
                out.misfit.append(g)
            elif self.stale(g, version):
                out.stale.append(g)
            else:
                pool.append(g)
        self.evicted.update(g.uid for g in (*out.misfit, *out.stale))
        pool.sort(key=lambda g: (g.version, g.uid))
        out.blocked = self.blocked(oldest_inflight, version)
        if out.misfit or out.stale or out.blocked:
            pass  # verl's order: evictions first (the caller clears, refills, offers a fresh snapshot); wait blocks
        elif self.config.on_policy:
            if want is not None and len(pool) >= want:
                self.commit(out, pool[:want])
        elif want is not None:
            self.admit_exactly(out, pool, inflight, want)
        else:
            self.admit_units(out, pool, inflight, max_units)
        admitted = {g.uid for g in out.admitted}
        # the caller replaces each evicted group one for one (verl's rule): those replacements are supply too
        replaced = [*out.stale, *out.misfit]
        out.deficit = self.deficit([g for g in pool if g.uid not in admitted] + replaced, inflight)
        return out

    def check_want(self, want: int | None) -> None:
        """A sample's size: on-policy the whole step; async whole units within what is left of the train batch."""
        if self.config.on_policy:
            if want is None or want < 1:
                raise ValueError("on-policy admission hands over a whole step: give want (the step's groups)")
            return
        unit = self.config.unit_groups
        if want is not None and (want < 1 or want % unit or want > self.remaining):
            raise ValueError(
                f"a sample of {want} groups is not a whole number of admission units of {unit} groups within the "
                f"{self.remaining} left of this train batch ({self.config.batch_groups} groups): batch_groups must be "
                f"train_batch_size and the trainer's sample size a multiple of the unit"
            )

    def admit_units(self, out: Admission, pool: list[GroupInfo], inflight: Mapping[str, int], max_units: int) -> None:
        """Admit up to ``max_units`` feasible units from ``pool`` (committed unit by unit)."""
        for _ in range(max_units):
            unit = self.next_unit(pool, inflight, Counter())
            if unit is None:
                break
            self.commit(out, unit)
            ids = {g.uid for g in unit}
            pool = [g for g in pool if g.uid not in ids]

    def admit_exactly(self, out: Admission, pool: list[GroupInfo], inflight: Mapping[str, int], want: int) -> None:
        """Admit ``want`` groups (whole feasible units) or nothing: a sample call gets what it asked for."""
        chosen: list[GroupInfo] = []
        taken: Counter[str] = Counter()
        rest = list(pool)
        for _ in range(want // self.config.unit_groups):
            u = self.next_unit(rest, inflight, taken)
            if u is None:
                return
            chosen += u
            taken.update(self.key(g) for g in u)
            ids = {g.uid for g in u}
            rest = [g for g in rest if g.uid not in ids]
        self.commit(out, chosen)

    def next_unit(
        self, pool: Sequence[GroupInfo], inflight: Mapping[str, int], before: Mapping[str, int]
    ) -> list[GroupInfo] | None:
        """The oldest unit of ``pool`` that keeps every quota satisfiable, given ``before`` already chosen."""
        if self.total + sum(before.values()) >= self.config.batch_groups:
            return None
        need = {s: n - before.get(s, 0) for s, n in self.need().items()}
        unit: list[GroupInfo] = []
        taken: Counter[str] = Counter()
        for g in pool:
            s = self.key(g)
            if need.get(s, 0) - taken[s] > 0:
                unit.append(g)
                taken[s] += 1
                if len(unit) == self.config.unit_groups:
                    break
        if len(unit) < self.config.unit_groups or not self.feasible(need, taken, pool, inflight):
            return None
        return unit

    def commit(self, out: Admission, groups: Sequence[GroupInfo]) -> None:
        self.admitted.update(self.key(g) for g in groups)
        self.total += len(groups)
        self.delivered.update(g.uid for g in groups)
        out.admitted.extend(groups)

    def supply(self, pool: Sequence[GroupInfo], inflight: Mapping[str, int]) -> Counter[str]:
        have: Counter[str] = Counter(self.key(g) for g in pool)
        for s, k in inflight.items():
            have[s if self.config.quotas is not None else ANY] += k
        return have

    def feasible(
        self, need: Mapping[str, int], taken: Mapping[str, int], pool: Sequence[GroupInfo], inflight: Mapping[str, int]
    ) -> bool:
        """After admitting ``taken``, can every remaining quota still be filled from what is left?

        Without per-source quotas any group serves any place: verl samples whatever is there, and so does this.
        """
        if self.config.quotas is None:
            return True
        have = self.supply(pool, inflight)
        return all(need[s] - taken.get(s, 0) <= have[s] - taken.get(s, 0) for s in need)

    def deficit(self, pool: Sequence[GroupInfo], inflight: Mapping[str, int]) -> dict[str, int]:
        """Groups per source that must be (re)generated for the remaining quotas to be satisfiable.

        Only per-source quotas (Conduit's) have one: without them verl's rules hold,
        whose only refills replace evicted groups one for one.
        """
        if self.config.on_policy or self.config.quotas is None:
            return {}
        have = self.supply(pool, inflight)
        return {s: n - have[s] for s, n in self.need().items() if n > have[s]}

    def next_batch(self) -> None:
        """Start the next train batch's quotas (the uids admitted or evicted stay decided)."""
        self.admitted.clear()
        self.total = 0
