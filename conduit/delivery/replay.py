"""Off-policy delivery: ``g`` training batches sampled from the replay ring per invocation."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import torch

from conduit.batch import Batch, BatchInfo
from conduit.buffer import ReplayBuffer, Sampled
from conduit.delivery.base import DeliveryPath, _Staged
from conduit.delivery.direct import DirectPull, direct_pull
from conduit.errors import RateLimited
from conduit.executor import fail
from conduit.operators import Packet
from conduit.ratelimit import RateLimiter
from conduit.scheduling.space import Mode

__all__ = ["ReplayDelivery"]


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
        self._g_of: tuple[Mode | None, int] = (None, 1)
        # _pull_layered's placement check, redone only when the buffer's storage object changes: comparing
        # torch devices costs microseconds on a pull's hot path
        self._direct_storage: object = None
        self._direct_learners = [False] * len(self.devices)
        # without a delivery hook (which reads rows where the buffer keeps them), a GPU learner's rows are
        # gathered straight onto its device: from host memory through pinned staging (an async DMA), where a
        # host gather then the transfer operator's copy would be a pageable, synchronous one (an H200 VM, a pull
        # of 512 from a pinned ring at dim 1,000: 1.23-1.38 ms before, 0.96-1.10 after)
        self._gather_to = [d if d.type == "cuda" and self._hookless else None for d in self.devices]
        # per learner: the fast inline pull (conduit.delivery.direct) and what it was built for
        self._fast: list[DirectPull | None] = [None] * len(self.devices)
        self._fast_for: list[tuple[object, Mode, int] | None] = [None] * len(self.devices)

    def _whole_g(self, mode: Mode) -> int:
        """``int(mode.granularity)``, remembered per mode: a Fraction's ``__int__`` is Python code, ~1-2 us cold."""
        cached = self._g_of  # one tuple, replaced whole: a concurrent pull never pairs a mode with another's g
        if cached[0] is not mode:
            cached = self._g_of = (mode, int(mode.granularity))
        return cached[1]

    @property
    def min_rows(self) -> int:
        return self.limiter.min_size

    def _can_produce(self, learner: int) -> bool:
        rows = int(self.mode.granularity) * self.batch_size
        return self.limiter.can_sample(rows, self.buffer.size)

    def _pull_direct(self, learner: int) -> Batch | None:
        """The fast inline pull where it applies (:mod:`conduit.delivery.direct`), else :meth:`_pull_layered`."""
        fast = self._fast[learner]
        if fast is not None:
            batch = fast()
            if batch is not None:
                return batch
        memory = self._memory[learner]
        storage, mode, min_bytes = self.buffer.storage, self.mode, memory.min_bytes if memory is not None else 0
        built = self._fast_for[learner]
        if built is None or built[0] is not storage or built[1] is not mode or built[2] != min_bytes:
            self._fast_for[learner] = (storage, mode, min_bytes)
            fast = self._fast[learner] = direct_pull(self, learner)
            if fast is not None:
                batch = fast()
                if batch is not None:
                    return batch
        return self._pull_layered(learner)

    def _pull_layered(self, learner: int) -> Batch | None:
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
        g = self._whole_g(mode)  # off-policy: a whole number of batches
        n = self.batch_size
        limiter = self.limiter
        with self._invoke_locks[learner]:
            with self._lock:
                if self.mode is not mode or self.staged[learner] or not limiter.can_sample(g * n, buffer.table.count):
                    return None  # switched schedule (set_mode), leftovers to hand out, or not enough rows yet
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
                    s = buffer.sample(n, self._gather_to[learner], out)
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
            drawn, weights = s.rows, s.weights
            if g > 1:
                rest = [
                    _Staged(part, self._info(learner, index, invocation, mode, s, i), None)
                    for i, part in enumerate(parts[1:], start=1)
                ]
                with self._lock:
                    self.staged[learner].extend(rest)
                # the first batch's rows
                drawn, weights = drawn[:n], None if weights is None else weights[:n]
            info = BatchInfo(
                learner, index, index, s.version, invocation, None, None, None, False, drawn, weights, mode,
                buffer.inserted,
            )
            # counted before the invocation lock goes: a checkpoint (which pauses delivery by taking the
            # lock) then never sees this pull's index without its rows counted as sampled
            self._on_pulled(learner, info, reserved=False)
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
        to = self._gather_to[learner]
        outs = [self._recycled(learner, n) for _ in range(g)]
        if g == 1:
            s = self.buffer.sample(n, to, outs[0])
            return [s.data], s
        if any(o is not None for o in outs):
            return self.buffer.sample_split([n] * g, to, outs)
        s = self.buffer.sample(g * n, to)
        parts = [{k: v[i * n : (i + 1) * n] for k, v in s.data.items()} for i in range(g)]
        return parts, s

    def _info(
        self, learner: int, sampled_at_pull: int, invocation: int, mode: Mode, s: Sampled, i: int
    ) -> dict[str, object]:
        """Provenance of batch ``i`` of an invocation (a staged item's info: BatchInfo fields but the pull's)."""
        sl = slice(i * self.batch_size, (i + 1) * self.batch_size)
        return dict(
            learner=learner, sampled_at_pull=sampled_at_pull, buffer_version=s.version, iteration=invocation,
            epoch=None, minibatch=None, num_minibatches=None, last=False, rows=s.rows[sl],
            weights=None if s.weights is None else s.weights[sl], mode=mode,
        )

    def _refuse(self, learner: int) -> None:
        if not self.block and self.buffer.ready(self.min_rows):
            raise RateLimited(f"a batch now would break the sample/insert ratio ({self.limiter.describe()})")

    def _on_pulled(self, learner: int, info: BatchInfo, reserved: bool = True) -> None:
        limiter = self.limiter
        if reserved:
            limiter.commit(len(info.rows))
        else:  # the direct path samples and hands over one batch in one step: no reservation between
            limiter.sampled(self.batch_size)
        buffer = self.buffer
        if buffer.max_times_sampled is not None:  # else nothing is counted per row (and the arrays stay unmade)
            buffer.delivered(info.indices, info.ids)
        if self._on_sampled is not None and self.limiter.samples_per_insert is not None:
            self._on_sampled()  # actors may be waiting for learners to sample

    def _abandon(self, packet: Packet) -> None:
        self.limiter.release(packet.meta["rows"])

    def release_reservations(self) -> None:
        """Staged batches that will never be delivered do not count as sampled."""
        with self.cond:
            for staged in self.staged:
                for item in staged:
                    self.limiter.release(len(item.info["rows"]))  # type: ignore[arg-type]
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
        packet.meta.update(drawn=sampled.rows, weights=sampled.weights, version=sampled.version)
        return packet

    def _infos(self, packet: Packet) -> list[dict[str, object]]:
        m = packet.meta
        drawn = Sampled({}, m["drawn"], m["weights"], m["version"])
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
