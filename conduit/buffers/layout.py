"""One on-policy iteration's record, and where its rows are laid out in storage (pure index math)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conduit.storage.base import Storage

__all__ = ["Iteration", "laid_out"]


@dataclass
class Iteration:
    """One on-policy iteration's rows, sealed once all its units are ingested."""

    index: int
    storage: Storage
    rows: int = 0
    ids: list[np.ndarray] | None = None
    sealed: bool = False
    #: ``plan[epoch][minibatch][learner]`` -> rows (insertion order); drawn for the expected rows when the
    #: iteration is created, drawn again at the seal if it ends with another count
    plan: list[list[list[np.ndarray]]] | None = None
    #: mini-batches still to be delivered, per learner
    remaining: list[int] | None = None
    #: storage row of each of the first ``len(position)`` rows (later rows sit at their own index);
    #: None: every row at its own index
    position: np.ndarray | None = None
    #: ``runs[minibatch][learner] = (start, n)``: the storage rows of the last epoch's mini-batches, while
    #: ``plan`` is the plan the rows were laid out by (None otherwise)
    runs: list[list[tuple[int, int]]] | None = None
    #: the first ``early`` mini-batches of the first epoch are written in full and may be delivered before
    #: the seal (:meth:`IterationBuffer.write`'s closing write, mini-batch by mini-batch); never the last one
    early: int = 0

    def id_array(self) -> np.ndarray:
        return np.concatenate(self.ids) if self.ids else np.zeros(0, dtype=np.int64)

    def slots(self, rows: np.ndarray) -> np.ndarray:
        """Storage rows of ``rows`` (insertion order)."""
        p = self.position
        if p is None:
            return rows
        if rows.size and int(rows.max()) >= len(p):
            return np.where(rows < len(p), p[np.minimum(rows, len(p) - 1)], rows)
        return p[rows]


def laid_out(epoch: list[list[np.ndarray]]) -> tuple[np.ndarray | None, list[list[tuple[int, int]]]]:
    """Storage rows that put an epoch's mini-batches side by side, in plan order, and each one's run.

    ``epoch[minibatch][learner]`` are rows (insertion order) covering ``0..R`` once;
    row ``r`` goes to storage row ``position[r]`` so that mini-batch ``j`` of learner
    ``l`` is the run ``runs[j][l] = (start, n)``. ``position`` is None when the
    epoch is unshuffled (every row at its own index already).
    """
    order = np.concatenate([rows for mb in epoch for rows in mb])
    runs: list[list[tuple[int, int]]] = []
    start = 0
    for mb in epoch:
        runs.append([])
        for rows in mb:
            runs[-1].append((start, len(rows)))
            start += len(rows)
    if np.array_equal(order, np.arange(len(order))):
        return None, runs
    position = np.empty_like(order)
    position[order] = np.arange(len(order), dtype=order.dtype)
    return position, runs
