"""The iteration-latency cost model and the schedule optimizer (paper §6.2–6.3, Eq. 2, App. E).

Pure functions over measured costs. One *iteration* is one actor→learner round:
off-policy, one rollout unit and one training batch; on-policy, the rollouts of
one iteration and its whole update (``M`` mini-batches × epochs).

- ``T̄(g) = T(g) · n(g)``: the per-iteration cost of an operator whose single
  invocation at granularity ``g`` takes ``T(g)``, run ``n(g)`` times per
  iteration (``1/g`` off-policy; on-policy the invocations one iteration needs).
- ``T_ing_path = T_rollout + T̄_ing + overlap·S_ing(g) − hide_ing``
- ``T_del_path = T_update  + T̄_del + overlap·S_del(g) − hide_del``
- ``S(g) = T_sync0 + n(g)·T_sync``: what overlapping costs per iteration
- ``hide = overlap · γ(g) · min(T_neighbour, T̄(g))``, ``γ(g) = 1`` for ``g ≥ 1``,
  ``1 − g`` for ``0 < g < 1``.
- ``S_both``: what overlapping *both* paths costs beyond the two single-path
  costs (two workers and the learner's compute share the cores), paid by
  every schedule that overlaps both.
- Eq. 2: minimise ``T_iter = max(T_ing_path + T_del_path (+ S_both),
  T_rollout + T_update) + t_other`` over every feasible schedule (the loop's
  own work is never hidden); exposed experience-path latency is
  ``T_iter − T_rollout − T_update``.

``S(g)`` is whatever overlap costs beyond the hidden work: a part paid **per
invocation** (``T_sync``: the hand-off between the worker and the caller —
wake-ups, the GIL, events — and, on a CPU, the worker's bursts of contention
with the compute it overlaps), so a coarser granularity pays it less often, and
a part paid per iteration whatever the granularity (``T_sync0``). The
profiler calibrates it from measured overlapped runs, so the optimizer chooses
no overlap where overlap does not pay. Where the profiler probed a path
overlapped at a granularity, that measurement is used as it is (``s_ing`` /
``s_del``): on busy cores the cost is far from linear in ``g``, and the line
serves only the granularities left unprobed. ``S_both`` is measured once, with both paths overlapped at their
finest granularity, as what that run took beyond the single-path model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from conduit.core import Mode, Policy, Schedule

__all__ = ["Costs", "Prediction", "coarseness", "gamma", "optimize", "predict", "rank"]


def gamma(g: Fraction) -> float:
    """How much of the overlappable bound is practically hidden (App. E, Eq. 6)."""
    return 1.0 if g >= 1 else float(1 - g)


@dataclass(frozen=True)
class Costs:
    """Measured costs in seconds.

    Attributes:
        policy: decides how many invocations one iteration needs.
        t_rollout / t_update: one iteration's rollouts / update, alone.
        t_ing / t_del: wall time of ONE invocation at each granularity.
        t_sync_ing / t_sync_del: cost of overlapping a path, per invocation.
        t_sync0_ing / t_sync0_del: cost of overlapping a path, per iteration (any granularity).
        s_ing / s_del: the per-iteration cost of overlapping a path, measured at each
            probed granularity; where present it replaces the line
            ``T_sync0 + n(g)·T_sync`` (costs on a busy CPU are not linear in ``g``).
        s_both: the per-iteration cost of overlapping both paths beyond the sum of
            overlapping each alone (fitted between 0 and the smaller path's overlap cap).
        t_other: per-iteration time outside every term (the loop's own bookkeeping);
            the same for every schedule, so it never changes the choice.
        units_per_iteration: on-policy rollout units per iteration (``U``).
        num_minibatches / num_epochs: on-policy ``M`` and epochs.
    """

    policy: Policy
    t_rollout: float
    t_update: float
    t_ing: Mapping[Fraction, float]
    t_del: Mapping[Fraction, float]
    t_sync_ing: float = 0.0
    t_sync_del: float = 0.0
    t_other: float = 0.0
    t_sync0_ing: float = 0.0
    t_sync0_del: float = 0.0
    units_per_iteration: int = 1
    num_minibatches: int = 1
    num_epochs: int = 1
    notes: Mapping[str, float] = field(default_factory=dict)
    s_ing: Mapping[Fraction, float] = field(default_factory=dict)
    s_del: Mapping[Fraction, float] = field(default_factory=dict)
    s_both: float = 0.0

    def ingestion_invocations(self, g: Fraction) -> float:
        """Invocations per iteration at ingestion granularity ``g``."""
        if self.policy is Policy.OFF_POLICY:
            return float(1 / g)
        return self.units_per_iteration * float(1 / g)

    def delivery_invocations(self, g: Fraction) -> float:
        """Invocations per iteration at delivery granularity ``g``."""
        if self.policy is Policy.OFF_POLICY:
            return float(1 / g)
        per_epoch = self.num_minibatches if g < 1 else 1
        return per_epoch * self.num_epochs

    def per_iteration_ing(self, g: Fraction) -> float:
        return self.t_ing[g] * self.ingestion_invocations(g)

    def per_iteration_del(self, g: Fraction) -> float:
        return self.t_del[g] * self.delivery_invocations(g)

    def overlap_cap(self, path: str, g: Fraction) -> float:
        """The most overlapping ``path`` (``"ingestion"`` or ``"delivery"``) at ``g`` can cost per iteration: the
        work it overlaps, the path's own and its neighbour's (rollout or update) run one after the other."""
        if path == "ingestion":
            return self.t_rollout + self.per_iteration_ing(g)
        return self.t_update + self.per_iteration_del(g)

    def sync_ing(self, g: Fraction) -> float:
        """Per-iteration cost of overlapping ingestion at ``g`` (between 0 and :meth:`overlap_cap`)."""
        s = self.s_ing[g] if g in self.s_ing else self.t_sync0_ing + self.t_sync_ing * self.ingestion_invocations(g)
        return min(max(0.0, s), self.overlap_cap("ingestion", g))

    def sync_del(self, g: Fraction) -> float:
        """Per-iteration cost of overlapping delivery at ``g`` (between 0 and :meth:`overlap_cap`)."""
        s = self.s_del[g] if g in self.s_del else self.t_sync0_del + self.t_sync_del * self.delivery_invocations(g)
        return min(max(0.0, s), self.overlap_cap("delivery", g))


@dataclass(frozen=True, order=True)
class Prediction:
    """The model's answer for one schedule (ordered by ``t_iter``)."""

    t_iter: float
    exposed: float
    ingestion_path: float
    delivery_path: float
    schedule: Schedule

    def to_json(self) -> dict[str, object]:
        return {
            "schedule": self.schedule.to_json(),
            "t_iter_s": self.t_iter,
            "exposed_s": self.exposed,
            "ingestion_path_s": self.ingestion_path,
            "delivery_path_s": self.delivery_path,
        }


def _path(t_neighbour: float, per_iteration: float, mode: Mode, sync: float) -> float:
    if not mode.overlap:
        return t_neighbour + per_iteration
    hide = gamma(mode.granularity) * min(t_neighbour, per_iteration)
    return t_neighbour + per_iteration + sync - hide


def predict(costs: Costs, schedule: Schedule) -> Prediction:
    """``T_iter`` of one schedule under the model."""
    i, d = schedule.ingestion, schedule.delivery
    ing = _path(costs.t_rollout, costs.per_iteration_ing(i.granularity), i, costs.sync_ing(i.granularity))
    dlv = _path(costs.t_update, costs.per_iteration_del(d.granularity), d, costs.sync_del(d.granularity))
    t_iter = ing + dlv + costs.t_other + (costs.s_both if i.overlap and d.overlap else 0.0)
    # the loop's own rollout and update can never be hidden: a negative S_both (both paths overlapped hid
    # more than each alone) lowers T_iter at most to that bound, where schedules tie (exposed latency 0)
    t_iter = max(t_iter, costs.t_rollout + costs.t_update + costs.t_other)
    exposed = max(0.0, t_iter - costs.t_rollout - costs.t_update)  # never -1e-18 from rounding
    return Prediction(t_iter, exposed, ing, dlv, schedule)


def rank(costs: Costs, schedules: Iterable[Schedule]) -> list[Prediction]:
    """Predictions for every schedule, best first (equal predictions: the finer, the simpler schedule first)."""
    return sorted((predict(costs, s) for s in schedules), key=lambda p: (p.t_iter, _tie_order(p.schedule)))


def optimize(costs: Costs, schedules: Iterable[Schedule]) -> Prediction:
    """Eq. 2: the schedule with the smallest predicted ``T_iter``."""
    ranked = rank(costs, schedules)
    if not ranked:
        raise ValueError("no feasible schedule to choose from")
    return ranked[0]


def coarseness(s: Schedule) -> Fraction:
    """Units and batches a schedule groups beyond one per path (pure): ``g - 1`` summed over paths of whole ones.

    A grouped unit waits for the rest of its group before it lands; a grouped
    batch is drawn before the pulls it serves: data up to that many iterations
    older than at ``g = 1``. A fraction of an on-policy iteration (``g < 1``)
    groups nothing across iterations (docs/design.md §2).
    """
    return sum((m.granularity - 1 for m in (s.ingestion, s.delivery) if m.granularity >= 1), Fraction(0))


def _tie_order(s: Schedule) -> tuple[Fraction, int, Fraction, Fraction]:
    """Equal predictions: the finer, then fewer overlapped paths, then the finer delivery, then ingestion."""
    i, d = s.ingestion, s.delivery
    return (coarseness(s), int(i.overlap) + int(d.overlap), d.granularity, i.granularity)
