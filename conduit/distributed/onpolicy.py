"""On-policy across ranks: each learner gets its data-parallel share of every mini-batch of the iteration.

Each rank keeps the units its actors pushed since the last iteration (the
ingestion hook runs at push, as on one runtime; its failure is latched on the rank, as one runtime
latches it). ``minibatches()`` is collective, at the call:
it seals the iteration on every rank at once (units pushed after it belong to the
next, so no iteration mixes with another: on-policy freshness), the ranks
exchange their row counts, and every rank computes the same plan
(:func:`conduit.distributed.sampling.on_policy_plan`): one permutation per epoch,
``M`` mini-batches, each split into one disjoint part per learner. Per epoch one
``all_to_all`` moves each learner's rows to it, laid out as in
:mod:`conduit.distributed.exchange`; the learner's mini-batch parts are then views
of what it received, in plan order. A part leaves by the core's delivery path
(:class:`GroupMinibatches`: one part an invocation, the epoch's exchange its row
source), so the delivery hook, ``BatchInfo`` and the pull's checks are one process's.

Every learner must iterate every mini-batch of an iteration (the exchanges are
collective); one that stops early leaves the others to time out (``RankFailed``). An iteration
of fewer rows than ``num_minibatches`` x learners is refused on every rank alike, its rows kept
for the next call; a checkpoint is taken between iterations, as on one runtime.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from conduit.batch import Batch, DrawnRows
from conduit.core import Mode
from conduit.distributed.exchange import RowLayout
from conduit.distributed.sampling import on_policy_plan
from conduit.errors import HookFailed, SemanticsError
from conduit.hooks import HookKind
from conduit.operators import HookOperator, Packet
from conduit.paths.delivery import Claim, DeliveryPath, HookFn
from conduit.paths.minibatch import MinibatchClaim
from conduit.spec import Data, ExperienceSpec, rows_of
from conduit.trace import global_tracer

#: the rank's :class:`~conduit.distributed.runtime.DistributedConduit` (not imported: it imports this module)
DistributedConduit = Any

__all__ = ["GroupMinibatches", "OnPolicyShare"]


class OnPolicyShare:
    """The on-policy store of one rank and the collective that deals mini-batch parts (module docstring)."""

    def __init__(self, owner: DistributedConduit) -> None:
        self.owner = owner
        self.spec: ExperienceSpec | None = owner.spec_declared
        self._lock = threading.Lock()
        self._units: list[dict[str, torch.Tensor]] = []
        self.iteration = 0
        self.pushed_rows = 0
        self.path: GroupMinibatches | None = None  # made at the first iteration

    def push(self, data: Data) -> int:
        """Run the ingestion hook and keep what it writes for the open iteration (all-or-nothing), every unit
        checked against the group's one spec (:mod:`conduit.distributed.admission`); returns the rows pushed."""
        spec = self.owner.registry.get(HookKind.INGESTION)
        agreement = self.owner.agreement
        tensors = agreement.check(data, hooked=spec is not None)
        if spec is None:
            items = [tensors]
        else:  # the hook as one process runs it: its checks (no attachments) and HookFailed, latched
            try:
                items = HookOperator("hook", spec.fn, "Actor", "ExperienceBuffer").run(Packet([tensors])).parts
            except HookFailed as e:
                raise self.owner.group.failure.set("ingestion", e) from None
        with self._lock:
            checked = []
            for item in items:
                if self.spec is None:
                    self.spec = agreement.spec_for(item)
                checked.append({k: v.clone() for k, v in self.spec.validate(item).items()})
            self._units += checked
            self.pushed_rows += rows_of(tensors)
        return rows_of(tensors)

    def _seal(self) -> dict[str, torch.Tensor]:
        with self._lock:
            units, self._units = self._units, []
        if not units:
            spec = self.spec
            return {} if spec is None else {f.name: torch.empty((0, *f.shape), dtype=f.dtype) for f in spec}
        return {k: torch.cat([u[k] for u in units]) for k in units[0]}

    def minibatches(self, timeout: float | None = None) -> Iterator[Batch]:
        """Collective, at the call: seal the iteration pushed so far on every rank; returns this learner's part
        of every mini-batch of every epoch of it, pulled through the rank's delivery path
        (:class:`GroupMinibatches`; ``timeout``: each pull's, the config's by default; every collective is bounded
        by the group's)."""
        owner, group = self.owner, self.owner.group
        group.check()
        store = self._seal()
        n_local = int(next(iter(store.values())).shape[0]) if store else 0
        key = float(owner.spec_key())
        counts_keys = group.gather(torch.tensor([float(n_local), key], dtype=torch.float64), "minibatches (rows)")
        counts = counts_keys[:, 0].to(torch.int64).numpy()
        owner.agree_on_spec(counts_keys[:, 1].numpy())
        if self.spec is None:
            self.spec = owner.spec
        if int(counts.sum()) == 0:
            raise SemanticsError("minibatches(): no rank pushed any rows for this iteration")
        need = owner.config.num_minibatches * group.world
        if int(counts.sum()) < need:  # decided alike on every rank (the gathered counts); the rows stay
            if store:
                with self._lock:
                    self._units.insert(0, store)
            raise SemanticsError(
                f"minibatches(): iteration {self.iteration} holds {int(counts.sum())} rows over the ranks, fewer "
                f"than num_minibatches x learners = {need}; push more before sealing (the rows stay for the next "
                "call)"
            )
        assert self.spec is not None
        if not store:
            store = {f.name: torch.empty((0, *f.shape), dtype=f.dtype) for f in self.spec}
        path = self._path()
        path.begin(self.iteration, store, counts)
        self.iteration += 1
        return self._parts(path, timeout)

    def _parts(self, path: GroupMinibatches, timeout: float | None) -> Iterator[Batch]:
        for _ in range(path.per_iteration):
            b = path.pull(0, timeout)
            yield Batch(dict(b.items()), b.info._replace(learner=self.owner.rank))

    @property
    def open_rows(self) -> int:
        """Rows pushed on this rank for the iteration not yet sealed."""
        with self._lock:
            return sum(rows_of(u) for u in self._units)

    def delivering(self) -> bool:
        """Whether an iteration's mini-batches are still being handed out."""
        return self.path is not None and self.path.open

    def _path(self) -> GroupMinibatches:
        """The rank's on-policy delivery path, made at the first iteration with the registered delivery hook."""
        if self.path is None:
            registry = self.owner.registry
            registry.freeze("the group has delivered; register hooks before the first push/pull")
            spec = registry.get(HookKind.DELIVERY)
            self.path = GroupMinibatches(self.owner, spec.fn if spec else None)
        return self.path

    def state_dict(self) -> dict[str, object]:
        """The open iteration's rows (a checkpoint keeps what was pushed and not yet trained on)."""
        with self._lock:
            units = list(self._units)
        rows = {k: torch.cat([u[k] for u in units]) for k in units[0]} if units else {}
        return {"rows": rows, "iteration": self.iteration, "pushed_rows": self.pushed_rows}

    def load_rows(self, rows: dict[str, torch.Tensor]) -> None:
        """Add rows to the open iteration (a restore, possibly re-sharded)."""
        if rows:
            with self._lock:
                if self.spec is None:
                    self.spec = ExperienceSpec.infer(rows)
                self._units.append(dict(rows))


class GroupMinibatches(DeliveryPath):
    """A rank's on-policy delivery: the core's delivery path, one mini-batch part an invocation, whose row source
    is the iteration's exchange -- per epoch one ``all_to_all`` (at the epoch's first part) moves each learner's
    rows to it, in the order of the plan every rank computes alike (module docstring)."""

    def __init__(self, owner: DistributedConduit, hook: HookFn | None) -> None:
        cfg = owner.config
        super().__init__(buffer=None, mode=Mode(False, Fraction(1, cfg.num_minibatches)),  # type: ignore[arg-type]
                         hook=hook, tracer=global_tracer(), failure=owner.group.failure, timeout=cfg.timeout_s,
                         learner_devices=[owner.device], recycle_batches=False)
        self.owner = owner
        self.m = cfg.num_minibatches
        self.per_iteration = cfg.num_minibatches * cfg.num_epochs
        self._iteration = -1
        self._next = self.per_iteration  # the next flat position (epoch * M + mini-batch); none until begin()
        self._store: dict[str, torch.Tensor] = {}
        self._counts = np.zeros(1, dtype=np.int64)
        self._plan: list[list[Any]] = []  # the open epoch's parts, per learner
        self._rows: dict[str, torch.Tensor] = {}  # this learner's rows of the open epoch, in plan order
        self._positions = np.zeros(0, dtype=np.int64)  # and their positions in the iteration

    @property
    def open(self) -> bool:
        """Whether an iteration's mini-batches are still being handed out."""
        return self._next < self.per_iteration

    def begin(self, iteration: int, store: dict[str, torch.Tensor], counts: np.ndarray) -> None:
        """Open ``iteration``: this rank's sealed rows and every rank's row count (the collective's)."""
        self._iteration, self._next, self._store, self._counts = iteration, 0, store, counts

    def _ready(self, learner: int, rows: int = 0) -> bool:
        return self._next < self.per_iteration  # an iteration is open from its collective on

    def _describe_wait(self, learner: int) -> str:
        return f"an open iteration on rank {self.owner.rank}: call minibatches() for the next one"

    def _version(self) -> int:
        return int(self._counts.sum())

    def _begin(self, learner: int, sampled_at_pull: int, handed: bool, rows: int = 0) -> MinibatchClaim:
        pos = self._next
        self._next += 1
        if pos % self.m == 0:  # an epoch's first part: its plan, from the generator every rank advances alike
            group = self.owner.group
            self._plan = on_policy_plan(self.owner.shared_rng, self._counts.tolist(), self.m, group.world,
                                        pos // self.m)
        size = len(self._plan[self.owner.group.rank][pos % self.m].owners)
        return MinibatchClaim(learner, sampled_at_pull, self.mode, [size], iteration=self._iteration,
                              positions=[pos], num_minibatches=self.m, per_iteration=self.per_iteration)

    def _gather(self, claim: Claim) -> list[dict[str, torch.Tensor]]:
        assert isinstance(claim, MinibatchClaim)
        pos = claim.positions[0]
        k = pos % self.m
        if k == 0:
            self._exchange(pos // self.m)
        mine = self._plan[self.owner.group.rank]
        off = sum(len(p.owners) for p in mine[:k])
        n = len(mine[k].owners)
        ids = self._positions[off : off + n]
        claim.rows = [DrawnRows(ids.copy(), ids.copy())]
        claim.buffer_version = self._version()
        return [{f: t[off : off + n] for f, t in self._rows.items()}]

    def _exchange(self, epoch: int) -> None:
        """Collective: this learner's rows of every part of ``epoch``, in plan order, and their positions in the
        iteration (rank by rank, each rank's rows in push order)."""
        owner, group, store, plan = self.owner, self.owner.group, self._store, self._plan
        spec = owner.on_policy.spec
        layout = RowLayout.of(spec)
        W, me = group.world, group.rank
        # what this rank sends each learner: its rows of that learner's parts, in plan order
        want = [np.concatenate([p.local[p.owners == me] for p in plan[r]]) for r in range(W)]
        mine = plan[me]
        owners = np.concatenate([p.owners for p in mine])
        local = np.concatenate([p.local for p in mine])
        send_sizes = [layout.block_bytes(len(w)) for w in want]
        recv_sizes = [layout.block_bytes(int((owners == s).sum())) for s in range(W)]
        send = torch.empty(sum(send_sizes), dtype=torch.uint8)
        at = 0
        for r in range(W):
            if len(want[r]):
                idx = torch.from_numpy(want[r])
                for f, view in layout.views(send, at, len(want[r])).items():
                    torch.index_select(store[f], 0, idx, out=view)
            at += send_sizes[r]
        recv = group.exchange(send, send_sizes, recv_sizes, f"minibatches (epoch {epoch} rows)").cpu()
        rows = {f.name: torch.empty((len(owners), *f.shape), dtype=f.dtype) for f in spec}
        at = 0
        for s in range(W):
            pos = torch.from_numpy(np.flatnonzero(owners == s))
            if len(pos):
                for f, view in layout.views(recv, at, len(pos)).items():
                    rows[f].index_copy_(0, pos, view)
            at += recv_sizes[s]
        starts = np.concatenate([[0], np.cumsum(self._counts)[:-1]])
        self._rows, self._positions = rows, starts[owners] + local
