"""``max_times_sampled``: each row may be used a bounded number of times, and no two draws take the same use.

A learner's draw under a budget takes each row at most once (the sampler's
``sample_distinct``) and reserves the use it takes in the slot table, in the same
hold of the buffer's lock. A row whose every use is
counted or reserved is *held*: live, but no sampler may draw it (a prioritized
sampler sees it at priority 0; its own priority waits here). The use is settled
when the batch reaches its learner (counted; the row leaves after its last) or
given back when a staged batch is dropped unread (:mod:`conduit.slots`).

Pure bookkeeping over the buffer's slot table and sampler; the buffer calls
every method under its lock.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conduit.errors import SemanticsError
from conduit.samplers.base import Draw, Sampler
from conduit.slots import SlotTable

__all__ = ["UseBudget"]


class UseBudget:
    """The uses left of each row of one buffer (``limit`` per row)."""

    def __init__(self, limit: int, table: SlotTable, sampler: Sampler) -> None:
        self.limit = limit
        self.table = table
        self.sampler = sampler
        #: prioritized: the priorities of held rows, whose leaves are 0 while held
        self._held_leaves: np.ndarray | None = None

    def select(self, n: int, rng: np.random.Generator) -> Draw:
        """``n`` distinct rows that have a use left, one use of each reserved for the draw's learner."""
        table = self.table
        if table.sampleable < n:
            raise SemanticsError(
                f"cannot draw {n} rows: {table.sampleable} of the buffer's {table.count} have a use left that no "
                f"batch on its way to a learner holds (max_times_sampled={self.limit})"
            )
        draw = self.sampler.sample_distinct(n, table, rng)
        self._hold(table.reserve(draw.indices, self.limit))
        return draw

    def delivered(self, slots: np.ndarray, reserved: bool) -> np.ndarray:
        """A batch of ``slots`` (still holding the rows drawn) reached a learner: count one use each.

        ``reserved``: its draw reserved the uses (settled now). Returns the rows with no use left.
        """
        table = self.table
        if reserved:
            spent, freed = table.settle(slots, self.limit, delivered=True)
            self._unhold(freed)
            return spent
        np.add.at(table.times_sampled, slots, 1)
        return slots[table.times_sampled[slots] >= self.limit]

    def unreserve(self, slots: np.ndarray) -> None:
        """A batch drawn with ``reserve`` will never reach a learner: its uses come back."""
        _, freed = self.table.settle(slots, self.limit, delivered=False)
        self._unhold(freed)

    def priorities_updated(self, slots: np.ndarray) -> None:
        """The sampler just set new priorities for ``slots``: held ones keep priority 0 until released."""
        if not self.table.held_count or self._held_leaves is None:
            return
        held = slots[self.table.held[slots]]
        if held.size:
            self._held_leaves[held] = self.sampler.leaf_values(held)  # type: ignore[attr-defined]
            self.sampler.on_release(held)

    def remover_priorities(self) -> np.ndarray | None:
        """The sampler's priorities as a remover should see them: held rows at their own priority, not 0."""
        pr = self.sampler.priorities()
        if pr is None or not self.table.held_count or self._held_leaves is None:
            return pr
        pr = pr.copy()
        held = self.table.held
        pr[held] = self._held_leaves[held]
        return pr

    def state_dict(self) -> dict[str, Any]:
        """The held rows' own priorities (their leaves are 0 in the sampler's state while held)."""
        return {"held_leaves": None if self._held_leaves is None else self._held_leaves.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """After the slot table and the sampler are loaded: the held rows follow from the table's counts, their
        priorities from the record (a checkpoint from before reservations has neither)."""
        self.table.hold_spent(self.limit)
        held = state.get("held_leaves")
        self._held_leaves = None if held is None else np.asarray(held, dtype=np.float64).copy()

    def _hold(self, slots: np.ndarray) -> None:
        if slots.size and self.sampler.has_priorities:
            if self._held_leaves is None:
                self._held_leaves = np.zeros(self.table.capacity)
            self._held_leaves[slots] = self.sampler.leaf_values(slots)  # type: ignore[attr-defined]
            self.sampler.on_release(slots)

    def _unhold(self, slots: np.ndarray) -> None:
        if slots.size and self.sampler.has_priorities and self._held_leaves is not None:
            self.sampler.set_leaf_values(  # type: ignore[attr-defined]
                slots, self._held_leaves[slots], self.sampler.max_priority  # type: ignore[attr-defined]
            )
