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

With delivery granularity ``g`` one exchange draws ``g`` batches per learner, each batch its own draw:
fewer collectives, batches at most ``g - 1`` pulls older. Overlapped, the next exchange starts on the rank's
collective lane (:class:`conduit.executor.Lane`) as soon as the last drawn batch is handed out, and runs
while the learner computes; any other collective of the caller waits for it first, so every rank keeps one
order of collectives. The mode is the config's (pinned knobs, else the prior: overlapped for learners on a
GPU), or chosen by measuring the loop (``plan="auto"``, :mod:`conduit.scheduling.planner`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from conduit.batch import Batch, BatchInfo, DrawnRows
from conduit.config import ConduitConfig
from conduit.core import Mode, SamplerKind
from conduit.distributed import sampling as smp
from conduit.distributed.exchange import META_ID, META_SLOT, META_WEIGHT, RowLayout, blocks, put
from conduit.errors import ConduitTimeout, RuntimeFailed, SemanticsError
from conduit.scheduling.planner import DeliveryMode, LivePlanner, candidates, group_planner

log = logging.getLogger("conduit")

#: the rank's :class:`~conduit.distributed.runtime.DistributedConduit` (not imported: it imports this module)
DistributedConduit = Any

__all__ = [
    "GIVE_UP", "HEAD", "INSERTED", "MASS", "MIN", "PUSHED", "ROWS", "SINCE", "SPEC", "WANT", "GroupTimeout",
    "ReplayShare", "ShardedBatch", "shard_config", "shard_mass",
]

#: the state vector every rank contributes to a sync: these columns, then one outbox size per rank
#: (PUSHED, WANT, SINCE: the rank's rows the group's rate limit admitted, its push longest waiting for room
#: and since which sync; 0 without a limit: :mod:`conduit.distributed.ratelimit`)
ROWS, MASS, MIN, SPEC, INSERTED, GIVE_UP, PUSHED, WANT, SINCE = range(9)
HEAD = 9


class GroupTimeout(ConduitTimeout):
    """Every rank gave up waiting at the same sync (they decided on the same state): the group is still in
    step, so, raised by an overlapped exchange, it is the caller's to catch, not a failure of the rank."""


class ShardedBatch(Batch):
    """A batch whose rows came from several shards: :attr:`owners` is the rank holding each row
    (``info.indices``/``info.ids`` are slots and transition ids *within* that rank's shard)."""

    __slots__ = ("owners",)

    def __init__(self, data: dict[str, torch.Tensor], info: BatchInfo, owners: np.ndarray) -> None:
        super().__init__(data, info)
        self.owners = owners


class ReplayShare:
    """This rank's draws: batches drawn ahead (``g`` per exchange), the exchange in flight when overlapped, and
    the counters their info carries."""

    def __init__(self, edp: DistributedConduit, mode: DeliveryMode, planner: LivePlanner[DeliveryMode] | None) -> None:
        self.edp = edp
        self.mode = mode
        self.planner = planner
        self.ready: deque[ShardedBatch] = deque()
        self.pending: Future[list[ShardedBatch]] | None = None
        self.pulls = 0
        self.exchanges = 0

    @classmethod
    def planned(cls, edp: DistributedConduit, auto: bool) -> ReplayShare:
        """The rank's draws under the config's prior (pinned knobs, else overlapped for GPU learners, ``g = 1``),
        or probing every mode first (``auto``, global sampling only)."""
        cfg = edp.config
        prior = cfg.default_schedule().delivery
        # rows on NCCL: an exchange on the lane beside the learner's own NCCL collectives (DDP) could meet them
        # in a different order on different ranks, which NCCL may deadlock on: overlapped only where pinned
        lone = edp.group.rows_backend == "nccl" and cfg.pinned.delivery_overlap is None
        modes = tuple(m for m in candidates(cfg) if not (lone and m.overlap))
        rate = cfg.rate_limit
        if rate is not None:
            # the ratio admits at most a band's width of samples at once; a refused draw raises on the learner's
            # thread (block=False), never on the lane, where it would be a failure of the rank
            fits = [m for m in modes if edp.world * m.g * cfg.train_batch_size <= rate.tolerance
                    and (rate.block or not m.overlap)]
            modes = tuple(fits)  # never empty: validate_rate refused a pinned mode that does not fit
            lone = lone or not rate.block
        planner = group_planner(modes) if auto and edp.sampling.value == "global" else None
        return cls(edp, DeliveryMode(bool(prior.overlap) and not lone, int(prior.granularity)), planner)

    def pull(self, timeout: float) -> ShardedBatch:
        local = self.edp.sampling.value == "local"
        if self.planner is not None and not local:
            self.mode = self.planner.tick(time.perf_counter())
            if self.planner.checking:
                self.drain(timeout)
                if self._recheck(self.planner):
                    self.mode = self.planner.tick(time.perf_counter())  # the probe's first pull
            if self.planner.deciding:
                self.drain(timeout)
                self.mode = self._decide(self.planner)
        if not self.ready:
            if self.pending is not None:
                self.drain(timeout)
            else:
                self.ready.extend(self._draw_local() if local else self._draw_global(timeout, self.mode.g))
        batch = self.ready.popleft()
        batch.info = batch.info._replace(pull_index=self.pulls)  # drawn ahead (g > 1, overlap): handed out now
        self.pulls += 1
        if self.mode.overlap and not local and not self.ready:
            bound = timeout + 4 * self.edp.config.timeout_s  # the wait for rows, then at most four collectives
            self.pending = self.edp.group.ahead(self._draw_ahead, timeout, self.mode.g, bound_s=bound)
        return batch

    def _draw_ahead(self, timeout: float, g: int) -> list[ShardedBatch]:
        """:meth:`_draw_global` on the lane: on the learner's GPU (a new thread's current device is GPU 0)."""
        if self.edp.device.type == "cuda":
            torch.cuda.set_device(self.edp.device)
        return self._draw_global(timeout, g, overlap=True)

    def drain(self, timeout: float | None = None) -> None:
        """Wait for the exchange in flight (its batches join the ready ones): before any other collective."""
        if self.pending is None or self.edp.group.on_lane:
            return
        future, self.pending = self.pending, None
        wait = (self.edp.config.timeout_s if timeout is None else timeout) + 4 * self.edp.config.timeout_s
        try:
            self.ready.extend(future.result(timeout=wait))
        except BaseException as exc:
            # latched, whatever it was: this rank's exchanges are out of step with its peers' from here on
            if isinstance(exc, FutureTimeout):
                exc = ConduitTimeout(f"rank {self.edp.rank}: the overlapped exchange did not end within {wait:.3g}s")
            if isinstance(exc, (RuntimeFailed, GroupTimeout)):  # latched already (RankFailed), or in step
                raise
            raise self.edp.group.failure.set("pull (overlapped exchange)", exc) from exc

    def _decide(self, planner: LivePlanner[DeliveryMode]) -> DeliveryMode:
        """Collective, at the same pull on every rank: gather the probe's windows and keep the plan."""
        edp = self.edp
        shape = planner.times.shape
        got = edp.group.gather(torch.from_numpy(planner.times.reshape(-1).copy()), "plan (probe windows)")
        mode = planner.decide(got.numpy().reshape(edp.world, *shape))
        if edp.rank == 0:
            log.info("conduit.distributed: delivery plan %s (%s)", mode,
                     ", ".join(f"{r['mode']} {float(r['median_s']) * 1e3:.3f} ms/pull" for r in planner.report()))
        return mode

    def _recheck(self, planner: LivePlanner[DeliveryMode]) -> bool:
        """Collective, at the same pull on every rank: gather the plan's watched windows; probe again where the
        group's time drifted (:func:`conduit.scheduling.planner.drifted`)."""
        edp = self.edp
        got = edp.group.gather(torch.from_numpy(planner.watched.copy()), "plan (drift check)")
        replan = planner.recheck(got.numpy().reshape(edp.world, -1), time.perf_counter())
        if replan and edp.rank == 0:
            log.info("conduit.distributed: re-planning delivery: %s", planner.replans[-1])
        return replan

    def _draw_local(self) -> list[ShardedBatch]:
        """Local sampling: ``g`` pulls from this rank's shard through its own delivery path (the core's draw, hook
        and batch memory; the shard starts sampling at its share of ``min_size_to_sample``)."""
        edp = self.edp
        assert edp.shard is not None and edp.shard.buffer is not None
        if edp.shard.buffer.rows < edp.local_sample_min():
            raise SemanticsError(
                f"rank {edp.rank}'s shard holds {edp.shard.buffer.rows} rows: too few to sample (local mode)"
            )
        out = []
        for _ in range(self.mode.g):
            b = edp.shard.pull()
            info = self._info(b.info.rows, b.info.weights, b.info.buffer_version, Mode(False, Fraction(self.mode.g)))
            out.append(ShardedBatch(dict(b.items()), info, np.full(len(info.rows), edp.rank, dtype=np.int64)))
        self.exchanges += 1
        return out

    def _draw_global(self, timeout: float, g: int, overlap: bool = False) -> list[ShardedBatch]:
        edp = self.edp
        deadline = time.monotonic() + timeout
        W, B = edp.world, edp.config.train_batch_size
        rate = edp.rate
        while True:
            state = edp.sync(give_up=time.monotonic() > deadline)
            size = int(state[:, ROWS].sum())
            if size >= edp.config.sample_min and (rate is None or rate.can_draw(W * g * B, size)):
                break
            if rate is not None and size >= edp.config.sample_min and not rate.block:
                raise rate.refused(W * g * B, size)  # on every rank: they decided on the same state
            if state[:, GIVE_UP].any():
                wanted = (f"the group's sample/insert ratio to admit {W * g * B} rows ({rate.limiter.describe()})"
                          if rate is not None and size >= edp.config.sample_min
                          else f"{edp.config.sample_min} rows over the group")
                raise GroupTimeout(f"timed out after {timeout:.3g}s waiting for {wanted} "
                                   f"(shards hold {state[:, ROWS].astype(int).tolist()})")
            time.sleep(0.01)
        if rate is not None:
            rate.drew(W * g * B)
        assert edp.shard is not None and edp.shard.buffer is not None and edp.spec is not None
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
                if prioritized:  # the draw's own leaves and beta, re-weighed by the group's smallest leaf
                    assert sampled.leaves is not None and sampled.beta is not None
                    views[META_WEIGHT].copy_(torch.from_numpy(smp.global_weights(sampled.leaves, low, sampled.beta)))
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
            info = self._info(rows, weights, version, Mode(overlap, Fraction(g)))
            data = edp.deliver({f: t.to(edp.device, non_blocking=True) for f, t in cols.items()}, info)
            out.append(ShardedBatch(data, info, owners))
        self.exchanges += 1
        return out

    def _info(self, rows: DrawnRows, weights: np.ndarray | None, version: int, mode: Mode) -> BatchInfo:
        edp = self.edp
        return BatchInfo(
            learner=edp.rank, pull_index=self.pulls, sampled_at_pull=self.pulls, buffer_version=version,
            iteration=self.exchanges, epoch=None, minibatch=None, num_minibatches=None, last=False,
            rows=rows, weights=weights, mode=mode, version_at_delivery=version,
        )


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def shard_mass(buf: Any, cfg: ConduitConfig) -> tuple[float, float]:
    """A prioritized shard's total priority mass and smallest non-zero priority (``p^alpha``)."""
    if buf is None or cfg.sampler is not SamplerKind.PRIORITIZED or not buf.rows:
        return 0.0, float("inf")
    total, low, _ = buf.priority_mass()
    return total, low


def shard_config(
    cfg: ConduitConfig, capacity: int, rank: int, device: str, sample_min: int | None = None
) -> ConduitConfig:
    """The config of one rank's shard: its capacity, one learner, delivery inline (a global draw is this module's;
    local sampling pulls through the shard's own delivery path, from ``sample_min`` rows: its share)."""
    d = cfg.model_dump()
    pinned = {**d["pinned"], "delivery_overlap": False, "delivery_granularity": "1"}
    d.update(rate_limit=None)  # the group's ratio is the runtime's (:mod:`conduit.distributed.ratelimit`)
    # no explicit ring of batches: local sampling pulls g batches an exchange before the learner takes one, so a
    # ring of batch_pool would be overwritten under them (recycled memory is reused only once a batch is dropped)
    d["tuning"] = {**d["tuning"], "batch_pool": 0}
    d.update(
        capacity=capacity, train_batch_size=min(cfg.train_batch_size, capacity), num_learners=1,
        learner_device=device, min_size_to_sample=sample_min, pinned=pinned,
        seed=None if cfg.seed is None else cfg.seed * 1_000_003 + rank + 1,
    )
    return ConduitConfig(**d)
