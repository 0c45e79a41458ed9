"""Slot bookkeeping for the replay buffer: which slots hold which transitions.

Pure index math over numpy arrays, no tensors. The default FIFO ring never
leaves holes, so its slots are ``[0, count)`` and a write is a contiguous range
from ``pos``. Other removers (LIFO, uniform, prioritized) and ``max_times_sampled``
eviction leave holes: then free slots are filled first (lowest index first)
and, when there are not enough, the remover names the slots to evict.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

__all__ = [
    "FifoRemover",
    "LifoRemover",
    "PrioritizedRemover",
    "Remover",
    "SlotTable",
    "UniformRemover",
    "make_remover",
]


class SlotTable:
    """Transition ids, validity and sample counts per slot of a ``capacity``-slot buffer."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.ids = np.full(capacity, -1, dtype=np.int64)
        self.times_sampled = np.zeros(capacity, dtype=np.int64)
        self.valid = np.zeros(capacity, dtype=bool)
        self.count = 0  # valid slots
        self.high = 0  # slots [0, high) were written at least once
        self.pos = 0  # ring pointer of the FIFO fast path
        self._dense: np.ndarray | None = None  # valid slots, rebuilt lazily after a change
        # while every row came through occupy_ring with consecutive ids, slot s holds id
        # next_id - 1 - ((pos - 1 - s) mod capacity), and a draw's ids can be worked out later (ring_state)
        self._pure_ring = True
        self._next_id = 0

    @property
    def contiguous(self) -> bool:
        """No holes: the valid slots are exactly ``[0, count)``."""
        return self.count == self.high

    def ring_state(self) -> tuple[int, int, int] | None:
        """``(pos, next_id, capacity)`` while every slot was filled by :meth:`occupy_ring` with consecutive ids.

        Then slot ``s`` holds id ``next_id - 1 - ((pos - 1 - s) mod capacity)``, so the ids a draw
        took can be worked out from this state later (:class:`conduit.batch.DrawnRows`); None otherwise.
        """
        return (self.pos, self._next_id, self.capacity) if self._pure_ring else None

    def valid_slots(self) -> np.ndarray:
        if self.contiguous:
            return np.arange(self.count, dtype=np.int64)
        if self._dense is None:
            self._dense = np.flatnonzero(self.valid).astype(np.int64)
        return self._dense

    # -- allocation -------------------------------------------------------------
    def ring_slots(self, n: int) -> np.ndarray:
        """The FIFO ring's next ``n`` slots from ``pos`` (evicting the oldest once full)."""
        return (self.pos + np.arange(n, dtype=np.int64)) % self.capacity

    def occupy_ring(self, n: int, first_id: int) -> None:
        """The ring fast path of :meth:`occupy`: ``n`` rows from ``pos`` (wrapping), no holes ever."""
        start, cap = self.pos, self.capacity
        first = min(n, cap - start)
        ids = np.arange(first_id, first_id + n, dtype=np.int64)
        full = self.count == cap  # a full ring has no holes: every slot is valid already
        if first == n:  # the common case: no wrap (two numpy calls, not four: each one counts on the push path)
            self.ids[start : start + n] = ids
            if not full:
                self.valid[start : start + n] = True
        else:
            self.ids[start:] = ids[:first]
            self.ids[: n - first] = ids[first:]
            if not full:
                self.valid[start:] = True
                self.valid[: n - first] = True
        self.count = min(cap, self.count + n)
        self.high = max(self.high, min(cap, start + n))
        self.pos = (start + n) % cap
        self._dense = None
        if first_id != self._next_id:
            self._pure_ring = False
        self._next_id = first_id + n

    def allocate(self, n: int, remover: Remover, priorities: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
        """``n`` slots for new rows: free slots first, then what the remover evicts."""
        free = np.flatnonzero(~self.valid)[:n].astype(np.int64)
        short = n - free.size
        if short <= 0:
            return free
        victims = remover.choose(short, self.valid_slots(), self.ids, priorities, rng)
        return np.concatenate([free, victims])

    def occupy(self, slots: np.ndarray, first_id: int) -> None:
        """Rows with ids ``first_id, first_id+1, ...`` now live in ``slots`` (in order)."""
        newly = ~self.valid[slots]
        self.ids[slots] = np.arange(first_id, first_id + slots.size, dtype=np.int64)
        self.times_sampled[slots] = 0
        self.valid[slots] = True
        self.count += int(np.count_nonzero(newly))
        if slots.size:
            self.high = max(self.high, int(slots.max()) + 1)
        self._dense = None
        self._pure_ring = False

    def release(self, slots: np.ndarray) -> np.ndarray:
        """Free ``slots`` (evicted by ``max_times_sampled``); returns the ones that were valid."""
        slots = np.unique(slots)
        slots = slots[self.valid[slots]]
        self.valid[slots] = False
        self.ids[slots] = -1
        self.count -= slots.size
        self._dense = None
        self._pure_ring = False
        return slots

    def state_dict(self) -> dict[str, Any]:
        return {
            "ids": self.ids.copy(), "times_sampled": self.times_sampled.copy(), "valid": self.valid.copy(),
            "count": self.count, "high": self.high, "pos": self.pos,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("ids", "times_sampled", "valid"):
            arr = np.asarray(state[key])
            if arr.shape != (self.capacity,):
                raise ValueError(f"slot table {key}: expected shape ({self.capacity},), got {arr.shape}")
        self.ids = np.asarray(state["ids"], dtype=np.int64).copy()
        self.times_sampled = np.asarray(state["times_sampled"], dtype=np.int64).copy()
        self.valid = np.asarray(state["valid"], dtype=bool).copy()
        self.count, self.high, self.pos = int(state["count"]), int(state["high"]), int(state["pos"])
        self._dense = None
        self._pure_ring, self._next_id = self._ring_arithmetic()

    def _ring_arithmetic(self) -> tuple[bool, int]:
        """Whether loaded ids are a pure ring's (see :meth:`ring_state`), and the id its next row gets."""
        if not self.contiguous or (self.count < self.capacity and self.pos != self.count):
            return False, 0
        if self.count == 0:
            return True, 0
        next_id = int(self.ids[(self.pos - 1) % self.capacity]) + 1
        slots = np.arange(self.count, dtype=np.int64)
        expected = next_id - 1 - ((self.pos - 1 - slots) % self.capacity)
        return bool(np.array_equal(self.ids[: self.count], expected)), next_id


class Remover(ABC):
    """Chooses which live slots to evict when a write needs more than the free ones."""

    name: str = "remover"

    @abstractmethod
    def choose(
        self, k: int, valid: np.ndarray, ids: np.ndarray, priorities: np.ndarray | None, rng: np.random.Generator
    ) -> np.ndarray:
        """``k`` distinct slots among ``valid``."""


class FifoRemover(Remover):
    """Evict the oldest transitions (the ring's behaviour)."""

    name = "fifo"

    def choose(self, k, valid, ids, priorities, rng):  # type: ignore[no-untyped-def]
        order = np.argpartition(ids[valid], k - 1)[:k] if k < valid.size else np.arange(valid.size)
        return valid[order][np.argsort(ids[valid[order]])]


class LifoRemover(Remover):
    """Evict the newest transitions."""

    name = "lifo"

    def choose(self, k, valid, ids, priorities, rng):  # type: ignore[no-untyped-def]
        order = np.argpartition(-ids[valid], k - 1)[:k] if k < valid.size else np.arange(valid.size)
        return valid[order]


class UniformRemover(Remover):
    """Evict uniformly at random."""

    name = "uniform"

    def choose(self, k, valid, ids, priorities, rng):  # type: ignore[no-untyped-def]
        return rng.choice(valid, size=k, replace=False).astype(np.int64)


class PrioritizedRemover(Remover):
    """Evict the lowest-priority transitions (uniform when there are no priorities)."""

    name = "prioritized"

    def choose(self, k, valid, ids, priorities, rng):  # type: ignore[no-untyped-def]
        if priorities is None:
            return UniformRemover().choose(k, valid, ids, priorities, rng)
        p = priorities[valid]
        order = np.argpartition(p, k - 1)[:k] if k < valid.size else np.arange(valid.size)
        return valid[order]


_REMOVERS: dict[str, type[Remover]] = {
    r.name: r for r in (FifoRemover, LifoRemover, UniformRemover, PrioritizedRemover)
}


def make_remover(name: str) -> Remover:
    if name not in _REMOVERS:
        raise ValueError(f"remover={name!r}: expected one of {sorted(_REMOVERS)}")
    return _REMOVERS[name]()
