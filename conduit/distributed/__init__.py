"""The distributed experience plane: one Conduit per learner rank, a buffer sharded over ranks and nodes.

Data moves only through ``torch.distributed`` (gloo on CPU, NCCL on GPU); Ray or
torch.multiprocessing only launch (:mod:`conduit.distributed.launch`). Each rank
holds a shard (a single-process :class:`conduit.Conduit`); learners' batches are
drawn over every shard with one buffer's distribution (``sampling="global"``) or
from their own shard (``sampling="local"``); on-policy, each learner gets its
data-parallel part of every mini-batch. Every collective is bounded by the
config's ``timeout_s``; a dead or stalled rank is named (:class:`RankFailed`) at
most ``timeout_s`` plus a short diagnosis window, ``min(1 s, max(0.1 s, timeout_s / 4))``,
after the collective that waits for it began (``RankGroup.failure_bound_s``). A bad
push raises ``SpecError`` at the push on every rank, under every routing, and the
group holds one experience spec. Collective checkpoints restore onto any number of
ranks, all or nothing.

The core never imports this package; importing it imports ``torch.distributed``.
"""

from __future__ import annotations

from conduit.distributed.group import RankFailed
from conduit.distributed.options import DistributedStats, Routing, Sampling
from conduit.distributed.replay import ShardedBatch
from conduit.distributed.runtime import DistributedConduit

#: the per-rank runtime, spelled as the single-process one: ``conduit.distributed.Conduit(...)``
Conduit = DistributedConduit

__all__ = ["Conduit", "DistributedConduit", "DistributedStats", "RankFailed", "Routing", "Sampling", "ShardedBatch"]
