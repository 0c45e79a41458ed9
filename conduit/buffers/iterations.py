"""The Experience Buffer, on-policy: one store per policy iteration, never mixed (off-policy: :mod:`~.replay`).

Every row gets a global *transition id* in ingestion order; an iteration's rows
are delivered as its shuffled mini-batches, epoch by epoch, and the store is
reused only once no delivered view of it is alive. Writes are all-or-nothing:
every part is validated against the spec before any byte is stored.

Units are assigned to an iteration when they are pushed (:meth:`IterationBuffer.admit`):
an iteration closes with the unit that brings it to ``train_batch_size`` rows (or on
:meth:`IterationBuffer.close_open`), and is sealed for delivery once every piece of it
has been written.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from conduit.buffers.base import ExperienceBuffer, Ticket
from conduit.buffers.layout import Iteration, laid_out
from conduit.errors import CheckpointError, SemanticsError
from conduit.executor import StreamOrder
from conduit.samplers.minibatch import minibatch_plan
from conduit.spec import Data, ExperienceSpec, SpecHolder, batch_size_of
from conduit.storage.base import Storage
from conduit.storage.policy import StoragePolicy, copy_rows

__all__ = ["Iteration", "IterationBuffer", "laid_out"]

log = logging.getLogger("conduit")


class IterationBuffer(ExperienceBuffer):
    """Per-iteration stores for on-policy training; never mixes iterations.

    At most ``max_in_flight`` iterations exist at once (one being consumed, one
    being collected by default); writes to a further iteration wait.

    With ``presort`` the rows are stored in the order of the last epoch's shuffled
    mini-batches (the plan is drawn when an iteration's first rows arrive, for
    ``expected_rows``; numpy's row scatter costs about what the contiguous copy
    did): that epoch's mini-batches are then runs of consecutive storage rows,
    handed to the learner as views — no gather, and an on-policy iteration's rows
    are moved once. A store is reused only once no view of it is alive
    (:meth:`Storage.in_use`), so a learner may keep a mini-batch as long as it
    likes; mini-batches of earlier epochs are gathered copies (a learner that
    normalizes one in place must not change what a later epoch reads). An
    iteration sealed with another count than expected gets a plan of its own and is
    gathered, epoch by epoch, from wherever its rows were stored. Either way the
    plans, and so the mini-batches, are the same draw by draw.

    With ``early_minibatches`` (set by a delivery that hands out one mini-batch
    per invocation on its worker), the write that completes an iteration of the
    expected size stores its rows mini-batch by mini-batch, in the first epoch's
    order, and each of that epoch's mini-batches but the last becomes deliverable
    as soon as its rows are in (:attr:`Iteration.early`): the learner's first
    update starts after a fraction of the last unit's write instead of all of it
    — pipelining inside an iteration at mini-batch granularity (docs/design.md §2).
    The mini-batches are the plan's, whichever way the rows were written.
    """

    def __init__(
        self,
        rows: int,
        storage: StoragePolicy,
        *,
        num_minibatches: int,
        num_epochs: int,
        num_learners: int,
        spec: ExperienceSpec | None = None,
        seed: int | None = None,
        growable: frozenset[str] = frozenset(),
        max_in_flight: int = 2,
        shuffle: bool = True,
        expected_rows: int | None = None,
        presort: bool = True,
    ) -> None:
        super().__init__()
        self.store_rows = rows
        self.expected_rows = rows if expected_rows is None else expected_rows
        self.presort = presort
        self.policy = storage
        self._specs = SpecHolder(spec, growable)
        self.num_minibatches = num_minibatches
        self.num_epochs = num_epochs
        self.num_learners = num_learners
        self.max_in_flight = max_in_flight
        self.shuffle = shuffle
        self.rng = np.random.default_rng(seed)
        self.iterations: dict[int, Iteration] = {}
        self.sealed: set[int] = set()
        self.consumed = 0  # iterations fully delivered (== index of the oldest live one)
        self._free: list[Storage] = []
        self._order: StreamOrder | None = None
        #: release the first epoch's mini-batches one by one during an iteration's closing write (see above)
        self.early_minibatches = False
        # the push side: the iteration being pushed, its rows so far, and per iteration the pieces
        # admitted and written; an iteration closed at the push side is sealed once they agree
        self._push_iter = 0
        self._push_rows = 0
        self._warned_long = False  # an iteration longer than train_batch_size is said once
        self._pieces_pushed: dict[int, int] = {}
        self._pieces_done: dict[int, int] = {}
        self._closed: set[int] = set()

    @property
    def spec(self) -> ExperienceSpec | None:
        return self._specs.spec

    @property
    def rows(self) -> int:
        with self.lock:
            return sum(it.rows for it in self.iterations.values())

    def validate(self, parts: Sequence[Data]) -> list[dict[str, torch.Tensor]]:
        return self._specs.check(parts)

    # -- the push side ------------------------------------------------------------------
    def room(self, rows: int) -> bool:
        return self.accepts(self._push_iter)

    def describe_room(self, rows: int) -> str:
        return (
            f"room to push (iteration {self._push_iter} would exceed {self.max_in_flight} iterations in flight: "
            f"the learner has consumed {self.consumed}); is a learner pulling?"
        )

    def admit(self, rows: int, pieces: int) -> Ticket:
        with self.lock:
            it = self._push_iter
            closes = self.early_minibatches and self._push_rows + rows == self.expected_rows
            if closes:
                pieces = 1  # written whole: the buffer stores it mini-batch by mini-batch (_closing_write)
            self._pieces_pushed[it] = self._pieces_pushed.get(it, 0) + pieces
            self._push_rows += rows
            if self._push_rows >= self.expected_rows:
                if self._push_rows > self.expected_rows and not self._warned_long:
                    self._warned_long = True
                    log.warning(
                        "conduit: on-policy iteration %d holds %d rows, not train_batch_size=%d: a pushed unit is "
                        "never split across iterations, so the unit that crosses train_batch_size ends its "
                        "iteration whole (said once). Push units whose sizes add up to train_batch_size for "
                        "iterations of exactly that size.", it, self._push_rows, self.expected_rows,
                    )
                self._close_push_iteration()
            return Ticket(it, pieces, closes)

    def store(self, parts: Sequence[Data], ticket: Ticket, *, validated: bool = False) -> int:
        self._check_open()
        assert ticket.iteration is not None
        return self.write(ticket.iteration, parts, closes=ticket.closes)[1]

    def stored(self, ticket: Ticket) -> None:
        it = ticket.iteration
        assert it is not None
        with self.lock:
            self._pieces_done[it] = self._pieces_done.get(it, 0) + 1
            ready = self._take_sealable(it)
        if ready is not None:  # outside the lock: sealing notifies the delivery path
            self.seal(ready)

    def close_open(self) -> int | None:
        with self.lock:
            if self._push_rows == 0:
                return None
            need = self.num_minibatches * self.num_learners
            if self._push_rows < need:
                raise SemanticsError(
                    f"seal(): iteration {self._push_iter} holds {self._push_rows} rows, fewer than "
                    f"num_minibatches x num_learners = {need}; push more before sealing"
                )
            it = self._push_iter
            self._close_push_iteration()
            return it

    def seal_closed(self, iteration: int) -> None:
        with self.lock:
            ready = self._take_sealable(iteration)
        if ready is not None:
            self.seal(ready)

    def _close_push_iteration(self) -> None:
        self._closed.add(self._push_iter)
        self._push_iter += 1
        self._push_rows = 0

    def _take_sealable(self, iteration: int) -> int | None:
        """``iteration`` if it is closed and fully written (caller holds the lock); claims it."""
        done, pushed = self._pieces_done.get(iteration, 0), self._pieces_pushed.get(iteration, 0)
        if iteration not in self._closed or done != pushed:
            return None
        self._closed.discard(iteration)
        self._pieces_pushed.pop(iteration, None)
        self._pieces_done.pop(iteration, None)
        return iteration

    # -- state ------------------------------------------------------------------------------
    def state_dict(self, *, rows: bool = True) -> dict[str, Any]:
        """Counters, generator and the push side, between iterations (an on-policy iteration's data is used once:
        RLlib does not checkpoint it either)."""
        with self.lock:
            if self.iterations or self._push_rows or self._pieces_pushed:
                raise SemanticsError(
                    f"an on-policy runtime is checkpointed between iterations; "
                    f"{len(self.iterations) + bool(self._push_rows)} iteration(s) are being collected or delivered"
                )
            return {
                "inserted": self.inserted,
                "consumed": self.consumed,
                "rng": self.rng.bit_generator.state,
                "push_iteration": self._push_iter,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self.lock:
            if self.inserted:
                raise CheckpointError("restore into a fresh runtime (this one already holds data)")
            self.inserted = int(state["inserted"])
            self.consumed = int(state["consumed"])
            self.rng.bit_generator.state = state["rng"]
            self._push_iter = int(state["push_iteration"])

    def release(self) -> None:
        """Free every store (the runtime closed)."""
        with self.lock:
            self.released = True
            for it in self.iterations.values():
                it.storage.close()
            for storage in self._free:
                storage.close()
            self.iterations.clear()
            self._free.clear()
            self.on_data.clear()
            self.on_room.clear()

    def accepts(self, iteration: int) -> bool:
        """Whether rows of ``iteration`` can be stored now (back-pressure)."""
        return iteration < self.consumed + self.max_in_flight

    def write(self, iteration: int, parts: Sequence[Data], closes: bool = False) -> tuple[int, int]:
        """Store rows of ``iteration``; ``closes``: no further rows will join it (the ingestion path knows)."""
        with self.lock:
            if iteration < self.consumed or iteration in self.sealed:
                raise SemanticsError(
                    f"rows for iteration {iteration} arrived after it was sealed; on-policy data never "
                    "joins another iteration"
                )
            if not self.accepts(iteration):
                raise SemanticsError(f"iteration {iteration} is more than {self.max_in_flight} ahead of delivery")
            checked = self.validate(parts)
            if self._specs.spec is None:
                self._specs.spec = ExperienceSpec.infer(checked[0], self._specs.growable)
            it = self._get(iteration)
            first = self.inserted
            if self._order is None:
                self._order = StreamOrder(it.storage.devices)
            self._order.before_write()  # a reused store may still be read by a delivery stream
            closing = self._closing_write(it, checked) if closes else None
            if closing is None:
                for tensors in checked:
                    n = batch_size_of(tensors)
                    self._ensure_room(it, n, tensors)
                    if it.position is None:
                        it.storage.write(it.rows, tensors)
                    else:
                        it.storage.write_slots(it.slots(np.arange(it.rows, it.rows + n)), tensors)
                    assert it.ids is not None
                    it.ids.append(np.arange(self.inserted, self.inserted + n))
                    it.rows += n
                    self.inserted += n
                self._order.after_write()
                return first, self.inserted - first
        self._write_by_minibatch(it, closing)  # outside the lock: delivery serves the mini-batches already in
        return first, self.expected_rows - closing[0][0]

    def _closing_write(
        self, it: Iteration, checked: Sequence[Mapping[str, torch.Tensor]]
    ) -> list[tuple[int, Mapping[str, torch.Tensor], list[np.ndarray]]] | None:
        """For the write that completes ``it``, at the size its plan was drawn for, with ``early_minibatches``:
        its parts as (first row, data, the part's rows in each of the first epoch's mini-batches), every row
        already counted (ids, rows, version); else None (caller holds the lock)."""
        m = self.num_minibatches
        if not self.early_minibatches or it.plan is None or m < 2 or it.early or it.ids is None:
            return None
        n = sum(batch_size_of(t) for t in checked)
        if n == 0 or it.rows + n != self.expected_rows or self.expected_rows > it.storage.rows:
            return None
        spec = self._specs.spec
        assert spec is not None
        if any(spec.grown_by(t) is not None for t in checked):
            return None
        owner = np.empty(self.expected_rows, dtype=np.int64)  # the first epoch's mini-batch of every row
        for k, minibatch in enumerate(it.plan[0]):
            for rows in minibatch:
                owner[rows] = k
        parts = []
        start = it.rows
        for tensors in checked:
            size = batch_size_of(tensors)
            mine = owner[start : start + size]
            order = np.argsort(mine, kind="stable")
            bounds = np.searchsorted(mine[order], np.arange(m + 1))
            parts.append((start, tensors, [order[bounds[k] : bounds[k + 1]] for k in range(m)]))
            start += size
        # counted before any row is written: a writer of the next iteration takes the ids after these, and
        # nothing reads a row of this iteration before its mini-batch is released
        it.ids.append(np.arange(self.inserted, self.inserted + n))
        it.rows += n
        self.inserted += n
        return parts

    def _write_by_minibatch(
        self, it: Iteration, parts: list[tuple[int, Mapping[str, torch.Tensor], list[np.ndarray]]]
    ) -> None:
        """The closing write, mini-batch by mini-batch of the first epoch; each but the last is released
        (:attr:`Iteration.early`, and the ``on_data`` callbacks) as soon as its rows are stored.

        Row ``r`` still lands in storage row ``it.slots(r)`` with id ``first + r``: only the order of the
        writes changes. It runs outside the lock, which the delivery path needs to serve the mini-batches
        already complete: nothing else touches this iteration's storage meanwhile — its rows are all
        counted, so no further write joins it, and it cannot be released before its last mini-batch, which
        waits for the seal. A part's rows of one mini-batch are picked out of it by the storage
        (:meth:`Storage.write_slots` with ``rows``).
        """
        assert self._order is not None
        m = self.num_minibatches
        for k in range(m):
            for first, tensors, by_minibatch in parts:
                rows = by_minibatch[k]
                if rows.size:
                    it.storage.write_slots(it.slots(first + rows), tensors, rows)
            with self.lock:
                self._order.after_write()
                if k < m - 1:  # the last mini-batch waits for the seal
                    it.early = k + 1
            if k < m - 1:
                self._notify(self.on_data)

    def _get(self, iteration: int) -> Iteration:
        it = self.iterations.get(iteration)
        if it is None:
            assert self._specs.spec is not None
            storage = self._reusable() or self.policy.create(self._specs.spec, self.store_rows)
            it = Iteration(iteration, storage, ids=[])
            if self.expected_rows >= self.num_minibatches * self.num_learners:  # else drawn at the seal
                it.plan = minibatch_plan(
                    self.expected_rows, self.num_minibatches, self.num_epochs, self.rng, self.num_learners,
                    self.shuffle,
                )
                # laid out only where the last epoch can be handed out as views: elsewhere (a GPU store) the
                # scatter would buy nothing, every mini-batch is gathered there anyway
                if self.presort and storage.hands_out_views and self.expected_rows <= storage.rows:
                    it.position, it.runs = laid_out(it.plan[-1])
            self.iterations[iteration] = it
        return it

    def _reusable(self) -> Storage | None:
        """A released store no delivered view still refers to (caller holds the lock)."""
        for i, storage in enumerate(self._free):
            if not storage.in_use():
                return self._free.pop(i)
        return None

    def _ensure_room(self, it: Iteration, n: int, tensors: Mapping[str, torch.Tensor]) -> None:
        assert self._specs.spec is not None
        grown = self._specs.spec.grown_by(tensors)
        if grown is not None:
            self._specs.spec = grown
            self._free.clear()
        need = it.rows + n
        if grown is None and need <= it.storage.rows:
            return
        new = self.policy.create(self._specs.spec, max(need, it.storage.rows, self.store_rows))
        # laid out: the rows so far are spread over the expected rows' storage rows
        copy_rows(it.storage, new, it.rows if it.position is None else max(it.rows, len(it.position)))
        it.storage.close()
        it.storage = new

    def seal(self, iteration: int) -> None:
        """Close an iteration: shuffle its mini-batch plan and make it deliverable."""
        with self.lock:
            it = self._get(iteration) if iteration in self.iterations else None
            if it is None or it.rows == 0:
                raise SemanticsError(f"iteration {iteration} has no rows to seal")
            it.sealed = True
            if it.plan is None or it.rows != self.expected_rows:  # another count than the plan was drawn for
                it.plan = minibatch_plan(
                    it.rows, self.num_minibatches, self.num_epochs, self.rng, self.num_learners, self.shuffle
                )
                it.runs = None
            if it.remaining is None:  # else set by a mini-batch delivered early (the plan is unchanged then)
                it.remaining = [self.num_minibatches * self.num_epochs] * self.num_learners
            self.sealed.add(iteration)
        self._notify(self.on_data)

    def current(self) -> Iteration | None:
        """The oldest sealed iteration still being delivered."""
        with self.lock:
            if self.consumed in self.sealed:
                return self.iterations[self.consumed]
            return None

    def gather(
        self,
        it: Iteration,
        rows: np.ndarray,
        device: torch.device | None = None,
        out: Mapping[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Rows ``rows`` (insertion order) of ``it`` (into ``out`` when given: recycled batch memory)."""
        idx = torch.from_numpy(it.slots(rows))
        with self.lock:
            if self._order is not None:
                self._order.before_read()
            out = it.storage.gather(idx, device) if out is None else it.storage.gather(idx, device, out)
            if self._order is not None:
                self._order.after_read()
            return out

    def view(self, it: Iteration, epoch: int, minibatch: int, learner: int) -> dict[str, torch.Tensor] | None:
        """Mini-batch ``minibatch`` of ``epoch`` for ``learner`` as views of the store, where its rows were laid
        out in that epoch's order (the last epoch's, see ``presort``) and the storage hands out views; else None."""
        if it.runs is None or epoch != self.num_epochs - 1:
            return None
        start, n = it.runs[minibatch][learner]
        with self.lock:
            return it.storage.view(start, n)

    def delivered(self, iteration: int, learner: int, count: int = 1) -> None:
        """Mark mini-batches handed to ``learner``; release the iteration when all learners are done."""
        with self.lock:
            it = self.iterations[iteration]
            if it.remaining is None:  # a mini-batch released before the seal (never the last one)
                it.remaining = [self.num_minibatches * self.num_epochs] * self.num_learners
            it.remaining[learner] -= count
            if it.remaining[learner] < 0:
                raise SemanticsError(f"learner {learner} pulled more mini-batches than iteration {iteration} holds")
            if all(r == 0 for r in it.remaining):
                self.sealed.discard(iteration)
                del self.iterations[iteration]
                if it.storage.rows == self.store_rows and it.storage.spec == self._specs.spec:
                    self._free.append(it.storage)
                    if len(self._free) > self.max_in_flight:  # a learner keeps views: let one such store go
                        busy = [s for s in self._free if s.in_use()]
                        dropped = busy[0] if busy else self._free[0]
                        self._free.remove(dropped)
                        dropped.close()  # its memory goes when the last view of it does
                else:
                    it.storage.close()
                self.consumed += 1
                released = True
            else:
                released = False
        if released:
            self._notify(self.on_room)
