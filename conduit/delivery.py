"""The delivery path: buffer rows become training-ready batches on each learner's device.

Graph: ``select+gather -> hook -> to_learner -> split`` (processing, processing,
transfer, processing). One invocation handles ``g`` training batches: off-policy
it samples ``g·B`` rows in one gather and splits them into ``g`` batches; on-policy
``g = 1`` prepares an epoch's ``M`` mini-batches at once and ``g = 1/M`` one
mini-batch at a time.

Timing (``overlap``): inline runs an invocation in the pulling thread when that
learner has nothing staged; overlapped lets the path's worker stage at most one
invocation ahead per learner (so a staged batch is at most ``g`` batches older
than an inline sample would have been), on a dedicated CUDA stream whose event
the learner's stream waits on at hand-off.

Each learner has its own staging queue and pull counter; several data-parallel
learners each pull their own batches.
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
from conduit.buffer import IterationBuffer, ReplayBuffer, Sampled
from conduit.errors import ConduitError, RateLimited
from conduit.executor import FailureBox, StreamSet, Worker, fail, handoff, hold_still, in_worker, wait_until
from conduit.hooks import EXPERIENCE_BUFFER, LEARNER, Reader, Writer
from conduit.memory import BatchMemory
from conduit.operators import FnOperator, Graph, HookOperator, OperatorKind, Packet
from conduit.ratelimit import RateLimiter
from conduit.scheduling.space import Mode
from conduit.trace import Tracer

__all__ = ["DeliveryPath", "DeliveryStats", "MinibatchDelivery", "ReplayDelivery"]

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
        self.cond = threading.Condition()
        self.staged: list[deque[_Staged]] = [deque() for _ in self.devices]
        self.pulls = [0] * self.num_learners
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
        handoff(item.data, item.event)
        info = BatchInfo(pull_index=index, version_at_delivery=self._version(), **item.info)  # type: ignore[arg-type]
        self._on_pulled(learner, info)
        self.stats.pull_s += time.perf_counter() - t0
        return Batch(item.data, info)

    def _pull_direct(self, learner: int) -> Batch | None:
        """The inline fast path, or None to take the general one (see :meth:`ReplayDelivery._pull_direct`)."""
        return None

    def _pop(self, learner: int) -> tuple[_Staged, int]:
        """Take the next staged batch (caller holds cond)."""
        item = self.staged[learner].popleft()
        index = self.pulls[learner]
        self.pulls[learner] += 1
        self.stats.pulls += 1
        self.stats.delivered_rows += len(item.info["indices"])  # type: ignore[arg-type]
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


class ReplayDelivery(DeliveryPath):
    """Off-policy: sample ``g·B`` rows per invocation from the replay ring."""

    def __init__(
        self,
        *,
        buffer: ReplayBuffer,
        batch_size: int,
        limiter: RateLimiter,
        block: bool = True,
        on_sampled: Callable[[], None] | None = None,
        batch_pool: int = 0,
        **kw: object,
    ) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.buffer = buffer
        self.batch_size = batch_size
        self.batch_pool = batch_pool
        self._pools: list[deque[dict[str, torch.Tensor]]] = [deque() for _ in self.devices]
        if batch_pool:  # the explicit ring decides
            self._memory = [None] * len(self.devices)
        self.limiter = limiter
        self.block = block
        self._on_sampled = on_sampled
        self._invocation = 0
        # _pull_direct's placement check, redone only when the buffer's storage object changes: comparing
        # torch devices costs microseconds on a pull's hot path
        self._direct_storage: object = None
        self._direct_learners = [False] * len(self.devices)

    @property
    def min_rows(self) -> int:
        return self.limiter.min_size

    def _can_produce(self, learner: int) -> bool:
        rows = int(self.mode.granularity) * self.batch_size
        return self.limiter.can_sample(rows, self.buffer.size)

    def _pull_direct(self, learner: int) -> Batch | None:
        """Inline, no hook, rows already on the learner's device, nobody tracing: sample and hand over.

        The same operators as the graph (select+gather; to_learner and split are
        no-ops here) without building a packet. At ``g > 1`` the invocation's
        other ``g - 1`` batches are staged, with their rows reserved, and later
        pulls take them through the general path. Right after the previous gather
        every attribute read here costs several times its warm time, so what can
        be decided once (the placement check) is. Anything else — waiting, staged
        leftovers, a hook, a transfer — takes the general path.
        """
        buffer = self.buffer
        storage = buffer.storage
        if storage is not self._direct_storage:  # placed, or migrated: which learners its rows already sit on
            # the list first: a concurrent pull that sees the new storage also sees its list
            self._direct_learners = [
                self._hookless and storage is not None and storage.devices == (d,) for d in self.devices
            ]
            self._direct_storage = storage
        mode = self.mode
        if not self._direct_learners[learner] or self.graph.tracer.enabled:
            return None
        g = int(mode.granularity)  # off-policy: a whole number of batches
        n = self.batch_size
        limiter = self.limiter
        with self._invoke_locks[learner]:
            with self.cond:
                if self.staged[learner] or not limiter.can_sample(g * n, buffer.table.count):
                    return None
                index = self.pulls[learner]
                self.pulls[learner] = index + 1
                invocation = self._invocation
                self._invocation = invocation + 1
                stats = self.stats
                stats.pulls += 1
                stats.invocations += 1
                stats.delivered_rows += n
                if g > 1:
                    limiter.reserve((g - 1) * n)  # the batches staged below, committed as they are pulled
            t0 = time.perf_counter()
            try:
                if g == 1:  # what _sample_batches does at g = 1, two calls shorter (~2-5% of a pull at dim 128)
                    memory = self._memory[learner]
                    out = memory.take(buffer.spec, n) if memory is not None else self._recycled(learner, n)
                    s = buffer.sample(n, out=out)
                    parts = [s.data]
                else:
                    parts, s = self._sample_batches(learner, g)
            except Exception as exc:
                if g > 1:
                    limiter.release((g - 1) * n)
                fail(self.failure, "delivery operator", exc)
            graph = self.graph
            graph.timings.append((time.perf_counter() - t0, float(g)))
            graph.invocations += 1
            if g > 1:
                rest = [
                    _Staged(part, self._info(learner, index, invocation, mode, s, i), None)
                    for i, part in enumerate(parts[1:], start=1)
                ]
                with self.cond:
                    self.staged[learner].extend(rest)
        indices, ids, weights = s.indices, s.ids, s.weights
        if g > 1:  # the first batch's rows
            indices, ids, weights = indices[:n], ids[:n], None if weights is None else weights[:n]
        # what _on_pulled does, for a batch sampled and handed over in one step (no reservation between)
        limiter.sampled(n)
        if buffer.max_times_sampled is not None:
            buffer.delivered(indices, ids)
        if self._on_sampled is not None and limiter.samples_per_insert is not None:
            self._on_sampled()  # actors may be waiting for learners to sample
        info = BatchInfo(
            learner, index, index, s.version, invocation, None, None, None, False, indices, ids, weights,
            mode, buffer.inserted,
        )
        return Batch(parts[0], info)

    def _sample_batches(self, learner: int, g: int) -> tuple[list[dict[str, torch.Tensor]], Sampled]:
        """``g`` training batches from one draw, and that draw.

        One batch: gathered into the memory :meth:`_recycled` offers. Several, of small
        transitions (no field large enough for recycled memory): one gather of ``g·B``
        rows split into views — a kernel call a field instead of ``g``. Otherwise one
        gather a batch into its own memory (:meth:`ReplayBuffer.sample_split`: one
        ``g·B`` allocation above glibc's mmap ceiling page-faults afresh every time).
        """
        n = self.batch_size
        outs = [self._recycled(learner, n) for _ in range(g)]
        if g == 1:
            s = self.buffer.sample(n, out=outs[0])
            return [s.data], s
        if any(o is not None for o in outs):
            return self.buffer.sample_split([n] * g, outs=outs)
        s = self.buffer.sample(g * n)
        parts = [{k: v[i * n : (i + 1) * n] for k, v in s.data.items()} for i in range(g)]
        return parts, s

    def _info(
        self, learner: int, sampled_at_pull: int, invocation: int, mode: Mode, s: Sampled, i: int
    ) -> dict[str, object]:
        """Provenance of batch ``i`` of an invocation (a staged item's info: BatchInfo fields but the pull's)."""
        sl = slice(i * self.batch_size, (i + 1) * self.batch_size)
        return dict(
            learner=learner, sampled_at_pull=sampled_at_pull, buffer_version=s.version, iteration=invocation,
            epoch=None, minibatch=None, num_minibatches=None, last=False, indices=s.indices[sl], ids=s.ids[sl],
            weights=None if s.weights is None else s.weights[sl], mode=mode,
        )

    def _refuse(self, learner: int) -> None:
        if not self.block and self.buffer.ready(self.min_rows):
            raise RateLimited(f"a batch now would break the sample/insert ratio ({self.limiter.describe()})")

    def _on_pulled(self, learner: int, info: BatchInfo) -> None:
        self.limiter.commit(len(info.indices))
        self.buffer.delivered(info.indices, info.ids)
        if self._on_sampled is not None and self.limiter.samples_per_insert is not None:
            self._on_sampled()  # actors may be waiting for learners to sample

    def _abandon(self, packet: Packet) -> None:
        self.limiter.release(packet.meta["rows"])

    def release_reservations(self) -> None:
        """Staged batches that will never be delivered do not count as sampled."""
        with self.cond:
            for staged in self.staged:
                for item in staged:
                    self.limiter.release(len(item.info["indices"]))  # type: ignore[arg-type]
                staged.clear()

    def _version(self) -> int:
        return self.buffer.inserted

    def _begin(self, learner: int) -> Packet:
        g = int(self.mode.granularity)
        self.limiter.reserve(g * self.batch_size)
        self._invocation += 1
        return Packet(
            [],
            {
                "learner": learner,
                "device": self.devices[learner],
                "rows": g * self.batch_size,
                "sizes": [self.batch_size] * g,
                "sampled_at_pull": self.pulls[learner] + len(self.staged[learner]),
                "invocation": self._invocation - 1,
                "granularity": float(self.mode.granularity),
                "mode": self.mode,
            },
        )

    def _recycled(self, learner: int, rows: int) -> dict[str, torch.Tensor] | None:
        """Memory for the next batch: released host memory (default), or the ``batch_pool`` ring.

        Default on the CPU: memory of batches the learner has dropped (``BatchMemory``;
        nothing alive is ever overwritten). With ``batch_pool``: the oldest of this
        learner's ``batch_pool`` buffers (plus room for staging) — a batch stays valid
        for ``batch_pool - 1`` further pulls, then its memory receives a new batch.
        """
        spec = self.buffer.spec
        if spec is None:
            return None
        memory = self._memory[learner]
        if memory is not None:
            return memory.take(spec, rows)
        if not self.batch_pool:
            return None
        ring = self._pools[learner]
        # one buffer per batch: the learner's last ``batch_pool`` batches, plus the
        # invocation's other g - 1 staged ones, plus one prefetched invocation ahead
        g = int(self.mode.granularity)
        depth = self.batch_pool + g - 1 + (1 if self.mode.overlap else 0)
        if len(ring) >= depth:
            out = ring.popleft()
            first = next(iter(out.values()))
            f = next(iter(spec))
            if first.shape[0] == rows and tuple(first.shape[1:]) == f.shape and len(out) == len(spec):
                ring.append(out)
                return out
        out = {f.name: torch.empty((rows, *f.shape), dtype=f.dtype, device=self.devices[learner]) for f in spec}
        ring.append(out)
        return out

    def _select_gather(self, packet: Packet) -> Packet:
        packet.parts, sampled = self._sample_batches(packet.meta["learner"], len(packet.meta["sizes"]))
        packet.meta.update(
            indices=sampled.indices, ids=sampled.ids, weights=sampled.weights, version=sampled.version
        )
        return packet

    def _infos(self, packet: Packet) -> list[dict[str, object]]:
        m = packet.meta
        drawn = Sampled({}, m["indices"], m["ids"], m["weights"], m["version"])
        return [
            self._info(m["learner"], m["sampled_at_pull"], m["invocation"], m["mode"], drawn, i)
            for i in range(len(m["sizes"]))
        ]

    def _describe_wait(self, learner: int) -> str:
        return (
            f"a batch for learner {learner}: the buffer holds {self.buffer.size} rows and sampling starts at "
            f"{self.min_rows} (min_size_to_sample); push more rollouts, or flush() units still pending ingestion; "
            f"rate limiter: {self.limiter.describe()}"
        )


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

    def _can_produce(self, learner: int) -> bool:
        iteration, _ = self.cursor[learner]
        with self.buffer.lock:
            return iteration in self.buffer.sealed

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
        # per mini-batch: no epoch-sized allocation; into released memory where there is some
        packet.parts = [
            self.buffer.gather(it, r, out=None if memory is None or spec is None else memory.take(spec, len(r)))
            for r in rows
        ]
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
                    indices=rows, ids=ids, weights=None, mode=meta["mode"],
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
