"""A reuse queue: batches handed out most-reuses-left first, newest first among equals, reused while they last.

What: :class:`ReuseQueue` collects items into groups of ``group_size``, forms each
group into one entry (the caller's ``form``: typically a stack of the group into one
batch, once), and orders entries by ``(reuses_left, receive_time)``. ``get`` takes
the entry with the most reuses left -- the newest among equals, ties to the one
inserted last -- decrements ``reuses_left``, increments ``reuses`` and puts it back
while ``reuses_left > 0`` and the queue is not full. Over ``max_size`` entries, the
one with the fewest reuses left and the oldest arrival is dropped (lossy under
back-pressure: :attr:`dropped` counts). The same entry object comes back each time it
is reused. Every method is thread-safe (one lock): a stream thread puts while a
trainer thread gets, with no sleep between them.

Why: this is the on-policy-with-reuse queue of SRL's trainer (its default buffer) and
the neighbour of Reverb's queue table, usable by any learner that trains on the
freshest batches a bounded number of times. A batch is formed once at ``put`` and
handed back as is on every reuse: a runtime that gathers its rows again at each pull
would copy a whole batch per reuse where this copies it once. Each entry may carry a
token (the event a device copy made at ``form`` records) that ``get`` returns with it.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Reusable", "ReuseQueue"]


class Reusable(Protocol):
    """An entry: how many more times it may be handed out, when it arrived, how often it was."""

    reuses_left: int
    receive_time: float
    reuses: int


E = TypeVar("E", bound=Reusable)


class ReuseQueue(Generic[E]):
    """See the module docstring. ``form(group)`` returns ``(entry, token)``; it runs outside the lock."""

    def __init__(self, max_size: int, group_size: int, form: Callable[[list[Any]], tuple[E, Any]]) -> None:
        if max_size < 1 or group_size < 1:
            raise ValueError(f"max_size={max_size}, group_size={group_size}: both must be at least 1")
        self.max_size, self.group_size, self.form = max_size, group_size, form
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._entries: list[tuple[tuple[float, float, int], E]] = []  # sorted by (reuses_left, receive_time, seq)
        self._tokens: dict[int, Any] = {}  # id(entry) -> its token, while the entry is queued
        self._pending: list[Any] = []
        self._forming: dict[int, list[Any]] = {}  # groups taken from pending and being formed, by id
        #: entries formed, entries dropped on overflow, entries handed out (reuses included)
        self.formed = self.dropped = self.handed = 0

    def put(self, item: Any) -> E | None:
        """Add ``item``; the entry it completed (its group formed and queued), else None."""
        with self._lock:
            self._pending.append(item)
            if len(self._pending) < self.group_size:
                return None
            group, self._pending = self._pending[: self.group_size], self._pending[self.group_size :]
            self._forming[id(group)] = group
        try:
            entry, token = self.form(group)
        except BaseException:
            with self._lock:  # the group's items stay (first in line), as SRL keeps a batch it failed to stack
                del self._forming[id(group)]
                self._pending[:0] = group
            raise
        with self._lock:
            del self._forming[id(group)]
            self.formed += 1
            self._insert(entry, token)
        return entry

    def insert(self, entry: E, token: Any = None) -> None:
        """Queue an entry formed elsewhere (a restored one)."""
        with self._lock:
            self._insert(entry, token)

    def get(self) -> tuple[E, Any] | None:
        """The entry with the most reuses left (newest among equals) and its token; None when empty."""
        with self._lock:
            if not self._entries:
                return None
            _, entry = self._entries.pop()
            entry.reuses_left -= 1
            entry.reuses += 1
            self.handed += 1
            if len(self._entries) < self.max_size and entry.reuses_left > 0:
                token = self._tokens.get(id(entry))
                self._place(entry)
            else:
                token = self._tokens.pop(id(entry), None)
            return entry, token

    def _insert(self, entry: E, token: Any) -> None:
        if token is not None:
            self._tokens[id(entry)] = token
        self._place(entry)

    def _place(self, entry: E) -> None:
        bisect.insort(self._entries, ((entry.reuses_left, entry.receive_time, next(self._seq)), entry))
        while len(self._entries) > self.max_size:  # the fewest reuses left, the oldest arrival
            _, gone = self._entries.pop(0)
            self._tokens.pop(id(gone), None)
            self.dropped += 1

    def __len__(self) -> int:
        return len(self._entries)

    def full(self) -> bool:
        return len(self._entries) >= self.max_size

    def snapshot(self) -> tuple[list[E], list[Any], tuple[int, int, int]]:
        """Entries in queue order (fewest reuses left first), items not yet in an entry (a group being formed
        right now among them, first), the counters."""
        with self._lock:
            forming = [x for group in self._forming.values() for x in group]
            pending = forming + self._pending
            return [e for _, e in self._entries], pending, (self.formed, self.dropped, self.handed)

    def restore(self, entries: list[E], pending: list[Any], counts: tuple[int, int, int]) -> None:
        """Load what :meth:`snapshot` returned (into an empty queue)."""
        with self._lock:
            for entry in entries:
                self._place(entry)
            self._pending = list(pending)
            self.formed, self.dropped, self.handed = counts
