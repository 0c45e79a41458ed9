"""A sum-tree (and min-tree) over leaf priorities: C where built, numpy otherwise, the same bits either way.

Every operation takes and returns arrays: ``update`` sets many leaves and
re-sums only their ancestors; ``find`` descends for a whole vector of prefix
sums at once.

Two implementations. The C kernels of ``conduit._native`` (``sumtree_set``,
``sumtree_find``) walk the levels in a loop. The numpy path does each level in
a few array calls: ``O(k log n)`` work for ``k`` leaves, with a few dozen numpy
calls regardless of ``k`` — or, for a few leaves (a push of one transition, a
small priority update), a handful of calls per leaf along its path. At 10^5
leaves (17 levels) those calls are the cost: a numpy call's dispatch outweighs
the few additions it does by far. The C kernels have no per-call dispatch, so
pushes, priority updates and draws all run faster in C; a draw's descents go
eight in lockstep, so their cache misses overlap (BENCHMARKS.md, "Delivery and
ingestion").

Both compute every inner node as one addition of its two children (and one
minimum), and descend with the same comparisons and subtractions, so they
build the same tree and find the same leaves, bit for bit (a hypothesis test
checks it). The C kernels are used wherever the extension was built
(:data:`NATIVE`); ``SumTree(capacity, native=False)`` keeps numpy.
"""

from __future__ import annotations

import math

import numpy as np

try:
    from conduit import _native
except ImportError:  # built without a C compiler: numpy walks the levels
    _native = None

__all__ = ["NATIVE", "SumTree"]

#: whether this install has the C sum-tree kernels (the default for every tree)
NATIVE: bool = _native is not None


class SumTree:
    """Sums and minima over ``capacity`` non-negative leaves.

    Leaves with value 0 are never returned by :meth:`find` (empty slots).
    """

    def __init__(self, capacity: int, native: bool | None = None) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be > 0, got {capacity}")
        if native and _native is None:
            raise RuntimeError("native=True, but conduit._native is not built (no C compiler at install)")
        #: whether updates and draws run in C (default: wherever it is built)
        self.native = NATIVE if native is None else native
        self.capacity = capacity
        self.size = 1 << max(0, (capacity - 1).bit_length())  # leaves, a power of two
        self.depth = self.size.bit_length() - 1
        self._sum = np.zeros(2 * self.size, dtype=np.float64)
        self._min = np.full(2 * self.size, np.inf, dtype=np.float64)
        self._shifts = np.arange(self.depth + 1, dtype=np.int64)  # node >> shifts: a leaf's path to the root

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
        if self.native:
            if values.shape != leaves.shape:
                values = np.broadcast_to(values, leaves.shape)
            _native.sumtree_set(  # checks every leaf and value before it changes anything
                self._sum, self._min, self.size, self.capacity,
                np.ascontiguousarray(leaves), np.ascontiguousarray(values),
            )
            return
        if leaves.size <= self.FEW:  # one path at a time (a push of a few rows, a small priority update)
            pairs = list(zip(leaves.tolist(), values.tolist()))
            for leaf, value in pairs:  # all checked before anything changes
                if not 0.0 <= value < math.inf:
                    raise ValueError("priorities must be finite and >= 0")
                if not 0 <= leaf < self.capacity:
                    raise IndexError(f"leaf index out of range [0, {self.capacity})")
            for leaf, value in pairs:  # in order: the last write wins on duplicates
                self._set_path(leaf, value)
            return
        if np.any(values < 0) or not np.all(np.isfinite(values)):
            raise ValueError("priorities must be finite and >= 0")
        if leaves.min() < 0 or leaves.max() >= self.capacity:
            raise IndexError(f"leaf index out of range [0, {self.capacity})")
        first = int(leaves[0])
        if int(leaves[-1]) - first == leaves.size - 1 and np.all(leaves[1:] - leaves[:-1] == 1):
            self._update_range(first, values)  # consecutive leaves: a ring's push
            return
        nodes = leaves + self.size
        self._sum[nodes] = values
        self._min[nodes] = np.where(values > 0, values, np.inf)
        # children of node i are 2i and 2i+1: row i of the (size, 2) views
        sums, mins = self._sum.reshape(-1, 2), self._min.reshape(-1, 2)
        nodes = np.unique(nodes >> 1)  # sorted once: halving keeps the order, so each level only drops repeats
        while nodes[0] >= 1:  # node 0 is unused: a tree of one leaf has no inner node
            s, m = sums[nodes], mins[nodes]
            self._sum[nodes] = s[:, 0] + s[:, 1]
            self._min[nodes] = np.minimum(m[:, 0], m[:, 1])
            if nodes[0] == 1:
                break
            nodes >>= 1
            fresh = np.empty(nodes.size, dtype=bool)
            fresh[0] = True
            np.not_equal(nodes[1:], nodes[:-1], out=fresh[1:])
            nodes = nodes[fresh]

    def _update_range(self, first: int, values: np.ndarray) -> None:
        """Set leaves ``first, first+1, ...``: their ancestors at each level are a range of nodes too.

        So each level is re-summed with slices, two numpy calls a level and no
        index arrays — the same additions, in the same order, as the general
        path; once the range narrows to one node, its ancestors go up as one path
        (:meth:`_set_up`). A ring push writes consecutive leaves, and this path
        skips the general path's index arrays and de-duplication at every level.
        """
        lo = first + self.size
        hi = lo + values.size  # nodes [lo, hi) at the leaves' level
        s, m = self._sum, self._min
        s[lo:hi] = values
        m[lo:hi] = np.where(values > 0, values, np.inf)
        while hi - lo > 1:  # children of node i are 2i and 2i+1: a level's block of parents reads one block of children
            lo, hi = lo >> 1, ((hi - 1) >> 1) + 1
            kids = s[2 * lo : 2 * hi].reshape(-1, 2)
            np.add(kids[:, 0], kids[:, 1], out=s[lo:hi])
            kids = m[2 * lo : 2 * hi].reshape(-1, 2)
            np.minimum(kids[:, 0], kids[:, 1], out=m[lo:hi])
        if lo > 1:  # one node left (a leaf, or the range's common ancestor): the rest is its path to the root
            self._set_up(lo, float(s[lo]), float(m[lo]))

    #: updates of at most this many leaves go path by path (:meth:`_set_path`, a cost per leaf), more level
    #: by level (a cost per level that barely grows with the leaves); the threshold sits below where they meet
    FEW = 24

    def _set_path(self, leaf: int, value: float) -> None:
        """Set one leaf and its ancestors in a handful of numpy calls, whatever the depth.

        Only the path from the leaf to the root changes, and each ancestor is the
        running child plus its unchanged sibling: the ancestors' sums are the
        running sum of ``value`` and the siblings' sums (the same additions, in
        the same order, as re-summing level by level), their minima the running
        minimum. So a leaf costs a handful of array calls, not one numpy scalar
        operation per level, and a few leaves cost less this way than re-summing
        level by level with index arrays.
        """
        self._set_up(leaf + self.size, value, value if value > 0 else math.inf)

    def _set_up(self, node: int, total: float, least: float) -> None:
        """Set ``node``'s sum and minimum, then re-sum its ancestors along the path (see :meth:`_set_path`)."""
        path = node >> self._shifts[: node.bit_length()]  # node, parent, ..., root
        siblings = path[:-1] ^ 1
        s, m = self._sum, self._min
        run = np.empty(path.size, dtype=np.float64)
        run[0] = total
        run[1:] = s[siblings]
        s[path] = np.add.accumulate(run, out=run)
        run[0] = least
        run[1:] = m[siblings]
        m[path] = np.minimum.accumulate(run, out=run)

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """For each ``v`` in ``prefix`` (``0 <= v < total``) the leaf where the running sum passes ``v``."""
        if self.native:
            v = np.ascontiguousarray(prefix, dtype=np.float64)
            out = np.empty(v.shape, dtype=np.int64)
            _native.sumtree_find(self._sum, self.size, v, out)
            return out
        v = np.asarray(prefix, dtype=np.float64).copy()
        idx = np.ones(v.shape, dtype=np.int64)
        s = self._sum
        for _ in range(self.depth):
            idx <<= 1  # the left child
            left_sum = s[idx]
            # right when v is past the left mass, but never into an empty subtree because of float rounding
            # (v stays >= 0 and every node on the way has mass, so an empty left means the right has it)
            go_right = v >= left_sum
            go_right &= s[idx + 1] > 0
            v -= left_sum * go_right
            idx += go_right
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
