"""One Conduit per learner rank, each holding a shard of one Experience Buffer, delivering one buffer's samples.

::

    torch.distributed.init_process_group("gloo")         # or torchrun / Ray actors / conduit.distributed.launch
    edp = conduit.distributed.Conduit(policy="off_policy", train_batch_size=256, capacity=1_000_000,
                                      sampler="prioritized")
    with edp:
        for it in range(iterations):
            edp.push(rollout())            # into this rank's shard (or routed: round_robin, proportional)
            batch = edp.pull()             # collective: this learner's batch, drawn over every shard
            edp.update_priorities(batch, td_error(batch))

**The shard** is a single-process :class:`conduit.Conduit` over this rank's share
of ``capacity`` (equal, or ``shares=`` such as the placement's multi-node split,
:func:`conduit.distributed.sampling.shard_capacities`): ingestion hooks, validation, the replay ring
and its sampler are the core's own, unchanged. For a learner on a GPU its rows live where Alg. 1
puts them over the part of the node that is the rank's alone: its GPU, or its part of the host's
pinned or pageable memory (:mod:`conduit.distributed.shards`).

**Which calls are collective.** ``pull`` (global sampling), ``minibatches``,
``sync``, ``stats``, ``save`` and construction: every rank calls them, in the
same order, as a data-parallel learner calls its all-reduce. ``push``,
``update_priorities`` and ``flush`` join no collective: a unit routed to another
shard, or a priority for a row another rank holds, waits in an outbox and moves
at the next collective (before that collective samples, so a priority update is
in place for the next draw exactly as on one buffer). Where no spec was declared,
a rank's first push asks the group's store once which spec the group holds.

**Bad input** raises ``SpecError`` at the push, on every rank and under every routing, changing
nothing: checked as the core checks it, against the group's one spec (:mod:`conduit.distributed.admission`).

**Sampling.** ``sampling="global"`` (the default) draws each learner's batch over all rows of all shards
with one buffer's distribution (uniform over every row, or prioritized over the global priority mass,
weights normalised by the global maximum: :mod:`conduit.distributed.sampling`); rows move in one
``all_to_all`` (:mod:`conduit.distributed.exchange`). ``sampling="local"``: each learner draws from its own
shard only, no exchange and no collective in ``pull``. That changes the distribution: a row is drawn with probability
``1/rows_of_its_shard`` (or its priority over its *shard's* mass), so rows of
a smaller or less-filled shard are over-represented, each learner sees only the
experience of the actors that feed its shard, and weights are normalised by the
shard's own maximum. It equals global sampling only when shards are equally full
and the actors are exchangeable.

**Exactly once.** Every unit is counted where it is pushed and where a shard ingests it;
:meth:`DistributedConduit.stats` adds them up: ``pushed == ingested + refused + in flight`` (0 after ``sync``).

**Rate limit.** ``rate_limit`` keeps the group's samples per insert in the band one buffer would
(:mod:`conduit.distributed.ratelimit`): pushes still join no collective, but wait for their rank's
part of the room, which each sync shares out.

**Faults.** Every collective is bounded by ``timeout_s``; a rank that died or stalled makes the others' next
collective raise :class:`RankFailed` naming it, at most ``timeout_s`` plus the diagnosis window
``min(1 s, max(0.1 s, timeout_s / 4))`` after that collective began (``group.failure_bound_s``:
:mod:`conduit.distributed.group`), and every later call raises it again.
"""

from __future__ import annotations

import logging
import math
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from conduit.batch import Batch
from conduit.config import ConduitConfig
from conduit.core import Policy
from conduit.distributed import sampling as smp
from conduit.distributed import syncing
from conduit.distributed.admission import GroupSpec, Router, spec_text
from conduit.distributed.group import RankGroup
from conduit.distributed.options import DistributedStats, Routing, Sampling, validate, validate_local, validate_rate
from conduit.distributed.ratelimit import GroupRateLimit
from conduit.distributed.replay import (
    ROWS,
    GroupDelivery,
    ShardedBatch,
    make_delivery,
    planned,
    pull_global,
    pull_local,
    shard_config,
)
from conduit.distributed.shards import shard_storage
from conduit.errors import ConduitTimeout, ConfigError, SemanticsError, SpecError
from conduit.hooks import HookKind, HookRegistry
from conduit.runtime import Conduit
from conduit.samplers.prioritized import checked_priorities
from conduit.scheduling.planner import DeliveryMode
from conduit.spec import Data, ExperienceSpec, as_tensors, batch_size_of, rows_of

__all__ = ["DistributedConduit"]

log = logging.getLogger("conduit")


class DistributedConduit:
    """The Conduit of one rank of a ``torch.distributed`` group (see the module docstring).

    Args:
        config: the *global* configuration (``capacity`` of the whole buffer, ``train_batch_size`` per
            learner off-policy; on-policy an iteration is every row the ranks pushed before ``minibatches()``,
            whatever ``train_batch_size`` says); ``Conduit(policy=..., ...)`` is shorthand.
        group: the learners' process group (default: the world). Construction is collective over it.
        sampling: ``"global"`` (default) or ``"local"`` (:class:`Sampling`).
        routing: ``"local"`` (default), ``"round_robin"`` or ``"proportional"`` (:class:`Routing`).
        shares: each rank's share of ``capacity`` (default equal), e.g. a placement's capacity split.
        plan: off-policy delivery's schedule: ``"prior"`` (default; the config's pinned knobs, else overlapped
            for learners on a GPU and inline on the CPU, ``g = 1``) or ``"auto"`` (measured on the running
            loop, the same rule as one process's planner: :mod:`conduit.scheduling.planner`).
        spec: the experience spec, when known up front.
        registry: the hooks (default: a fresh registry filled by ``@edp.register_*``).
    """

    def __init__(
        self,
        config: ConduitConfig | None = None,
        *,
        group: dist.ProcessGroup | None = None,
        sampling: Sampling | str = Sampling.GLOBAL,
        routing: Routing | str = Routing.LOCAL,
        shares: list[float] | tuple[float, ...] | None = None,
        plan: str = "prior",
        spec: ExperienceSpec | None = None,
        registry: HookRegistry | None = None,
        **fields: Any,
    ) -> None:
        if plan not in ("prior", "auto"):
            raise ConfigError(f"plan: expected 'prior' or 'auto', received {plan!r}")
        if config is not None and fields:
            raise ConfigError(f"pass either a ConduitConfig or config fields, not both (got {sorted(fields)})")
        cfg = config if config is not None else ConduitConfig(**fields)
        self.config = cfg
        self.sampling = Sampling(sampling)
        self.routing = Routing(routing)
        validate(cfg, self.routing)
        world = dist.get_world_size(group)  # before the group forms: nothing to undo
        validate_rate(cfg, self.sampling, world)
        validate_local(cfg, self.sampling, world, shares)
        self.group = RankGroup(cfg.timeout_s, group)
        self.rank, self.world = self.group.rank, self.group.world
        self.registry = registry or HookRegistry()
        self.spec_declared = spec
        devices = cfg.learner_devices
        device = torch.device(devices[self.rank] if len(devices) == self.world else devices[0])
        if device.type == "cuda" and device.index is None:  # "cuda": this process's current GPU, named
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        seed = cfg.seed if cfg.seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
        peers = self.group.gather_object((seed, str(self.device), spec_text(spec)), "seeding")
        if len({p[2] for p in peers}) > 1:  # every rank refuses, alike: the group holds one spec
            self.group.close()
            raise SpecError(f"the ranks declared different experience specs: {[p[2] or None for p in peers]}")
        #: the generator every rank holds alike (request matrices, on-policy permutations)
        self.shared_rng = np.random.default_rng([int(peers[0][0]), 0x5EED])
        hosts = [p["host"] for p in self.group.peers]
        #: ranks of this host whose learners share this rank's device (their shards share its memory)
        self.device_sharers = sum(1 for r, (_, d, _) in enumerate(peers) if hosts[r] == hosts[self.rank]
                                  and d == str(self.device))
        #: the group's one experience spec, and the check every push makes against it
        self.agreement = GroupSpec(self.group, spec, frozenset(cfg.growable))
        self._settled = False  # whether this shard took a checked unit (its own checks are then the group's)
        self.restored = False  # whether a checkpoint was loaded (a runtime restores once, fresh)
        self.restored_delivery: dict[str, Any] | None = None  # a restore's batches drawn ahead (replay.py)
        self._lock = threading.Lock()
        self._outbox: list[dict[str, list[Any]]] = [{"units": [], "priorities": []} for _ in range(self.world)]
        self._outbox_rows = 0
        self._counts = {"pushed": 0, "ingested": 0, "refused": 0}
        self._closed = False
        self._channels: list[Any] = []
        self.rate = (GroupRateLimit(cfg.rate_limit, cfg.sample_min, self.rank, self.world, self.group.check,
                                    patience_s=cfg.timeout_s) if cfg.rate_limit is not None else None)
        if cfg.policy is Policy.OFF_POLICY:
            assert cfg.capacity is not None
            self.capacities = smp.shard_capacities(cfg.capacity, self.world, shares)
            self.router = Router(self.routing, self.rank, self.capacities)
            local = self.sampling is Sampling.LOCAL
            shard_cfg = shard_config(cfg, self.capacities[self.rank], self.rank, str(self.device),
                                     self.local_sample_min() if local else None)
            storage = shard_storage(cfg, self.device, self.capacities[self.rank], self.group.local_ranks,
                                    gpu_sharers=self.device_sharers)
            self.shard: Conduit | None = Conduit(shard_cfg, spec=spec, registry=self.registry, storage=storage)
            self.on_policy = None
            #: global sampling's delivery path, made at the first pull (the hooks are frozen there)
            self.delivery: GroupDelivery | None = None
            self._mode, self.planner = planned(self, plan == "auto")
        else:
            from conduit.distributed.onpolicy import OnPolicyShare

            self.capacities = (0,) * self.world
            self.shard = None
            self.on_policy = OnPolicyShare(self)
            self.delivery, self.planner = None, None

    # -- hooks -----------------------------------------------------------------------------
    def register_ingestion(self, input: str = "Actor", output: str = "ExperienceBuffer") -> Any:
        """Decorator: the framework's ingestion logic; it runs on the rank whose shard takes the unit."""
        return self.registry.register(HookKind.INGESTION, input, output)

    def register_delivery(self, input: str = "ExperienceBuffer", output: str = "Learner") -> Any:
        """Decorator: the framework's delivery logic; it runs on the learner's rank, over its whole batch."""
        return self.registry.register(HookKind.DELIVERY, input, output)

    # -- push side (never collective) ------------------------------------------------------------
    def start(self) -> DistributedConduit:
        self.group.check()
        if self.shard is not None:
            self.shard.start()  # (freezes the hooks: the shard shares this registry)
            if self.sampling is Sampling.GLOBAL and self.delivery is None:
                make_delivery(self)
        return self

    def push(self, data: Data, *, timeout: float | None = None, copy: bool | None = None) -> None:
        """Push one rollout unit into the shard routing picks (this rank's, by default).

        A bad unit raises ``SpecError`` here, whichever shard it is routed to, and nothing is counted, routed or
        stored (:mod:`conduit.distributed.admission`)."""
        self.group.check()
        if self.on_policy is not None:
            n = self.on_policy.push(data)
            with self._lock:  # (on-policy units stay on this rank: pushed is ingested)
                self._counts["pushed"] += n
                self._counts["ingested"] += n
            return
        assert self.shard is not None
        unit, n = self._checked(data)
        if self.rate is not None:
            self.rate.admit(n, self.config.timeout_s if timeout is None else timeout)
        counted = False
        try:
            with self._lock:
                dest = self.router.route(n)
                self._counts["pushed"] += n
                counted = True
                if dest != self.rank:
                    keep = copy if copy is not None else self.config.copy_on_push
                    self._outbox[dest]["units"].append({k: v.clone() if keep else v for k, v in unit.items()})
                    self._outbox_rows += n
                    return
            self.shard.push(unit, timeout=timeout, copy=copy)
        except (SpecError, ConduitTimeout) as exc:
            queued = isinstance(exc, ConduitTimeout) and exc.queued  # the shard ingests it when that ends
            with self._lock:
                if queued:
                    self._counts["ingested"] += n
                elif counted:  # a refused push, or one that timed out taking nothing, changes nothing
                    self._counts["pushed"] -= n
            if self.rate is not None and not queued:
                self.rate.give_back(n)
            raise
        self._settled = True
        with self._lock:
            self._counts["ingested"] += n

    def _checked(self, data: Data) -> tuple[Data, int]:
        """The unit to push and its rows, checked as the core's push checks it against the group's spec. Where
        it stays on this shard and the shard took a checked unit already, the shard's own push checks it."""
        if self.routing is Routing.LOCAL and self._settled and isinstance(data, Mapping) and data:
            return data, batch_size_of(as_tensors(data))
        unit = self.agreement.check(data, hooked=self.registry.get(HookKind.INGESTION) is not None)
        return unit, rows_of(unit)

    def flush(self, *, timeout: float | None = None) -> None:
        """Ingest every unit pushed into this rank's shard so far (routed units move at the next collective)."""
        if self.shard is not None:
            self.shard.flush(timeout=timeout)

    def update_priorities(self, batch: ShardedBatch, priorities: Any) -> int:
        """New priorities for a pulled batch's rows: this rank's now, other ranks' at the next collective; returns
        how many were applied here or queued for their rank."""
        self.group.check()
        if self.shard is None or self.shard.buffer is None or not self.shard.buffer.sampler.has_priorities:
            raise SemanticsError("update_priorities needs off-policy replay with sampler='prioritized'")
        if isinstance(priorities, torch.Tensor):
            priorities = priorities.detach().to("cpu", torch.float64).numpy()
        # checked whole here, as one process does: a bad priority must not surface on its row's rank, mid-collective
        slots, ids, pr = checked_priorities(batch.info.indices, batch.info.ids, priorities)
        owners = batch.owners
        mine = owners == self.rank
        applied = self.shard.buffer.update_priorities(slots[mine], ids[mine], pr[mine]) if mine.any() else 0
        with self._lock:
            for r in np.unique(owners[~mine]):
                sel = owners == r
                self._outbox[int(r)]["priorities"].append(
                    [torch.from_numpy(slots[sel].copy()), torch.from_numpy(ids[sel].copy()), torch.from_numpy(pr[sel])]
                )
        return int(applied + (~mine).sum())

    # -- collectives -------------------------------------------------------------------------
    def sync(self, *, give_up: bool = False) -> np.ndarray:
        """Collective: move routed units and queued priority updates to their shards, then exchange every
        shard's state; returns the ``[world, fields]`` matrix of it (live rows, priority mass, ...):
        :func:`conduit.distributed.syncing.sync`."""
        return syncing.sync(self, give_up)

    def agree_on_spec(self, keys: np.ndarray) -> None:
        """Every rank lays rows out by one spec: learn it where this shard has none yet, refuse a mismatch."""
        self.agreement.settle(keys, self.spec)

    def spec_key(self) -> float:
        """A checksum of this rank's spec (0: none yet), for the ranks to agree on one row layout."""
        spec = self.spec
        self.agreement.learn(spec)
        return 0.0 if spec is None else float(zlib.crc32(spec_text(spec).encode()) + 1)

    def pull(self, learner: int | None = None, *, timeout: float | None = None) -> ShardedBatch:
        """This learner's next batch (collective under global sampling; ``learner`` is this rank)."""
        self.group.check()
        if learner is not None and learner != self.rank:
            raise ValueError(f"pull(learner={learner}) on rank {self.rank}: each rank pulls its own batch")
        if self.shard is None:
            raise SemanticsError("on-policy: iterate minibatches(); pull() is off-policy replay")
        self.start()
        t = self.config.timeout_s if timeout is None else timeout
        return pull_local(self, t) if self.sampling is Sampling.LOCAL else pull_global(self, t)

    @property
    def delivery_mode(self) -> DeliveryMode | None:
        """Off-policy: how deliveries run now (overlapped or inline, ``g`` batches each); on-policy: ``None``."""
        if self.shard is None:
            return None
        mode = self.delivery.mode if self.delivery is not None else None
        if self.sampling is Sampling.LOCAL:
            mode = self.shard.schedule.delivery
        return self._mode if mode is None else DeliveryMode(bool(mode.overlap), int(mode.granularity))

    def delivery_plan(self) -> list[dict[str, Any]]:
        """``plan="auto"``: each candidate's measured seconds per pull and the one chosen (empty before the
        decision, or under ``plan="prior"``)."""
        planner = self.planner
        return planner.report() if planner is not None and planner.chosen is not None else []

    def minibatches(self, *, timeout: float | None = None) -> Iterator[Batch]:
        """On-policy, collective: this learner's part of every mini-batch of the iteration pushed so far."""
        if self.on_policy is None:
            raise SemanticsError("minibatches() iterates an on-policy iteration; off-policy uses pull()")
        return self.on_policy.minibatches(timeout)

    def ready(self) -> bool:
        """Collective under global sampling: whether a pull can be served now (a batch drawn ahead, or enough
        rows over the group and, under ``rate_limit``, inserts enough for the next exchange's draw). On-policy (not
        collective): whether this rank holds rows for an iteration, or one is being handed out."""
        if self.on_policy is not None:
            return self.on_policy.open_rows > 0 or self.on_policy.delivering()
        if self.sampling is Sampling.LOCAL and self.shard is not None:
            self.start()
            assert self.shard.buffer is not None
            return self.shard.buffer.rows >= self.local_sample_min()
        size = int(self.sync()[:, ROWS].sum())  # (an exchange queued or running stages its batches first)
        if self.delivery is not None and self.delivery.staged[0]:
            return True
        mode = self.delivery_mode
        g = mode.g if mode is not None else 1
        draw = self.world * g * self.config.train_batch_size
        return size >= self.config.sample_min and (self.rate is None or self.rate.can_draw(draw, size))

    def local_sample_min(self) -> int:
        """Rows this shard needs before local sampling starts: its share of ``min_size_to_sample``."""
        share = self.capacities[self.rank] / sum(self.capacities)
        return max(1, min(self.capacities[self.rank], math.ceil(self.config.sample_min * share)))

    def stats(self) -> DistributedStats:
        """Collective: the group's counters (moves routed units first, so in flight is 0 unless one failed)."""
        state = self.sync()
        with self._lock:
            mine = [self._counts["pushed"], self._counts["ingested"], self._counts["refused"], self._outbox_rows]
        m = self.group.gather(torch.tensor(mine, dtype=torch.int64), "stats").numpy()
        return DistributedStats(
            pushed_rows=tuple(int(x) for x in m[:, 0]), ingested_rows=tuple(int(x) for x in m[:, 1]),
            refused_rows=tuple(int(x) for x in m[:, 2]), in_flight_rows=tuple(int(x) for x in m[:, 3]),
            shard_rows=tuple(int(x) for x in state[:, ROWS]), shard_capacity=self.capacities,
        )

    def counters(self) -> dict[str, int]:
        """This rank's exactly-once counters (rows pushed here, ingested by its shard, refused by it)."""
        with self._lock:
            return dict(self._counts)

    def add_counts(self, counts: dict[str, int]) -> None:
        """Continue counters from a checkpoint (the group's totals, added on one rank)."""
        with self._lock:
            for k in self._counts:
                self._counts[k] += int(counts.get(k, 0))

    # -- checkpoints -------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Collective: every rank's shard and one manifest, atomically (:mod:`conduit.distributed.checkpoint`)."""
        from conduit.distributed.checkpoint import save

        return save(self, path)

    def restore(self, path: str | Path) -> dict[str, Any]:
        """Collective: load a distributed checkpoint saved on any number of ranks (re-sharded where it differs)."""
        from conduit.distributed.checkpoint import restore

        if self.delivery is not None:
            self.delivery.quiesce()
        return restore(self, path)

    # -- introspection and lifecycle ---------------------------------------------------------------
    @property
    def spec(self) -> ExperienceSpec | None:
        if self.shard is not None and self.shard.spec is not None:
            return self.shard.spec
        if self.on_policy is not None and self.on_policy.spec is not None:
            return self.on_policy.spec
        return self.agreement.spec

    def actor_channel(self, maxsize: int = 8, context: str = "spawn", *,
                      on_actor_lost: Callable[[Any], None] | None = None) -> Any:
        """A channel actor processes push through into this rank (routing applies to what they push), as one
        process's :meth:`conduit.Conduit.actor_channel`."""
        from conduit.remote import ActorChannel

        channel = ActorChannel(self.push, self.group.failure, maxsize, self.config.timeout_s, context,
                               on_actor_lost=on_actor_lost)
        self._channels.append(channel)
        return channel

    def close(self, timeout: float = 5.0) -> None:
        """Close this rank's shard (not collective: a rank may close while others failed); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.rate is not None:
            self.rate.close()
        for c in self._channels:
            c.close(timeout)
        if self.delivery is not None:  # an overlapped exchange still reading the shard: let it end, bounded
            self.delivery.close(timeout)
        if self.shard is not None:
            self.shard.close(timeout)
        self.group.close()

    def __enter__(self) -> DistributedConduit:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"conduit.distributed.Conduit(rank {self.rank}/{self.world}, {self.config.policy.value}, "
                f"sampling={self.sampling.value}, routing={self.routing.value})")
