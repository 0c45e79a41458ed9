"""Slot bookkeeping for the replay buffer: which slots hold which transitions.

Pure index math over numpy arrays, no tensors. The default FIFO ring never
leaves holes, so its slots are ``[0, count)`` and a write is a contiguous range
from ``pos``. Other removers (LIFO, uniform, prioritized) and ``max_times_sampled``
eviction leave holes: then free slots are filled first (lowest index first)
and, when there are not enough, the remover names the slots to evict.

Under ``max_times_sampled`` a draw *reserves* each row it takes (``reserved``)
until the batch reaches a learner (then the use counts in ``times_sampled``) or
is given back (a staged batch dropped unread). A row whose uses are all counted
or reserved is *held*: still live, but no sampler may draw it again, so two
draws in flight never take the same use of a row (:meth:`SlotTable.candidates`).

With ``count_replays`` the table also counts how many batches drew each row (Reverb's
``times_sampled``, SRL's reuses): once per batch, at the draw or at the batch's priority
update, reset when a slot holds a new row -- lazily, by id, so a write pays nothing.
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
    "slots_in_order",
]


class SlotTable:
    """Transition ids, validity and sample counts per slot of a ``capacity``-slot buffer."""

    def __init__(self, capacity: int, count_replays: str | None = None) -> None:
        self.capacity = capacity
        self.ids = np.full(capacity, -1, dtype=np.int64)
        self.times_sampled = np.zeros(capacity, dtype=np.int64)
        self.valid = np.zeros(capacity, dtype=bool)
        self.count = 0  # valid slots
        self.high = 0  # slots [0, high) were written at least once
        self.pos = 0  # ring pointer of the FIFO fast path
        #: draws of each row that are in flight (taken, not yet delivered or given back)
        self.reserved = np.zeros(capacity, dtype=np.int64)
        #: rows every use of which is counted or reserved: live, but no draw may take them
        self.held = np.zeros(capacity, dtype=bool)
        self.held_count = 0
        self._dense: np.ndarray | None = None  # valid slots, rebuilt lazily after a change
        self._free: np.ndarray | None = None  # valid slots not held, rebuilt lazily after a change
        # while every row came through occupy_ring with consecutive ids, slot s holds id
        # next_id - 1 - ((pos - 1 - s) mod capacity), and a draw's ids can be worked out later (ring_state)
        self._pure_ring = True
        self._next_id = 0
        #: count_replays: "draw" or "feedback" (None: not counted), each row's count, and the id it belongs to
        self.replays_at = count_replays
        counting = count_replays is not None
        self.replays = np.zeros(capacity, dtype=np.int64) if counting else None
        self._replays_of = np.full(capacity, -1, dtype=np.int64) if counting else None

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

    @property
    def sampleable(self) -> int:
        """Live rows a draw may take (not held)."""
        return self.count - self.held_count

    def candidates(self) -> np.ndarray:
        """The slots a draw may take: live and not held."""
        if not self.held_count:
            return self.valid_slots()
        if self._free is None:
            self._free = np.flatnonzero(self.valid & ~self.held).astype(np.int64)
        return self._free

    # -- reservations (max_times_sampled) ------------------------------------------
    def reserve(self, slots: np.ndarray, max_times: int) -> np.ndarray:
        """A draw took ``slots`` (distinct, live, not held): reserve one use each; returns the ones now held."""
        self.reserved[slots] += 1
        full = slots[self.times_sampled[slots] + self.reserved[slots] >= max_times]
        self._hold(full)
        return full

    def hold_spent(self, max_times: int) -> np.ndarray:
        """Hold every live row whose uses are all counted or reserved (after a load); returns them."""
        full = np.flatnonzero(self.valid & (self.times_sampled + self.reserved >= max_times)).astype(np.int64)
        self._hold(full)
        return full

    def settle(self, slots: np.ndarray, max_times: int, *, delivered: bool) -> tuple[np.ndarray, np.ndarray]:
        """Reserved uses of ``slots`` (distinct, live, one each) end: counted (``delivered``) or given back.

        Returns ``(spent, freed)``: rows whose every use is now counted (the caller evicts them),
        and held rows that may be drawn again.
        """
        slots = slots[self.reserved[slots] > 0]  # a use is settled once: what was given back stays given back
        self.reserved[slots] -= 1  # distinct: one draw's rows
        if delivered:
            self.times_sampled[slots] += 1
        spent = slots[self.times_sampled[slots] >= max_times]
        rest = slots[self.times_sampled[slots] < max_times]
        freed = rest[self.held[rest] & (self.times_sampled[rest] + self.reserved[rest] < max_times)]
        self._unhold(freed)
        return spent, freed

    def _hold(self, slots: np.ndarray) -> None:
        slots = slots[~self.held[slots]]
        if slots.size:
            self.held[slots] = True
            self.held_count += int(slots.size)
            self._free = None

    def _unhold(self, slots: np.ndarray) -> None:
        slots = slots[self.held[slots]]
        if slots.size:
            self.held[slots] = False
            self.held_count -= int(slots.size)
            self._free = None

    # -- replay counts (count_replays) -------------------------------------------
    def replays_before(self, slots: np.ndarray, ids: np.ndarray, *, count: bool) -> np.ndarray:
        """Each row's replay count (``slots`` holding ``ids``, one batch); ``count``: this batch counts too, once
        per row however often it drew the row (as SRL counts). A slot whose row changed starts at 0."""
        assert self.replays is not None and self._replays_of is not None
        stale = self._replays_of[slots] != ids
        if stale.any():
            self.replays[slots[stale]] = 0
            self._replays_of[slots[stale]] = ids[stale]
        before = self.replays[slots]
        if count:
            self.replays[slots] += 1  # fancy-index ``+=``: a slot drawn twice in one batch counts once
        return before

    def fed_back(self, slots: np.ndarray, ids: np.ndarray) -> None:
        """A batch's priorities landed on ``slots`` (still holding ``ids``): counted there if ``"feedback"``."""
        if self.replays_at == "feedback":
            self.replays_before(slots, ids, count=True)

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
        self._unhold(slots)  # a held row overwritten: its reserved draws were gathered already
        self.ids[slots] = np.arange(first_id, first_id + slots.size, dtype=np.int64)
        self.times_sampled[slots] = 0
        self.reserved[slots] = 0
        self.valid[slots] = True
        self.count += int(np.count_nonzero(newly))
        if slots.size:
            self.high = max(self.high, int(slots.max()) + 1)
        self._dense = self._free = None
        self._pure_ring = False

    def release(self, slots: np.ndarray) -> np.ndarray:
        """Free ``slots`` (evicted by ``max_times_sampled``); returns the ones that were valid."""
        slots = np.unique(slots)
        slots = slots[self.valid[slots]]
        self._unhold(slots)
        self.valid[slots] = False
        self.ids[slots] = -1
        self.reserved[slots] = 0
        self.count -= slots.size
        self._dense = self._free = None
        self._pure_ring = False
        return slots

    def state_dict(self) -> dict[str, Any]:
        out = {
            "ids": self.ids.copy(), "times_sampled": self.times_sampled.copy(), "valid": self.valid.copy(),
            "reserved": self.reserved.copy(), "count": self.count, "high": self.high, "pos": self.pos,
        }
        if self.replays is not None and self._replays_of is not None:
            out.update(replays=self.replays.copy(), replays_of=self._replays_of.copy())
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a checkpoint from before reservations has none: every row free); which rows
        are held follows from the counts and the limit (:meth:`hold_spent`)."""
        keys = ("ids", "times_sampled", "valid", *(k for k in ("reserved", "replays", "replays_of") if k in state))
        for key in keys:
            arr = np.asarray(state[key])
            if arr.shape != (self.capacity,):
                raise ValueError(f"slot table {key}: expected shape ({self.capacity},), got {arr.shape}")
        self.ids = np.asarray(state["ids"], dtype=np.int64).copy()
        self.times_sampled = np.asarray(state["times_sampled"], dtype=np.int64).copy()
        self.valid = np.asarray(state["valid"], dtype=bool).copy()
        self.reserved = np.asarray(state.get("reserved", np.zeros(self.capacity)), dtype=np.int64).copy()
        self.held = np.zeros(self.capacity, dtype=bool)
        self.held_count = 0
        self.count, self.high, self.pos = int(state["count"]), int(state["high"]), int(state["pos"])
        if self.replays is not None and "replays" in state:  # (a checkpoint of a buffer that did not count: none)
            self.replays = np.asarray(state["replays"], dtype=np.int64).copy()
            self._replays_of = np.asarray(state["replays_of"], dtype=np.int64).copy()
        self._dense = self._free = None
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


def slots_in_order(ids: np.ndarray, first: int = 0, n: int | None = None) -> np.ndarray:
    """The slots of a slot table's ``ids`` holding transition ids ``[first, first + n)`` (every live one without
    ``n``), in id order: oldest first, or the rows of one write in the order written."""
    held = (ids >= first) if n is None else (ids >= first) & (ids < first + n)
    slots = np.flatnonzero(held)
    return slots[np.argsort(ids[slots], kind="stable")]
