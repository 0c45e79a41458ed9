"""On-policy across ranks: each learner gets its data-parallel share of every mini-batch of the iteration.

Each rank keeps the units its actors pushed since the last iteration (the
ingestion hook runs at push, as on one runtime). ``minibatches()`` is collective:
it seals the iteration on every rank at once (units pushed after it belong to the
next, so no iteration mixes with another: on-policy freshness), the ranks
exchange their row counts, and every rank computes the same plan
(:func:`conduit.distributed.sampling.on_policy_plan`): one permutation per epoch,
``M`` mini-batches, each split into one disjoint part per learner. Per epoch one
``all_to_all`` moves each learner's rows to it, laid out as in
:mod:`conduit.distributed.exchange`; the learner's mini-batch parts are then views
of what it received, in plan order.

Every learner must iterate every mini-batch of an iteration (the exchanges are
collective); one that stops early leaves the others to time out, naming it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from conduit.batch import Batch, BatchInfo, DrawnRows
from conduit.core import Mode
from conduit.distributed.exchange import RowLayout
from conduit.distributed.sampling import on_policy_plan
from conduit.errors import SemanticsError
from conduit.hooks import EXPERIENCE_BUFFER, LEARNER, HookKind, Reader, Writer
from conduit.operators import HookOperator
from conduit.paths.hooked import hooked
from conduit.spec import Data, ExperienceSpec, rows_of

#: the rank's :class:`~conduit.distributed.runtime.DistributedConduit` (not imported: it imports this module)
DistributedConduit = Any

__all__ = ["OnPolicyShare"]


class OnPolicyShare:
    """The on-policy store of one rank and the collective that deals mini-batch parts (module docstring)."""

    def __init__(self, owner: DistributedConduit) -> None:
        self.owner = owner
        self.spec: ExperienceSpec | None = owner.spec_declared
        self._lock = threading.Lock()
        self._units: list[dict[str, torch.Tensor]] = []
        self.iteration = 0
        self.pulls = 0
        self.pushed_rows = 0
        self._hook: list[HookOperator] | None = None  # made at the first mini-batch ([]: none registered)

    def deliver(self, data: dict[str, torch.Tensor], info: BatchInfo) -> dict[str, torch.Tensor]:
        """The registered delivery hook over this learner's part, as a delivery path runs it
        (:func:`conduit.paths.hooked.hooked`: the same operator, made once, when the hooks freeze)."""
        if self._hook is None:
            registry = self.owner.registry
            registry.freeze("the group has delivered; register hooks before the first push/pull")
            spec = registry.get(HookKind.DELIVERY)
            self._hook = [HookOperator("hook", spec.fn, EXPERIENCE_BUFFER, LEARNER)] if spec else []
        return hooked(next(iter(self._hook), None), data, info)

    def push(self, data: Data) -> None:
        """Run the ingestion hook and keep what it writes for the open iteration (all-or-nothing), every unit
        checked against the group's one spec (:mod:`conduit.distributed.admission`)."""
        spec = self.owner.registry.get(HookKind.INGESTION)
        agreement = self.owner.agreement
        tensors = agreement.check(data, hooked=spec is not None)
        if spec is None:
            items = [tensors]
        else:
            w = Writer("ExperienceBuffer")
            spec.fn(Reader("Actor", tensors), w)
            items = w.items
        with self._lock:
            checked = []
            for item in items:
                if self.spec is None:
                    self.spec = agreement.spec_for(item)
                checked.append({k: v.clone() for k, v in self.spec.validate(item).items()})
            self._units += checked
            self.pushed_rows += rows_of(tensors)

    def _seal(self) -> dict[str, torch.Tensor]:
        with self._lock:
            units, self._units = self._units, []
        if not units:
            spec = self.spec
            return {} if spec is None else {f.name: torch.empty((0, *f.shape), dtype=f.dtype) for f in spec}
        return {k: torch.cat([u[k] for u in units]) for k in units[0]}

    def minibatches(self) -> Iterator[Batch]:
        """Collective: this learner's part of every mini-batch of every epoch of the iteration pushed so far."""
        owner, group = self.owner, self.owner.group
        group.check()
        cfg = owner.config
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
        assert self.spec is not None
        if not store:
            store = {f.name: torch.empty((0, *f.shape), dtype=f.dtype) for f in self.spec}
        layout = RowLayout.of(self.spec)
        W, me, M, E = group.world, group.rank, cfg.num_minibatches, cfg.num_epochs
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        iteration = self.iteration
        self.iteration += 1
        for epoch in range(E):
            plan = on_policy_plan(owner.shared_rng, counts.tolist(), M, W, epoch)
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
            rows = {f.name: torch.empty((len(owners), *f.shape), dtype=f.dtype) for f in self.spec}
            at = 0
            for s in range(W):
                pos = torch.from_numpy(np.flatnonzero(owners == s))
                if len(pos):
                    for f, view in layout.views(recv, at, len(pos)).items():
                        rows[f].index_copy_(0, pos, view)
                at += recv_sizes[s]
            global_pos = starts[owners] + local
            off = 0
            for p in mine:
                n = len(p.owners)
                data = {f: t[off : off + n].to(owner.device, non_blocking=True) for f, t in rows.items()}
                ids = global_pos[off : off + n]
                info = BatchInfo(
                    learner=me, pull_index=self.pulls, sampled_at_pull=self.pulls, buffer_version=int(counts.sum()),
                    iteration=iteration, epoch=epoch, minibatch=p.minibatch, num_minibatches=M,
                    last=epoch == E - 1 and p.minibatch == M - 1, rows=DrawnRows(ids.copy(), ids.copy()),
                    weights=None, mode=Mode(False, 1), version_at_delivery=int(counts.sum()),
                )
                off += n
                self.pulls += 1
                yield Batch(self.deliver(data, info), info)

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
