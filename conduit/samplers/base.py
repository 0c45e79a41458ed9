"""The sampler protocol for off-policy replay.

Samplers are pure index math over the buffer's :class:`~conduit.slots.SlotTable`
(which slots hold live transitions, and their ids): they never touch tensors.
The buffer calls them under its lock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

if TYPE_CHECKING:
    from conduit.slots import SlotTable

__all__ = ["Draw", "Sampler"]


class Draw(NamedTuple):
    """Slots drawn for one invocation, with importance weights when prioritized.

    The slots come as an int64 array, or as a host int64 tensor when the sampler
    drew one (the gather takes it as it is; :attr:`indices` makes the array).
    """

    array: np.ndarray | None  # int64 slots (None: see tensor)
    weights: np.ndarray | None = None  # float32, same length
    tensor: torch.Tensor | None = None  # the slots as a tensor, when the sampler drew one
    #: prioritized: each drawn row's priority after ``** alpha`` and the exponent ``beta`` the weights used, read in
    #: the draw (a draw over several buffers as one re-weighs its rows by the group's mass: conduit.distributed)
    leaves: np.ndarray | None = None
    beta: float | None = None

    @property
    def indices(self) -> np.ndarray:
        """The slots as an int64 array."""
        if self.array is not None:
            return self.array
        assert self.tensor is not None
        return self.tensor.numpy()


class Sampler(ABC):
    """Draws slots among the live ones of a buffer of ``capacity`` slots."""

    name: str = "sampler"
    #: whether the sampler keeps per-slot priorities (``update_priorities`` applies)
    has_priorities: bool = False

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        #: torch's generator for samplers that draw index tensors directly (faster to gather with)
        self.generator = torch.Generator()
        #: draw with the buffer's numpy generator instead: a framework handed its own (``use_rng``), whose
        #: state it sets and saves (RLlib's ``buffer.rng``)
        self.draws_with_rng = False

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    @abstractmethod
    def sample(self, n: int, table: SlotTable, rng: np.random.Generator) -> Draw:
        """``n`` live slots (with replacement where the sampler draws at random)."""

    @abstractmethod
    def sample_distinct(self, n: int, table: SlotTable, rng: np.random.Generator) -> Draw:
        """``n`` distinct slots a draw may take (:meth:`SlotTable.candidates`), in the sampler's order.

        What a draw under ``max_times_sampled`` takes: a row at most once per draw, so no draw
        outruns a row's remaining uses. The caller checks that ``table.sampleable >= n``.
        """

    def on_insert(self, slots: np.ndarray) -> None:
        """New rows were written to ``slots`` (overwriting what was there)."""

    def on_release(self, slots: np.ndarray) -> None:
        """``slots`` no longer hold a transition (evicted by ``max_times_sampled``)."""

    def priorities(self) -> np.ndarray | None:
        """Per-slot priorities, for a prioritized remover (None: no priorities)."""
        return None

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no priorities to update")

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state().clone(), "draws_with_rng": self.draws_with_rng}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "generator" in state:
            self.generator.set_state(torch.as_tensor(np.asarray(state["generator"], dtype=np.uint8)).clone())
        self.draws_with_rng = bool(state.get("draws_with_rng", False))


def _require(table: SlotTable) -> None:
    if table.count <= 0:
        raise ValueError("cannot sample from an empty buffer")
