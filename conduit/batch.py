"""What a learner pulls: a training-ready batch and the metadata to check it.

:class:`Batch` is a read-only mapping ``field -> tensor`` (so ``batch["obs"]``
works wherever a dict of tensors does) plus :class:`BatchInfo`, which records
where the rows came from and how they were delivered. The semantics tests of
DESIGN.md §2 are written against these fields.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple

import numpy as np
import torch

from conduit.scheduling.space import Mode

__all__ = ["Batch", "BatchInfo"]


class BatchInfo(NamedTuple):
    """Provenance of one delivered batch (immutable; a NamedTuple because one is built per pull).

    Attributes:
        learner: the data-parallel learner rank it was delivered to.
        pull_index: that learner's pull count when it was delivered (0-based).
        sampled_at_pull: that learner's pull count when its rows were sampled;
            ``pull_index - sampled_at_pull`` is its staleness in batches.
        buffer_version: transitions ingested when its rows were sampled.
        iteration: on-policy: the policy iteration; off-policy: the delivery
            invocation that produced it.
        epoch / minibatch: on-policy position in the iteration (None off-policy).
        last: the final mini-batch of its iteration for this learner (on-policy).
        indices: off-policy: ring slots; on-policy: rows within the iteration.
        ids: global transition ids (ingestion order) of the rows.
        weights: importance-sampling weights (prioritized replay), else None.
        mode: the delivery mode (overlap, granularity) it ran under.
        version_at_delivery: transitions ingested when it was handed over.
    """

    learner: int
    pull_index: int
    sampled_at_pull: int
    buffer_version: int
    iteration: int
    epoch: int | None
    minibatch: int | None
    num_minibatches: int | None
    last: bool
    indices: np.ndarray
    ids: np.ndarray
    weights: np.ndarray | None
    mode: Mode
    version_at_delivery: int = -1

    @property
    def staleness(self) -> int:
        """Batches between when an inline schedule would have sampled this one and its delivery."""
        return self.pull_index - self.sampled_at_pull

    @property
    def version_lag(self) -> int:
        """Transitions ingested between sampling and delivery (what prefetching did not see)."""
        return self.version_at_delivery - self.buffer_version


class Batch(Mapping[str, torch.Tensor]):
    """A training-ready batch on the learner's device."""

    __slots__ = ("_data", "info")

    def __init__(self, data: dict[str, torch.Tensor], info: BatchInfo) -> None:
        self._data = data
        self.info = info

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    @property
    def size(self) -> int:
        """Rows in the batch."""
        return int(next(iter(self._data.values())).shape[0]) if self._data else 0

    @property
    def device(self) -> torch.device:
        return next(iter(self._data.values())).device

    @property
    def weights(self) -> torch.Tensor | None:
        """Importance weights as a tensor on the batch's device (prioritized replay)."""
        if self.info.weights is None:
            return None
        return torch.from_numpy(self.info.weights).to(self.device)

    def to_dict(self) -> dict[str, torch.Tensor]:
        return dict(self._data)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in self._data.items())
        return f"Batch({fields}; learner={self.info.learner}, iteration={self.info.iteration})"

