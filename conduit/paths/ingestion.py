"""The ingestion path: actors push rollout units; the graph turns them into buffer rows.

Graph: ``[hook] -> buffer_write`` (processing, transfer). With the identity hook
the graph writes the ``g`` units as parts without concatenating them first, and
the push validates them eagerly, so bad input is rejected at the offending
``push`` before anything is queued.

Timing (``overlap``): inline runs an invocation in the pushing thread as soon as
``g`` units are pending; overlapped hands units to the path's worker, and a push
waits (bounded) while ``g`` units are already pending, so ingestion lags rollouts
by at most ``g`` units. A push whose write is deferred that way copies its unit
first (``copy_on_push``, the default): the actor owns its arrays again when push
returns, as with any replay buffer. ``copy=False`` hands the arrays over, for
actors that build fresh ones per rollout.

Bad input is refused at the offending ``push``, before anything is queued, with
or without a hook: without one the unit is checked against the buffer's spec;
with one, against the first unit's fields, dtypes and ranks (the hook's input
spec: trailing sizes free), since a unit the buffer could not store must never
reach a worker that would fail the runtime on it. A hook whose own output the
buffer refuses fails the runtime, except inline at ``g = 1`` with free admission,
where the push that ran it raises :class:`~conduit.errors.SpecError` and the
runtime, the buffer and the counters are as they were.

Granularity ``0 < g < 1`` (on-policy) splits each unit into pieces of
``ceil(g·rows)`` rows, one invocation each — but not a unit the buffer says to
write whole (:attr:`~conduit.buffers.base.Ticket.closes`).

What differs between the policies — back-pressure, the iteration a unit joins,
sealing — is the buffer's (:mod:`conduit.buffers.base`): this path never asks which
buffer it feeds.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from conduit.buffers.base import ANYWHERE, ExperienceBuffer, Ticket
from conduit.core import Mode
from conduit.errors import ConduitTimeout, SpecError
from conduit.executor import FailureBox, StreamSet, adopt, fail, mark_producers, wait_until
from conduit.hooks import ACTOR, EXPERIENCE_BUFFER, Reader, Writer
from conduit.operators import FnOperator, HookOperator, Operator, OperatorKind, Packet
from conduit.paths.base import DataPath
from conduit.spec import Data, ExperienceSpec, as_tensors, batch_size_of, rows_of
from conduit.trace import Tracer

__all__ = ["IngestionPath", "IngestionStats", "Piece"]

log = logging.getLogger("conduit")

HookFn = Callable[[Reader, Writer], object]


@dataclass(eq=False)
class Piece:
    """A pushed unit, or a piece of one, waiting to be written."""

    data: dict[str, torch.Tensor]
    rows: int
    #: the unit's last piece (the unit counts as ingested once it is written)
    unit_end: bool
    ticket: Ticket = ANYWHERE
    #: the pushing thread's CUDA streams at push time (None for host data): the writer waits for them
    producers: dict[torch.device, torch.cuda.Event] | None = None
    #: the pushing thread (an inline invocation of its own unit alone may hand a bad write back to it)
    owner: int = 0


@dataclass(frozen=True)
class Invocation:
    """What one ingestion invocation writes (the packet's record)."""

    granularity: float
    ticket: Ticket

    def facts(self) -> dict[str, object]:
        """What a hook reads as ``actor_in.info``."""
        return {"granularity": self.granularity, "iteration": self.ticket.iteration, "closes": self.ticket.closes}


def _own(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A private copy of a pushed unit (same devices), so the actor may reuse its arrays."""
    return {k: v.clone() for k, v in tensors.items()}


def _matches(spec: ExperienceSpec, tensors: dict[str, torch.Tensor]) -> bool:
    """Same fields, dtypes and ranks as ``spec``, dense, one leading size: what the full check would pass."""
    if len(tensors) != len(spec):
        return False
    n = -1
    for name, t in tensors.items():
        f = spec.fields.get(name)
        if f is None or t.dtype != f.dtype or t.dim() != len(f.shape) + 1 or t.layout is not torch.strided:
            return False
        if not (t.is_cpu or t.is_cuda):
            return False
        if n not in (-1, t.shape[0]):
            return False
        n = t.shape[0]
    return n > 0


@dataclass
class IngestionStats:
    pushed_units: int = 0
    pushed_rows: int = 0
    ingested_rows: int = 0
    invocations: int = 0
    blocked_s: float = 0.0  # time pushes waited on back-pressure
    push_s: float = 0.0  # total time spent inside push (exposed ingestion latency)


class IngestionPath(DataPath):
    """Runs the ingestion graph inline or on its worker."""

    name = "ingestion"

    def __init__(
        self,
        *,
        mode: Mode,
        buffer: ExperienceBuffer,
        hook: HookFn | None,
        tracer: Tracer,
        failure: FailureBox,
        timeout: float,
        stream_device: torch.device,
        copy_on_push: bool = True,
    ) -> None:
        ops: list[Operator] = []
        if hook is not None:
            ops.append(HookOperator("hook", hook, ACTOR, EXPERIENCE_BUFFER))
        ops.append(FnOperator("buffer_write", OperatorKind.TRANSFER, self._write))
        super().__init__(mode=mode, failure=failure, timeout=timeout, tracer=tracer, operators=ops)
        self.buffer = buffer
        self.copy_on_push = copy_on_push
        self.queue: deque[Piece] = deque()
        self.pending_units = 0
        self.flushing = 0
        self.stats = IngestionStats()
        self._identity = hook is None
        self._input_spec: ExperienceSpec | None = None  # with a hook: the first unit's fields, dtypes and ranks
        self.streams = StreamSet(stream_device)
        self.start()

    def wake(self) -> None:
        """Room to push opened (the buffer's ``on_room``): wake pushes waiting for it."""
        with self.cond:
            self.cond.notify_all()

    # -- granularity ----------------------------------------------------------
    def _split(self, tensors: dict[str, torch.Tensor], rows: int) -> list[dict[str, torch.Tensor]]:
        """A unit as the pieces one invocation each writes: itself, or row pieces at a fractional granularity."""
        if not self.mode.overlap or self.g_units > 1 or self.mode.granularity == 1:
            return [tensors]
        step = max(1, math.ceil(rows * self.mode.granularity))
        chunks = {k: torch.split(v, step) for k, v in tensors.items()}
        return [{k: c[i] for k, c in chunks.items()} for i in range(len(next(iter(chunks.values()))))]

    # -- push -----------------------------------------------------------------
    def _defers(self) -> bool:
        """Whether a unit pushed now may be read after its push returns (on the worker, or with its group)."""
        return self.mode.overlap or self.g_units > 1

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
            tensors = self._check_input(data)
            rows = batch_size_of(tensors)
        copy = self.copy_on_push if copy is None else copy
        copied = copy and self._defers()
        if copied:
            tensors = _own(tensors)
        timeout = self.timeout if timeout is None else timeout
        buffer = self.buffer
        with self.cond:
            t_wait = time.perf_counter()
            if not buffer.room(rows):
                buffer.refuse(rows)  # raises where the buffer's back-pressure does not wait
            wait_until(
                self.cond, lambda: buffer.room(rows) and self.pending_units < self.g_units, timeout,
                self.failure, lambda: buffer.describe_room(rows) if not buffer.room(rows) else self._describe_lag(),
            )
            self.stats.blocked_s += time.perf_counter() - t_wait
            if copy and not copied and self._defers():  # the schedule switched while this push waited
                tensors = _own(tensors)
                copied = True
            parts = self._split(tensors, rows)
            ticket = buffer.admit(rows, len(parts))
            if ticket.pieces == 1 and len(parts) > 1:  # the buffer writes this unit whole
                parts = [tensors]
            producers = mark_producers(tensors)
            last = len(parts) - 1
            owner = threading.get_ident()
            mine = [
                Piece(p, rows_of(p) if len(parts) > 1 else rows, i == last, ticket, producers, owner)
                for i, p in enumerate(parts)
            ]
            self.queue.extend(mine)
            self.pending_units += 1
            self.stats.pushed_units += 1
            self.stats.pushed_rows += rows
            self.cond.notify_all()
        if not self.mode.overlap:
            self._drain_own(mine, copy and not copied, timeout)
        self.stats.push_s += time.perf_counter() - t0

    def _drain_own(self, mine: list[Piece], copy: bool, timeout: float) -> None:
        """Inline: run what is pending, this push's unit included, waiting at most ``timeout`` for another
        thread's invocation (a hook that hangs). While it waits the unit is copied (``copy``: the actor may
        refill its arrays meanwhile). Where the wait times out, the unit is taken back if no invocation took it
        yet and admission was free (the push raises, nothing changed); else it stays queued for the invocation
        in flight to ingest, and the push says so as it raises."""
        lock = self._invoke_locks[0]
        if not lock.acquire(blocking=False):
            if copy:
                with self.cond:
                    for p in mine:
                        if p in self.queue:  # by identity (eq=False)
                            p.data = _own(p.data)
            try:
                self._acquire(lock, timeout, "run ingestion")
            except ConduitTimeout as exc:
                with self.cond:
                    if all(p in self.queue for p in mine) and self.buffer.free_admission:
                        for p in mine:
                            self.queue.remove(p)
                        self._uncount(mine)
                        raise ConduitTimeout(f"{exc}; this push's unit was not ingested") from None
                late = ConduitTimeout(f"{exc}; this push's unit is queued and is ingested when that ends")
                late.queued = True
                raise late from None
        try:
            self._drain_held(flush=False)
        finally:
            lock.release()

    def _check_input(self, data: Data) -> dict[str, torch.Tensor]:
        """With a hook: the unit as pushed (dense, detached), refused with SpecError unless it matches the first
        unit's fields, dtypes (or casts that keep every value) and ranks."""
        tensors = as_tensors(data)
        spec = self._input_spec
        if spec is None:
            first = ExperienceSpec.infer(tensors, frozenset(tensors))  # every trailing size free, ranks fixed
            first.validate(tensors)  # dense, non-empty
            with self._lock:  # the first unit to get here defines it, whichever thread pushed it
                if self._input_spec is None:
                    self._input_spec = first
                spec = self._input_spec
        if not _matches(spec, tensors):  # the common case costs a glance; anything else the full check, which
            spec.validate(tensors)  # names what is wrong (its result is discarded: the hook reads the unit as pushed)
        return {k: v.detach() if v.requires_grad else v for k, v in tensors.items()}

    def _push_direct(self, tensors: dict[str, torch.Tensor], rows: int) -> bool:
        """Inline, no hook, g = 1, free admission, nobody tracing, nothing queued: write now.

        The graph's one operator here (the buffer write; push has validated the
        data already) without queueing a piece and draining it, so a push costs
        little more than its copy. Returns False, having changed nothing, to
        take the general path.
        """
        if self.mode.overlap or not self.buffer.free_admission or self.g_units != 1 or self.graph.tracer.enabled:
            return False
        with self._invoke_locks[0]:  # held by whoever pauses this path, so no write starts then
            with self._lock:
                if self.queue or self._paused or self.mode.overlap:
                    return False
                self.stats.pushed_units += 1
                self.stats.pushed_rows += rows
            t0 = time.perf_counter()
            try:
                n = self.buffer.store([tensors], ANYWHERE, validated=True)
            except Exception as exc:
                fail(self.failure, "ingestion operator", exc)
            self.graph.timings.append((time.perf_counter() - t0, 1.0))
            self.graph.invocations += 1
            with self._lock:
                self.stats.invocations += 1
                self.stats.ingested_rows += n
                self.cond.notify_all()
        return True

    def _describe_lag(self) -> str:
        return (
            f"ingestion to catch up ({self.pending_units} unit(s) pending, granularity {self.mode.granularity}): "
            f"{self.doing('the ingestion worker is stalled')}"
        )

    # -- invocations ----------------------------------------------------------
    def _take_group(self, flush: bool) -> list[Piece] | None:
        """Pop the next invocation's pieces (caller holds cond): ``g`` units, or one piece of an iteration."""
        queue = self.queue
        if not queue:
            return None
        if queue[0].ticket.iteration is not None:  # on-policy: a piece an invocation, never across iterations
            return [queue.popleft()]
        g = self.g_units
        if len(queue) >= g:
            return [queue.popleft() for _ in range(g)]
        if flush:
            return [queue.popleft() for _ in range(len(queue))]
        return None

    def _claim_work(self) -> list[Piece] | None:
        return self._take_group(self.flushing > 0)

    def _work(self, group: list[Piece]) -> None:
        with self.streams.active():
            self._invoke(group)

    def _drain_inline(self, flush: bool, timeout: float | None = None) -> None:
        """Run pending invocations in this thread; ``timeout`` bounds the wait for another thread's invocation
        (a hook that hangs holds the path's invocation lock)."""
        lock = self._invoke_locks[0]
        self._acquire(lock, self.timeout if timeout is None else timeout, "run ingestion")
        try:
            self._drain_held(flush)
        finally:
            lock.release()

    def _drain_held(self, flush: bool) -> None:
        """Run pending invocations in this thread (caller holds the invocation lock)."""
        while True:
            with self.cond:
                group = self._take_group(flush)
            if group is None:
                return
            self._invoke(group, inline=True)

    def _invoke(self, group: list[Piece], inline: bool = False) -> None:
        for p in group:  # on the worker's stream: after the actor's kernels that produced the unit
            adopt(p.data, p.producers)
        granularity = self.g_float
        packet = Packet([p.data for p in group], Invocation(granularity, group[0].ticket))
        try:
            self.graph.run(packet, granularity)
        except SpecError as exc:
            if inline and self._hand_back(group):
                raise
            fail(self.failure, "ingestion operator", exc)
        except Exception as exc:
            fail(self.failure, "ingestion operator", exc)
        with self.cond:
            self.stats.invocations += 1
            self.pending_units -= sum(1 for p in group if p.unit_end)
            self.cond.notify_all()
        for p in group:  # outside cond: sealing an iteration notifies the delivery path
            self.buffer.stored(p.ticket)

    def _hand_back(self, group: list[Piece]) -> bool:
        """A write the buffer refused whole (SpecError: nothing stored) of the calling thread's own unit alone,
        admitted freely: un-count it, so that its push raises and the runtime is as it was. False otherwise."""
        me = threading.get_ident()
        if len(group) != 1 or group[0].owner != me or not group[0].unit_end or not self.buffer.free_admission:
            return False
        with self.cond:
            self._uncount(group)
        return True

    def _uncount(self, pieces: list[Piece]) -> None:
        """One unit's pieces, out of the queue, are as if never pushed (caller holds cond; free admission)."""
        self.pending_units -= 1
        self.stats.pushed_units -= 1
        self.stats.pushed_rows -= sum(p.rows for p in pieces)
        if not self.stats.pushed_units:  # the unit that defined the hook's input spec was refused
            self._input_spec = None
        self.cond.notify_all()

    def _write(self, packet: Packet) -> Packet:
        if not packet.parts:
            return packet  # the hook filtered everything out
        invocation: Invocation = packet.record
        n = self.buffer.store(packet.parts, invocation.ticket, validated=self._identity)
        with self.cond:
            self.stats.ingested_rows += n
        return packet

    def seal(self) -> int | None:
        """End the iteration being pushed now (on-policy): under cond, so no push is between its room check
        and its admission (a push admitted to the next iteration would then skip the in-flight bound)."""
        with self.cond:
            closed = self.buffer.close_open()
            self.cond.notify_all()
        if closed is not None:  # outside cond: sealing notifies the delivery path
            self.buffer.seal_closed(closed)
        return closed

    # -- flush / switch -------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Ingest everything pushed so far, including a partial group."""
        timeout = self.timeout if timeout is None else timeout
        if not self.mode.overlap:
            self._drain_inline(flush=True, timeout=timeout)
            return
        with self.cond:
            self.flushing += 1
            self.cond.notify_all()
            try:
                wait_until(
                    self.cond, lambda: self.pending_units == 0 and not self.queue, timeout, self.failure,
                    lambda: f"ingestion to flush {self.pending_units} pending unit(s): "
                    + self.doing("no invocation under way"),
                )
            finally:
                self.flushing -= 1

    def drain_within(self, timeout: float) -> bool:
        """Ingest what is pending within ``timeout`` (for ``close``), on a thread of its own: an inline drain runs
        the hook in the calling thread, and a hook that hangs must not hold the caller past ``timeout``. Says what
        it could not do in a warning; True when everything pending was ingested."""
        errors: list[BaseException] = []

        def run() -> None:
            try:
                self.flush(timeout)
            except BaseException as e:  # reported here, or (after close) ended quietly by the closed runtime
                errors.append(e)

        t = threading.Thread(target=run, name="conduit-close-drain", daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            log.warning("conduit: close could not drain pending units within %.3gs: %s", timeout,
                        self.doing("ingestion is busy"))
            return False
        if errors:
            log.warning("conduit: close could not drain pending units: %s", errors[0])
            return False
        return True

    def _before_switch(self, timeout: float) -> None:
        self.flush(timeout)  # everything pushed so far is ingested under the old mode

    def _after_switch(self) -> None:
        if not self.mode.overlap:
            self._drain_inline(flush=False, timeout=self.timeout)  # units pushed while switching

    # -- state ----------------------------------------------------------------
    def queued(self) -> tuple[list[Piece], int]:
        """The queue and its unit count at one point (caller holds cond: pushes still admit and queue while
        the path is paused, so a checkpoint reads the buffer's admissions under the same hold)."""
        return list(self.queue), self.pending_units

    def state_dict(self, queued: tuple[list[Piece], int] | None = None) -> dict[str, object]:
        """Units pushed (acknowledged) but not yet ingested, on the host (caller has paused the path):
        ``queued`` (from :meth:`queued`), or the queue now."""
        if queued is None:
            with self.cond:
                queued = self.queued()
        queued_pieces, pending_units = queued
        pieces = []
        for p in queued_pieces:
            adopt(p.data, p.producers)  # a unit pushed from CUDA memory: after the actor's kernels that wrote it
            pieces.append({
                "data": {k: v.cpu() for k, v in p.data.items()}, "rows": p.rows, "unit_end": p.unit_end,
                "ticket": tuple(p.ticket),
            })
        return {"pieces": pieces, "pending_units": pending_units}

    def load_state_dict(self, state: dict[str, object]) -> None:
        with self.cond:
            for p in state["pieces"]:  # type: ignore[attr-defined]
                ticket = Ticket(*p["ticket"]) if "ticket" in p else ANYWHERE
                self.queue.append(Piece(p["data"], int(p["rows"]), bool(p["unit_end"]), ticket))
            self.pending_units += int(state["pending_units"])  # type: ignore[call-overload]
            self.cond.notify_all()
