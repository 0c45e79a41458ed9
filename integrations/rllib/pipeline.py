"""PPO's mini-batch iterator, one step ahead: mini-batch k+1 is prepared while k trains.

RLlib's ``Learner.update`` only does ``for minibatch in batch_iter``; the iterator
(``MiniBatchCyclicIterator``) slices the train batch, concatenates pieces that
straddle an epoch boundary and reshuffles the whole batch at each boundary.
:class:`PipelinedMinibatches` runs that same iterator through the core's prefetch
node (:class:`conduit.ext.Prefetcher`: the core's worker and, on a GPU, its CUDA
stream), at most ``depth`` mini-batches ahead. The mini-batches are RLlib's own,
in RLlib's order: only the worker draws from the global ``np.random`` the
reshuffle uses, so the sequence is the one the learner would have produced inline.
What stays here is RLlib's: which tensors a ``MultiAgentBatch`` holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import tree

from conduit.ext import Prefetcher, PrefetchStats

__all__ = ["PipelineStats", "PipelinedMinibatches"]

#: what the learner's prefetch counted (``minibatches`` handed over, ``wait_s`` exposed, ``prepare_s`` hidden)
PipelineStats = PrefetchStats


def _tensors(minibatch: Any) -> dict[str, torch.Tensor]:
    leaves = tree.flatten({mid: dict(b) for mid, b in minibatch.policy_batches.items()})
    return {str(i): t for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)}


class PipelinedMinibatches(Prefetcher[Any]):
    """Iterate ``source`` (RLlib mini-batches of ``batch``) with up to ``depth`` prepared ahead."""

    def __init__(
        self,
        source: Iterable[Any],
        *,
        device: torch.device | str | None,
        depth: int = 1,
        timeout_s: float = 60.0,
        stats: PrefetchStats | None = None,
        batch: Any = None,
    ) -> None:
        super().__init__(source, device=device, depth=depth, timeout_s=timeout_s, stats=stats, tensors=_tensors,
                         inputs=batch, name="ppo-minibatches")
