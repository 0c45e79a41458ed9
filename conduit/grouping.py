"""Group-aware admission: groups of rows that must be trained together, admitted whole, each once, early.

What: many on-policy workloads generate *groups* of rows that are only
meaningful together (GRPO's samples of one prompt, a self-play match's
players, an episode's agents): a group must reach the learner whole or not at
all. :class:`AdmissionController` decides, each time groups finish
generating, which of them the next sample hands to the learner. Its
invariants:

- **exactly once per uid**: a group's uid is admitted or evicted at most once
  in the controller's life; an offer that repeats a uid, or re-offers one
  already decided, is refused (``ValueError``), never delivered twice;
- **staleness**: a group submitted at policy version ``g`` has, at version
  ``s``, the span ``s - g + 1``; with ``max_staleness`` and strategy ``drop``
  a finished group whose span exceeds the bound is evicted (and refilled by
  the caller), with ``wait`` nothing is evicted for staleness and no admission
  happens while an in-flight group's span has reached the bound;
- **whole, right-sized groups** (asynchronous admission): a group is admitted
  only with exactly ``group_size`` rows; a failed group or one with fewer is
  evicted and refilled, one with more is refused as a configuration error
  (``group_size`` is not what each group generates);
- **units**: an admission is made of units of whole groups whose row count is
  divisible by both the data-parallel size and the mini-batch
  (``lcm(dp, mini_batch_groups·group_size) / group_size`` groups), so the
  learner never pads it; a unit is admitted only if every remaining
  per-source quota (an optional mix of data sources) stays satisfiable from
  the finished and in-flight groups, and the controller names a source's
  deficit so the caller refills that many groups instead of waiting forever.

``on_policy`` is a synchronous trainer: the step's whole batch is handed over
at once, the oldest groups first (no staleness, no eviction, no refill: such a
trainer pads a failed group downstream).

Why: admitting a batch only when its last group finished leaves the learner
idle behind the long tail of generation; admitting whole units as soon as they
are feasible starts the mini-batches early (KnitTrans-style
constraint-preserving early mini-batches) without breaking a group, the
batch's mix or the staleness bound. Pure Python, no threads: a framework's
sampler maps its own state onto :class:`GroupInfo` and acts on each
:class:`Admission`, or hands :meth:`AdmissionController.poll` a snapshot of its
state and its eviction and refill calls (``conduit.integrations.verl.sampler``
does it for verl's replay buffer, whose rules these are).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["ANY_SOURCE", "STRATEGIES", "Admission", "AdmissionConfig", "AdmissionController", "GroupInfo"]

#: the one source of every group when there are no per-source quotas
ANY_SOURCE = "*"
#: what a group past the staleness bound does: evicted (``drop``) or kept while admission waits (``wait``)
STRATEGIES = ("drop", "wait")


@dataclass(frozen=True)
class GroupInfo:
    """A terminal (finished or failed) group: its uid, the policy version it was submitted at, its source, its rows.

    ``size`` is the number of rows found (``None``: the configured group size);
    ``failed`` says its generation failed.
    """

    uid: str
    version: int
    source: str = ANY_SOURCE
    size: int | None = None
    failed: bool = False


@dataclass(frozen=True)
class AdmissionConfig:
    """Sizes and bounds of one train batch.

    ``group_size`` is the rows each group generates, ``mini_batch_groups`` the
    groups of one mini-batch, ``dp_size`` the learner's data-parallel ranks,
    ``batch_groups`` the groups of one train batch. ``quotas`` maps a data source
    to its number of groups per train batch (summing to ``batch_groups``);
    ``None`` is one quota for every source. ``max_staleness`` bounds a group's
    span (``None``: unbounded) and ``strategy`` (:data:`STRATEGIES`) says what a
    group past it does; ``on_policy`` hands each step's whole batch over at once.
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
        if not self.on_policy and self.batch_groups % self.unit_groups:  # (on-policy hands the step over whole)
            raise ValueError(
                f"a train batch of {self.batch_groups} groups cannot be cut into admissions of {self.unit_groups} "
                f"groups (lcm(dp={self.dp_size}, mini_batch={self.mini_batch_groups}x{self.group_size}) "
                f"rows): choose a batch size that is a multiple of it"
            )
        if self.quotas is not None and sum(self.quotas.values()) != self.batch_groups:
            raise ValueError(f"quotas {dict(self.quotas)} do not add up to the batch's {self.batch_groups} groups")
        if self.max_staleness is not None and (not isinstance(self.max_staleness, int) or self.max_staleness < 1):
            raise ValueError(f"max_staleness {self.max_staleness!r} must be an integer >= 1 or None")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy {self.strategy!r} is not one of {STRATEGIES}")
        if self.on_policy and self.quotas is not None:
            raise ValueError(
                "per-source quotas need asynchronous admission: on-policy admission hands over the step's whole "
                "batch and cannot refill a missing source"
            )

    @property
    def unit_groups(self) -> int:
        """Groups per admission: the smallest whole-group count divisible by dp and by the mini-batch."""
        rows = math.lcm(self.dp_size, self.mini_batch_groups * self.group_size)
        return rows // self.group_size

    def quota(self) -> dict[str, int]:
        return dict(self.quotas) if self.quotas is not None else {ANY_SOURCE: self.batch_groups}


@dataclass
class Admission:
    """One decision: groups admitted now, evicted as stale or misfit (failed / wrong size), refills needed.

    The caller refills each evicted group one for one; ``deficit`` is what the
    quotas need beyond those replacements.

    ``blocked`` says the ``wait`` strategy held the admission back (an
    in-flight group reached the staleness bound).
    """

    admitted: list[GroupInfo] = field(default_factory=list)
    stale: list[GroupInfo] = field(default_factory=list)
    misfit: list[GroupInfo] = field(default_factory=list)
    deficit: dict[str, int] = field(default_factory=dict)
    blocked: bool = False


@dataclass
class Polled:
    """What :meth:`AdmissionController.poll` admitted, and what it took: seconds waited, groups evicted as stale
    or misfit and refilled (over every poll), polls the ``wait`` rule held back."""

    admitted: list[GroupInfo]
    wait_s: float = 0.0
    stale: int = 0
    misfit: int = 0
    refilled: int = 0
    blocked: int = 0


#: a framework's state at one poll: its terminal groups, the groups in flight per source, the oldest in-flight version
Snapshot = tuple[Sequence[GroupInfo], Mapping[str, int], int | None]


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
        return g.source if self.config.quotas is not None else ANY_SOURCE

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
        """Staleness: the number of policy versions from the group's submission to ``version``, inclusive."""
        return version - g.version + 1

    def stale(self, g: GroupInfo, version: int) -> bool:
        """Evicted for staleness: the ``drop`` rule (``span > max_staleness``); never on-policy or under ``wait``."""
        cfg = self.config
        if cfg.on_policy or cfg.max_staleness is None or cfg.strategy != "drop":
            return False
        return self.span(g, version) > cfg.max_staleness

    def fresh(self, g: GroupInfo, version: int) -> bool:
        return not self.stale(g, version)

    def misfit(self, g: GroupInfo) -> bool:
        """A failed group or one short of ``group_size`` rows (asynchronous only: on-policy the trainer pads it)."""
        if self.config.on_policy:
            return False
        size = self.config.group_size if g.size is None else g.size
        if size > self.config.group_size:
            raise ValueError(
                f"group {g.uid} has {size} rows, more than group_size={self.config.group_size}: set group_size "
                f"to the rows each group generates; admission needs one row per group member"
            )
        return g.failed or size < self.config.group_size

    def blocked(self, oldest_inflight: int | None, version: int) -> bool:
        """The ``wait`` (dropless) rule: no admission while an in-flight group's span reached the bound."""
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
        """Decide on the terminal groups not yet admitted, at policy ``version`` (the trainer's step).

        ``inflight`` counts groups still generating, per source; ``oldest_inflight``
        is the oldest version among them (the ``wait`` rule reads it). An offer
        that evicts admits nothing (the caller evicts, refills, then offers a
        fresh snapshot). Without ``want``, admits up to ``max_units`` units,
        oldest groups first, each only if it keeps the remaining quotas
        satisfiable. With ``want`` (groups), admits exactly that many or none:
        on-policy, the oldest ``want`` terminal groups; otherwise ``want / unit``
        feasible units.
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
            pass  # evictions first (the caller clears, refills, offers a fresh snapshot); wait blocks
        elif self.config.on_policy:
            if want is not None and len(pool) >= want:
                self.commit(out, pool[:want])
        elif want is not None:
            self.admit_exactly(out, pool, inflight, want)
        else:
            self.admit_units(out, pool, inflight, max_units)
        admitted = {g.uid for g in out.admitted}
        # the caller replaces each evicted group one for one: those replacements are supply too
        replaced = [*out.stale, *out.misfit]
        out.deficit = self.deficit([g for g in pool if g.uid not in admitted] + replaced, inflight)
        return out

    def poll(
        self, snapshot: Callable[[], Snapshot], version: int, want: int, *, evict: Callable[[set[str]], None],
        refill: Callable[[int], None] | None, timeout_s: float, interval_s: float,
    ) -> Polled:
        """Offer fresh snapshots until ``want`` groups are admitted: each poll evicts what the offer evicted
        (``evict`` their uids), refills one for one plus the quotas' deficit (``refill``, if given), and offers a
        fresh snapshot at once after evicting, else after ``interval_s``; ``TimeoutError`` after ``timeout_s``."""
        t0 = time.monotonic()
        out = Polled([])
        while True:
            finished, inflight, oldest = snapshot()
            decision = self.offer(finished, inflight, version, want=want, oldest_inflight=oldest)
            gone = {g.uid for g in (*decision.stale, *decision.misfit)}
            if gone:
                evict(gone)
                out.stale += len(decision.stale)
                out.misfit += len(decision.misfit)
            out.blocked += decision.blocked
            n = len(gone) + sum(decision.deficit.values())
            if n and refill is not None:  # none on-policy: the controller evicts nothing there
                refill(n)
                out.refilled += n
            if decision.admitted:
                out.admitted, out.wait_s = decision.admitted, time.monotonic() - t0
                return out
            left = timeout_s - (time.monotonic() - t0)
            if left <= 0:
                raise TimeoutError(f"no {want} admissible whole groups within {timeout_s}s{self._why(out)}")
            if not gone:  # after evicting, select on a fresh snapshot at once; never sleep past the timeout
                time.sleep(min(interval_s, left))

    def _why(self, polled: Polled) -> str:
        """What the wait evicted, for a timeout's message: groups failed or short of ``group_size`` rows, again and
        again, point at a ``group_size`` other than the rollout's ``n``."""
        if not (polled.misfit or polled.stale):
            return ""
        said = (f": meanwhile {polled.misfit} groups were evicted as failed or short of group_size="
                f"{self.config.group_size} rows and {polled.stale} as stale, and refilled")
        if polled.misfit > polled.stale:
            said += " (is group_size the rollout's n?)"
        return said

    def check_want(self, want: int | None) -> None:
        """A sample's size: on-policy the whole step; otherwise whole units within what is left of the train batch."""
        if self.config.on_policy:
            if want is None or want < 1:
                raise ValueError("on-policy admission hands over a whole step: give want (the step's groups)")
            return
        unit = self.config.unit_groups
        if want is not None and (want < 1 or want % unit or want > self.remaining):
            raise ValueError(
                f"a sample of {want} groups is not a whole number of admission units of {unit} groups within the "
                f"{self.remaining} left of this train batch ({self.config.batch_groups} groups): batch_groups must be "
                f"the train batch's groups and each sample a multiple of the unit"
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
            have[s if self.config.quotas is not None else ANY_SOURCE] += k
        return have

    def feasible(
        self, need: Mapping[str, int], taken: Mapping[str, int], pool: Sequence[GroupInfo], inflight: Mapping[str, int]
    ) -> bool:
        """After admitting ``taken``, can every remaining quota still be filled from what is left?

        Without per-source quotas any group serves any place: whatever is there is admitted.
        """
        if self.config.quotas is None:
            return True
        have = self.supply(pool, inflight)
        return all(need[s] - taken.get(s, 0) <= have[s] - taken.get(s, 0) for s in need)

    def deficit(self, pool: Sequence[GroupInfo], inflight: Mapping[str, int]) -> dict[str, int]:
        """Groups per source that must be (re)generated for the remaining quotas to be satisfiable.

        Only per-source quotas have one: without them the only refills replace
        evicted groups one for one.
        """
        if self.config.on_policy or self.config.quotas is None:
            return {}
        have, need = self.supply(pool, inflight), self.need()
        short = {s: n - have[s] for s, n in need.items() if n > have[s]}
        # groups in flight whose source the framework cannot name (verl's prompts carry none) may still fill any
        # quota: only what they cannot cover is regenerated, or every poll would refill while they run
        unnamed = 0 if ANY_SOURCE in need else inflight.get(ANY_SOURCE, 0)
        for s in sorted(short):
            covered = min(unnamed, short[s])
            short[s] -= covered
            unnamed -= covered
        return {s: n for s, n in short.items() if n > 0}

    def next_batch(self) -> None:
        """Start the next train batch's quotas (the uids admitted or evicted stay decided)."""
        self.admitted.clear()
        self.total = 0
