"""Sum- and min-trees laid out and searched exactly like RLlib's segment trees, vectorized.

RLlib's ``PrioritizedEpisodeReplayBuffer`` keeps a ``SumSegmentTree`` and a
``MinSegmentTree`` of ``2 * 2**ceil(log2(capacity))`` leaves as Python lists and
updates them one leaf at a time. Every inner node is ``op(left, right)`` of its
children, so recomputing the touched ancestors level by level with numpy gives
the same float64 values; the search below follows RLlib's ``find_prefixsum_idx``
step for step (the ``root - 1e-5`` clamp, strict ``>`` when going left). The
core's :class:`conduit.samplers.SumTree` searches differently (it never steps
into an empty subtree), which is why the exact mode keeps this variant.
"""

from __future__ import annotations

import numpy as np

__all__ = ["RLlibSegmentTrees", "rllib_tree_leaves"]


def rllib_tree_leaves(capacity: int) -> int:
    """Leaves of RLlib's trees for a buffer of ``capacity`` timesteps (also its node-id range)."""
    return 2 * int(2 ** np.ceil(np.log2(capacity)))


class RLlibSegmentTrees:
    """A sum-tree and a min-tree over ``leaves`` priorities (empty leaves: 0 and inf)."""

    def __init__(self, leaves: int) -> None:
        if leaves <= 0 or leaves & (leaves - 1):
            raise ValueError(f"leaves must be a positive power of two, got {leaves}")
        self.leaves = leaves
        self.depth = leaves.bit_length() - 1
        self.sum = np.zeros(2 * leaves, dtype=np.float64)
        self.min = np.full(2 * leaves, np.inf, dtype=np.float64)

    def set(self, nodes: np.ndarray, sums: np.ndarray, mins: np.ndarray | None = None) -> None:
        """Set leaves ``nodes`` (no duplicates) and recompute their ancestors."""
        nodes = np.asarray(nodes, dtype=np.int64)
        if nodes.size == 0:
            return
        pos = nodes + self.leaves
        s, m = self.sum, self.min
        s[pos] = sums
        m[pos] = sums if mins is None else mins
        if pos.size == 1:  # one leaf (an add of a single step): scalar walk, no per-level array calls
            i = int(pos[0]) >> 1
            while i >= 1:
                left = 2 * i
                s[i] = s[left] + s[left + 1]
                a, b = m[left], m[left + 1]
                m[i] = b if b < a else a
                i >>= 1
            return
        parents = np.unique(pos >> 1)  # sorted; stays sorted under >> 1, so duplicates are adjacent
        while True:
            left = 2 * parents
            s[parents] = s[left] + s[left + 1]
            m[parents] = np.minimum(m[left], m[left + 1])
            if parents[0] == 1:
                break
            parents >>= 1
            parents = parents[np.concatenate(([True], parents[1:] != parents[:-1]))]

    def clear(self, nodes: np.ndarray) -> None:
        """Empty leaves ``nodes`` (sum 0, min inf), as RLlib does on eviction."""
        nodes = np.asarray(nodes, dtype=np.int64)
        self.set(nodes, np.zeros(nodes.size), np.full(nodes.size, np.inf))

    def total(self) -> float:
        """RLlib's ``sum()``: ``0.0 + root``."""
        return 0.0 + float(self.sum[1])

    def minimum(self) -> float:
        """RLlib's ``min()``: ``min(inf, root)``."""
        return min(float("inf"), float(self.min[1]))

    def leaf(self, nodes: np.ndarray) -> np.ndarray:
        return self.sum[np.asarray(nodes, dtype=np.int64) + self.leaves]

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """RLlib's ``find_prefixsum_idx`` for every value of ``prefix``."""
        p = np.array(prefix, dtype=np.float64, copy=True)
        root = float(self.sum[1])
        p[p >= root] = root - 1e-5
        idx = np.ones(p.shape, dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * idx
            left_sum = self.sum[left]
            go_left = left_sum > p
            p = np.where(go_left, p, p - left_sum)
            idx = np.where(go_left, left, left + 1)
        return idx - self.leaves

    def state(self) -> dict[str, np.ndarray]:
        """The leaves (inner nodes are recomputed on load)."""
        return {"sum": self.sum[self.leaves :].copy(), "min": self.min[self.leaves :].copy()}

    def load(self, state: dict[str, np.ndarray]) -> None:
        sums = np.asarray(state["sum"], dtype=np.float64)
        mins = np.asarray(state["min"], dtype=np.float64)
        if sums.shape != (self.leaves,) or mins.shape != (self.leaves,):
            raise ValueError(f"expected {self.leaves} leaves, got {sums.shape} / {mins.shape}")
        self.sum[self.leaves :] = sums
        self.min[self.leaves :] = mins
        for level in range(self.depth - 1, -1, -1):
            lo, hi = 1 << level, 1 << (level + 1)
            self.sum[lo:hi] = self.sum[2 * lo : 2 * hi : 2] + self.sum[2 * lo + 1 : 2 * hi : 2]
            self.min[lo:hi] = np.minimum(self.min[2 * lo : 2 * hi : 2], self.min[2 * lo + 1 : 2 * hi : 2])
