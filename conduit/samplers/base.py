"""The sampler protocol for off-policy replay.

Samplers are pure index math over slots ``[0, size)`` of the ring: they never
touch tensors. The buffer calls them under its lock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Draw", "Sampler"]


class Draw(NamedTuple):
    """Slots drawn for one invocation, with importance weights when prioritized."""

    indices: np.ndarray  # int64
    weights: np.ndarray | None = None  # float32, same length


class Sampler(ABC):
    """Draws slots of a ring holding ``size`` valid rows in ``[0, size)``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    @abstractmethod
    def sample(self, n: int, size: int, rng: np.random.Generator) -> Draw:
        """``n`` slots (with replacement) from ``[0, size)``."""

    def on_insert(self, slots: np.ndarray) -> None:
        """New rows were written to ``slots`` (overwriting what was there)."""

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no priorities to update")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state
