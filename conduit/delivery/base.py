"""What both delivery paths share: staging, pull, the worker's loop, and the graph they run.

See :mod:`conduit.delivery` for the path as a whole; :mod:`~conduit.delivery.replay` and
:mod:`~conduit.delivery.minibatch` say what one invocation produces off- and on-policy.
"""

from __future__ import annotations

import contextlib
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from conduit.batch import Batch, BatchInfo
from conduit.errors import ConduitError
from conduit.executor import FailureBox, StreamSet, Worker, fail, handoff, hold_still, in_worker, wait_until
from conduit.hooks import EXPERIENCE_BUFFER, LEARNER, Reader, Writer
from conduit.memory import BatchMemory
from conduit.operators import FnOperator, Graph, HookOperator, OperatorKind, Packet
from conduit.scheduling.space import Mode
from conduit.trace import Tracer

__all__ = ["DeliveryPath", "DeliveryStats", "HookFn"]

HookFn = Callable[[Reader, Writer], object]


class _Staged(NamedTuple):
    data: dict[str, torch.Tensor]
    info: dict[str, object]  # BatchInfo fields but pull_index / version_at_delivery
    event: torch.cuda.Event | None


@dataclass
class DeliveryStats:
    pulls: int = 0
    invocations: int = 0
    delivered_rows: int = 0
    pull_s: float = 0.0  # total time spent inside pull (exposed delivery latency)
    wait_s: float = 0.0  # of which waiting for data or the worker


class DeliveryPath(ABC):
    """Shared staging, pull and worker logic; subclasses say what one invocation produces."""

    def __init__(
        self,
        *,
        mode: Mode,
        hook: HookFn | None,
        tracer: Tracer,
        failure: FailureBox,
        timeout: float,
        learner_devices: Sequence[torch.device],
        recycle_batches: bool = True,
    ) -> None:
        self.mode = mode
        self.failure = failure
        self.timeout = timeout
        self.devices = list(learner_devices)
        # host batches go back to a free list once the learner drops them (conduit.memory); a GPU
        # learner's batches come from torch's caching allocator, which already recycles them
        self._memory = [BatchMemory() if recycle_batches and d.type == "cpu" else None for d in self.devices]
        self.num_learners = len(self.devices)
        # the condition's lock by name: ``with self._lock`` enters and leaves in C, ``with self.cond`` through two
        # Python methods around it (the inline pull's hot path takes it once per batch)
        self._lock = threading.RLock()
        self.cond = threading.Condition(self._lock)
        self.staged: list[deque[_Staged]] = [deque() for _ in self.devices]
        self.pulls = [0] * self.num_learners
        self.handing = 0  # batches popped from staging whose accounting (_on_pulled) has not run yet
        self._busy = [False] * self.num_learners
        self._data_waiters = 0  # threads waiting for buffer data (worker or inline pulls)
        self._paused = False
        self._invoke_locks = [threading.Lock() for _ in self.devices]
        self.stats = DeliveryStats()
        self.streams = [StreamSet(d) for d in self.devices]
        self._hookless = hook is None
        ops = [FnOperator("select_gather", OperatorKind.PROCESSING, self._select_gather)]
        if hook is not None:
            ops.append(HookOperator("hook", hook, EXPERIENCE_BUFFER, LEARNER))
        ops.append(FnOperator("to_learner", OperatorKind.TRANSFER, self._to_learner))
        ops.append(FnOperator("split", OperatorKind.PROCESSING, self._split))
        self.graph = Graph("delivery", ops, tracer)
        self.worker: Worker | None = None

    def start(self) -> None:
        if self.mode.overlap and self.worker is None:
            worker = Worker("delivery", self._step, self.failure, self.cond)
            worker.start()
            with self.cond:
                self.worker = worker

    def notify(self) -> None:
        """New data or a sealed iteration: wake whoever waits for it, and nobody else.

        A needless wake-up costs more than it looks on a loaded CPU: the woken
        thread must win the GIL and a core from the learner.
        """
        with self.cond:
            if self._data_waiters:
                self.cond.notify_all()

    # -- subclass hooks -------------------------------------------------------
    @abstractmethod
    def _can_produce(self, learner: int) -> bool:
        """Whether an invocation for ``learner`` can run now (caller holds cond)."""

    @abstractmethod
    def _begin(self, learner: int) -> Packet:
        """Claim the next invocation's rows for ``learner`` (caller holds cond)."""

    @abstractmethod
    def _select_gather(self, packet: Packet) -> Packet:
        """Gather the claimed rows (processing)."""

    @abstractmethod
    def _infos(self, packet: Packet) -> list[dict[str, object]]:
        """Per-batch provenance (BatchInfo fields) for the split parts."""

    def _on_pulled(self, learner: int, info: BatchInfo) -> None:
        """Called outside cond after a batch was handed to ``learner``."""

    def _abandon(self, packet: Packet) -> None:
        """An invocation failed: give back what :meth:`_begin` claimed."""

    def _refuse(self, learner: int) -> None:
        """Raise instead of waiting when waiting is not wanted (non-blocking rate limits)."""

    @abstractmethod
    def _describe_wait(self, learner: int) -> str: ...

    @abstractmethod
    def _version(self) -> int:
        """Transitions ingested so far (the buffer version)."""

    # -- graph operators ------------------------------------------------------
    def _to_learner(self, packet: Packet) -> Packet:
        device: torch.device = packet.meta["device"]
        if all(v.device == device for part in packet.parts for v in part.values()):
            return packet
        packet.parts = [
            {k: v if v.device == device else v.to(device, non_blocking=device.type == "cuda") for k, v in part.items()}
            for part in packet.parts
        ]
        return packet

    def _split(self, packet: Packet) -> Packet:
        sizes: list[int] = packet.meta["sizes"]
        if len(sizes) == 1 and len(packet.parts) == 1 and next(iter(packet.parts[0].values())).shape[0] == sizes[0]:
            return packet
        if len(packet.parts) == len(sizes) and all(
            next(iter(p.values())).shape[0] == s for p, s in zip(packet.parts, sizes)
        ):
            return packet
        whole = packet.parts[0] if len(packet.parts) == 1 else {
            k: torch.cat([p[k] for p in packet.parts]) for k in packet.parts[0]
        }
        rows = next(iter(whole.values())).shape[0]
        if rows != sum(sizes):
            raise ConduitError(
                f"the delivery hook wrote {rows} rows but this invocation delivers {sum(sizes)} "
                f"(batches of {sizes}); a delivery hook must keep one output row per input row"
            )
        chunks = {k: torch.split(v, sizes) for k, v in whole.items()}
        packet.parts = [{k: c[i] for k, c in chunks.items()} for i in range(len(sizes))]
        return packet

    # -- invocations ----------------------------------------------------------
    def _invoke(self, learner: int, packet: Packet) -> list[_Staged]:
        granularity = packet.meta["granularity"]
        try:
            packet = self.graph.run(packet, granularity)
        except Exception as exc:
            self._abandon(packet)
            fail(self.failure, "delivery operator", exc)
        infos = self._infos(packet)
        event = self.streams[learner].record() if in_worker() else None  # inline: the caller's own stream
        return [_Staged(part, info, event) for part, info in zip(packet.parts, infos)]

    def _step(self) -> None:
        with self.cond:
            if not self.mode.overlap or self._paused:  # retired (switched to inline) or paused
                self.cond.wait(0.05)
                return
            idle = [r for r in range(self.num_learners) if not self.staged[r] and not self._busy[r]]
            learner = next((r for r in idle if self._can_produce(r)), None)
            if learner is None:
                starved = bool(idle)  # someone needs a batch but the buffer cannot serve it yet
                self._data_waiters += starved
                try:
                    self.cond.wait(0.05)
                finally:
                    self._data_waiters -= starved
                return
            self._busy[learner] = True
            packet = self._begin(learner)
        try:
            with self.streams[learner].active():
                staged = self._invoke(learner, packet)
        finally:
            with self.cond:
                self._busy[learner] = False
        with self.cond:
            self.staged[learner].extend(staged)
            self.stats.invocations += 1
            self.cond.notify_all()

    # -- pull -----------------------------------------------------------------
    def pull(self, learner: int = 0, timeout: float | None = None) -> Batch:
        t0 = time.perf_counter()
        self.failure.check()
        if not 0 <= learner < self.num_learners:
            raise ValueError(f"learner={learner}: expected a rank in [0, {self.num_learners})")
        timeout = self.timeout if timeout is None else timeout
        if not self.mode.overlap:
            direct = self._pull_direct(learner)
            if direct is not None:
                self.stats.pull_s += time.perf_counter() - t0
                return direct
            item, index = self._pull_inline(learner, timeout)
        else:
            with self.cond:
                if not self.staged[learner]:
                    if not self._busy[learner] and not self._can_produce(learner):
                        self._refuse(learner)
                    t_wait = time.perf_counter()
                    wait_until(
                        self.cond, lambda: bool(self.staged[learner]), timeout, self.failure,
                        lambda: self._describe_wait(learner),
                    )
                    self.stats.wait_s += time.perf_counter() - t_wait
                item, index = self._pop(learner)
                self.cond.notify_all()
        try:
            handoff(item.data, item.event)
            info = BatchInfo(pull_index=index, version_at_delivery=self._version(), **item.info)  # type: ignore[arg-type]
            self._on_pulled(learner, info)
        finally:
            with self.cond:
                self.handing -= 1
                if not self.handing:
                    self.cond.notify_all()  # a checkpoint may wait for the counts to settle (settled())
        self.stats.pull_s += time.perf_counter() - t0
        return Batch(item.data, info)

    def _pull_direct(self, learner: int) -> Batch | None:
        """The inline fast path, or None to take the general one (see :meth:`ReplayDelivery._pull_direct`)."""
        return None

    def _pop(self, learner: int) -> tuple[_Staged, int]:
        """Take the next staged batch (caller holds cond; the caller's pull owes ``handing`` its decrement)."""
        item = self.staged[learner].popleft()
        index = self.pulls[learner]
        self.pulls[learner] += 1
        self.handing += 1
        self.stats.pulls += 1
        self.stats.delivered_rows += len(item.info["rows"])  # type: ignore[arg-type]
        return item, index

    def _pull_inline(self, learner: int, timeout: float) -> tuple[_Staged, int]:
        with self._invoke_locks[learner]:
            with self.cond:
                if self.staged[learner]:
                    return self._pop(learner)
                if not self._can_produce(learner):
                    self._refuse(learner)
                    t_wait = time.perf_counter()
                    self._data_waiters += 1
                    try:
                        wait_until(
                            self.cond, lambda: self._can_produce(learner), timeout, self.failure,
                            lambda: self._describe_wait(learner),
                        )
                    finally:
                        self._data_waiters -= 1
                    self.stats.wait_s += time.perf_counter() - t_wait
                packet = self._begin(learner)
            staged = self._invoke(learner, packet)
            with self.cond:
                self.staged[learner].extend(staged)
                self.stats.invocations += 1
                return self._pop(learner)

    @contextlib.contextmanager
    def paused(self, timeout: float | None = None) -> Iterator[None]:
        """No delivery invocation runs inside this block (staged batches can still be pulled)."""
        timeout = self.timeout if timeout is None else timeout
        with contextlib.ExitStack() as stack:
            for lock in self._invoke_locks:
                stack.enter_context(lock)
            stack.enter_context(hold_still(self, lambda: not any(self._busy), timeout, "delivery to pause"))
            yield

    @contextlib.contextmanager
    def settled(self, timeout: float | None = None) -> Iterator[None]:
        """Hold ``cond`` with every handed-out batch accounted for (a point where the counts agree).

        A pull takes a staged batch under ``cond`` and then, outside it, counts
        the rows as sampled (the rate limiter, ``max_times_sampled``). Inside
        this block no batch is between the two, and none can be taken: what
        is staged, the pull counts, the limiter and the rows' sample counts
        describe one point. For checkpoints, with delivery :meth:`paused`.
        """
        timeout = self.timeout if timeout is None else timeout
        with self.cond:
            wait_until(
                self.cond, lambda: not self.handing, timeout, self.failure, lambda: "handed-out batches to be counted"
            )
            yield

    def set_mode(self, mode: Mode, timeout: float | None = None) -> None:
        """Switch timing/granularity; staged batches stay and keep the mode they were made under."""
        if mode == self.mode:
            return
        timeout = self.timeout if timeout is None else timeout
        with self.cond:
            old, self.worker = self.worker, None
            self.mode = mode  # a retiring worker sees inline mode and produces nothing more
            self.cond.notify_all()
        if old is not None:
            old.stop(timeout)
        for lock in self._invoke_locks:  # no inline invocation of the old mode in flight
            with lock:
                pass
        self.start()

    def close(self, timeout: float) -> bool:
        if self.worker is not None:
            return self.worker.stop(timeout)
        return True
