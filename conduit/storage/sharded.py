"""Sharded storage: one ring of rows spread over several devices (and memory tiers).

A :class:`RowLayout` maps ring rows to shards by contiguous segments: segment
``s`` holds ring rows ``start .. start+length`` at rows ``offset ..`` of shard
``shard``. A fresh storage has one segment per shard, in shard order; a
migration (:mod:`conduit.placement.policy`) may produce several segments per
shard, so that records move by a makespan-optimal plan and still keep their
ring slot (the buffer keeps ids and pointers by slot).

Each shard is a :class:`~conduit.storage.tensor.TensorStorage` on its own
device (``"cuda:k"``, ``"pinned"``, ``"cpu"``; several shards may share a device,
which is how CPU-only machines test the sharded path). ``gather`` groups indices
by shard (numpy index math: a few microseconds), gathers each shard on its own
device -- on a dedicated CUDA stream per source device where CUDA is, the
target's stream waiting on each source stream's event -- into consecutive slices
of one output per field on the target device, then restores the callers' index
order with one ``index_select`` per field (skipped when grouping kept it), so
the result equals a single-device storage's. A single-shard identity layout
delegates straight to its shard (no per-call overhead beyond one branch).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from conduit.errors import PlacementError
from conduit.executor import StreamSet
from conduit.spec import ExperienceSpec
from conduit.storage.base import Storage
from conduit.storage.tensor import TensorStorage, copy_into, gather_into

__all__ = ["RowCopy", "RowLayout", "Segment", "ShardedStorage", "copy_block", "move_rows", "shards_of"]


@dataclass(frozen=True, slots=True)
class Segment:
    """Ring rows ``start .. start+length`` live at rows ``offset ..`` of shard ``shard``."""

    start: int
    length: int
    shard: int
    offset: int


@dataclass(frozen=True, slots=True)
class RowCopy:
    """Copy ``rows`` rows from ``src_row`` of shard ``src`` to ``dst_row`` of shard ``dst``."""

    src: int
    src_row: int
    dst: int
    dst_row: int
    rows: int


class RowLayout:
    """Ring row -> (shard, row on the shard): contiguous segments covering every row of every shard once."""

    def __init__(self, shard_rows: Sequence[int], segments: Sequence[Segment]) -> None:
        self.shard_rows = tuple(int(r) for r in shard_rows)
        if not self.shard_rows or any(r <= 0 for r in self.shard_rows):
            raise PlacementError(f"RowLayout.shard_rows: expected one or more counts > 0, received {self.shard_rows}")
        self.segments = _merge(sorted(segments, key=lambda s: s.start))
        self.rows = sum(self.shard_rows)
        self._check()
        self.identity = len(self.segments) == 1 and len(self.shard_rows) == 1
        self._starts = np.array([s.start for s in self.segments], dtype=np.int64)
        self._shard = np.array([s.shard for s in self.segments], dtype=np.int64)
        self._delta = np.array([s.offset - s.start for s in self.segments], dtype=np.int64)

    def _check(self) -> None:
        ring = 0
        for s in self.segments:
            if s.start != ring or s.length <= 0:
                raise PlacementError(
                    f"RowLayout.segments: expected contiguous segments of length > 0 from ring row {ring}, "
                    f"received {s}"
                )
            ring += s.length
        if ring != self.rows:
            raise PlacementError(f"RowLayout.segments: expected to cover {self.rows} ring rows, received {ring}")
        for k, n in enumerate(self.shard_rows):
            spans = sorted((s.offset, s.offset + s.length) for s in self.segments if s.shard == k)
            covered = 0
            for lo, hi in spans:
                if lo != covered:
                    raise PlacementError(
                        f"RowLayout.segments: shard {k} rows must be covered exactly once; gap or overlap at row {lo}"
                    )
                covered = hi
            if covered != n:
                raise PlacementError(f"RowLayout.segments: expected shard {k} to hold {n} rows, received {covered}")
        if any(not 0 <= s.shard < len(self.shard_rows) for s in self.segments):
            raise PlacementError(f"RowLayout.segments: shard index out of range 0..{len(self.shard_rows) - 1}")

    @classmethod
    def contiguous(cls, shard_rows: Sequence[int]) -> RowLayout:
        """Shard ``k`` holds the ``k``-th contiguous range of ring rows."""
        starts = itertools.accumulate(shard_rows, initial=0)
        return cls(shard_rows, [Segment(a, n, k, 0) for k, (a, n) in enumerate(zip(starts, shard_rows))])

    def locate(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(shard, row on the shard) of each ring row in ``indices`` (int64, host)."""
        i = _as_numpy(indices)
        seg = np.searchsorted(self._starts, i, side="right") - 1
        return torch.from_numpy(self._shard[seg]), torch.from_numpy(i + self._delta[seg])

    def group(self, indices: torch.Tensor) -> tuple[torch.Tensor, list[int], torch.Tensor | None]:
        """Rows on the shards grouped by shard (stable), rows per shard, and the permutation back.

        ``grouped.index_select(0, inverse)`` restores the order of ``indices``;
        ``inverse`` is ``None`` when the grouping kept that order.
        """
        i = _as_numpy(indices)
        seg = np.searchsorted(self._starts, i, side="right") - 1
        shard = self._shard[seg]
        local = i + self._delta[seg]
        counts = np.bincount(shard, minlength=len(self.shard_rows)).tolist()
        if max(counts, default=0) == i.shape[0] or bool(np.all(shard[1:] >= shard[:-1])):
            return torch.from_numpy(local), counts, None
        order = np.argsort(shard, kind="stable")
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.shape[0])
        return torch.from_numpy(local[order]), counts, torch.from_numpy(inverse)

    def pieces(self, start: int, n: int) -> Iterator[tuple[int, Segment]]:
        """Ring rows ``start .. start+n`` (mod rows) in order, as (offset into the range, sub-segment)."""
        done = 0
        start %= self.rows
        while done < n:
            ring = (start + done) % self.rows
            span = min(n - done, self.rows - ring)  # up to the wrap
            for s in self.segments:
                lo, hi = max(ring, s.start), min(ring + span, s.start + s.length)
                if lo < hi:
                    yield done + lo - ring, Segment(lo, hi - lo, s.shard, s.offset + lo - s.start)
            done += span

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RowLayout) and (self.shard_rows, self.segments) == (other.shard_rows, other.segments)

    def __hash__(self) -> int:
        return hash((self.shard_rows, self.segments))

    def __repr__(self) -> str:
        return f"RowLayout(shard_rows={self.shard_rows}, segments={len(self.segments)})"


def _as_numpy(indices: torch.Tensor) -> np.ndarray:
    if indices.device.type != "cpu":
        indices = indices.cpu()
    return indices.to(torch.int64).numpy()


def _merge(segments: Sequence[Segment]) -> tuple[Segment, ...]:
    """Join ring-adjacent segments that are also adjacent on the same shard."""
    out: list[Segment] = []
    for s in segments:
        last = out[-1] if out else None
        if (
            last is not None
            and last.shard == s.shard
            and last.start + last.length == s.start
            and last.offset + last.length == s.offset
        ):
            out[-1] = Segment(last.start, last.length + s.length, s.shard, last.offset)
        else:
            out.append(s)
    return tuple(out)


class ShardedStorage(Storage):
    """``rows`` rows over ``shards`` = ``[(device, row_count), ...]`` (see the module docstring)."""

    def __init__(
        self,
        spec: ExperienceSpec,
        rows: int,
        shards: Sequence[tuple[str | torch.device, int]],
        *,
        layout: RowLayout | None = None,
        labels: Sequence[str] | None = None,
    ) -> None:
        super().__init__(spec, rows)
        counts = [int(n) for _, n in shards]
        if sum(counts) != rows or any(n <= 0 for n in counts):
            raise PlacementError(
                f"ShardedStorage.shards: expected row counts > 0 summing to rows={rows}, received {counts}"
            )
        self.layout = layout if layout is not None else RowLayout.contiguous(counts)
        if self.layout.shard_rows != tuple(counts):
            raise PlacementError(
                f"ShardedStorage.layout: expected shard rows {tuple(counts)}, received {self.layout.shard_rows}"
            )
        self.labels = tuple(labels) if labels is not None else tuple(str(d) for d, _ in shards)
        if len(self.labels) != len(counts):
            raise PlacementError(f"ShardedStorage.labels: expected {len(counts)} labels, received {len(self.labels)}")
        self.shards: list[TensorStorage] = [TensorStorage(spec, n, device) for device, n in shards]
        self._devices = tuple(dict.fromkeys(s.device for s in self.shards))
        self._single = self.layout.identity
        self._streams: dict[tuple[torch.device, torch.device], StreamSet | None] = {}

    @property
    def devices(self) -> tuple[torch.device, ...]:
        return self._devices

    @property
    def streaming(self) -> bool:
        return any(s.streaming for s in self.shards)

    def set_streaming(self, enabled: bool) -> None:
        for shard in self.shards:
            shard.set_streaming(enabled)

    def write(self, start: int, data: Mapping[str, torch.Tensor]) -> None:
        if self._single:
            self.shards[0].write(start, data)
            return
        n = next(iter(data.values())).shape[0]
        for at, seg in self.layout.pieces(start, n):
            self.shards[seg.shard].write(seg.offset, {k: v[at : at + seg.length] for k, v in data.items()})

    def gather(
        self, indices: torch.Tensor, device: torch.device | None = None, out: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        if self._single:
            return self.shards[0].gather(indices, device, out)
        target = device if device is not None else self._devices[0]
        local, counts, inverse = self.layout.group(indices)
        n = local.shape[0]
        out = {f.name: torch.empty((n, *f.shape), dtype=f.dtype, device=target) for f in self.spec}
        events = []
        lo = 0
        for k, count in enumerate(counts):
            if count:
                events.append(self._gather_shard(self.shards[k], local[lo : lo + count], out, lo, target))
            lo += count
        if target.type == "cuda":  # the target's stream waits for every source stream (no host sync)
            current = torch.cuda.current_stream(target)
            for event in events:
                if event is not None:
                    current.wait_event(event)
        if inverse is None:
            return out
        if target.type == "cpu":
            return {name: gather_into(t, inverse, torch.empty_like(t)) for name, t in out.items()}
        inv = inverse.to(target, non_blocking=True)
        return {name: t.index_select(0, inv) for name, t in out.items()}

    def _gather_shard(
        self, shard: TensorStorage, local: torch.Tensor, out: dict[str, torch.Tensor], lo: int, target: torch.device
    ) -> torch.cuda.Event | None:
        """Rows ``local`` of one shard into ``out[...][lo:]``, on the shard's dedicated stream where CUDA is."""
        hi = lo + local.shape[0]
        streams = self._stream(shard.device, target)
        if streams is None:  # host to host, or no CUDA: plain gathers
            for name, dst in out.items():
                gather_into(shard.tensors[name], local, dst[lo:hi])
            return None
        assert streams.stream is not None
        streams.stream.wait_stream(torch.cuda.current_stream(streams.device))  # earlier writes, the fresh output
        with streams.active():
            idx = local if shard.device.type == "cpu" else local.to(shard.device, non_blocking=True)
            for name, dst in out.items():
                src = shard.tensors[name]
                if shard.device == target:
                    torch.index_select(src, 0, idx, out=dst[lo:hi])
                elif shard.device.type == "cpu":  # host rows to a GPU: stage in pinned memory for an async DMA
                    staged = torch.empty((hi - lo, *src.shape[1:]), dtype=src.dtype, pin_memory=True)
                    dst[lo:hi].copy_(gather_into(src, idx, staged), non_blocking=True)
                else:  # GPU rows to another GPU (peer copy) or to the host (a blocking copy)
                    dst[lo:hi].copy_(torch.index_select(src, 0, idx), non_blocking=target.type == "cuda")
            return streams.record()

    def _stream(self, source: torch.device, target: torch.device) -> StreamSet | None:
        """The dedicated stream for copies out of ``source`` (on the source GPU, else on a GPU target)."""
        key = (source, target)
        if key not in self._streams:
            on = source if source.type == "cuda" else target if target.type == "cuda" else None
            self._streams[key] = StreamSet(on) if on is not None and torch.cuda.is_available() else None
        return self._streams[key]

    def read(self, start: int, n: int) -> dict[str, torch.Tensor]:
        if self._single:
            return self.shards[0].read(start, n)
        target = self._devices[0]
        out = {f.name: torch.empty((n, *f.shape), dtype=f.dtype, device=target) for f in self.spec}
        for at, seg in self.layout.pieces(start, n):
            src = self.shards[seg.shard]
            for name, t in out.items():
                copy_into(t[at : at + seg.length], src.tensors[name][seg.offset : seg.offset + seg.length])
        return out

    def close(self) -> None:
        for s in self.shards:
            s.close()
        self._streams.clear()

    def __repr__(self) -> str:
        parts = ", ".join(f"{lab}:{s.rows}" for lab, s in zip(self.labels, self.shards))
        return f"ShardedStorage({parts}; {len(self.layout.segments)} segments)"


def shards_of(storage: Storage) -> tuple[list[TensorStorage], RowLayout]:
    """The single-device shards of a storage and its ring layout (a TensorStorage is one shard)."""
    if isinstance(storage, ShardedStorage):
        return storage.shards, storage.layout
    if isinstance(storage, TensorStorage):
        return [storage], RowLayout.contiguous([storage.rows])
    raise PlacementError(
        f"storage: expected a TensorStorage or ShardedStorage to migrate, received {type(storage).__name__}"
    )


def copy_block(src: TensorStorage, src_row: int, dst: TensorStorage, dst_row: int, rows: int) -> None:
    """Rows ``src_row..`` of ``src`` into ``dst_row..`` of ``dst`` (grown trailing dims stay zero-padded).

    ``dst`` must be freshly allocated (zeroed), as migration targets are.
    """
    non_blocking = dst.device.type == "cuda" or dst.pinned
    for name, d in dst.tensors.items():
        s = src.tensors[name][src_row : src_row + rows]
        view = d[dst_row : dst_row + rows]
        if s.shape[1:] != view.shape[1:]:
            if s.device.type == "cuda" and view.device.type == "cpu":
                _padded_to_host(view, s, non_blocking)
                continue
            view = view[(slice(None), *(slice(0, k) for k in s.shape[1:]))]
        copy_into(view, s, non_blocking)


#: GPU memory a grown field's rows are padded in before they go to the host, a chunk at a time
PAD_CHUNK_BYTES = 64 << 20


def _padded_to_host(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool) -> None:
    """Narrower GPU rows ``src`` into whole host rows ``dst``: zero-padded on the GPU, then one DMA per chunk.

    torch copies a GPU tensor into a strided host view (the rows' first columns) through a pageable host
    temporary and a CPU scatter, far slower than the one DMA the cost model assumes for the migration
    (BENCHMARKS.md, "GPU"); padding on the GPU first keeps it to DMAs. Chunks bound the GPU memory this takes
    (the GPU is usually short of it when rows leave it); the caching allocator hands a chunk's block to the
    next one only after the copy queued on the same stream is done with it.
    """
    if src.shape[0] == 0:
        return
    row_bytes = max(1, dst[0].numel() * dst.element_size())
    step = max(1, PAD_CHUNK_BYTES // row_bytes)
    cols = (slice(None), *(slice(0, k) for k in src.shape[1:]))
    for i in range(0, src.shape[0], step):
        part = src[i : i + step]
        padded = part.new_zeros((part.shape[0], *dst.shape[1:]))
        padded[cols] = part
        dst[i : i + part.shape[0]].copy_(padded, non_blocking=non_blocking)


def move_rows(src: Sequence[TensorStorage], dst: Sequence[TensorStorage], copies: Sequence[RowCopy]) -> None:
    """Run ``copies`` between shard lists; in parallel on one dedicated stream per source device where CUDA is.

    Returns once every copy is complete (devices involved are synchronized), so
    the sources may be released right after.
    """
    cuda = [
        d for d in dict.fromkeys([s.device for s in src] + [s.device for s in dst]) if d.type == "cuda"
    ]
    if not cuda or not torch.cuda.is_available():
        for c in copies:
            copy_block(src[c.src], c.src_row, dst[c.dst], c.dst_row, c.rows)
        return
    for d in cuda:  # pending writes to the sources and the targets' zero fill come first
        torch.cuda.synchronize(d)
    streams: dict[tuple[torch.device, torch.device], StreamSet] = {}
    for c in copies:
        s, t = src[c.src], dst[c.dst]
        on = s.device if s.device.type == "cuda" else t.device  # a host source copies on its target's GPU
        if on.type != "cuda":
            copy_block(s, c.src_row, t, c.dst_row, c.rows)
            continue
        key = (s.device, on)
        stream = streams.get(key)
        if stream is None:
            stream = streams[key] = StreamSet(on)
        with stream.active():
            copy_block(s, c.src_row, t, c.dst_row, c.rows)
    for d in cuda:
        torch.cuda.synchronize(d)
