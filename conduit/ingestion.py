"""The ingestion path: actors push rollout units; the graph turns them into buffer rows.

Graph: ``[assemble] -> hook -> write`` (processing, processing, transfer).
With the identity hook the graph writes the ``g`` units as parts without
concatenating them first, and the push validates them eagerly, so bad input is
rejected at the offending ``push`` before anything is queued.

Timing (``overlap``): inline runs an invocation in the pushing thread as soon as
``g`` units are pending; overlapped hands units to the path's worker, and a push
waits (bounded) while ``g`` units are already pending, so ingestion lags rollouts
by at most ``g`` units. A push whose write is deferred that way copies its unit
first (``copy_on_push``, the default): the actor owns its arrays again when push
returns, as with any replay buffer. Measured before this copy existed: an actor
refilling one preallocated rollout buffer saw its earlier units overwritten in
the buffer (units 0-3 stored as 1, 2, 3, 3 at overlapped g = 1). ``copy=False``
hands the arrays over for actors that build fresh ones per rollout.

Granularity ``0 < g < 1`` (on-policy) splits each unit into pieces of
``ceil(g·rows)`` rows, one invocation each — but the unit that completes its
iteration, when the buffer releases that iteration's mini-batches as their rows
are written (``IterationBuffer.early_minibatches``): it is one invocation, which
the buffer writes mini-batch by mini-batch.

On-policy units are assigned to an iteration at push time: an iteration closes
with the unit that brings it to ``train_batch_size`` rows (or on ``seal()``), and
is sealed for delivery once every piece of it has been written.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from conduit.buffer import ReplayBuffer
from conduit.errors import RateLimited, SemanticsError
from conduit.executor import FailureBox, StreamSet, Worker, adopt, fail, hold_still, mark_producers, wait_until
from conduit.hooks import ACTOR, EXPERIENCE_BUFFER, Reader, Writer
from conduit.iterations import IterationBuffer
from conduit.operators import FnOperator, Graph, HookOperator, OperatorKind, Packet
from conduit.ratelimit import RateLimiter
from conduit.scheduling.space import Mode
from conduit.spec import Data, as_tensors, batch_size_of, rows_of
from conduit.trace import Tracer

__all__ = ["IngestionPath", "IngestionStats"]

HookFn = Callable[[Reader, Writer], object]


@dataclass
class _Piece:
    data: dict[str, torch.Tensor]
    rows: int
    unit_end: bool
    iteration: int | None = None
    #: the last rows of its iteration, which closes at the expected size: the buffer may release the
    #: iteration's mini-batches as this write stores them
    closes: bool = False
    #: the pushing thread's CUDA streams at push time (None for host data): the writer waits for them
    producers: dict[torch.device, torch.cuda.Event] | None = None


def _own(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A private copy of a pushed unit (same devices), so the actor may reuse its arrays."""
    return {k: v.clone() for k, v in tensors.items()}


@dataclass
class IngestionStats:
    pushed_units: int = 0
    pushed_rows: int = 0
    ingested_rows: int = 0
    invocations: int = 0
    blocked_s: float = 0.0  # time pushes waited on back-pressure
    push_s: float = 0.0  # total time spent inside push (exposed ingestion latency)
    per_iteration_rows: dict[int, int] = field(default_factory=dict)


class IngestionPath:
    """Runs the ingestion graph inline or on its worker."""

    def __init__(
        self,
        *,
        mode: Mode,
        buffer: ReplayBuffer | IterationBuffer,
        hook: HookFn | None,
        tracer: Tracer,
        failure: FailureBox,
        timeout: float,
        train_batch_size: int,
        stream_device: torch.device,
        limiter: RateLimiter | None = None,
        block: bool = True,
        copy_on_push: bool = True,
    ) -> None:
        self.mode = mode
        self.copy_on_push = copy_on_push
        self.buffer = buffer
        self.on_policy = isinstance(buffer, IterationBuffer)
        self.failure = failure
        self.timeout = timeout
        self.train_batch_size = train_batch_size
        self.cond = threading.Condition()
        self._invoke_lock = threading.Lock()
        self.queue: deque[_Piece] = deque()
        self.pending_units = 0
        self.flushing = 0
        self.stats = IngestionStats()
        self.limiter = limiter
        self.block = block
        self._identity = hook is None
        self._paused = False
        self._busy = False
        self._group, self._group_for = 1, None
        self.streams = StreamSet(stream_device)
        # on-policy push-side iteration accounting
        self._push_iter = 0
        self._push_iter_rows = 0
        self._pieces_pushed: dict[int, int] = {}
        self._pieces_done: dict[int, int] = {}
        self._closed: set[int] = set()

        ops = []
        if hook is not None:
            ops.append(HookOperator("hook", hook, ACTOR, EXPERIENCE_BUFFER))
        ops.append(FnOperator("buffer_write", OperatorKind.TRANSFER, self._write))
        self.graph = Graph("ingestion", ops, tracer)
        self.worker: Worker | None = None
        if mode.overlap:
            self.worker = Worker("ingestion", self._step, failure, self.cond)
            self.worker.start()

    # -- granularity ----------------------------------------------------------
    @property
    def group_units(self) -> int:
        """Units (or pieces) one invocation takes (cached: Fraction arithmetic is slow on the hot path)."""
        if self._group_for is not self.mode:
            g = self.mode.granularity
            self._group = int(g) if g >= 1 else 1
            self._group_for = self.mode
        return self._group

    def _split(
        self, tensors: dict[str, torch.Tensor], rows: int, producers: dict[torch.device, torch.cuda.Event] | None
    ) -> list[_Piece]:
        if not self.mode.overlap or self.group_units > 1 or self.mode.granularity == 1:
            return [_Piece(tensors, rows, True, producers=producers)]
        g = self.mode.granularity
        step = max(1, math.ceil(rows * g))
        chunks = {k: torch.split(v, step) for k, v in tensors.items()}
        count = len(next(iter(chunks.values())))
        return [
            _Piece(
                {k: c[i] for k, c in chunks.items()}, int(next(iter(chunks.values()))[i].shape[0]), i == count - 1,
                producers=producers,
            )
            for i in range(count)
        ]

    # -- push -----------------------------------------------------------------
    def _defers(self) -> bool:
        """Whether a unit pushed now may be read after its push returns (on the worker, or with its group)."""
        return self.mode.overlap or self.group_units > 1

    def push(self, data: Data, timeout: float | None = None, copy: bool | None = None) -> None:
        t0 = time.perf_counter()
        self.failure.check()
        if self._identity:
            tensors = self.buffer.validate([data])[0]  # bad input fails here, nothing queued
            rows = rows_of(tensors)
            if self._push_direct(tensors, rows):
                self.stats.push_s += time.perf_counter() - t0
                return
        else:
            tensors = as_tensors(data)
            rows = batch_size_of(tensors)
        copy = self.copy_on_push if copy is None else copy
        copied = copy and self._defers()
        if copied:
            tensors = _own(tensors)
        pieces = self._split(tensors, rows, mark_producers(tensors))
        timeout = self.timeout if timeout is None else timeout
        with self.cond:
            iteration = None
            t_wait = time.perf_counter()
            limiter = self.limiter
            if limiter is not None and not limiter.can_insert(rows):
                if not self.block:
                    raise RateLimited(f"push of {rows} rows would break the sample/insert ratio ({limiter.describe()})")
                wait_until(
                    self.cond, lambda: limiter.can_insert(rows), timeout, self.failure,
                    lambda: f"learners to sample before {rows} more rows can be inserted ({limiter.describe()})",
                )
            wait_until(self.cond, self._has_room, timeout, self.failure, self._describe_wait)
            self.stats.blocked_s += time.perf_counter() - t_wait
            if copy and not copied and self._defers():  # the schedule switched while this push waited
                tensors = _own(tensors)
                pieces = self._split(tensors, rows, mark_producers(tensors))
            if limiter is not None:
                limiter.insert(rows)
            closes = self.on_policy and self._closes(rows)
            if closes and len(pieces) > 1:
                # the unit that completes its iteration is written whole: the buffer stores it mini-batch by
                # mini-batch and releases each as it completes, which row pieces would only delay
                pieces = [_Piece(tensors, rows, True, producers=pieces[0].producers)]
            if self.on_policy:
                iteration = self._assign_iteration(rows, len(pieces))
            for p in pieces:
                p.iteration = iteration
            pieces[-1].closes = closes
            self.queue.extend(pieces)
            self.pending_units += 1
            self.stats.pushed_units += 1
            self.stats.pushed_rows += rows
            self.cond.notify_all()
        if not self.mode.overlap:
            self._drain_inline(flush=False)
        self.stats.push_s += time.perf_counter() - t0

    def _push_direct(self, tensors: dict[str, torch.Tensor], rows: int) -> bool:
        """Inline, no hook, g = 1, off-policy, no rate limit, nobody tracing, nothing queued: write now.

        The graph's one operator here (the buffer write; push has validated the
        data already) without queueing a piece and draining it, so a push costs
        little more than its copy (the general path added ~30 us per push at
        dim 128 next to a 40 us copy). Returns False, having changed nothing, to
        take the general path.
        """
        if (
            self.mode.overlap
            or self.on_policy
            or self.limiter is not None
            or self.group_units != 1
            or self.graph.tracer.enabled
        ):
            return False
        with self._invoke_lock:  # held by whoever pauses this path (hold_still), so no write starts then
            with self.cond:
                if self.queue or self._paused or self.mode.overlap:
                    return False
                self.stats.pushed_units += 1
                self.stats.pushed_rows += rows
            t0 = time.perf_counter()
            assert isinstance(self.buffer, ReplayBuffer)
            try:
                _, n = self.buffer.write([tensors], validated=True)
            except Exception as exc:
                fail(self.failure, "ingestion operator", exc)
            self.graph.timings.append((time.perf_counter() - t0, 1.0))
            self.graph.invocations += 1
            with self.cond:
                self.stats.invocations += 1
                self.stats.ingested_rows += n
                self.cond.notify_all()
        return True

    def _has_room(self) -> bool:
        if self.on_policy:
            assert isinstance(self.buffer, IterationBuffer)
            if not self.buffer.accepts(self._push_iter):
                return False
        return self.pending_units < self.group_units

    def _assign_iteration(self, rows: int, pieces: int) -> int:
        it = self._push_iter
        self._pieces_pushed[it] = self._pieces_pushed.get(it, 0) + pieces
        self._push_iter_rows += rows
        self.stats.per_iteration_rows[it] = self.stats.per_iteration_rows.get(it, 0) + rows
        if self._push_iter_rows >= self.train_batch_size:
            self._close_push_iteration()
        return it

    def _closes(self, rows: int) -> bool:
        """Whether a unit of ``rows`` completes the iteration being pushed at its expected size, in a buffer
        that releases such an iteration's mini-batches as they are written (caller holds cond)."""
        assert isinstance(self.buffer, IterationBuffer)
        return self.buffer.early_minibatches and self._push_iter_rows + rows == self.buffer.expected_rows

    def _close_push_iteration(self) -> None:
        self._closed.add(self._push_iter)
        self._push_iter += 1
        self._push_iter_rows = 0

    def seal(self) -> int | None:
        """Close the iteration being pushed early (on-policy); returns its index."""
        with self.cond:
            if not self.on_policy or self._push_iter_rows == 0:
                return None
            assert isinstance(self.buffer, IterationBuffer)
            need = self.buffer.num_minibatches * self.buffer.num_learners
            if self._push_iter_rows < need:
                raise SemanticsError(
                    f"seal(): iteration {self._push_iter} holds {self._push_iter_rows} rows, fewer than "
                    f"num_minibatches x num_learners = {need}; push more before sealing"
                )
            it = self._push_iter
            self._close_push_iteration()
            ready = self._take_sealable(it)
            self.cond.notify_all()
        if ready is not None:
            self._seal(ready)
        return it

    def _describe_wait(self) -> str:
        if self.on_policy:
            return (
                f"room to push (iteration {self._push_iter} would exceed {getattr(self.buffer, 'max_in_flight', 2)} "
                f"iterations in flight: the learner has consumed {getattr(self.buffer, 'consumed', 0)}); "
                "is a learner pulling?"
            )
        return (
            f"ingestion to catch up ({self.pending_units} unit(s) pending, granularity {self.mode.granularity}); "
            "the ingestion worker is stalled"
        )

    # -- invocations ----------------------------------------------------------
    def _take_group(self, flush: bool) -> list[_Piece] | None:
        """Pop the next invocation's pieces (caller holds cond)."""
        if not self.queue:
            return None
        if self.on_policy:
            return [self.queue.popleft()]
        g = self.group_units
        if len(self.queue) >= g:
            return [self.queue.popleft() for _ in range(g)]
        if flush:
            return [self.queue.popleft() for _ in range(len(self.queue))]
        return None

    def _step(self) -> None:
        with self.cond:
            if not self.mode.overlap or self._paused:  # retired (switched to inline) or paused
                self.cond.wait(0.05)
                return
            group = self._take_group(self.flushing > 0)
            if group is None:
                self.cond.wait(0.05)
                return
            self._busy = True
        try:
            with self.streams.active():
                self._invoke(group)
        finally:
            with self.cond:
                self._busy = False
                self.cond.notify_all()

    def _drain_inline(self, flush: bool) -> None:
        with self._invoke_lock:
            while True:
                with self.cond:
                    group = self._take_group(flush)
                if group is None:
                    return
                self._invoke(group)

    def _invoke(self, group: list[_Piece]) -> None:
        for p in group:  # on the worker's stream: after the actor's kernels that produced the unit
            adopt(p.data, p.producers)
        granularity = float(self.mode.granularity)
        meta = {"iteration": group[0].iteration, "granularity": granularity, "closes": group[-1].closes}
        packet = Packet([p.data for p in group], meta)
        try:
            self.graph.run(packet, granularity)
        except Exception as exc:
            fail(self.failure, "ingestion operator", exc)
        with self.cond:
            self.stats.invocations += 1
            self.pending_units -= sum(1 for p in group if p.unit_end)
            for p in group:
                if p.iteration is not None:
                    self._pieces_done[p.iteration] = self._pieces_done.get(p.iteration, 0) + 1
            ready = self._take_sealable(group[0].iteration) if self.on_policy else None
            self.cond.notify_all()
        if ready is not None:
            self._seal(ready)

    def _write(self, packet: Packet) -> Packet:
        if not packet.parts:
            return packet  # the hook filtered everything out
        if self.on_policy:
            assert isinstance(self.buffer, IterationBuffer)
            _, n = self.buffer.write(packet.meta["iteration"], packet.parts, closes=packet.meta["closes"])
        else:
            assert isinstance(self.buffer, ReplayBuffer)
            _, n = self.buffer.write(packet.parts, validated=self._identity)
        with self.cond:
            self.stats.ingested_rows += n
        return packet

    def _take_sealable(self, iteration: int | None) -> int | None:
        """``iteration`` if it is closed and fully ingested (caller holds cond); claims it."""
        if iteration is None or iteration not in self._closed:
            return None
        if self._pieces_done.get(iteration, 0) != self._pieces_pushed.get(iteration, 0):
            return None
        self._closed.discard(iteration)
        self._pieces_pushed.pop(iteration, None)
        self._pieces_done.pop(iteration, None)
        return iteration

    def _seal(self, iteration: int) -> None:
        """Seal outside ``cond``: the buffer notifies the delivery path (lock order)."""
        assert isinstance(self.buffer, IterationBuffer)
        self.buffer.seal(iteration)

    # -- flush / close --------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Ingest everything pushed so far, including a partial group."""
        timeout = self.timeout if timeout is None else timeout
        if not self.mode.overlap:
            self._drain_inline(flush=True)
            return
        with self.cond:
            self.flushing += 1
            self.cond.notify_all()
            try:
                wait_until(
                    self.cond,
                    lambda: self.pending_units == 0 and not self.queue,
                    timeout,
                    self.failure,
                    lambda: f"ingestion to flush {self.pending_units} pending unit(s)",
                )
            finally:
                self.flushing -= 1

    @contextlib.contextmanager
    def paused(self, timeout: float | None = None) -> Iterator[None]:
        """No ingestion invocation runs inside this block (pushes still queue)."""
        timeout = self.timeout if timeout is None else timeout
        with self._invoke_lock, hold_still(self, lambda: not self._busy, timeout, "ingestion to pause"):
            yield

    def set_mode(self, mode: Mode, timeout: float | None = None) -> None:
        """Switch timing/granularity: everything pushed so far is ingested under the old mode first."""
        if mode == self.mode:
            return
        timeout = self.timeout if timeout is None else timeout
        self.flush(timeout)
        with self._invoke_lock, self.cond:
            self.mode = mode
            old, self.worker = self.worker, None
            self.cond.notify_all()
        if old is not None:
            old.stop(timeout)
        if mode.overlap:
            worker = Worker("ingestion", self._step, self.failure, self.cond)
            worker.start()
            with self.cond:
                self.worker = worker
                self.cond.notify_all()
        else:
            self._drain_inline(flush=False)  # units pushed while switching

    def close(self, timeout: float) -> bool:
        if self.worker is not None:
            return self.worker.stop(timeout)
        return True
