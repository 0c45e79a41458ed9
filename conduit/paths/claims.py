"""The records a delivery path keeps per invocation and per batch: a claim, a batch's place, a staged batch.

Kept apart from :mod:`conduit.paths.delivery` (which re-exports them) so that the path's
module holds the route and the worker, and the policies' subclasses
(:mod:`~conduit.paths.replay`, :mod:`~conduit.paths.minibatch`) extend plain records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from conduit.batch import BatchInfo, DrawnRows
from conduit.core import Mode

__all__ = ["Claim", "DeliveryStats", "Place", "Staged"]


class Place(NamedTuple):
    """A batch's place in its policy's order and its rows: the BatchInfo fields that differ between the policies."""

    iteration: int
    epoch: int | None
    minibatch: int | None
    num_minibatches: int | None
    last: bool
    rows: DrawnRows
    weights: np.ndarray | None


@dataclass(eq=False, slots=True)
class Claim:
    """One claimed invocation: what it delivers, and (once gathered) the rows it drew.

    Subclasses add what their policy needs and say where each of the invocation's
    batches sits (:meth:`place`) and which rows it holds (:meth:`provenance`).
    """

    learner: int
    #: the learner's pull count when the invocation was claimed (its first batch's)
    sampled_at_pull: int
    mode: Mode
    #: rows of each training batch the invocation delivers
    sizes: Sequence[int]
    #: rows reserved for batches not handed over at once (given back if the invocation fails)
    reserved: int = 0
    #: transitions ingested when the rows were drawn (set by the gather)
    buffer_version: int = -1
    #: what the delivery hook attached to each batch (``Writer.write(attach=)``), None if nothing
    attached: list[Any] | None = None

    def place(self, part: int) -> Place:
        """Batch ``part``'s place, rows and importance weights (after the gather)."""
        raise NotImplementedError

    def facts(self) -> dict[str, object]:
        """What a delivery hook reads as ``exp_in.info`` (subclasses add their policy's keys)."""
        return {
            "learner": self.learner, "mode": self.mode, "granularity": float(self.mode.granularity),
            "sizes": list(self.sizes), "rows": sum(self.sizes), "sampled_at_pull": self.sampled_at_pull,
            "buffer_version": self.buffer_version,
        }


class Staged(NamedTuple):
    """A batch made ahead of its pull: its data, its provenance (pull index still open), its CUDA event."""

    data: dict[str, torch.Tensor]
    info: BatchInfo
    event: torch.cuda.Event | None


@dataclass
class DeliveryStats:
    pulls: int = 0
    invocations: int = 0
    delivered_rows: int = 0
    pull_s: float = 0.0  # total time spent inside pull (exposed delivery latency)
    wait_s: float = 0.0  # of which waiting for data or the worker
