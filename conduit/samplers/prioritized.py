"""Prioritized replay (Schaul et al., 2016) over a vectorized sum-tree.

``P(i) = p_i^alpha / sum_k p_k^alpha``; new rows get the maximum priority seen
so far; importance weights ``w_i = (N·P(i))^-beta / max_j w_j`` with the max
taken from the tree's minimum priority. Draws are stratified: one uniform
point per equal segment of the total mass.

Which transition a priority update lands on is the buffer's business: it
checks each slot's transition id (its generation) before calling
:meth:`update_priorities`, so updates for slots overwritten since sampling
are dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conduit.samplers.base import Draw, Sampler, _require
from conduit.samplers.sumtree import SumTree
from conduit.slots import SlotTable

__all__ = ["PrioritizedSampler", "checked_priorities"]


class PrioritizedSampler(Sampler):
    name = "prioritized"
    has_priorities = True

    def __init__(
        self, capacity: int, alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6, max_priority: float = 1.0
    ) -> None:
        super().__init__(capacity)
        self.alpha = alpha
        self.beta = beta
        self.eps = eps
        self.tree = SumTree(capacity)
        self.max_priority = max_priority  # in |td| units, before ** alpha: what new rows start at

    def on_insert(self, slots: np.ndarray) -> None:
        self.tree.update(slots, np.full(len(slots), self.max_priority**self.alpha))

    def on_release(self, slots: np.ndarray) -> None:
        self.tree.update(slots, np.zeros(len(slots)))

    def priorities(self) -> np.ndarray:
        return self.tree.leaves()

    def sample(self, n: int, table: SlotTable, rng: np.random.Generator) -> Draw:
        _require(table)
        total = self.tree.total
        if total <= 0:
            raise ValueError("cannot sample: every live transition has priority 0")
        segment = total / n
        points = (np.arange(n) + rng.random(n)) * segment
        np.clip(points, 0.0, np.nextafter(total, 0.0), out=points)
        idx = self.tree.find(points)
        leaves = self.tree.get(idx)
        probs = leaves / total
        p_min = self.tree.min / total
        # (N * P)^-beta / (N * P_min)^-beta == (P / P_min)^-beta
        weights = np.power(probs / p_min, -self.beta).astype(np.float32)
        return Draw(idx, weights, leaves=leaves, beta=float(self.beta))  # (fancy indexing: a fresh array)

    def sample_distinct(self, n: int, table: SlotTable, rng: np.random.Generator) -> Draw:
        """``n`` distinct slots, each round drawn in proportion to priority among the rows not yet taken.

        A stratified draw, then the rows it repeated are drawn again from the rest of the mass (their
        leaves set to 0 for the next round, restored after); weights are those of the first round's
        distribution, as in :meth:`sample`. Rows with priority 0 (held) are never drawn.
        """
        total = self.tree.total
        if total <= 0:
            raise ValueError("cannot sample: every live transition has priority 0")
        p_min = self.tree.min / total
        chosen = np.empty(0, dtype=np.int64)
        taken_values = np.empty(0, dtype=np.float64)
        try:
            while chosen.size < n:
                mass = self.tree.total
                if mass <= 0:
                    raise ValueError(f"cannot draw {n} distinct rows: {chosen.size} have non-zero priority")
                want = n - chosen.size
                points = (np.arange(want) + rng.random(want)) * (mass / want)
                np.clip(points, 0.0, np.nextafter(mass, 0.0), out=points)
                found = self.tree.find(points)
                _, first = np.unique(found, return_index=True)
                new = found[np.sort(first)]
                values = self.tree.get(new).copy()
                chosen = np.concatenate([chosen, new])
                taken_values = np.concatenate([taken_values, values])
                self.tree.update(new, np.zeros(new.size))
        finally:
            if chosen.size:
                self.tree.update(chosen, taken_values)
        weights = np.power((taken_values / total) / p_min, -self.beta).astype(np.float32)
        return Draw(chosen, weights, leaves=taken_values, beta=float(self.beta))

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        pr = np.abs(np.asarray(priorities, dtype=np.float64)) + self.eps
        if not np.all(np.isfinite(pr)):
            raise ValueError("priorities must be finite")
        if pr.size:
            self.max_priority = max(self.max_priority, float(pr.max()))
        self.tree.update(slots, pr**self.alpha)

    def leaf_values(self, slots: np.ndarray) -> np.ndarray:
        """The tree's values at ``slots`` (priorities after ``** alpha``)."""
        return self.tree.get(np.asarray(slots, dtype=np.int64)).copy()

    def set_leaf_values(self, slots: np.ndarray, values: np.ndarray, max_priority: float) -> None:
        """Set values :meth:`leaf_values` returned (of the same rows, now at ``slots``) and the max priority."""
        self.tree.update(np.asarray(slots, dtype=np.int64), np.asarray(values, dtype=np.float64))
        self.max_priority = float(max_priority)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(), "leaves": self.tree.state(), "max_priority": self.max_priority,
            "beta": self.beta, "alpha": self.alpha,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The saved priorities, max priority and beta (as annealed by ``set_beta`` when saved: the restored run
        goes on drawing with it; a checkpoint from before beta was saved keeps the configured one)."""
        super().load_state_dict(state)
        self.tree.load(np.asarray(state["leaves"], dtype=np.float64))
        self.max_priority = float(state["max_priority"])
        self.beta = float(state.get("beta", self.beta))


def checked_priorities(indices: Any, ids: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A priority update's three arrays as int64 / int64 / float64, refused with the reason where they disagree
    in length or a priority is not finite or negative."""
    indices = np.asarray(indices, dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    pr = np.asarray(priorities, dtype=np.float64).reshape(-1)
    if not (len(indices) == len(ids) == len(pr)):
        raise ValueError(
            f"update_priorities: {len(indices)} indices, {len(ids)} ids and {len(pr)} priorities must match"
        )
    if not np.all(np.isfinite(pr)):
        raise ValueError("update_priorities: priorities must be finite")
    if np.any(pr < 0):
        at = int(np.flatnonzero(pr < 0)[0])
        raise ValueError(
            f"update_priorities: priorities must be >= 0, got {float(pr[at])!r} at position {at}; "
            "pass the TD errors' magnitudes (e.g. td_error.abs())"
        )
    return indices, ids, pr
