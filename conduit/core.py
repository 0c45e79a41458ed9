"""The vocabulary every layer shares: policies, schedules, feasible spaces, sampler and remover kinds.

This module imports nothing of Conduit, so the runtime, the configuration, the
checkpoints and the planner above them all speak the same records.

Schedules (docs/design.md §4, the paper's §4.3 and Fig. 10) have two knobs per operator:
*timing* (``overlap``: run inline at push/pull, or on the worker overlapped with
rollout/update) and *granularity* ``g`` (how many rollout units / training batches one
invocation handles; a fraction pipelines one on-policy iteration mini-batch by
mini-batch).

Granularities are :class:`fractions.Fraction` so ``k/M`` is exact.

- off-policy: ``G_ing = {1..g_ing_max}``, ``G_del = {1..g_del_max}``, any overlap;
- on-policy with ``M`` mini-batches: ``G_ing = {1/M, 2/M, ..., 1}`` and
  ``G_del = {1/M, 1}``; only ``(overlap=0, g=1)`` and ``(overlap=1, 0<g<1)``
  keep on-policy freshness (Fig. 10), so the other combinations are infeasible.
  ``g_del = 1`` prepares an epoch's ``M`` mini-batches in one invocation;
  ``g_del = 1/M`` prepares one mini-batch at a time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction

__all__ = [
    "INLINE",
    "Mode",
    "Policy",
    "RemoverKind",
    "SamplerKind",
    "Schedule",
    "as_granularity",
    "delivery_space",
    "feasible_schedules",
    "ingestion_space",
    "is_feasible_mode",
]


class Policy(str, Enum):
    """Whether the learner may replay old experience."""

    OFF_POLICY = "off_policy"
    ON_POLICY = "on_policy"


class SamplerKind(str, Enum):
    """How off-policy delivery selects rows (Reverb's selectors)."""

    UNIFORM = "uniform"
    PRIORITIZED = "prioritized"
    FIFO = "fifo"
    LIFO = "lifo"


class RemoverKind(str, Enum):
    """Which rows a full off-policy buffer evicts for new ones."""

    FIFO = "fifo"
    LIFO = "lifo"
    UNIFORM = "uniform"
    PRIORITIZED = "prioritized"


def as_granularity(value: float | int | str | Fraction) -> Fraction:
    """Parse ``2``, ``0.25``, ``"1/4"`` into an exact fraction (denominator ≤ 1024)."""
    g = Fraction(value) if not isinstance(value, float) else Fraction(value).limit_denominator(1024)
    if g <= 0:
        raise ValueError(f"granularity must be > 0, got {value!r}")
    return g


@dataclass(frozen=True, order=True)
class Mode:
    """Timing and granularity of one operator (ingestion or delivery)."""

    overlap: bool
    granularity: Fraction

    def __post_init__(self) -> None:
        object.__setattr__(self, "granularity", as_granularity(self.granularity))

    @property
    def is_fractional(self) -> bool:
        return self.granularity < 1

    def __str__(self) -> str:
        timing = "overlap" if self.overlap else "inline"
        return f"{timing} g={self.granularity}"

    def to_json(self) -> dict[str, object]:
        return {"overlap": self.overlap, "granularity": str(self.granularity)}

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Mode:
        return cls(bool(d["overlap"]), as_granularity(d["granularity"]))  # type: ignore[arg-type]


@dataclass(frozen=True, order=True)
class Schedule:
    """A complete plan for both paths."""

    ingestion: Mode
    delivery: Mode

    def __str__(self) -> str:
        return f"ingestion[{self.ingestion}] delivery[{self.delivery}]"

    def to_json(self) -> dict[str, object]:
        return {"ingestion": self.ingestion.to_json(), "delivery": self.delivery.to_json()}

    @classmethod
    def from_json(cls, d: dict[str, dict[str, object]]) -> Schedule:
        return cls(Mode.from_json(d["ingestion"]), Mode.from_json(d["delivery"]))


#: both paths inline at g = 1: an RLlib-style buffer, what a user runs without a plan
INLINE = Schedule(Mode(False, Fraction(1)), Mode(False, Fraction(1)))


def ingestion_space(policy: Policy, num_minibatches: int = 1, g_max: int = 4) -> tuple[Fraction, ...]:
    """``G_ing``: integers ``1..g_max`` off-policy, ``k/M`` on-policy."""
    if policy is Policy.OFF_POLICY:
        return tuple(Fraction(g) for g in range(1, g_max + 1))
    m = num_minibatches
    return tuple(sorted({Fraction(k, m) for k in range(1, m + 1)}))


def delivery_space(policy: Policy, num_minibatches: int = 1, g_max: int = 4) -> tuple[Fraction, ...]:
    """``G_del``: integers ``1..g_max`` off-policy, ``{1/M, 1}`` on-policy."""
    if policy is Policy.OFF_POLICY:
        return tuple(Fraction(g) for g in range(1, g_max + 1))
    return tuple(sorted({Fraction(1, num_minibatches), Fraction(1)}))


def is_feasible_mode(policy: Policy, mode: Mode, space: tuple[Fraction, ...]) -> bool:
    """Whether ``mode`` keeps the policy's semantics and lies in ``space``."""
    if mode.granularity not in space:
        return False
    if policy is Policy.OFF_POLICY:
        return mode.granularity >= 1 and mode.granularity.denominator == 1
    # on-policy (Fig. 10): inline whole, or overlapped sub-unit pipelining
    return (not mode.overlap and mode.granularity == 1) or (mode.overlap and mode.granularity < 1)


def feasible_schedules(
    policy: Policy,
    num_minibatches: int = 1,
    g_ing_max: int = 4,
    g_del_max: int = 4,
) -> list[Schedule]:
    """All feasible schedules out of the ``4·|G_ing|·|G_del|`` candidates."""
    g_ing = ingestion_space(policy, num_minibatches, g_ing_max)
    g_del = delivery_space(policy, num_minibatches, g_del_max)
    out = []
    for o_i, gi, o_d, gd in itertools.product((False, True), g_ing, (False, True), g_del):
        ing, dlv = Mode(o_i, gi), Mode(o_d, gd)
        if is_feasible_mode(policy, ing, g_ing) and is_feasible_mode(policy, dlv, g_del):
            out.append(Schedule(ing, dlv))
    return out
