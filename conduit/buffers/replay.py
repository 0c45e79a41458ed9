"""The Experience Buffer, off-policy: the replay ring (the on-policy store is :mod:`conduit.buffers.iterations`).

Thread-safe, and it keeps what the semantics tests need: every row gets a
global *transition id* in ingestion order, and each slot remembers the id of
the row it holds (its generation). A priority update lands only where the id
still matches, so updates for slots overwritten since sampling are dropped.

Writes are all-or-nothing: every part is validated against the spec before
any byte is stored, so a bad write raises :class:`~conduit.errors.SpecError`
and leaves contents, counters and sampler state exactly as they were.

Admission control is the buffer's, as in a Reverb table: its
:class:`~conduit.ratelimit.RateLimiter` holds learners' samples and actors'
inserts in ratio (:meth:`ExperienceBuffer.room`) and starts sampling at
``min_size`` rows (:meth:`ReplayBuffer.can_sample`).

``max_times_sampled`` (Reverb's queue at 1): the delivery's draw (``reserve=True``)
takes each row at most once and reserves the use it takes in the same hold of
the lock that draws it, so no other draw can take that use while the
batch is in flight (:mod:`conduit.buffers.budget`). The use counts when the
learner receives the batch (:meth:`ReplayBuffer.delivered`), or is given back
when a staged batch is dropped unread (:meth:`ReplayBuffer.unreserve`).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from conduit.batch import DrawnRows, Sampled
from conduit.buffers.base import ANYWHERE, ExperienceBuffer, Ticket
from conduit.buffers.budget import UseBudget
from conduit.buffers.priorities import PriorityOps
from conduit.errors import CheckpointError, RateLimited, SemanticsError, SpecError
from conduit.executor import StreamOrder
from conduit.memory import DirectSampleMemory
from conduit.ratelimit import RateLimiter
from conduit.samplers.base import Draw, Sampler
from conduit.slots import FifoRemover, Remover, SlotTable, slots_in_order
from conduit.spec import Data, ExperienceSpec, SpecHolder, rows_of
from conduit.storage.base import Storage
from conduit.storage.policy import StoragePolicy

__all__ = ["ReplayBuffer", "Sampled"]


class ReplayBuffer(PriorityOps, ExperienceBuffer):
    """Off-policy replay over ``capacity`` slots.

    The default (FIFO remover, no ``max_times_sampled``) is a ring: writes are
    contiguous slice copies from ``pos``. Other removers and ``max_times_sampled``
    eviction go through the slot table (free slots first, then the remover's
    victims) and scatter rows into their slots.
    """

    def __init__(
        self,
        capacity: int,
        storage: StoragePolicy,
        sampler: Sampler,
        *,
        spec: ExperienceSpec | None = None,
        seed: int | None = None,
        growable: frozenset[str] = frozenset(),
        remover: Remover | None = None,
        max_times_sampled: int | None = None,
        count_replays: str | None = None,
        recycle_batches: bool = True,
        limiter: RateLimiter | None = None,
        block: bool = True,
    ) -> None:
        super().__init__()
        self.capacity = capacity
        self.policy = storage
        self.sampler = sampler
        self.remover = remover or FifoRemover()
        self.max_times_sampled = max_times_sampled
        self._ring = isinstance(self.remover, FifoRemover) and max_times_sampled is None
        self._sampler_tracks_inserts = type(sampler).on_insert is not Sampler.on_insert
        self._specs = SpecHolder(spec, growable)
        self.storage: Storage | None = None
        self.rng = np.random.default_rng(seed)
        self.sampler.seed(int(self.rng.integers(2**62)))
        self.table = SlotTable(capacity, count_replays)  # count_replays: read by the delivery path, at each draw
        #: this buffer's lineage: its draws carry it, its checkpoints keep it (a priority update for rows drawn
        #: from another buffer is refused, whose slots and ids mean other rows)
        self.lineage = secrets.randbits(62)
        self.evicted_by_sampling = 0
        #: the uses left of each row (max_times_sampled), None without a limit
        self.budget = UseBudget(max_times_sampled, self.table, sampler) if max_times_sampled is not None else None
        #: admission control: the samples-per-insert ratio, and the rows sampling starts at
        self.limiter = limiter or RateLimiter()
        #: whether a push or pull that would break the ratio waits (True) or raises RateLimited
        self.block = block
        self._order: StreamOrder | None = None
        #: host memory of dropped batches for :meth:`sample` calls given no ``out`` (the delivery offers its own)
        self.memory = DirectSampleMemory() if recycle_batches else None

    @property
    def spec(self) -> ExperienceSpec | None:
        return self._specs.spec

    @property
    def ids(self) -> np.ndarray:
        """Transition id held by each slot (-1: empty)."""
        return self.table.ids

    @property
    def size(self) -> int:
        """Live transitions."""
        return self.table.count

    @property
    def rows(self) -> int:
        return self.table.count

    # -- admission (the protocol's push side) ------------------------------------------
    @property
    def free_admission(self) -> bool:
        return self.limiter.samples_per_insert is None

    def room(self, rows: int) -> bool:
        return self.limiter.can_insert(rows)

    def refuse(self, rows: int) -> None:
        if not self.block:
            raise RateLimited(f"push of {rows} rows would break the sample/insert ratio ({self.limiter.describe()})")

    def describe_room(self, rows: int) -> str:
        return f"learners to sample before {rows} more rows can be inserted ({self.limiter.describe()})"

    def admit(self, rows: int, pieces: int) -> Ticket:
        if self.limiter.samples_per_insert is not None:
            self.limiter.insert(rows)
        return ANYWHERE if pieces == 1 else Ticket(pieces=pieces)

    def store(self, parts: Sequence[Data], ticket: Ticket, *, validated: bool = False) -> int:
        self._check_open()
        return self.write(parts, validated=validated)[1]

    # -- admission (the sampling side) ----------------------------------------------------
    def refuses_sampling(self) -> bool:
        """Whether a sample that the ratio forbids should raise RateLimited instead of waiting."""
        return not self.block and self.table.count >= self.limiter.min_size

    def counted(self) -> None:
        """Learners' samples were counted: actors waiting for the ratio may insert again."""
        if self.limiter.samples_per_insert is not None:
            self._notify(self.on_room)

    # -- writes ---------------------------------------------------------------
    def validate(self, parts: Sequence[Data]) -> list[dict[str, torch.Tensor]]:
        """Validate without storing (raises SpecError; changes nothing)."""
        checked = self._specs.check(parts)
        for t in checked:
            n = rows_of(t)
            if n > self.capacity:
                raise SpecError(f"a write of {n} rows exceeds the buffer capacity of {self.capacity} rows")
        return checked

    def write(self, parts: Sequence[Data], *, validated: bool = False) -> tuple[int, int]:
        """Store parts in order; returns (first transition id, rows written).

        ``validated``: the parts came out of :meth:`validate` already (the
        ingestion path checks identity-hook pushes before queuing them).
        """
        with self.lock:
            written = self._write_locked(parts, validated)
        self._notify(self.on_data)
        return written

    def _write_locked(self, parts: Sequence[Data], validated: bool) -> tuple[int, int]:
        """:meth:`write`'s storing (caller holds the lock; nobody is notified yet)."""
        checked = list(parts) if validated and self._specs.spec is not None else self.validate(parts)
        if self.storage is None:
            self._allocate(checked[0])
        first = self.inserted
        assert self._order is not None and self.storage is not None
        self._order.before_write()
        for tensors in checked:
            self._maybe_grow(tensors)
            n = rows_of(tensors)
            table = self.table
            if self._ring:
                slots = table.ring_slots(n) if self._sampler_tracks_inserts else None
                self.storage.write(table.pos, tensors)
                table.occupy_ring(n, self.inserted)
            else:
                priorities = self.budget.remover_priorities() if self.budget else self.sampler.priorities()
                slots = table.allocate(n, self.remover, priorities, self.rng)
                self.storage.write_slots(slots, tensors)
                table.occupy(slots, self.inserted)
            if slots is not None:
                self.sampler.on_insert(slots)
            self.inserted += n
        self._order.after_write()
        return first, self.inserted - first

    def load_rows(self, rows: Data, leaves: np.ndarray | None = None, max_priority: float = 1.0) -> int:
        """Fill this empty buffer with ``rows``, oldest first (the newest ``capacity`` kept), the oldest
        ``len(leaves)`` with these priority leaves (``p^alpha``: :func:`conduit.snapshot.stored_in_order`), the
        rest at ``max_priority``, as new rows; in one hold of the lock (no draw sees rows without priorities)."""
        n = rows_of(rows) if rows else 0
        drop = max(0, n - self.capacity)
        with self.lock:
            if self.inserted:
                raise SemanticsError(f"load_rows fills an empty buffer; this one has stored {self.inserted} rows")
            if n == drop:
                return 0
            checked = self.validate([{k: v[drop:] for k, v in rows.items()}])  # refused: nothing changed
            restore = leaves is not None and self.sampler.has_priorities
            if restore:  # rows past the leaves enter at this max priority, as new rows do
                self._priorities("load_rows").max_priority = float(max_priority)
            first, written = self._write_locked(checked, True)
            if self.limiter.samples_per_insert is not None:  # stored rows count as inserts, as admitted pushes do
                self.limiter.insert(written)
            if restore:
                kept = np.asarray(leaves, dtype=np.float64)[drop:]
                slots = slots_in_order(np.asarray(self.ids), first, min(written, kept.size))
                self._priorities("load_rows").set_leaf_values(slots, kept[: slots.size], float(max_priority))
        self._notify(self.on_data)
        return written

    def _allocate(self, example: Mapping[str, torch.Tensor]) -> None:
        if self._specs.spec is None:
            self._specs.spec = ExperienceSpec.infer(example, self._specs.growable)
        self.use_storage(self.policy.create(self._specs.spec, self.capacity))

    def use_storage(self, storage: Storage) -> None:
        """Hold rows in ``storage`` from now on (new, migrated or restored; caller holds the lock once running).

        A ring's rows are read back long after they are written, so its large writes
        bypass the caches where the storage can (:mod:`conduit.storage.streaming`).
        """
        storage.set_streaming(True)
        self.storage = storage
        self._order = StreamOrder(storage.devices)

    def _maybe_grow(self, tensors: Mapping[str, torch.Tensor]) -> None:
        assert self._specs.spec is not None and self.storage is not None
        grown = self._specs.spec.grown_by(tensors)
        if grown is None:
            return
        self.relayout(grown)

    def relayout(self, spec: ExperienceSpec) -> None:
        """Move every row to storage for ``spec`` (growable fields zero-padded).

        Runs under the buffer lock, so ingestion and delivery are paused and no
        learner sees a half-migrated batch; the policy decides where the new
        storage lives and how rows move.
        """
        with self.lock:
            if self.storage is None:
                self._specs.spec = spec
                return
            self.use_storage(self.policy.migrate(self.storage, spec, self.table.high))  # may raise: spec unchanged
            self._specs.spec = spec
            self.migrations += 1

    # -- reads ----------------------------------------------------------------
    def sample(
        self, n: int, device: torch.device | None = None, out: Mapping[str, torch.Tensor] | None = None,
        *, reserve: bool = False,
    ) -> Sampled:
        """Draw ``n`` rows and gather them atomically.

        Into ``out`` when given; otherwise a host batch's large fields go into memory
        of batches already dropped (:class:`~conduit.memory.DirectSampleMemory`, unless
        ``recycle_batches=False``): a fresh multi-MB block is a new mapping whose
        pages fault in on every call.
        """
        if out is None and self.memory is not None:  # taken before the lock, as the delivery takes its own
            out = self.memory.for_draw(self.storage, self.spec, n, device)
        return self.draw(n, device, out, reserve=reserve)

    def draw(
        self, n: int, device: torch.device | None = None, out: Mapping[str, torch.Tensor] | None = None,
        *, reserve: bool = False,
    ) -> Sampled:
        """:meth:`sample` into ``out`` as given (the delivery offers its own recycled memory, or None);
        ``reserve``: see :meth:`_select` (settled by :meth:`delivered` or :meth:`unreserve`)."""
        with self.lock:
            draw = self._select(n, reserve)
            order = self._order
            assert order is not None
            if order.enabled:  # CUDA storage: reads wait for writes on other streams
                order.before_read()
            idx = draw.tensor if draw.tensor is not None else torch.from_numpy(draw.array)
            try:
                data = self.storage.gather(idx, device) if out is None else self.storage.gather(idx, device, out)
            except BaseException:
                self._unselect(draw, reserve)
                raise
            if order.enabled:
                order.after_read()
            return Sampled(data, self.drawn(draw), draw.weights, self.inserted, draw.leaves, draw.beta)

    def _select(self, n: int, reserve: bool) -> Draw:
        """One draw's slots (caller holds the lock): with ``reserve`` under ``max_times_sampled``, distinct rows
        with a use left, each use reserved; else the sampler's own draw (held rows excluded)."""
        if self.storage is None or self.table.count == 0:
            raise SemanticsError("cannot sample from an empty buffer")
        if self.budget is None or not reserve:
            return self.sampler.sample(n, self.table, self.rng)
        return self.budget.select(n, self.rng)

    def _unselect(self, draw: Draw, reserve: bool) -> None:
        """A draw whose gather did not complete gives back the uses it reserved (caller holds the lock)."""
        if reserve and self.budget is not None:
            self.budget.unreserve(draw.indices)

    def sample_split(
        self, sizes: Sequence[int], device: torch.device | None = None,
        outs: Sequence[Mapping[str, torch.Tensor] | None] | None = None, *, reserve: bool = False,
    ) -> tuple[list[dict[str, torch.Tensor]], Sampled]:
        """One draw of ``sum(sizes)`` rows, gathered batch by batch (one lock).

        Equivalent to :meth:`sample` then splitting, without one allocation of
        ``g`` batches: above glibc's 32 MiB mmap ceiling every such allocation
        is a fresh mapping that page-faults afresh.
        """
        with self.lock:
            draw = self._select(sum(sizes), reserve)
            assert self._order is not None
            self._order.before_read()
            idx = draw.tensor if draw.tensor is not None else torch.from_numpy(draw.array)
            parts, start = [], 0
            try:
                for i, n in enumerate(sizes):
                    out = outs[i] if outs is not None else None
                    sl = idx[start : start + n]
                    parts.append(
                        self.storage.gather(sl, device) if out is None else self.storage.gather(sl, device, out)
                    )
                    start += n
            except BaseException:
                self._unselect(draw, reserve)
                raise
            self._order.after_read()
            whole = Sampled({}, self.drawn(draw), draw.weights, self.inserted, draw.leaves, draw.beta)
            return parts, whole

    def drawn(self, draw: Draw) -> DrawnRows:
        """A draw's slots and ids (caller holds the lock): a pure ring's ids are worked out when first read."""
        ring = self.table.ring_state()
        if ring is not None:
            rows = DrawnRows(draw.array, tensor=draw.tensor, ring=ring)
        else:
            rows = DrawnRows(draw.indices, self.table.ids[draw.indices])
        rows.lineage = self.lineage
        return rows

    def delivered(self, indices: np.ndarray, ids: np.ndarray, *, reserved: bool = False) -> int:
        """Count a delivered batch's rows as sampled; evict rows reaching ``max_times_sampled``.

        Called when a learner receives the batch, never when it is merely
        prefetched; ``reserved``: its draw reserved the rows' uses (settled now).
        Rows overwritten since the draw are skipped. Returns how many rows were evicted.
        """
        if self.budget is None:
            return 0  # per-row counts only matter for eviction; the rate limiter counts totals
        with self.lock:
            spent = self.budget.delivered(indices[self.table.ids[indices] == ids], reserved)
            if not spent.size:
                return 0
            gone = self.table.release(spent)
            self.sampler.on_release(gone)
            self.evicted_by_sampling += gone.size
            return int(gone.size)

    def unreserve(self, indices: np.ndarray, ids: np.ndarray) -> None:
        """A batch drawn with ``reserve=True`` will never reach a learner: its rows may be drawn again."""
        if self.budget is None:
            return
        with self.lock:
            self.budget.unreserve(indices[self.table.ids[indices] == ids])
        self._notify(self.on_data)

    # -- state -----------------------------------------------------------------------------
    def state_dict(self, *, rows: bool = True) -> dict[str, Any]:
        """Table, sampler, rate limiter, generator and counters (and, with ``rows``, :meth:`rows_state`)."""
        with self.lock:
            state: dict[str, Any] = {
                "capacity": self.capacity,
                "spec": self.spec.to_json() if self.spec is not None else None,
                "inserted": self.inserted,
                "evicted_by_sampling": self.evicted_by_sampling,
                "rng": self.rng.bit_generator.state,
                "table": self.table.state_dict(),
                "sampler": {"kind": self.sampler.name, **self.sampler.state_dict()},
                "limiter": self.limiter.state_dict(),
                "lineage": self.lineage,
            }
            if self.budget is not None:
                state["budget"] = self.budget.state_dict()
        if rows:
            state["rows"] = self.rows_state()
        return state

    def rows_state(self) -> dict[str, torch.Tensor]:
        """A host copy of the stored rows (slots ``[0, high)``); only a write changes them."""
        storage, high = self.storage, self.table.high
        if storage is None or not high:
            return {}
        return {k: v.cpu() for k, v in storage.read(0, high).items()}

    def check_state(self, state: dict[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise CheckpointError(f"capacity: checkpoint has {state['capacity']}, runtime has {self.capacity}")
        kind = state["sampler"]["kind"]
        if kind != self.sampler.name:
            raise CheckpointError(f"sampler: checkpoint used {kind!r}, runtime uses {self.sampler.name!r}")
        alpha = state["sampler"].get("alpha")  # the saved priorities are p ** alpha: another alpha misreads them
        if alpha is not None and float(alpha) != getattr(self.sampler, "alpha", alpha):
            raise CheckpointError(f"prioritized.alpha: the checkpoint's priorities are p ** {alpha}, this runtime "
                                  f"uses alpha={self.sampler.alpha}; restore with alpha={alpha}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        with self.lock:
            if self.inserted:
                raise CheckpointError("restore into a fresh runtime (this one already holds data)")
            if state["spec"] is not None:
                spec = ExperienceSpec.from_json(state["spec"])
                self._specs.spec = spec
                storage = self.policy.create(spec, self.capacity)
                self.use_storage(storage)
                rows = state.get("rows") or {}
                if rows:
                    storage.write(0, rows)
            self.table.load_state_dict(state["table"])
            self.sampler.load_state_dict(state["sampler"])
            self.limiter.load_state_dict(state["limiter"])
            self.inserted = int(state["inserted"])
            # a runtime without a ratio counts no inserts (its pushes skip admission), only samples: restored into
            # one with a ratio, its stored rows count as inserted, as load_rows counts them
            self.limiter.inserts = max(self.limiter.inserts, self.inserted)
            self.evicted_by_sampling = int(state["evicted_by_sampling"])
            self.rng.bit_generator.state = state["rng"]
            self.lineage = int(state.get("lineage", self.lineage))  # the checkpoint's batches are this buffer's
            if self.budget is not None:
                self.budget.load_state_dict(state.get("budget", {}))

    def release(self) -> None:
        """Free the storage (the runtime closed); the slot table stays readable."""
        with self.lock:
            self.released = True
            if self.storage is not None:
                self.storage.close()
            self.on_data.clear()
            self.on_room.clear()

    def contents(self) -> dict[str, torch.Tensor]:
        """A copy of all live rows in slot order (tests, checkpoints)."""
        with self.lock:
            if self.storage is None:
                return {}
            if self.table.contiguous:
                return self.storage.read(0, self.table.count)
            return self.storage.gather(torch.from_numpy(self.table.valid_slots()))
