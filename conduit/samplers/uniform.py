"""Uniform, FIFO and LIFO selection of live slots."""

from __future__ import annotations

import numpy as np
import torch

from conduit.samplers.base import Draw, Sampler, _require
from conduit.slots import SlotTable

__all__ = ["FifoSampler", "LifoSampler", "UniformSampler"]


class UniformSampler(Sampler):
    """Every live slot equally likely, with replacement."""

    name = "uniform"

    def sample(self, n: int, table: SlotTable, rng: np.random.Generator) -> Draw:
        """Draws with torch's generator: the gather takes the index tensor as it is, and a gather right after
        a numpy draw of the same distribution runs slower (BENCHMARKS.md, "Delivery and ingestion"). With
        :attr:`draws_with_rng`, with ``rng``: the generator a framework owns."""
        count = table.count
        if count == table.high and not table.held_count:  # contiguous: the live slots are [0, count)
            if count <= 0:
                _require(table)
            # the tensor alone: its array is made only if someone reads it (conduit.batch.DrawnRows)
            return Draw(None, None, self._randint(count, n, rng))
        _require(table)
        valid = table.candidates()
        return Draw(valid[self._randint(valid.size, n, rng).numpy()])

    def _randint(self, high: int, n: int, rng: np.random.Generator) -> torch.Tensor:
        if self.draws_with_rng:
            return torch.from_numpy(rng.integers(0, high, size=n, dtype=np.int64))
        return torch.randint(0, high, (n,), generator=self.generator)

    def sample_distinct(self, n: int, table: SlotTable, rng: np.random.Generator) -> Draw:
        """Every ``n``-subset of the candidates equally likely (numpy's choice without replacement)."""
        valid = table.candidates()
        return Draw(valid[rng.choice(valid.size, n, replace=False)])


def _ordered(n: int, table: SlotTable, newest: bool) -> np.ndarray:
    valid = table.candidates()
    key = -table.ids[valid] if newest else table.ids[valid]
    k = min(n, valid.size)
    pick = np.argpartition(key, k - 1)[:k] if k < valid.size else np.arange(valid.size)
    pick = pick[np.argsort(key[pick])]
    chosen = valid[pick]
    return np.resize(chosen, n)  # fewer live rows than asked: cycle through them


class FifoSampler(Sampler):
    """The ``n`` oldest live transitions, oldest first (a queue, with ``max_times_sampled=1``)."""

    name = "fifo"

    def sample(self, n: int, table: SlotTable, rng: np.random.Generator) -> Draw:
        _require(table)
        return Draw(_ordered(n, table, newest=False))

    def sample_distinct(self, n: int, table: SlotTable, rng: np.random.Generator) -> Draw:
        return Draw(_ordered(n, table, newest=False))


class LifoSampler(Sampler):
    """The ``n`` newest live transitions, newest first (a stack)."""

    name = "lifo"

    def sample(self, n: int, table: SlotTable, rng: np.random.Generator) -> Draw:
        _require(table)
        return Draw(_ordered(n, table, newest=True))

    def sample_distinct(self, n: int, table: SlotTable, rng: np.random.Generator) -> Draw:
        return Draw(_ordered(n, table, newest=True))
