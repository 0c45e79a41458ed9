"""Off-policy delivery: ``g`` training batches sampled from the replay ring per invocation.

Under ``max_times_sampled`` (a queue at 1) rows leave the buffer as they are used,
so two invocations in flight must never count on the same rows: a claim *promises*
itself its rows under the path's condition (:meth:`ReplayDelivery._ready` counts
only rows no other claim has promised itself), and its draw reserves them in the
buffer (:mod:`conduit.buffers.replay`), which settles each use when the batch
reaches its learner or gives it back when a staged batch is dropped.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from conduit.batch import Batch, BatchInfo
from conduit.buffers.replay import ReplayBuffer, Sampled
from conduit.core import Mode
from conduit.errors import RateLimited, SemanticsError
from conduit.paths.delivery import Claim, DeliveryPath, Place, Staged

__all__ = ["AWAITING", "ReplayClaim", "ReplayDelivery"]

#: delivered batches that await their priority update, at most (prioritized replay; the oldest are forgotten)
AWAITING = 64


@dataclass(eq=False, slots=True)
class ReplayClaim(Claim):
    """An off-policy invocation: its number (a batch's ``iteration``) and, once gathered, its draw."""

    invocation: int = 0
    drawn: Sampled | None = None
    #: rows promised to this claim and not yet drawn (max_times_sampled)
    promised: int = 0

    def place(self, part: int) -> Place:
        s = self.drawn
        assert s is not None
        if len(self.sizes) == 1:
            return Place(self.invocation, None, None, None, False, s.rows, s.weights)
        n = self.sizes[0]
        sl = slice(part * n, (part + 1) * n)
        return Place(self.invocation, None, None, None, False, s.rows[sl], None if s.weights is None else s.weights[sl])

    def facts(self) -> dict[str, object]:
        out = Claim.facts(self)
        out["invocation"] = self.invocation
        s = self.drawn
        if s is not None:
            out.update(drawn=s.rows, weights=s.weights, indices=s.indices, ids=s.ids, version=s.version)
        return out


class ReplayDelivery(DeliveryPath):
    """Off-policy: sample ``g·B`` rows per invocation from the replay ring."""

    buffer: ReplayBuffer

    def __init__(self, *, buffer: ReplayBuffer, batch_size: int, batch_pool: int = 0, **kw: Any) -> None:
        super().__init__(buffer=buffer, **kw)
        self.batch_size = batch_size
        self.batch_pool = batch_pool
        self._pools: list[deque[dict[str, torch.Tensor]]] = [deque() for _ in self.devices]
        if batch_pool:  # the explicit ring decides
            self._memory = [None] * len(self.devices)
        self.limiter = buffer.limiter
        #: rows leave as they are used (max_times_sampled): claims promise rows, draws reserve them
        self._budgeted = buffer.max_times_sampled is not None
        self._promised = 0  # rows promised to claims that have not drawn yet
        self._invocation = 0
        # which learners the storage's rows already sit on, redone only when the storage object changes
        # (placed, or migrated): comparing torch devices on every pull would cost more than the pull's bookkeeping
        self._local_for: object = None
        self._local_learners = [False] * len(self.devices)
        # without a delivery hook (which reads rows where the buffer keeps them), a GPU learner's rows are
        # gathered straight onto its device: from host memory through pinned staging (an async DMA), where a host
        # gather then the transfer operator's copy would be a pageable, synchronous one (BENCHMARKS.md, "GPU")
        self._gather_to = [d if d.type == "cuda" and self._hookless else None for d in self.devices]
        #: prioritized replay: the newest delivered batches, newest last, each awaiting its first priority update
        #: until it had one (``rows.fed_back``; :meth:`awaited`)
        self.awaiting: deque[BatchInfo] | None = deque(maxlen=AWAITING) if buffer.sampler.has_priorities else None

    @property
    def min_rows(self) -> int:
        return self.limiter.min_size

    # -- what an invocation is ------------------------------------------------------------
    def _ready(self, learner: int, rows: int = 0) -> bool:
        table = self.buffer.table  # ReplayBuffer.can_sample, one call shorter on every pull
        rows = rows or self.g_units * self.batch_size
        if not self.limiter.can_sample(rows, table.count):
            return False
        return not self._budgeted or table.sampleable - self._promised >= rows

    def _begin(self, learner: int, sampled_at_pull: int, handed: bool, rows: int = 0) -> ReplayClaim:
        g, n, mode = self.g_units, self.batch_size, self.mode
        if rows:  # one batch of ``rows`` rows, drawn inline (pull_rows): its granularity says its size
            g, n, mode = 1, rows, Mode(False, Fraction(rows, self.batch_size))
        reserved = (g - 1) * n if handed else g * n  # a batch handed at once is counted when it is (_counted)
        if reserved:
            self.limiter.reserve(reserved)
        invocation = self._invocation
        self._invocation = invocation + 1
        claim = ReplayClaim(learner, sampled_at_pull, mode, (n,) * g, reserved, invocation=invocation)
        if self._budgeted:
            claim.promised = g * n
            self._promised += g * n
        return claim

    def pull_rows(self, learner: int, rows: int, timeout: float | None = None) -> Batch:
        """One batch of ``rows`` rows, not the configured batch size (a framework whose ``sample`` takes any size).

        Drawn now, on the caller's thread, by the same sampler, hook and accounting as
        any pull, and gated like one (``min_size_to_sample``, the rate limiter); it takes
        the learner's next pull index, and batches already staged keep their turn.
        """
        if rows < 1:
            raise ValueError(f"rows={rows}: a batch holds at least one row")
        t0, deadline = self._deadline(learner, timeout)
        lock = self._invoke_locks[learner]
        while True:
            if not lock.acquire(True, max(0.0, deadline[0] - time.perf_counter())):  # a checkpoint, an inline pull
                raise self._held_up(deadline[1], f"a pull of {rows} rows for learner {learner}")
            try:
                with self._lock:
                    claim, index = self._claim(learner, True, rows) if self._ready(learner, rows) else (None, -1)
                if claim is not None:  # not _deliver: the learner's busy flag is the worker's, untouched here
                    batch = self._batch(self._invoke(claim)[0], self._info(claim, 0, index, self._version()))
                    self._counted(learner, batch.info, rows, False)
                    self.stats.pull_s += time.perf_counter() - t0
                    return batch
            finally:
                lock.release()
            with self._lock:  # wait for rows without the invocation lock (a checkpoint may need it)
                if not self._ready(learner, rows):
                    self._refuse(learner)
                    self._wait(learner, deadline, lambda: self._ready(learner, rows))

    def _drew(self, claim: ReplayClaim) -> None:
        """The claim's draw reserved its rows in the buffer: its promise is kept."""
        if claim.promised:
            with self._lock:
                self._promised -= claim.promised
                claim.promised = 0
                if self._data_waiters:  # a pull that counted these rows twice meanwhile may be served now
                    self.cond.notify_all()

    def _local(self, learner: int) -> bool:
        storage = self.buffer.storage
        if storage is not self._local_for:
            # the list first: a concurrent pull that sees the new storage also sees its list
            self._local_learners = [storage is not None and storage.devices == (d,) for d in self.devices]
            self._local_for = storage
        return self._local_learners[learner] or self._gather_to[learner] is not None

    def _gather(self, claim: ReplayClaim) -> list[dict[str, torch.Tensor]]:  # type: ignore[override]
        """``g`` training batches from one draw (recorded on the claim).

        One batch: gathered into the memory :meth:`_recycled` offers. Several, of small
        transitions (no field large enough for recycled memory): one gather of ``g·B``
        rows split into views, a kernel call a field instead of ``g``. Otherwise one
        gather a batch into its own memory (:meth:`ReplayBuffer.sample_split`: one
        ``g·B`` allocation above glibc's mmap ceiling would page-fault afresh every time).
        """
        learner, sizes = claim.learner, claim.sizes
        buffer, to, reserve = self.buffer, self._gather_to[learner], self._budgeted
        n = sizes[0]
        if len(sizes) == 1:
            memory = self._memory[learner]  # _recycled's first case, a call shorter on every pull
            spec = buffer.spec
            out = memory.take(spec, n) if memory is not None and spec is not None else self._recycled(learner, n)
            s = buffer.draw(n, to, out, reserve=reserve)
            parts = [s.data]
        else:
            outs = [self._recycled(learner, n) for _ in sizes]
            if any(o is not None for o in outs):
                parts, s = buffer.sample_split(list(sizes), to, outs, reserve=reserve)
            else:  # the joint block may recycle where a batch does not
                s = buffer.sample(n * len(sizes), to, reserve=reserve)
                parts = [{k: v[i * n : (i + 1) * n] for k, v in s.data.items()} for i in range(len(sizes))]
        claim.drawn = s
        table = buffer.table
        if table.replays is not None:  # each batch's rows' replay counts, in draw order (count_replays)
            with buffer.lock:
                rows, count = s.rows, table.replays_at == "draw"
                s.rows.times = np.concatenate([
                    table.replays_before(rows.indices[i * n : (i + 1) * n], rows.ids[i * n : (i + 1) * n], count=count)
                    for i in range(len(sizes))
                ])
        if reserve:
            self._drew(claim)
        claim.buffer_version = s.version
        return parts

    def _recycled(self, learner: int, rows: int) -> dict[str, torch.Tensor] | None:
        """Memory for the next batch: released host memory (default), or the ``batch_pool`` ring.

        Default on the CPU: memory of batches the learner has dropped (``BatchMemory``;
        nothing alive is ever overwritten). With ``batch_pool``: the oldest of this
        learner's ``batch_pool`` buffers (plus room for staging) — a batch stays valid
        for ``batch_pool - 1`` further pulls, then its memory receives a new batch.
        """
        memory = self._memory[learner]
        spec = self.buffer.spec
        if memory is not None:
            return memory.take(spec, rows) if spec is not None else None
        if not self.batch_pool or spec is None:
            return None
        ring = self._pools[learner]
        # one buffer per batch: the learner's last ``batch_pool`` batches, plus the
        # invocation's other g - 1 staged ones, plus one prefetched invocation ahead
        depth = self.batch_pool + self.g_units - 1 + (1 if self.mode.overlap else 0)
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

    def _refuse(self, learner: int) -> None:
        if self.buffer.refuses_sampling():
            raise RateLimited(f"a batch now would break the sample/insert ratio ({self.limiter.describe()})")

    def _counted(self, learner: int, info: BatchInfo, rows: int, reserved: bool) -> None:
        buffer, limiter = self.buffer, self.limiter
        if self._budgeted:  # else nothing is counted per row (and the arrays stay unmade); spent rows are evicted
            buffer.delivered(info.indices, info.ids, reserved=True)  # before the limiter frees their room
        if reserved:
            limiter.commit(rows)
        else:  # handed over in the invocation that sampled it: no reservation between
            limiter.sampled(rows)
        if self.awaiting is not None:  # (without what a hook attached: its memory goes back when the learner drops it)
            with self._lock:  # a full list drops its oldest: never while awaited() walks it
                self.awaiting.append(info if info.attachment is None else info._replace(attachment=None))
        if limiter.samples_per_insert is not None:
            buffer.counted()  # actors may be waiting for learners to sample

    def awaited(
        self, key: BatchInfo | np.ndarray | None, check: Callable[[BatchInfo], object]
    ) -> tuple[BatchInfo, bool]:
        """The delivered batch a priority update is for, and whether this is its first update (the one its replay
        counts take): ``key`` itself (a batch's info, also one older than the newest kept); the newest kept batch
        that drew exactly the slots ``key``, one awaiting its first update before one that had it (SRL's trainer
        repeats an entry's update as it stops; cpprb takes any); or (``None``) the newest batch still awaiting its
        first update. ``check(batch)`` raises for an update that batch refuses, before anything changes."""
        recent = self.awaiting
        found = None
        if recent is not None:
            with self._lock:
                for cand in reversed(recent):
                    if key is None:
                        match = not cand.rows.fed_back
                    elif isinstance(key, BatchInfo):
                        match = (cand.learner, cand.pull_index) == (key.learner, key.pull_index)
                    else:
                        match = np.array_equal(cand.indices, key)
                    if match and (found is None or found.rows.fed_back):
                        found = cand
                        if not cand.rows.fed_back:
                            break
                if found is not None:
                    return self._fed(found, check)
        if isinstance(key, BatchInfo):
            return self._fed(key, check)
        what = "no delivered batch" if key is None else f"no delivered batch drew these {len(key)} slots and"
        raise SemanticsError(
            f"update_priorities: {what} awaits priorities (the newest {AWAITING} delivered batches are kept, each "
            "awaiting its first update); pull a batch first, or pass the batch itself"
        )

    @staticmethod
    def _fed(info: BatchInfo, check: Callable[[BatchInfo], object]) -> tuple[BatchInfo, bool]:
        check(info)
        first = not info.rows.fed_back
        info.rows.fed_back = True
        return info, first

    def _abandon(self, claim: Claim) -> None:
        assert isinstance(claim, ReplayClaim)
        if claim.reserved:
            self.limiter.release(claim.reserved)
        self._drew(claim)  # a promise not drawn on is released with it
        if self._budgeted and claim.drawn is not None:
            self.buffer.unreserve(claim.drawn.indices, claim.drawn.ids)

    def _unstage(self, learner: int, item: Staged) -> None:
        self.limiter.release(len(item.info.rows))
        if self._budgeted:
            self.buffer.unreserve(item.info.indices, item.info.ids)

    def _describe_wait(self, learner: int) -> str:
        if self.graph.running and (self.staged[learner] or self._ready(learner) or self._busy[learner]):
            return f"a batch for learner {learner}: {self.doing('')}"  # an invocation, not the data, is the wait
        rows, table = self.g_units * self.batch_size, self.buffer.table
        if table.count < self.min_rows:
            why = f"sampling starts at {self.min_rows} (min_size_to_sample)"
        elif self._budgeted and table.sampleable - self._promised < rows:  # max_times_sampled: distinct rows
            why = (f"{max(0, table.sampleable - self._promised)} of them may still be drawn (the others' uses are "
                   f"taken by batches drawn or promised) and a draw takes {rows} distinct rows")
        else:
            why = f"the sample/insert ratio holds the draw of {rows} rows back"
        return (
            f"a batch for learner {learner}: the buffer holds {table.count} rows and {why}; push more rollouts, or "
            f"flush() units still pending ingestion; rate limiter: {self.limiter.describe()}"
        )

    # -- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "invocation": self._invocation}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The base's staged batches, reserved again; those of another ``train_batch_size`` (a restore that changed
        it) go back unread, their rows drawable again, so every batch handed out has this runtime's size."""
        super().load_state_dict(state)
        with self._lock:
            self._invocation = int(state["invocation"])
            # staged batches were counted as reserved when they were made
            self.limiter.reserve(sum(len(s.info.rows) for q in self.staged for s in q))
            for learner, staged in enumerate(self.staged):
                for item in [s for s in staged if len(s.info.rows) != self.batch_size]:
                    staged.remove(item)
                    self._unstage(learner, item)
