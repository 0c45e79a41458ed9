"""Off-policy delivery across ranks: global draws (one buffer's distribution, rows by ``all_to_all``) or local.

A global draw (:meth:`ReplayShare.pull`) is one collective round after the sync
that moves routed units and priority updates
(:meth:`conduit.distributed.runtime.DistributedConduit.sync`):

1. every rank knows every shard's live rows and priority mass (the sync's ``all_gather``);
2. every rank computes the same request matrix ``counts[requester, batch, shard]`` with the shared
   generator (:mod:`conduit.distributed.sampling`): no counts travel;
3. each shard draws, for each requester and batch, its count of rows with its own sampler, gathering them
   straight into its send buffer with their slots, ids and (prioritized) global importance weights;
4. one ``all_to_all_single`` moves every block (:mod:`conduit.distributed.exchange`); each learner
   concatenates its pieces into its batch on its device and runs the delivery hook.

With delivery granularity ``g`` (``ConduitConfig(pinned=...)``, as on one process) one exchange draws
``g`` batches per learner, each batch its own draw: fewer collectives, batches at most ``g`` pulls stale.
"""

from __future__ import annotations

import time
from collections import deque
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from conduit.batch import Batch, BatchInfo, DrawnRows
from conduit.core import Mode, SamplerKind
from conduit.distributed import sampling as smp
from conduit.distributed.exchange import META_ID, META_SLOT, META_WEIGHT, RowLayout, blocks, put
from conduit.errors import ConduitTimeout, SemanticsError

#: the rank's :class:`~conduit.distributed.runtime.DistributedConduit` (not imported: it imports this module)
DistributedConduit = Any

__all__ = ["GIVE_UP", "HEAD", "INSERTED", "MASS", "MIN", "ROWS", "SPEC", "ReplayShare", "ShardedBatch"]

#: the state vector every rank contributes to a sync: these columns, then one outbox size per rank
ROWS, MASS, MIN, SPEC, INSERTED, GIVE_UP = range(6)
HEAD = 6


class ShardedBatch(Batch):
    """A batch whose rows came from several shards: :attr:`owners` is the rank holding each row
    (``info.indices``/``info.ids`` are slots and transition ids *within* that rank's shard)."""

    __slots__ = ("owners",)

    def __init__(self, data: dict[str, torch.Tensor], info: BatchInfo, owners: np.ndarray) -> None:
        super().__init__(data, info)
        self.owners = owners


class ReplayShare:
    """This rank's draws: batches drawn ahead (``g`` per exchange) and the counters their info carries."""

    def __init__(self, edp: DistributedConduit) -> None:
        self.edp = edp
        self.ready: deque[ShardedBatch] = deque()
        self.pulls = 0
        self.exchanges = 0

    def pull(self, timeout: float) -> ShardedBatch:
        if not self.ready:
            local = self.edp.sampling.value == "local"
            self.ready.extend(self._draw_local() if local else self._draw_global(timeout))
        batch = self.ready.popleft()
        self.pulls += 1
        return batch

    def _draw_local(self) -> list[ShardedBatch]:
        edp = self.edp
        assert edp.shard is not None and edp.shard.buffer is not None
        buf = edp.shard.buffer
        if buf.rows < edp.local_sample_min():
            raise SemanticsError(f"rank {edp.rank}'s shard holds {buf.rows} rows: too few to sample (local mode)")
        B = edp.config.train_batch_size
        out = []
        for _ in range(edp.g):
            s = buf.sample(B)
            weights = s.weights
            data = edp.deliver({k: v.to(edp.device) for k, v in s.data.items()})
            info = self._info(s.rows, weights, s.version)
            out.append(ShardedBatch(data, info, np.full(B, edp.rank, dtype=np.int64)))
        self.exchanges += 1
        return out

    def _draw_global(self, timeout: float) -> list[ShardedBatch]:
        edp = self.edp
        deadline = time.monotonic() + timeout
        while True:
            state = edp.sync(give_up=time.monotonic() > deadline)
            if state[:, ROWS].sum() >= edp.config.sample_min:
                break
            if state[:, GIVE_UP].any():
                raise ConduitTimeout(
                    f"timed out after {timeout:.3g}s waiting for {edp.config.sample_min} rows over the group "
                    f"(shards hold {state[:, ROWS].astype(int).tolist()})"
                )
            time.sleep(0.01)
        assert edp.shard is not None and edp.shard.buffer is not None and edp.spec is not None
        W, g, B = edp.world, edp.g, edp.config.train_batch_size
        prioritized = edp.config.sampler is SamplerKind.PRIORITIZED
        wants = [B] * (W * g)  # row r * g + k: requester r's k-th batch
        counts = (smp.prioritized_counts(edp.shared_rng, wants, state[:, MASS]) if prioritized
                  else smp.uniform_counts(edp.shared_rng, wants, state[:, ROWS]))
        per = counts.reshape(W, g, W)  # [requester, batch, shard]
        layout = RowLayout.of(edp.spec, meta=True, weights=prioritized)
        send_sizes = blocks(layout, per[:, :, edp.rank])
        recv_sizes = blocks(layout, per[edp.rank].T)
        send = torch.empty(sum(send_sizes), dtype=torch.uint8)
        buf = edp.shard.buffer
        low = float(state[:, MIN].min())
        at = 0
        for r in range(W):
            for k in range(g):
                n = int(per[r, k, edp.rank])
                if not n:
                    continue
                views = layout.views(send, at, n)
                sampled = buf.sample(n, out={f: views[f] for f in edp.spec.names})
                put(views, sampled.data)
                views[META_SLOT].copy_(torch.from_numpy(sampled.rows.indices))
                views[META_ID].copy_(torch.from_numpy(sampled.rows.ids))
                if prioritized:
                    leaf, _ = buf.priorities_at(sampled.rows.indices)
                    beta = buf.priority_mass()[2]
                    views[META_WEIGHT].copy_(torch.from_numpy(smp.global_weights(leaf, low, beta)))
                at += layout.block_bytes(n)
        recv = edp.group.exchange(send, send_sizes, recv_sizes, "pull (sampled rows)").cpu()
        version = int(state[:, INSERTED].sum())
        parts: list[list[tuple[int, dict[str, torch.Tensor]]]] = [[] for _ in range(g)]
        at = 0
        for s in range(W):
            for k in range(g):
                n = int(per[edp.rank, k, s])
                if n:
                    parts[k].append((s, layout.views(recv, at, n)))
                    at += layout.block_bytes(n)
        out = []
        for k in range(g):
            cols = {f: _cat([v[f] for _, v in parts[k]]) for f, _, _ in layout.fields}
            owners = np.concatenate([np.full(int(v[META_SLOT].shape[0]), s, dtype=np.int64) for s, v in parts[k]])
            rows = DrawnRows(cols.pop(META_SLOT).numpy(), cols.pop(META_ID).numpy())
            weights = cols.pop(META_WEIGHT).numpy() if prioritized else None
            data = edp.deliver({f: t.to(edp.device, non_blocking=True) for f, t in cols.items()})
            out.append(ShardedBatch(data, self._info(rows, weights, version), owners))
        self.exchanges += 1
        return out

    def _info(self, rows: DrawnRows, weights: np.ndarray | None, version: int) -> BatchInfo:
        edp = self.edp
        return BatchInfo(
            learner=edp.rank, pull_index=self.pulls, sampled_at_pull=self.pulls, buffer_version=version,
            iteration=self.exchanges, epoch=None, minibatch=None, num_minibatches=None, last=False,
            rows=rows, weights=weights, mode=Mode(False, Fraction(self.edp.g)), version_at_delivery=version,
        )


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)
