"""Off-policy delivery across ranks: the global draw and its exchange are a delivery path's row source.

A batch leaves a sharded buffer by the route it leaves one process's by: a delivery path
(:class:`conduit.paths.delivery.DeliveryPath`: staging, the pull route, the worker, the
hook operator, one ``BatchInfo`` a batch). Only where an invocation's rows come from is
the group's (:meth:`GroupDelivery._gather`): one global draw after the sync that moves
routed units and priority updates (:meth:`conduit.distributed.runtime.DistributedConduit.sync`):

1. every rank knows every shard's live rows and priority mass (the sync's ``all_gather``);
2. every rank computes the same request matrix ``counts[requester, batch, shard]`` with the shared
   generator (:mod:`conduit.distributed.sampling`): no counts travel;
3. each shard draws, for each requester and batch, its count of rows with its own sampler, gathering them
   straight into its send buffer with their slots, ids and (prioritized) global importance weights;
4. one ``all_to_all_single`` moves every block (:mod:`conduit.distributed.exchange`); each learner
   concatenates its pieces into its batches, which the path's hook and transfer operators take on.

Granularity ``g``: one invocation draws ``g`` batches per learner, each its own draw: fewer
collectives, batches at most ``g - 1`` pulls older. Overlapped, the path's worker runs the
invocation while the learner computes, but only invocations a pull queued: the pull that hands
out the last staged batch queues the next (:meth:`GroupDelivery._pull_staged`), so every rank
runs the same exchanges in the same order whatever its timing, and a collective of the learner's
own (a sync, the planner's gathers, a checkpoint), a mode switch and close first wait until no
queued invocation is left (:meth:`GroupDelivery.quiesce`). A timeout every rank reached alike
(:class:`GroupTimeout`) goes to the pull waiting for the batch, not latched as the rank's failure; a
hook's error is latched, as one process latches it (every later call on the rank raises it).
The mode is the config's (pinned knobs, else the prior: overlapped for learners on a GPU), or
chosen by measuring the loop (``plan="auto"``: :func:`plan_pull`, :mod:`conduit.scheduling.planner`).

Local sampling has no exchange: a learner pulls from its own shard's delivery path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from conduit.batch import Batch, BatchInfo, DrawnRows
from conduit.config import ConduitConfig
from conduit.core import Mode, SamplerKind
from conduit.distributed import sampling as smp
from conduit.distributed.exchange import META_ID, META_SLOT, META_WEIGHT, RowLayout, blocks, put
from conduit.errors import ConduitTimeout, RateLimited, RuntimeClosed, RuntimeFailed, SemanticsError
from conduit.executor import wait_until
from conduit.hooks import HookKind
from conduit.paths.delivery import Claim, DeliveryPath, HookFn, Place, Staged
from conduit.scheduling.planner import DeliveryMode, LivePlanner, candidates, group_planner
from conduit.trace import global_tracer

log = logging.getLogger("conduit")

#: the rank's :class:`~conduit.distributed.runtime.DistributedConduit` (not imported: it imports this module)
DistributedConduit = Any

__all__ = [
    "FAILED", "GIVE_UP", "HEAD", "INSERTED", "MASS", "MAXP", "MIN", "NEWLOW", "PUSHED", "ROWS", "SINCE", "SPEC", "WANT",
    "GroupClaim",
    "GroupDelivery", "GroupTimeout", "OwnedRows", "ShardedBatch", "make_delivery", "plan_pull", "planned",
    "pull_global", "pull_local", "shard_config",
]

#: the state vector every rank contributes to a sync: these columns, then one outbox size per rank
#: (PUSHED, WANT, SINCE: the rank's rows the group's rate limit admitted, its push longest waiting for room
#: and since which sync; 0 without a limit: :mod:`conduit.distributed.ratelimit`; MAXP, NEWLOW: the rank's view of
#: the group's max priority and the smallest priority of its shard's rows new since the last sync: lifts;
#: FAILED: 1 where the ingestion hook failed on a unit routed to the rank: :mod:`conduit.distributed.syncing`)
ROWS, MASS, MIN, SPEC, INSERTED, GIVE_UP, PUSHED, WANT, SINCE, MAXP, NEWLOW, FAILED = range(12)
HEAD = 12


def lifts(state: np.ndarray | torch.Tensor, alpha: float) -> bool:
    """Whether some shard's new rows entered below the group's max priority (one buffer's new rows enter at it):
    decided from the gathered state alone, so every rank decides alike."""
    return bool((state[:, NEWLOW] < float(state[:, MAXP].max()) ** alpha).any())


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


class OwnedRows(DrawnRows):
    """A batch's rows drawn over several shards: slots and ids *within* the shard holding each row, and that
    shard's rank (:attr:`owners`)."""

    __slots__ = ("owners",)

    def __init__(self, indices: np.ndarray, ids: np.ndarray, owners: np.ndarray) -> None:
        super().__init__(indices, ids)
        self.owners = owners


@dataclass(eq=False, slots=True)
class GroupClaim(Claim):
    """One exchange: its number, the pull's timeout, and (once drawn) each batch's rows and weights."""

    invocation: int = 0
    timeout: float = 0.0
    rows: list[OwnedRows] = field(default_factory=list)
    weights: list[np.ndarray | None] = field(default_factory=list)

    def place(self, part: int) -> Place:
        return Place(self.invocation, None, None, None, False, self.rows[part], self.weights[part])

    def facts(self) -> dict[str, object]:
        out = Claim.facts(self)
        out["invocation"] = self.invocation
        if self.rows:  # the whole invocation's rows, as one process's draw gives them (ReplayClaim.facts)
            indices = np.concatenate([r.indices for r in self.rows])
            ids = np.concatenate([r.ids for r in self.rows])
            weights = None if self.weights[0] is None else np.concatenate(self.weights)  # type: ignore[arg-type]
            out.update(drawn=DrawnRows(indices, ids), weights=weights, indices=indices, ids=ids,
                       owners=np.concatenate([r.owners for r in self.rows]), version=self.buffer_version)
        return out


class GroupDelivery(DeliveryPath):
    """A rank's off-policy delivery under global sampling (see the module docstring)."""

    def __init__(self, edp: DistributedConduit, mode: Mode, hook: HookFn | None) -> None:
        super().__init__(buffer=None, mode=mode, hook=hook, tracer=global_tracer(),  # type: ignore[arg-type]
                         failure=edp.group.failure, timeout=edp.config.timeout_s, learner_devices=[edp.device],
                         recycle_batches=False)
        self.edp = edp
        self._invocation = 0
        self._group_version = 0  # transitions the group had ingested at the last draw
        self._queued: deque[GroupClaim] = deque()  # claims a hand-over queued for the worker
        self._handed: BaseException | None = None  # an error every rank raised alike, for the waiting pull
        self._running = threading.local()  # ``.on``: this thread is running one of the worker's exchanges
        #: the current pull's timeout: the one its draw (inline, or queued at its hand-over) waits within
        self.pull_timeout = edp.config.timeout_s
        shard = edp.shard.buffer if edp.shard is not None else None
        self._new_since = shard.inserted if shard is not None else 0  # this shard's rows from this id on are new

    # -- what an invocation is ---------------------------------------------------------------------
    def _ready(self, learner: int, rows: int = 0) -> bool:
        return True  # whether the group holds enough rows is the draw's collective decision (bounded, below)

    def _begin(self, learner: int, sampled_at_pull: int, handed: bool, rows: int = 0) -> GroupClaim:
        if rows:
            raise SemanticsError("pull(rows=...) draws from one process's buffer; a group's batches are "
                                 "train_batch_size rows")
        invocation, self._invocation = self._invocation, self._invocation + 1
        return GroupClaim(learner, sampled_at_pull, self.mode, (self.edp.config.train_batch_size,) * self.g_units,
                          invocation=invocation, timeout=self.pull_timeout)

    def _passes(self, exc: Exception) -> bool:
        """Errors every rank raised alike (a group timeout, a draw the rate refused) and a closed runtime's go to the
        pulling caller; the rest fail the rank, inline or on the worker, as they fail one process: a hook's or a
        transfer's error is latched and raised by every later call (a failed rank's, latched already, re-raised)."""
        return isinstance(exc, (GroupTimeout, RateLimited, RuntimeClosed))

    def _on_worker(self) -> bool:
        return getattr(self._running, "on", False)

    def _version(self) -> int:
        return self._group_version

    def _batch(self, data: dict[str, torch.Tensor], info: BatchInfo) -> ShardedBatch:
        rows = info.rows
        assert isinstance(rows, OwnedRows)
        return ShardedBatch(data, info, rows.owners)

    def shard_priorities(self) -> tuple[float, float, float, float]:
        """What this rank's sync reports of its shard's priorities: the total mass and smallest non-zero priority
        (``p^alpha``) for the request matrix of the group's next draw; its max priority and the smallest
        ``p^alpha`` of its new rows (:func:`lifts`). 0, inf, 0, inf without priorities."""
        buffer = self.edp.shard.buffer
        if buffer is None or self.edp.config.sampler is not SamplerKind.PRIORITIZED:
            return 0.0, float("inf"), 0.0, float("inf")
        top, new_low = buffer.newest_state(self._new_since)
        if not buffer.rows:
            return 0.0, float("inf"), top, new_low
        total, low, _ = buffer.priority_mass()
        return total, low, top, new_low

    def synced(self, group_max: float) -> None:
        """A sync gathered the group's state: this shard's max priority becomes the group's, ``group_max``, and its
        rows new since the last sync rise to it (a no-op unless :func:`lifts` said some shard's were below); rows
        stored from now on are new."""
        buffer = self.edp.shard.buffer
        if buffer is None or self.edp.config.sampler is not SamplerKind.PRIORITIZED:
            return
        buffer.lift_newest(self._new_since, group_max)
        self._new_since = buffer.inserted

    def _describe_wait(self, learner: int) -> str:
        return f"the group's exchange for learner {self.edp.rank}: {self.doing('none running')}"

    # -- state: a checkpoint of the group holds each rank's batches drawn ahead ------------------------------
    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            state = super().state_dict()
            state["owners"] = [[np.asarray(s.info.rows.owners) for s in q] for q in self.staged]  # type: ignore
        return {**state, "invocation": self._invocation, "group_version": self._group_version}

    def restored(self, state: dict[str, Any] | None) -> None:
        """A checkpoint was loaded into this rank: the rows it loaded are not new (they keep their priorities);
        ``state``: the batches this rank had drawn ahead (a restore onto the same ranks), handed out first."""
        if state is not None:
            self.load_state_dict(state)
        buffer = self.edp.shard.buffer if self.edp.shard is not None else None
        self._new_since = buffer.inserted if buffer is not None else 0

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        with self._lock:
            for q, owners in zip(self.staged, state["owners"], strict=True):
                for i, (item, own) in enumerate(zip(list(q), owners, strict=True)):
                    rows = OwnedRows(item.info.indices, item.info.ids, np.asarray(own))
                    q[i] = Staged(item.data, item.info._replace(rows=rows), None)
            self._invocation, self._group_version = int(state["invocation"]), int(state["group_version"])

    # -- the worker runs queued claims only ------------------------------------------------------------
    def _claim_work(self) -> GroupClaim | None:
        if not self._queued:
            return None
        claim = self._queued.popleft()
        self._busy[claim.learner] = True
        return claim

    def _work(self, claim: Claim) -> None:
        self._running.on = True
        try:
            super()._work(claim)
        except (GroupTimeout, RuntimeFailed) as exc:  # passed or latched by _invoke: the waiting pull raises it
            with self._lock:
                self._handed = exc
                self.cond.notify_all()
        finally:
            self._running.on = False

    def _queue(self, learner: int) -> None:
        """Claim the next exchange for the worker (caller holds cond)."""
        self._queued.append(self._claim(learner, handed=False)[0])

    def _pull_staged(self, learner: int, deadline: tuple[float, float]) -> Batch | None:
        """Overlapped: the next batch the worker staged; the hand-over of the last one queues the next exchange.
        None if the mode switched to inline meanwhile."""
        extra = 4 * self.edp.config.timeout_s  # the exchange's wait for rows, then at most four collectives
        deadline = (deadline[0] + extra, deadline[1] + extra)
        with self._lock:
            staged = self.staged[learner]
            if not staged and not self._busy[learner] and not self._queued and self._handed is None:
                self._queue(learner)  # nothing drawn ahead (the first pull, a switch): drawn now, on the worker
                self.cond.notify_all()
            self._wait(learner, deadline, lambda: bool(staged) or self._handed is not None or not self.mode.overlap,
                       data=False)
            if not staged:
                exc, self._handed = self._handed, None
                if exc is not None:
                    raise exc
                return None
            item, index = self._pop(learner)
            if not staged and self.mode.overlap and not self._queued:
                self._queue(learner)  # woken when the hand-over ends (_hand_over), not in the middle of it
        return self._hand_over(learner, item, index)

    def quiesce(self, timeout: float | None = None) -> None:
        """Wait until no queued or running exchange is left: before a collective of the learner's own, a mode
        switch or close (every rank then issues its collectives in one order). A no-op on the worker itself."""
        if self._on_worker():
            return
        cfg = self.edp.config
        with self._lock:
            claims = [c.timeout for c in self._queued]
            bound = (timeout if timeout is not None else max(claims, default=cfg.timeout_s)) + 4 * cfg.timeout_s
            wait_until(self.cond, lambda: not self._queued and not self._working, bound, self.failure,
                       lambda: f"the overlapped exchange of rank {self.edp.rank} to end: {self.doing('queued')}")

    def _before_switch(self, timeout: float) -> None:
        self.quiesce(timeout)

    # -- the global draw ------------------------------------------------------------------------------
    def _gather(self, claim: Claim) -> list[dict[str, torch.Tensor]]:
        assert isinstance(claim, GroupClaim)
        edp = self.edp
        if self._on_worker() and edp.device.type == "cuda":
            torch.cuda.set_device(edp.device)  # a new thread's current device is GPU 0
        deadline = time.monotonic() + claim.timeout
        W, B, g = edp.world, edp.config.train_batch_size, len(claim.sizes)
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
                raise GroupTimeout(f"timed out after {claim.timeout:.3g}s waiting for {wanted} "
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
        buffer = edp.shard.buffer  # this path's own draws, as one process's path draws from its buffer
        low = float(state[:, MIN].min())
        at = 0
        for r in range(W):
            for k in range(g):
                n = int(per[r, k, edp.rank])
                if not n:
                    continue
                views = layout.views(send, at, n)
                sampled = buffer.sample(n, out={f: views[f] for f in edp.spec.names})
                put(views, sampled.data)
                views[META_SLOT].copy_(torch.from_numpy(sampled.rows.indices))
                views[META_ID].copy_(torch.from_numpy(sampled.rows.ids))
                if prioritized:  # the draw's own leaves and beta, re-weighed by the group's smallest leaf
                    assert sampled.leaves is not None and sampled.beta is not None
                    views[META_WEIGHT].copy_(torch.from_numpy(smp.global_weights(sampled.leaves, low, sampled.beta)))
                at += layout.block_bytes(n)
        recv = edp.group.exchange(send, send_sizes, recv_sizes, "pull (sampled rows)").cpu()
        claim.buffer_version = self._group_version = int(state[:, INSERTED].sum())
        pieces: list[list[tuple[int, dict[str, torch.Tensor]]]] = [[] for _ in range(g)]
        at = 0
        for s in range(W):
            for k in range(g):
                n = int(per[edp.rank, k, s])
                if n:
                    pieces[k].append((s, layout.views(recv, at, n)))
                    at += layout.block_bytes(n)
        parts = []
        for k in range(g):
            cols = {f: _cat([v[f] for _, v in pieces[k]]) for f, _, _ in layout.fields}
            owners = np.concatenate([np.full(int(v[META_SLOT].shape[0]), s, dtype=np.int64) for s, v in pieces[k]])
            claim.rows.append(OwnedRows(cols.pop(META_SLOT).numpy(), cols.pop(META_ID).numpy(), owners))
            claim.weights.append(cols.pop(META_WEIGHT).numpy() if prioritized else None)
            parts.append(cols)
        return parts


def make_delivery(edp: DistributedConduit) -> GroupDelivery:
    """Global sampling's delivery path (``edp.delivery``): the core's, with the global draw as its row source,
    made when the rank starts, with the registered delivery hook (the hooks freeze there)."""
    edp.registry.freeze("the group has delivered; register hooks before the first push/pull")
    spec = edp.registry.get(HookKind.DELIVERY)
    mode = edp.delivery_mode
    path = GroupDelivery(edp, Mode(mode.overlap, Fraction(mode.g)), spec.fn if spec else None)
    if edp.restored_delivery is not None:  # a restore onto these ranks: the batches they had drawn ahead
        path.restored(edp.restored_delivery)
        edp.restored_delivery = None
    path.start()
    edp.group.before_call = path.quiesce  # a collective of the learner's thread waits for a queued exchange
    edp.delivery = path
    return path


def pull_global(edp: DistributedConduit, timeout: float) -> ShardedBatch:
    """Global sampling: the planner's tick (``plan="auto"``), then a pull of the group's delivery path."""
    path = edp.delivery or make_delivery(edp)
    if edp.planner is not None:
        plan_pull(edp, path, edp.planner)
    path.pull_timeout = timeout
    return path.pull(0, timeout)  # type: ignore[return-value]


def pull_local(edp: DistributedConduit, timeout: float) -> ShardedBatch:
    """Local sampling: this rank's shard's own delivery path (the core's draw, hook, batch memory and schedule;
    the shard starts sampling at its share of ``min_size_to_sample``)."""
    assert edp.shard is not None and edp.shard.buffer is not None
    b = edp.shard.pull(timeout=timeout)  # waits, bounded, for the shard's share of min_size_to_sample
    info = b.info._replace(learner=edp.rank)
    return ShardedBatch(dict(b.items()), info, np.full(len(info.rows), edp.rank, dtype=np.int64))


def planned(edp: DistributedConduit, auto: bool) -> tuple[DeliveryMode, LivePlanner[DeliveryMode] | None]:
    """The rank's delivery mode under the config's prior (pinned knobs, else overlapped for GPU learners,
    ``g = 1``), and with ``auto`` (global sampling only) the planner that probes every mode first."""
    cfg = edp.config
    prior = cfg.default_schedule().delivery
    # rows on NCCL: an exchange on the worker beside the learner's own NCCL collectives (DDP) could meet them
    # in a different order on different ranks, which NCCL may deadlock on: overlapped only where pinned
    lone = edp.group.rows_backend == "nccl" and cfg.pinned.delivery_overlap is None
    modes = tuple(m for m in candidates(cfg) if not (lone and m.overlap))
    rate = cfg.rate_limit
    if rate is not None:
        # the ratio admits at most a band's width of samples at once; a refused draw raises on the learner's
        # thread (block=False), never on the worker, where it would be a failure of the rank
        fits = [m for m in modes if edp.world * m.g * cfg.train_batch_size <= (rate.tolerance or 0.0)
                and (rate.block or not m.overlap)]
        modes = tuple(fits)  # never empty: validate_rate refused a pinned mode that does not fit
        lone = lone or not rate.block
    planner = group_planner(modes) if auto and edp.sampling.value == "global" else None
    return DeliveryMode(bool(prior.overlap) and not lone, int(prior.granularity)), planner


def plan_pull(edp: DistributedConduit, path: GroupDelivery, planner: LivePlanner[DeliveryMode]) -> None:
    """``plan="auto"``, at the start of each pull: tick the planner; at the pulls where it asks, gather the
    group's windows (collective, at the same pull on every rank) to decide or to check the plan; switch the
    path to this pull's mode."""
    mode = planner.tick(time.perf_counter())
    if planner.checking:
        got = edp.group.gather(torch.from_numpy(planner.watched.copy()), "plan (drift check)")
        if planner.recheck(got.numpy().reshape(edp.world, -1), time.perf_counter()):
            if edp.rank == 0:
                log.info("conduit.distributed: re-planning delivery: %s", planner.replans[-1])
            mode = planner.tick(time.perf_counter())  # the probe's first pull
    if planner.deciding:
        shape = planner.times.shape
        got = edp.group.gather(torch.from_numpy(planner.times.reshape(-1).copy()), "plan (probe windows)")
        mode = planner.decide(got.numpy().reshape(edp.world, *shape))
        if edp.rank == 0:
            log.info("conduit.distributed: delivery plan %s (%s)", mode,
                     ", ".join(f"{r['mode']} {float(r['median_s']) * 1e3:.3f} ms/pull" for r in planner.report()))
    path.set_mode(Mode(mode.overlap, Fraction(mode.g)))


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def shard_config(
    cfg: ConduitConfig, capacity: int, rank: int, device: str, sample_min: int | None = None
) -> ConduitConfig:
    """The config of one rank's shard: its capacity, one learner. Local sampling (``sample_min``: its share of
    ``min_size_to_sample``) pulls through the shard's own delivery path, scheduled as the config says; under
    global sampling the group's path draws (:class:`GroupDelivery`) and the shard's delivers nothing."""
    d = cfg.model_dump()
    pinned = dict(d["pinned"])
    if sample_min is None:
        pinned.update(delivery_overlap=False, delivery_granularity="1")
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
