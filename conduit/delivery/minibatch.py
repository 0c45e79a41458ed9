"""On-policy delivery: an iteration's shuffled mini-batches, epoch by epoch, never across iterations."""

from __future__ import annotations

from conduit.batch import BatchInfo, DrawnRows
from conduit.delivery.base import DeliveryPath
from conduit.iterations import IterationBuffer
from conduit.operators import Packet

__all__ = ["MinibatchDelivery"]


class MinibatchDelivery(DeliveryPath):
    """On-policy: an iteration's shuffled mini-batches, epoch by epoch, never across iterations."""

    def __init__(self, *, buffer: IterationBuffer, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.buffer = buffer
        self.per_iteration = buffer.num_minibatches * buffer.num_epochs
        # per learner: (iteration, next flat mini-batch position) of the next invocation
        self.cursor = [(0, 0)] * self.num_learners

    def _version(self) -> int:
        return self.buffer.inserted

    def start(self) -> None:
        # one mini-batch per invocation on the worker: the buffer may release an iteration's first mini-batches
        # before its seal, and this path hands each out as soon as it is complete
        self.buffer.early_minibatches = bool(self.mode.overlap and self.mode.granularity < 1)
        super().start()

    def _can_produce(self, learner: int) -> bool:
        iteration, pos = self.cursor[learner]
        buffer = self.buffer
        with buffer.lock:
            if iteration in buffer.sealed:
                return True
            if self.mode.granularity >= 1:  # an invocation takes the rest of an epoch: the whole iteration
                return False
            it = buffer.iterations.get(iteration)
            return it is not None and pos < it.early  # released early: its rows are all stored

    def _begin(self, learner: int) -> Packet:
        iteration, pos = self.cursor[learner]
        m = self.buffer.num_minibatches
        count = m - pos % m if self.mode.granularity >= 1 else 1  # g=1: the rest of this epoch
        nxt = pos + count
        self.cursor[learner] = (iteration + 1, 0) if nxt == self.per_iteration else (iteration, nxt)
        return Packet(
            [],
            {
                "learner": learner, "device": self.devices[learner], "iteration": iteration,
                "positions": list(range(pos, pos + count)),
                "sampled_at_pull": self.pulls[learner] + len(self.staged[learner]),
                "granularity": float(self.mode.granularity),
                "mode": self.mode,
            },
        )

    def _select_gather(self, packet: Packet) -> Packet:
        meta = packet.meta
        it = self.buffer.iterations[meta["iteration"]]
        assert it.plan is not None
        m = self.buffer.num_minibatches
        learner = meta["learner"]
        rows = [it.plan[p // m][p % m][learner] for p in meta["positions"]]
        memory, spec = self._memory[learner], self.buffer.spec
        # per mini-batch, no epoch-sized allocation: views of the store where its rows are laid out in this
        # epoch's order and the learner reads the store's own memory (a GPU learner's copy starts from a
        # gather), else gathered into released memory where there is some
        local = it.storage.devices == (self.devices[learner],)
        packet.parts = []
        for p, r in zip(meta["positions"], rows):
            part = self.buffer.view(it, p // m, p % m, learner) if local else None
            if part is None:
                out = None if memory is None or spec is None else memory.take(spec, len(r))
                part = self.buffer.gather(it, r, out=out)
            packet.parts.append(part)
        ids = it.id_array()
        meta.update(rows=rows, sizes=[len(r) for r in rows], ids=[ids[r] for r in rows], version=self.buffer.inserted)
        return packet

    def _infos(self, packet: Packet) -> list[dict[str, object]]:
        meta = packet.meta
        m = self.buffer.num_minibatches
        out = []
        for pos, rows, ids in zip(meta["positions"], meta["rows"], meta["ids"]):
            out.append(
                dict(
                    learner=meta["learner"], sampled_at_pull=meta["sampled_at_pull"],
                    buffer_version=meta["version"], iteration=meta["iteration"], epoch=pos // m,
                    minibatch=pos % m, num_minibatches=m, last=pos == self.per_iteration - 1,
                    rows=DrawnRows(rows, ids), weights=None, mode=meta["mode"],
                )
            )
        return out

    def _on_pulled(self, learner: int, info: BatchInfo) -> None:
        self.buffer.delivered(info.iteration, learner)

    def _describe_wait(self, learner: int) -> str:
        iteration, _ = self.cursor[learner]
        return (
            f"on-policy iteration {iteration} for learner {learner}: it is not sealed yet; push the rest of its "
            "rollouts (train_batch_size rows) or call seal()"
        )
