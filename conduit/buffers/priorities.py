"""Prioritized replay's operations on a replay buffer: generation-checked updates, beta, and the priority mass.

A mixin of :class:`~conduit.buffers.replay.ReplayBuffer` (the buffer's lock, slot table,
sampler and use budget): a priority update lands only where the slot still holds the row
drawn, and tells the use budget and the replay counts (``count_replays="feedback"``).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from conduit.buffers.budget import UseBudget
from conduit.errors import SemanticsError
from conduit.samplers.base import Sampler
from conduit.samplers.prioritized import checked_priorities
from conduit.slots import SlotTable

__all__ = ["PriorityOps"]


class PriorityOps:
    """What a learner side does to a prioritized buffer's priorities (the buffer holds the attributes below)."""

    lock: threading.RLock
    table: SlotTable
    sampler: Sampler
    budget: UseBudget | None
    rng: np.random.Generator

    def update_priorities(
        self, indices: np.ndarray, ids: np.ndarray, priorities: np.ndarray, *, beta: float | None = None,
        count: bool = True,
    ) -> int:
        """Apply priorities where the slot still holds the sampled transition; returns how many applied.
        ``beta``: the importance-sampling exponent from the next draw on (annealed by the framework); ``count``:
        the update counts as its batch's feedback (``count_replays="feedback"``; a batch's later ones do not)."""
        if not self.sampler.has_priorities:
            raise SemanticsError("update_priorities needs off-policy replay with sampler='prioritized'")
        indices, ids, pr = checked_priorities(indices, ids, priorities)
        if beta is not None and not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta: expected 0 <= beta <= 1, got {beta}")
        with self.lock:
            if beta is not None:
                self.sampler.beta = float(beta)  # type: ignore[attr-defined]
            live = self.table.ids[indices] == ids
            if np.any(live):
                slots = indices[live]
                self.sampler.update_priorities(slots, pr[live])
                if count:
                    self.table.fed_back(slots, ids[live])
                if self.budget is not None:
                    self.budget.priorities_updated(slots)
            return int(live.sum())

    # -- what the learner side may set --------------------------------------------------
    def use_rng(self, rng: np.random.Generator) -> None:
        """Draw with ``rng`` from now on (frameworks that seed their buffers' generator themselves): every
        sampler, the uniform one included (which otherwise draws with its own torch generator)."""
        with self.lock:
            self.rng = rng
            self.sampler.draws_with_rng = True

    def set_beta(self, beta: float) -> None:
        """Prioritized replay: the importance-sampling exponent of the next draws (annealed by the framework)."""
        with self.lock:
            self._priorities("set_beta").beta = float(beta)

    def priorities_at(self, slots: np.ndarray) -> tuple[np.ndarray, float]:
        """Prioritized replay: the sampler's priorities of ``slots`` (after ``** alpha``) and its max priority."""
        with self.lock:
            s = self._priorities("priorities_at")
            return s.leaf_values(slots), s.max_priority

    def priority_mass(self) -> tuple[float, float, float]:
        """Prioritized replay: the rows' total ``p^alpha``, its smallest term and the sampler's beta (what a draw
        over several buffers as one needs: :mod:`conduit.distributed`)."""
        with self.lock:
            s = self._priorities("priority_mass")
            return float(s.tree.total), float(s.tree.min), float(s.beta)

    # -- one shard of several (conduit.distributed): new rows enter at the group's max priority -----------
    def newest_state(self, since: int) -> tuple[float, float]:
        """Prioritized: the max priority (``|p| + eps`` units) and the smallest ``p^alpha`` of the rows stored
        with ids from ``since`` on (inf if none)."""
        with self.lock:
            s = self._priorities("newest_state")
            slots = self._stored_since(since)
            return float(s.max_priority), float(s.leaf_values(slots).min()) if slots.size else float("inf")

    def lift_newest(self, since: int, max_priority: float) -> None:
        """Prioritized: the group's max priority becomes this buffer's, and the rows stored with ids from ``since`` on
        (never drawn yet, so still at the priority they entered with) rise to it, as one buffer's new rows would
        have entered at it."""
        with self.lock:
            s = self._priorities("lift_newest")
            s.max_priority = max(s.max_priority, float(max_priority))
            slots = self._stored_since(since)
            top = s.max_priority**s.alpha
            low = slots[s.leaf_values(slots) < top]
            s.tree.update(low, np.full(low.size, top))

    def _stored_since(self, since: int) -> np.ndarray:
        """Slots of the live rows with ids from ``since`` on (caller holds the lock): a ring's newest positions."""
        ring = self.table.ring_state()
        if ring is None:
            return np.flatnonzero(self.table.ids >= since)
        pos, next_id, capacity = ring
        n = min(max(0, next_id - since), self.table.count)
        return (pos - n + np.arange(n, dtype=np.int64)) % capacity

    def _priorities(self, what: str) -> Any:
        """The prioritized sampler (SemanticsError naming ``what`` for any other)."""
        if not self.sampler.has_priorities:
            raise SemanticsError(f"{what} needs sampler='prioritized'")
        return self.sampler
