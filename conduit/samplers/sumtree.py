"""A vectorized sum-tree (and min-tree) over leaf priorities, in numpy.

Every operation takes and returns arrays: ``update`` sets many leaves and
re-sums only their ancestors, level by level; ``find`` descends for a whole
vector of prefix sums at once. Costs are ``O(k log n)`` numpy work for ``k``
leaves, with a few dozen numpy calls regardless of ``k``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SumTree"]


class SumTree:
    """Sums and minima over ``capacity`` non-negative leaves.

    Leaves with value 0 are never returned by :meth:`find` (empty slots).
    """

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be > 0, got {capacity}")
        self.capacity = capacity
        self.size = 1 << max(0, (capacity - 1).bit_length())  # leaves, a power of two
        self.depth = self.size.bit_length() - 1
        self._sum = np.zeros(2 * self.size, dtype=np.float64)
        self._min = np.full(2 * self.size, np.inf, dtype=np.float64)

    # -- queries --------------------------------------------------------------
    @property
    def total(self) -> float:
        return float(self._sum[1])

    @property
    def min(self) -> float:
        """The smallest non-zero leaf (inf when empty)."""
        return float(self._min[1])

    def get(self, leaves: np.ndarray) -> np.ndarray:
        return self._sum[np.asarray(leaves, dtype=np.int64) + self.size]

    def leaves(self) -> np.ndarray:
        """A view of all leaf values (length ``capacity``)."""
        return self._sum[self.size : self.size + self.capacity]

    # -- updates --------------------------------------------------------------
    def update(self, leaves: np.ndarray, values: np.ndarray) -> None:
        """Set ``leaves[i] = values[i]`` (last write wins on duplicates)."""
        leaves = np.asarray(leaves, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if leaves.size == 0:
            return
        if np.any(values < 0) or not np.all(np.isfinite(values)):
            raise ValueError("priorities must be finite and >= 0")
        if leaves.min() < 0 or leaves.max() >= self.capacity:
            raise IndexError(f"leaf index out of range [0, {self.capacity})")
        nodes = leaves + self.size
        self._sum[nodes] = values
        self._min[nodes] = np.where(values > 0, values, np.inf)
        if leaves.size <= 4:  # a few leaves: walk up with scalars, cheaper than numpy calls per level
            s, m = self._sum, self._min
            for node in nodes.tolist():
                node >>= 1
                while node >= 1:
                    left = 2 * node
                    s[node] = s[left] + s[left + 1]
                    m[node] = min(m[left], m[left + 1])
                    node >>= 1
            return
        nodes = np.unique(nodes >> 1)
        while nodes.size and nodes[0] >= 1:
            left, right = 2 * nodes, 2 * nodes + 1
            self._sum[nodes] = self._sum[left] + self._sum[right]
            self._min[nodes] = np.minimum(self._min[left], self._min[right])
            if nodes[0] == 1:
                break
            nodes = np.unique(nodes >> 1)

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """For each ``v`` in ``prefix`` (``0 <= v < total``) the leaf where the running sum passes ``v``."""
        v = np.asarray(prefix, dtype=np.float64).copy()
        idx = np.ones(v.shape, dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * idx
            left_sum = self._sum[left]
            go_right = v >= left_sum
            # never step into an empty subtree because of float rounding
            go_right &= self._sum[left + 1] > 0
            go_right |= left_sum <= 0
            v -= np.where(go_right, left_sum, 0.0)
            idx = left + go_right
        return idx - self.size

    def state(self) -> np.ndarray:
        return self.leaves().copy()

    def load(self, leaves: np.ndarray) -> None:
        leaves = np.asarray(leaves, dtype=np.float64)
        if leaves.shape != (self.capacity,):
            raise ValueError(f"expected {self.capacity} leaves, got shape {leaves.shape}")
        self._sum[:] = 0.0
        self._min[:] = np.inf
        nz = np.nonzero(leaves)[0]
        self.update(nz, leaves[nz])
