"""Stored episodes in insertion order, addressed by RLlib's global episode index.

RLlib's episode buffers number episodes in the order they arrive and never
renumber them: the deque position is ``global index - episodes evicted``. This
table keeps the same addressing with numpy columns (length and done flags, read
vectorized while sampling) and one slot list per episode (the storage slot of
each of its time steps, used for n-step windows). Eviction pops from the front;
the columns are compacted now and then so they never grow without bound.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["EpisodeTable"]


class EpisodeTable:
    def __init__(self) -> None:
        self.first = 0  # global index of row 0 of the columns
        self.head = 0  # rows before head were evicted
        self.n = 0  # rows in use (evicted ones included until compaction)
        self.ids: list[str] = []
        self.slots: list[list[int]] = []
        self.length = np.zeros(64, dtype=np.int64)
        self.terminated = np.zeros(64, dtype=bool)
        self.truncated = np.zeros(64, dtype=bool)
        self.id_to_index: dict[str, int] = {}

    # -- addressing -------------------------------------------------------------
    @property
    def evicted(self) -> int:
        """Episodes evicted so far (RLlib's ``_num_episodes_evicted``)."""
        return self.first + self.head

    def __len__(self) -> int:
        return self.n - self.head

    def row(self, index: np.ndarray | int) -> Any:
        return np.asarray(index) - self.first if not isinstance(index, int) else index - self.first

    def ids_in_order(self) -> list[str]:
        return self.ids[self.head : self.n]

    # -- updates ----------------------------------------------------------------
    def append(self, eps_id: str) -> int:
        """A new episode; returns its global index."""
        if self.n == len(self.length):
            for name in ("length", "terminated", "truncated"):
                old = getattr(self, name)
                new = np.zeros(2 * len(old), dtype=old.dtype)
                new[: self.n] = old[: self.n]
                setattr(self, name, new)
        r = self.n
        self.n += 1
        self.ids.append(eps_id)
        self.slots.append([])
        self.length[r] = 0
        self.terminated[r] = False
        self.truncated[r] = False
        index = self.first + r
        self.id_to_index[eps_id] = index
        return index

    def extend(self, index: int, slots: list[int], terminated: bool, truncated: bool) -> int:
        """Append time steps to episode ``index``; returns its previous length (``concat_episode``)."""
        r = index - self.first
        old = int(self.length[r])
        self.slots[r].extend(slots)
        self.length[r] = old + len(slots)
        # RLlib's concat_episode only ever sets the done flags
        if terminated:
            self.terminated[r] = True
        elif truncated:
            self.truncated[r] = True
        return old

    def popleft(self) -> tuple[str, int, int]:
        """Evict the oldest episode: ``(id, global index, length)``."""
        if self.head >= self.n:
            raise IndexError("pop from an empty episode table")
        r = self.head
        eps_id = self.ids[r]
        index = self.first + r
        length = int(self.length[r])
        self.ids[r] = ""
        self.slots[r] = []
        del self.id_to_index[eps_id]
        self.head += 1
        if self.head > 1024 and self.head * 2 > self.n:
            self._compact()
        return eps_id, index, length

    def _compact(self) -> None:
        h = self.head
        self.ids = self.ids[h:]
        self.slots = self.slots[h:]
        for name in ("length", "terminated", "truncated"):
            col = getattr(self, name)
            setattr(self, name, col[h:].copy() if len(col) - h >= 64 else np.resize(col[h:], 64))
        self.first += h
        self.n -= h
        self.head = 0

    # -- persistence --------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        h, n = self.head, self.n
        return {
            "first": self.first + h,
            "ids": list(self.ids[h:n]),
            "slots": [np.asarray(s, dtype=np.int64) for s in self.slots[h:n]],
            "length": self.length[h:n].copy(),
            "terminated": self.terminated[h:n].copy(),
            "truncated": self.truncated[h:n].copy(),
        }

    def load(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self.first = int(state["first"])
        for i, eps_id in enumerate(state["ids"]):
            self.append(eps_id)
            self.slots[i] = [int(s) for s in state["slots"][i]]
            self.length[i] = state["length"][i]
            self.terminated[i] = state["terminated"][i]
            self.truncated[i] = state["truncated"][i]
