"""On-policy delivery: an iteration's shuffled mini-batches, epoch by epoch, never across iterations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from conduit.batch import BatchInfo, DrawnRows
from conduit.buffers.iterations import IterationBuffer
from conduit.paths.delivery import Claim, DeliveryPath, Place

__all__ = ["MinibatchClaim", "MinibatchDelivery"]


@dataclass(eq=False, slots=True)
class MinibatchClaim(Claim):
    """An on-policy invocation: consecutive mini-batch positions of one iteration (``epoch · M + minibatch``)."""

    iteration: int = 0
    positions: list[int] = field(default_factory=list)
    num_minibatches: int = 1
    per_iteration: int = 1
    #: each mini-batch's rows (within the iteration) and their ids, once gathered
    rows: list[DrawnRows] = field(default_factory=list)

    def place(self, part: int) -> Place:
        pos, m = self.positions[part], self.num_minibatches
        return Place(self.iteration, pos // m, pos % m, m, pos == self.per_iteration - 1, self.rows[part], None)

    def facts(self) -> dict[str, object]:
        return {
            **Claim.facts(self), "iteration": self.iteration, "positions": list(self.positions),
            "rows": [r.indices for r in self.rows], "ids": [r.ids for r in self.rows], "version": self.buffer_version,
        }


class MinibatchDelivery(DeliveryPath):
    """On-policy: an iteration's shuffled mini-batches, epoch by epoch, never across iterations."""

    buffer: IterationBuffer

    def __init__(self, *, buffer: IterationBuffer, **kw: Any) -> None:
        super().__init__(buffer=buffer, **kw)
        self.per_iteration = buffer.num_minibatches * buffer.num_epochs
        # per learner: (iteration, next flat mini-batch position) of the next invocation
        self.cursor = [(0, 0)] * self.num_learners

    def start(self) -> None:
        # one mini-batch per invocation on the worker: the buffer may release an iteration's first mini-batches
        # before its seal, and this path hands each out as soon as it is complete
        self.buffer.early_minibatches = bool(self.mode.overlap and self.mode.granularity < 1)
        super().start()

    def _ready(self, learner: int) -> bool:
        iteration, pos = self.cursor[learner]
        buffer = self.buffer
        with buffer.lock:
            if iteration in buffer.sealed:
                return True
            if self.mode.granularity >= 1:  # an invocation takes the rest of an epoch: the whole iteration
                return False
            it = buffer.iterations.get(iteration)
            return it is not None and pos < it.early  # released early: its rows are all stored

    def _begin(self, learner: int, sampled_at_pull: int, handed: bool, rows: int = 0) -> MinibatchClaim:
        iteration, pos = self.cursor[learner]
        m = self.buffer.num_minibatches
        count = m - pos % m if self.mode.granularity >= 1 else 1  # g=1: the rest of this epoch
        nxt = pos + count
        self.cursor[learner] = (iteration + 1, 0) if nxt == self.per_iteration else (iteration, nxt)
        positions = list(range(pos, pos + count))
        it = self.buffer.iterations[iteration]
        assert it.plan is not None
        sizes = [len(it.plan[p // m][p % m][learner]) for p in positions]
        return MinibatchClaim(
            learner, sampled_at_pull, self.mode, sizes, iteration=iteration, positions=positions,
            num_minibatches=m, per_iteration=self.per_iteration,
        )

    def _gather(self, claim: MinibatchClaim) -> list[dict[str, torch.Tensor]]:  # type: ignore[override]
        buffer = self.buffer
        it = buffer.iterations[claim.iteration]
        assert it.plan is not None
        m, learner = claim.num_minibatches, claim.learner
        rows = [it.plan[p // m][p % m][learner] for p in claim.positions]
        memory, spec = self._memory[learner], buffer.spec
        # per mini-batch, no epoch-sized allocation: views of the store where its rows are laid out in this
        # epoch's order and the learner reads the store's own memory (a GPU learner's copy starts from a
        # gather), else gathered into released memory where there is some
        local = it.storage.devices == (self.devices[learner],)
        parts = []
        for p, r in zip(claim.positions, rows):
            part = buffer.view(it, p // m, p % m, learner) if local else None
            if part is None:
                out = None if memory is None or spec is None else memory.take(spec, len(r))
                part = buffer.gather(it, r, out=out)
            parts.append(part)
        ids = it.id_array()
        claim.rows = [DrawnRows(r, ids[r]) for r in rows]
        claim.buffer_version = buffer.inserted
        return parts

    def _counted(self, learner: int, info: BatchInfo, rows: int, reserved: bool) -> None:
        self.buffer.delivered(info.iteration, learner)

    def _describe_wait(self, learner: int) -> str:
        iteration, _ = self.cursor[learner]
        if self.graph.running:  # a delivery invocation is under way (and slow): that, not the data, is the wait
            return f"on-policy iteration {iteration} for learner {learner}: {self.doing('')}"
        return (
            f"on-policy iteration {iteration} for learner {learner}: it is not sealed yet; push the rest of its "
            "rollouts (train_batch_size rows) or call seal()"
        )

    # -- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "cursor": [list(c) for c in self.cursor]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        with self._lock:
            self.cursor = [(int(a), int(b)) for a, b in state["cursor"]] or self.cursor
