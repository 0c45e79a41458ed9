"""Host memory for delivered batches, recycled once the learner has let go of it.

A learner pulls a batch, reads it (often copying it to its device) and drops it.
Whether a fresh allocation for the next batch is cheap depends on its size and on
the process's allocation history: glibc serves a large block from its heap only
while its dynamic mmap threshold (raised by each freed mmapped block, at most to
32 MiB) and heap trimming allow; otherwise it is a fresh ``mmap`` whose pages
are faulted in and zeroed on first touch, then unmapped when the batch dies.
For large fields those page faults and that zeroing can cost more than the
gather itself, and whether they happen changes with the process's history; for
small fields the allocator reuses a freed block at once, and a pool's
bookkeeping would only add to that (BENCHMARKS.md, "Delivery and ingestion").

So fields of at least ``min_bytes`` (1 MiB) reuse the memory of a batch the
learner has *already dropped*, and smaller ones are left to the gather's own
allocation. Nothing is ever overwritten while any reference to a batch — the
batch, one of its tensors, a view, a numpy array made from it — is alive.

How a release is detected, without a callback: each recycled field of a batch is
``torch.from_numpy`` over that field's backing block (a numpy array), and torch
holds a reference to the block for as long as any tensor shares its storage — the
batch, one of its tensors, a view, a numpy array made from it. So a block is free
exactly when only this pool refers to it, and ``take()`` reads that from the
block's reference count (the count a pooled, unreferenced block has is measured
once, at import, through the same code path). Unlike a ``weakref.finalize``
callback that puts a block back, the reference count costs no object per batch
and no callback on the learner's thread when a batch dies. Fields have blocks
of their own (not slices of one block) so a batch stays an ordinary set of
tensors: ``torch.save`` refuses tensors of different dtypes sharing a storage.

This is the default for batches on the CPU (off-policy batches, on-policy
mini-batches). ``batch_pool`` (an explicit ring that overwrites a batch
``batch_pool`` pulls later, dropped or not) stays for learners that want the
memory bounded.

Staging blocks for a framework's own prefetcher
-----------------------------------------------
:class:`Staging` hands out blocks a framework lays a batch into when its *own*
prefetcher copies the batch to a GPU (SRL's ``PyTorchGPUPrefetcher`` reads
``torch.from_numpy(x).cuda(non_blocking=True)``): page-locked blocks from torch's
caching host allocator where CUDA is (so that copy is a real DMA), else pageable
blocks recycled through :class:`BatchMemory`. :class:`HandoffGuard` keeps pinned
blocks alive until the learner's stream has passed the copies made from them (a
copy from a numpy view of a block is invisible to the allocator's event tracking).
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from conduit.errors import ConfigError
from conduit.spec import ExperienceSpec, FieldSpec

__all__ = ["BatchMemory", "DirectSampleMemory", "HandoffGuard", "Staging"]

#: the integer dtype a block of a dtype numpy lacks is held as, by element width
_SAME_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

#: a field's full shape and dtype (a :class:`Staging` block)
Shape = tuple[tuple[int, ...], torch.dtype]


def _refcounts(blocks: list[np.ndarray]) -> list[int]:
    return [sys.getrefcount(b) for b in blocks]


#: the reference count of a pooled block nothing else refers to, as :func:`_refcounts` reads it
_FREE = _refcounts([np.empty(1)])[0]


def _numpy_has(dtype: torch.dtype) -> bool:
    """Whether numpy has ``dtype`` (``Tensor.numpy()`` refuses bfloat16, the float8 types, ...)."""
    try:
        torch.empty(0, dtype=dtype).numpy()
    except TypeError:
        return False
    return True


class _Field:
    """One field's pool of blocks, one batch each (at most ``keep``; free when nothing but the pool refers to one).

    A block is a numpy array of the field's shape, of its own dtype where numpy
    has it, else (bfloat16, float8, ...) of the integer type of the same width,
    so handing it out is one ``torch.from_numpy`` (plus a same-width dtype view):
    a worker takes a block right after its gather has evicted the caches, when
    every torch call is at its slowest.
    """

    def __init__(
        self, name: str, dtype: torch.dtype, shape: tuple[int, ...], keep: int, swap: bool = False
    ) -> None:
        # ``swap``: the block is laid out with the first two axes exchanged (``[T, B, ...]`` for ``[B, T, ...]``
        # rows) and handed out as its transposed view
        self.name, self.dtype, self.keep, self.swap = name, dtype, keep, swap
        self.shape = (shape[1], shape[0], *shape[2:]) if swap else shape  # the block's own shape
        self.blocks: list[np.ndarray] = []
        self.native = _numpy_has(dtype)
        # a dtype numpy lacks (bfloat16, float8, ...) is held as the integer type of its width
        self.held = dtype if self.native else _SAME_WIDTH[torch.empty(0, dtype=dtype).element_size()]

    def new_block(self) -> np.ndarray:
        """Uninitialised memory for one batch of the field (torch's allocator: its 64-byte alignment)."""
        return torch.empty(self.shape, dtype=self.held).numpy()

    def tensor(self, block: np.ndarray) -> torch.Tensor:
        """The field's tensor over ``block`` (torch keeps a reference to the block while any view lives).

        The layout is made on the numpy side and handed to one ``torch.from_numpy``: freeing the
        result of a torch view op (``transpose``, ``view``, ``reshape``, ...) releases the GIL
        (torch 2.x), and a batch freed on the learner's thread would then hand the interpreter to
        the delivery worker in the middle of the learner's step.
        """
        t = torch.from_numpy(block.swapaxes(0, 1) if self.swap else block)
        return t if self.native else t.view(self.dtype)  # same width: no shape change

    def free_block(self) -> np.ndarray | None:
        counts = _refcounts(self.blocks)
        for i, c in enumerate(counts):
            if c == _FREE:
                return self.blocks[i]
        return None

    @property
    def free_count(self) -> int:
        return sum(c == _FREE for c in _refcounts(self.blocks))


class BatchMemory:
    """Pools of host memory for one learner's batches.

    ``take()`` returns memory (contents undefined) for the recycled fields of
    one batch — those of at least ``min_bytes`` — keyed by field name: a
    block no batch, tensor, view or array refers to any more where there is
    one, else a new block. It returns None when no field of the batch is that
    large: the gather then allocates every field itself. A pool holds the
    ``keep`` newest blocks per field; when every one is held, a new block
    takes the place of the oldest, which is freed with the batch holding it.

    ``time_major``: every field with a time axis (rows ``[B, T, ...]``) is
    recycled whatever its size, in a ``[T, B, ...]`` block handed out as its
    transposed view: the gather writes the time-major layout itself (one copy),
    and ``batch[k].transpose(0, 1)`` is contiguous for a time-major learner.
    """

    #: the smallest field recycled by default (see the module docstring for why)
    MIN_BYTES = 1 << 20

    def __init__(self, keep: int = 4, layouts: int = 4, min_bytes: int = MIN_BYTES, time_major: bool = False) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep}: hold at least one free block")
        self.keep = keep
        self.time_major = time_major
        self._min_bytes = min_bytes
        self.layouts = max(1, layouts)
        # (spec, rows, pools of its recycled fields) of a few batch shapes (on-policy's last mini-batch
        # may be shorter), least recently used first
        self._shapes: list[tuple[ExperienceSpec, int, list[_Field]]] = []
        self._lock = threading.Lock()  # two threads taking at once (a pull and a prefetch) never share a block
        self.allocated = 0  # blocks created (a measure of how well recycling works)
        self.recycled = 0  # blocks served again after their batch was dropped

    @property
    def min_bytes(self) -> int:
        """The smallest field recycled; changing it forgets the batch shapes seen (their fields are re-chosen)."""
        return self._min_bytes

    @min_bytes.setter
    def min_bytes(self, value: int) -> None:
        self._min_bytes = value
        self._shapes = []

    def recycles(self, spec: ExperienceSpec, rows: int) -> bool:
        """Whether :meth:`take` hands out memory for ``rows`` rows of ``spec`` (some field is large enough)."""
        return any(self._large(f, rows) for f in spec)

    def _large(self, f: FieldSpec, rows: int) -> bool:
        """Whether ``rows`` rows of field ``f`` are recycled: large enough (``min_bytes``), or time-major."""
        return (self.time_major and len(f.shape) >= 1) or rows * f.bytes_per_sample >= self._min_bytes

    def take(self, spec: ExperienceSpec, rows: int) -> dict[str, torch.Tensor] | None:
        shapes = self._shapes
        last = shapes[-1] if shapes else None
        if last is not None and not last[2] and last[1] == rows and last[0] is spec:
            return None  # small transitions, every pull: no field to recycle, answered without the lock
        with self._lock:
            shapes = self._shapes
            last = shapes[-1] if shapes else None
            if last is not None and last[1] == rows and last[0] is spec:  # the common case: same shape as last time
                fields = last[2]
            else:
                hit = next((i for i, (sp, r, _) in enumerate(shapes) if r == rows and sp == spec), None)
                if hit is None:
                    fields = [
                        _Field(
                            f.name, f.dtype, (rows, *f.shape), self.keep,
                            swap=self.time_major and len(f.shape) >= 1,
                        )
                        for f in spec
                        if self._large(f, rows)
                    ]
                    if len(shapes) >= self.layouts:  # its blocks are freed with their last reference
                        shapes.pop(0)
                else:
                    fields = shapes.pop(hit)[2]
                shapes.append((spec, rows, fields))  # most recently used last
            if not fields:  # no field large enough: the gather allocates (the common case for small transitions)
                return None
            out = {}
            for field in fields:
                block = field.free_block()
                if block is None:
                    block = field.new_block()
                    self.allocated += 1
                    field.blocks.append(block)
                    if len(field.blocks) > field.keep:  # every block held: forget the oldest (freed with its batch)
                        field.blocks.pop(0)
                else:
                    self.recycled += 1
                out[field.name] = field.tensor(block)
            return out

    @property
    def free(self) -> int:
        """Free blocks of the recycled field with the fewest (of the batch shape taken last)."""
        fields = self._shapes[-1][2] if self._shapes else []
        return min((f.free_count for f in fields), default=0)


class DirectSampleMemory(BatchMemory):
    """The memory a buffer's own ``sample(n)`` gathers into when no ``out`` is offered (the delivery offers its
    own): recycled host memory of dropped batches, or None (device rows, small fields, nothing stored yet).

    Whether a call recycles is decided once per storage, spec, size, target and threshold: a small batch (no
    field to recycle) would otherwise pay for the decision on every call. The storage is held weakly, so a
    migrated-away ring is not kept alive here.
    """

    def __init__(self) -> None:
        super().__init__()
        self._seen: tuple[Any, ...] | None = None  # (weak storage, spec, rows, device, min_bytes, recycle?)

    def for_draw(
        self, storage: Any, spec: ExperienceSpec | None, n: int, device: torch.device | None
    ) -> dict[str, torch.Tensor] | None:
        """Memory for ``n`` rows of ``spec`` gathered from ``storage`` to ``device`` (None: fresh memory)."""
        if spec is None or storage is None:
            return None
        seen = self._seen
        if (
            seen is None
            or seen[0]() is not storage
            or seen[1] is not spec
            or seen[2] != n
            or seen[3] != device
            or seen[4] != self.min_bytes
        ):
            host = all(d.type == "cpu" for d in ((device,) if device is not None else storage.devices))
            seen = self._seen = (weakref.ref(storage), spec, n, device, self.min_bytes, host and self.recycles(spec, n))
        return self.take(spec, n) if seen[5] else None


class Staging:
    """Blocks for one time-major batch at a time (thread-safe: ``BatchMemory`` and the allocator lock)."""

    def __init__(self, pinned: bool | None = None) -> None:
        available = torch.cuda.is_available()
        if pinned and not available:
            raise ConfigError(
                "pinned staging needs CUDA (page-locked host memory is a CUDA feature); "
                "leave pinned=None to fall back to pageable memory on this machine"
            )
        #: whether blocks are page-locked (True only where CUDA is available)
        self.pinned: bool = available if pinned is None else bool(pinned)
        self._memory = None if self.pinned else BatchMemory()
        self._specs: dict[tuple[tuple[str, tuple[int, ...], torch.dtype], ...], tuple[int, ExperienceSpec]] = {}

    def take(self, shapes: Mapping[str, Shape]) -> dict[str, torch.Tensor]:
        """Uninitialised blocks of ``shapes`` (contents undefined; nothing alive is ever handed out twice)."""
        if self.pinned:
            return {k: torch.empty(s, dtype=d, pin_memory=True) for k, (s, d) in shapes.items()}
        assert self._memory is not None
        key = tuple((k, s, d) for k, (s, d) in shapes.items())
        hit = self._specs.get(key)
        if hit is None:
            rows = next(iter(shapes.values()))[0][0]
            if any(s[0] != rows for s, _ in shapes.values()):  # not one leading dim: no shared spec, plain memory
                return {k: torch.empty(s, dtype=d) for k, (s, d) in shapes.items()}
            spec = ExperienceSpec({k: FieldSpec(k, tuple(s[1:]), d) for k, (s, d) in shapes.items()})
            hit = self._specs[key] = (rows, spec)
        rows, spec = hit
        got = self._memory.take(spec, rows) or {}
        return {k: got[k] if k in got else torch.empty(s, dtype=d) for k, (s, d) in shapes.items()}


class HandoffGuard:
    """Holds blocks handed to the learner until the learner's CUDA stream has passed their copies.

    SRL's prefetcher copies batch ``t`` on a side stream while batch ``t-1`` trains, and
    the learner's stream waits for that copy before batch ``t`` trains — which the
    stream reaches before anything enqueued after the hand-out of batch ``t+2``. So the
    blocks of hand-out ``k`` are released once an event recorded on the learner's
    current stream at hand-out ``k + lag`` has completed. Without CUDA it holds nothing.
    """

    def __init__(self, lag: int = 2, bound: int = 16) -> None:
        self.lag = lag
        self.bound = bound  # a GPU this far behind: wait for it rather than hold more memory
        self.enabled = torch.cuda.is_available()
        self._held: deque[tuple[torch.cuda.Event, Sequence[torch.Tensor]]] = deque()

    def handed(self, blocks: Sequence[torch.Tensor]) -> None:
        """Blocks just handed to the learner (call on the learner's thread, its stream current)."""
        if not self.enabled:
            return
        event = torch.cuda.Event()
        event.record()
        held = self._held
        held.append((event, blocks))
        while len(held) > self.lag and (len(held) > self.bound or held[self.lag][0].query()):
            if len(held) > self.bound:
                held[self.lag][0].synchronize()
            held.popleft()

    def __len__(self) -> int:
        return len(self._held)
