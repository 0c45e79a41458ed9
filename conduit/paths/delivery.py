"""The delivery path: buffer rows become training-ready batches on each learner's device.

Graph: ``select+gather -> [hook] -> to_learner -> split`` (processing, processing,
transfer, processing). One invocation handles ``g`` training batches: off-policy it
samples ``g·B`` rows in one draw (:mod:`~conduit.paths.replay`); on-policy ``g = 1``
prepares an epoch's ``M`` mini-batches at once and ``g = 1/M`` one mini-batch at a
time (:mod:`~conduit.paths.minibatch`).

Timing (``overlap``): inline runs an invocation in the pulling thread when that
learner has nothing staged; overlapped lets the path's worker stage at most one
invocation ahead per learner (so a staged batch is at most ``g`` batches older than
an inline sample would have been), on a dedicated CUDA stream whose event the
learner's stream waits on at hand-off.

There is one route for a pull (:meth:`DeliveryPath.pull`): take a staged batch, or
claim an invocation (:meth:`DeliveryPath._claim`), run it (:meth:`DeliveryPath._invoke`:
the operator functions directly where no hook runs and nobody traces, the graph
otherwise), hand the first batch over and stage the rest. Every batch's
:class:`~conduit.batch.BatchInfo` is made in one place (:meth:`DeliveryPath._info`),
from the invocation's typed record (a :class:`Claim`).

Each learner has its own staging queue and pull counter; several data-parallel
learners each pull their own batches.
"""

from __future__ import annotations

import contextlib
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from conduit.batch import Batch, BatchInfo
from conduit.buffers.base import ExperienceBuffer
from conduit.core import Mode
from conduit.errors import ConduitError, ConduitTimeout, SemanticsError, SpecError
from conduit.executor import POLL_S, FailureBox, StreamSet, fail, handoff
from conduit.hooks import EXPERIENCE_BUFFER, LEARNER, Reader, Writer
from conduit.memory import BatchMemory
from conduit.operators import FnOperator, HookOperator, Operator, OperatorKind, Packet, concat
from conduit.paths.base import DataPath
from conduit.paths.claims import Claim, DeliveryStats, Place, Staged
from conduit.spec import rows_of
from conduit.trace import Tracer

__all__ = ["Claim", "DeliveryPath", "DeliveryStats", "HookFn", "Place", "Staged"]

HookFn = Callable[[Reader, Writer], object]


class DeliveryPath(DataPath):
    """Staging, the pull route and the worker's invocations; subclasses say what one invocation produces."""

    name = "delivery"

    def __init__(
        self,
        *,
        buffer: ExperienceBuffer,
        mode: Mode,
        hook: HookFn | None,
        tracer: Tracer,
        failure: FailureBox,
        timeout: float,
        learner_devices: Sequence[torch.device],
        recycle_batches: bool = True,
        time_major: bool = False,
    ) -> None:
        ops: list[Operator] = [FnOperator("select_gather", OperatorKind.PROCESSING, self._gather_op)]
        if hook is not None:
            ops.append(HookOperator("hook", hook, EXPERIENCE_BUFFER, LEARNER))
        ops.append(FnOperator("to_learner", OperatorKind.TRANSFER, self._to_learner_op))
        ops.append(FnOperator("split", OperatorKind.PROCESSING, self._split_op))
        self.devices = list(learner_devices)
        super().__init__(mode=mode, failure=failure, timeout=timeout, tracer=tracer, operators=ops,
                         lanes=len(self.devices))
        self.buffer = buffer
        self.num_learners = len(self.devices)
        # host batches go back to a free list once the learner drops them (conduit.memory); a GPU
        # learner's batches come from torch's caching allocator, which already recycles them
        self._memory = [
            BatchMemory(time_major=time_major) if recycle_batches and d.type == "cpu" else None for d in self.devices
        ]
        self.staged: list[deque[Staged]] = [deque() for _ in self.devices]
        self.pulls = [0] * self.num_learners
        self.handing = 0  # batches popped from staging whose accounting (_counted) has not run yet
        self._busy = [False] * self.num_learners
        self._data_waiters = 0  # threads waiting for buffer data (worker or inline pulls)
        self._starved = False  # the worker found a learner to serve but no data for it
        self.stats = DeliveryStats()
        self.streams = [StreamSet(d) for d in self.devices]
        self._hookless = hook is None

    def memory(self, learner: int) -> BatchMemory | None:
        """The recycled host memory ``learner``'s batches are gathered into (None: fresh memory every pull)."""
        return self._memory[learner]

    def notify(self) -> None:
        """New data or a sealed iteration: wake whoever waits for it, and nobody else.

        A needless wake-up costs more than it looks on a loaded CPU: the woken
        thread must win the GIL and a core from the learner.
        """
        with self._lock:
            if self._data_waiters:
                self.cond.notify_all()

    def ready(self, learner: int = 0) -> bool:
        """Whether a pull for ``learner`` can be served now without waiting for more data."""
        with self._lock:
            return bool(self.staged[learner]) or self._ready(learner)

    # -- what a subclass says ---------------------------------------------------------
    @abstractmethod
    def _ready(self, learner: int) -> bool:
        """Whether an invocation for ``learner`` can run now (caller holds cond)."""

    @abstractmethod
    def _begin(self, learner: int, sampled_at_pull: int, handed: bool, rows: int = 0) -> Claim:
        """Claim the next invocation's rows for ``learner`` (caller holds cond); ``handed``: its first batch goes
        to the caller at once (an inline pull), the rest are staged; ``rows``: one batch of that size (replay)."""

    @abstractmethod
    def _gather(self, claim: Claim) -> list[dict[str, torch.Tensor]]:
        """Gather the claimed rows, one part per training batch where it can (records the draw on ``claim``)."""

    def _counted(self, learner: int, info: BatchInfo, rows: int, reserved: bool) -> None:
        """A batch of ``rows`` reached ``learner``: count it (outside cond); ``reserved``: its rows were reserved
        when claimed."""

    def _abandon(self, claim: Claim) -> None:
        """An invocation failed: give back what :meth:`_begin` claimed."""

    def _refuse(self, learner: int) -> None:
        """Raise instead of waiting when waiting is not wanted (non-blocking rate limits)."""

    @abstractmethod
    def _describe_wait(self, learner: int) -> str: ...

    def _local(self, learner: int) -> bool:
        """Whether gathered rows are already on ``learner``'s device (no transfer to check for)."""
        return False

    def _passes(self, exc: Exception) -> bool:
        """Whether an invocation's error is its caller's to handle rather than a failure of the path (a group's
        timeout, which every rank raised alike)."""
        return False

    def _version(self) -> int:
        """Transitions ingested so far: a batch's ``version_at_delivery``."""
        return self.buffer.inserted

    def _batch(self, data: dict[str, torch.Tensor], info: BatchInfo) -> Batch:
        """The batch handed to the learner (a path whose rows carry more than their slots says so here)."""
        return Batch(data, info)

    # -- the one place a BatchInfo is made -----------------------------------------------
    def _info(self, claim: Claim, part: int, pull_index: int = -1, version_at_delivery: int = -1) -> BatchInfo:
        """Batch ``part`` of ``claim``'s provenance; a staged batch's pull index and version are set at hand-over."""
        place = claim.place(part)
        return BatchInfo(
            learner=claim.learner,
            pull_index=pull_index,
            sampled_at_pull=claim.sampled_at_pull,
            buffer_version=claim.buffer_version,
            iteration=place.iteration,
            epoch=place.epoch,
            minibatch=place.minibatch,
            num_minibatches=place.num_minibatches,
            last=place.last,
            rows=place.rows,
            weights=place.weights,
            mode=claim.mode,
            version_at_delivery=version_at_delivery,
            attachment=claim.attached[part] if claim.attached is not None else None,
        )

    # -- invocations ------------------------------------------------------------------
    def _claim(self, learner: int, handed: bool, rows: int = 0) -> tuple[Claim, int]:
        """Claim an invocation (caller holds cond); with ``handed``, its first batch counts as pulled now."""
        staged = self.staged[learner]
        index = self.pulls[learner]
        claim = self._begin(learner, index + len(staged), handed, rows)
        stats = self.stats
        stats.invocations += 1
        if handed:
            self.pulls[learner] = index + 1
            stats.pulls += 1
            stats.delivered_rows += claim.sizes[0]
        return claim, index

    def _invoke(self, claim: Claim) -> list[dict[str, torch.Tensor]]:
        """Run one invocation: the operators' functions directly without a hook or tracing, else the graph."""
        graph = self.graph
        mode = claim.mode  # the mode it was claimed under (a switch may have come since)
        g = self.g_float if mode is self.mode else float(mode.granularity)
        try:
            if self._hookless and not graph.tracer.enabled:  # the hot path: no packet, no spans
                t0 = time.perf_counter()
                parts = self._gather(claim)
                if not self._local(claim.learner):
                    parts = self._to_learner(parts, self.devices[claim.learner])
                graph.timings.append((time.perf_counter() - t0, g))
                graph.invocations += 1
                return parts
            return graph.run(Packet([], claim), g).parts
        except BaseException as exc:
            self._abandon(claim)  # rows, promises and reservations go back whatever stopped it
            if not isinstance(exc, Exception) or self._passes(exc):  # the caller's, not a failure of the path
                raise
            fail(self.failure, "delivery operator", exc)

    def _gather_op(self, packet: Packet) -> Packet:
        packet.parts = self._gather(packet.record)
        return packet

    def _to_learner_op(self, packet: Packet) -> Packet:
        packet.parts = self._to_learner(packet.parts, self.devices[packet.record.learner])
        return packet

    @staticmethod
    def _to_learner(parts: list[dict[str, torch.Tensor]], device: torch.device) -> list[dict[str, torch.Tensor]]:
        if all(v.device == device for part in parts for v in part.values()):
            return parts
        return [
            {k: v if v.device == device else v.to(device, non_blocking=device.type == "cuda") for k, v in part.items()}
            for part in parts
        ]

    def _split_op(self, packet: Packet) -> Packet:
        """One part per training batch again, after a hook that may have joined or re-split them."""
        sizes = list(packet.record.sizes)
        parts = packet.parts
        aligned = len(parts) == len(sizes) and all(next(iter(p.values())).shape[0] == s for p, s in zip(parts, sizes))
        if packet.attached is not None:  # each training batch keeps what the hook attached to it
            if not aligned:
                raise SpecError(
                    f"the delivery hook attached objects to writes of {[rows_of(p) for p in parts]} rows; a hook "
                    f"that attaches writes one training batch per write (batches of {sizes} rows)"
                )
            packet.record.attached = packet.attached
        if aligned:
            return packet
        whole = concat(parts)
        _kept_rows(whole, sizes)
        chunks = {k: torch.split(v, sizes) for k, v in whole.items()}
        packet.parts = [{k: c[i] for k, c in chunks.items()} for i in range(len(sizes))]
        return packet

    # -- the worker ---------------------------------------------------------------------
    def _claim_work(self) -> Claim | None:
        idle = [r for r in range(self.num_learners) if not self.staged[r] and not self._busy[r]]
        learner = next((r for r in idle if self._ready(r)), None)
        self._starved = learner is None and bool(idle)  # someone needs a batch but the buffer cannot serve it yet
        if learner is None:
            return None
        self._busy[learner] = True
        return self._claim(learner, handed=False)[0]

    def _idle(self) -> None:
        starved = self._starved and self.mode.overlap and not self._paused  # else the worker claimed nothing
        self._starved = False
        self._data_waiters += starved
        try:
            self.cond.wait(POLL_S)
        finally:
            self._data_waiters -= starved

    def _work(self, claim: Claim) -> None:
        learner = claim.learner
        staged: list[Staged] = []
        try:
            with self.streams[learner].active():
                parts = self._invoke(claim)
                event = self.streams[learner].record()
            staged = [Staged(part, self._info(claim, i), event) for i, part in enumerate(parts)]
        finally:
            with self._lock:  # in one hold: a pull never sees the learner neither busy nor served
                self._busy[learner] = False
                self.staged[learner].extend(staged)
                self.cond.notify_all()

    # -- pull -----------------------------------------------------------------------------
    def pull(self, learner: int = 0, timeout: float | None = None) -> Batch:
        """The next training-ready batch for ``learner``, by whichever route the current mode takes.

        A pull waiting under one mode is handed to the other when the mode switches.
        """
        t0, deadline = self._deadline(learner, timeout)
        while True:
            if self.mode.overlap:
                batch = self._pull_staged(learner, deadline)
            else:
                batch = self._pull_inline(learner, deadline)
            if batch is not None:
                self.stats.pull_s += time.perf_counter() - t0
                return batch

    def _deadline(self, learner: int, timeout: float | None) -> tuple[float, tuple[float, float]]:
        """A pull's start, and its deadline (when, and the timeout it came from); checks the learner and failures."""
        t0 = time.perf_counter()
        self.failure.check()
        if not 0 <= learner < self.num_learners:
            raise ValueError(f"learner={learner}: expected a rank in [0, {self.num_learners})")
        limit = self.timeout if timeout is None else timeout
        return t0, (t0 + limit, limit)

    def pull_rows(self, learner: int, rows: int, timeout: float | None = None) -> Batch:  # replay's: .replay
        raise SemanticsError("pull(rows=...) draws from a replay buffer; on-policy mini-batches are the plan's")

    def _pull_inline(self, learner: int, deadline: tuple[float, float]) -> Batch | None:
        """Inline: a leftover staged batch, else an invocation in this thread; None if the mode switched."""
        lock = self._invoke_locks[learner]
        while True:
            item = claim = None
            if not lock.acquire(True, max(0.0, deadline[0] - time.perf_counter())):  # another pull's invocation
                raise self._held_up(deadline[1], f"pull for learner {learner}")
            try:
                with self._lock:
                    if self.mode.overlap:
                        return None
                    if self.staged[learner]:
                        item, index = self._pop(learner)
                    elif not self._busy[learner] and self._ready(learner):
                        # never beside the worker's invocation for this learner (it ran under the mode just left):
                        # its batches come first, in the order claimed; busy until this one's rest is staged
                        claim, index = self._claim(learner, handed=True)
                        self._busy[learner] = True
                if claim is not None:
                    return self._deliver(claim, index)
            finally:
                lock.release()
            if item is not None:
                return self._hand_over(learner, item, index)
            # nothing to serve yet: wait for data without the invocation lock (a checkpoint may need it)
            with self._lock:

                def servable() -> bool:
                    ready = not self._busy[learner] and self._ready(learner)
                    return bool(self.staged[learner]) or ready or self.mode.overlap

                if not servable():  # re-checked: another pull of this learner may have staged leftovers since
                    if not self._busy[learner]:  # busy: a batch is on its way, not refused
                        self._refuse(learner)
                    self._wait(learner, deadline, servable)

    def _deliver(self, claim: Claim, index: int) -> Batch:
        """Run an inline invocation (caller holds the invocation lock): its first batch now, the rest staged.

        The learner counts as busy from the claim until the rest is staged, so a worker started by a switch
        to overlap meanwhile claims only what comes after (batches stay in the order they were claimed).
        """
        learner = claim.learner
        rest: list[Staged] = []
        try:
            parts = self._invoke(claim)
            rest = [Staged(part, self._info(claim, i), None) for i, part in enumerate(parts[1:], start=1)]
        finally:
            with self._lock:  # in one hold: the rest is staged as the learner stops being busy
                self.staged[learner].extend(rest)
                self._busy[learner] = False
                self.cond.notify_all()
        info = self._info(claim, 0, index, self._version())
        # counted before the invocation lock goes: a checkpoint (which pauses delivery by taking the lock)
        # then never sees this pull's index without its rows counted
        self._counted(learner, info, claim.sizes[0], False)
        return self._batch(parts[0], info)

    def _pull_staged(self, learner: int, deadline: tuple[float, float]) -> Batch | None:
        """Overlapped: the next batch the worker staged; None if the mode switched to inline meanwhile."""
        with self._lock:
            staged = self.staged[learner]
            if not staged:
                if not self._busy[learner] and not self._ready(learner):
                    self._refuse(learner)
                self._wait(learner, deadline, lambda: bool(staged) or not self.mode.overlap, data=False)
                if not staged:
                    return None
            item, index = self._pop(learner)
        # the worker may stage the next invocation: woken when the hand-over ends (_hand_over), not here, so it
        # does not take the interpreter from this pull halfway through
        return self._hand_over(learner, item, index)

    def _wait(
        self, learner: int, deadline: tuple[float, float], done: Callable[[], bool], data: bool = True
    ) -> None:
        """Wait (holding cond) until ``done()``; bounded by ``deadline`` (when, and the timeout it came from)."""
        t_wait = time.perf_counter()
        self._data_waiters += data
        try:
            while not done():
                self.failure.check()
                left = deadline[0] - time.perf_counter()
                if left <= 0:
                    raise ConduitTimeout(
                        f"timed out after {deadline[1]:.3g}s waiting for {self._describe_wait(learner)}"
                    )
                self.cond.wait(min(left, POLL_S))
            self.failure.check()
        finally:
            self._data_waiters -= data
            self.stats.wait_s += time.perf_counter() - t_wait

    def _pop(self, learner: int) -> tuple[Staged, int]:
        """Take the next staged batch (caller holds cond; the caller owes ``handing`` its decrement)."""
        item = self.staged[learner].popleft()
        index = self.pulls[learner]
        self.pulls[learner] += 1
        self.handing += 1
        self.stats.pulls += 1
        self.stats.delivered_rows += len(item.info.rows)
        return item, index

    def _hand_over(self, learner: int, item: Staged, index: int) -> Batch:
        try:
            handoff(item.data, item.event)
            info = item.info._replace(pull_index=index, version_at_delivery=self._version())
            self._counted(learner, info, len(info.rows), True)
        finally:
            with self._lock:
                self.handing -= 1
                if not self.handing:  # (the last hand-over of concurrent pulls wakes for all of them)
                    # the worker may stage the next invocation; a checkpoint may wait for the counts to settle
                    self.cond.notify_all()
        return self._batch(item.data, info)

    # -- control ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def settled(self, timeout: float | None = None) -> Iterator[None]:
        """Hold ``cond`` with every handed-out batch accounted for (a point where the counts agree).

        A pull takes a staged batch under ``cond`` and then, outside it, counts
        the rows as sampled (the rate limiter, ``max_times_sampled``). Inside
        this block no batch is between the two, and none can be taken: what
        is staged, the pull counts, the limiter and the rows' sample counts
        describe one point. For checkpoints, with delivery :meth:`paused`.
        """
        deadline = time.perf_counter() + (self.timeout if timeout is None else timeout)
        with self._lock:
            while self.handing:
                self.failure.check()
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise ConduitTimeout("timed out waiting for handed-out batches to be counted")
                self.cond.wait(min(left, POLL_S))
            yield

    def close(self, timeout: float) -> list[str]:
        """Stop the worker, then drop what is staged (batches never delivered count as never sampled)."""
        left = super().close(timeout)
        with self._lock:  # after the worker stopped: its last invocation is staged
            for learner, staged in enumerate(self.staged):
                for item in staged:
                    self._unstage(learner, item)
                staged.clear()
        return left

    def _unstage(self, learner: int, item: Staged) -> None:
        """A staged batch will never be delivered (caller holds cond)."""

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Pull counts and staged batches, on the host (call inside :meth:`settled`, the path :meth:`paused`)."""
        staged = [[{"data": {k: v.cpu() for k, v in s.data.items()}, "info": s.info.state_dict()} for s in q]
                  for q in self.staged]
        return {"pulls": list(self.pulls), "staged": staged}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Pull counts and staged batches, handed out first. Into fewer learners, the batches staged for the
        learners gone go to those left, in turn, after their own (every staged row is delivered: a queue's rows
        were taken when drawn); into more, the new learners start at pull 0."""
        n = self.num_learners
        with self._lock:
            self.pulls = ([int(p) for p in state["pulls"]] + [0] * n)[:n]
            moved = 0
            for saved, items in enumerate(state["staged"]):
                for item in items:
                    learner = saved if saved < n else moved % n
                    moved += saved >= n
                    data = {k: v.to(self.devices[learner]) for k, v in item["data"].items()}
                    self.staged[learner].append(Staged(data, BatchInfo.from_state_dict(item["info"]), None))


def _kept_rows(whole: dict[str, torch.Tensor], sizes: Sequence[int]) -> None:
    """A delivery hook keeps one output row per input row (the batches' sizes and provenance depend on it)."""
    rows = next(iter(whole.values())).shape[0] if whole else 0
    if rows != sum(sizes):
        raise ConduitError(
            f"the delivery hook wrote {rows} rows but this invocation delivers {sum(sizes)} "
            f"(batches of {sizes}); a delivery hook must keep one output row per input row"
        )
