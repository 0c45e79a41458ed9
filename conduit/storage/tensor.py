"""Single-device storage: one preallocated tensor per field.

Writes are contiguous slice copies (two at the ring's wrap), through numpy where
ATen would copy on the calling thread anyway (a one-transition push is mostly
dispatch, and numpy's dispatch of a small copy is far cheaper); reads gather with
``torch.index_select``, into the memory the caller offers (recycled batch
memory, :mod:`conduit.memory`) or into fresh tensors. Large host fields are
advised for transparent huge pages (:mod:`conduit.storage.hugepages`) before
they are first touched: a random-row gather then misses the TLB far less.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

from conduit.errors import PlacementError
from conduit.executor import serial_kernels
from conduit.spec import ExperienceSpec
from conduit.storage import hugepages, streaming
from conduit.storage.base import Storage

__all__ = ["TensorStorage", "copy_into", "fits", "gather_into", "resolve_device"]

PINNED = "pinned"

#: ATen's CPU parallel grain (``at::internal::GRAIN_SIZE``): calls below it run serially.
SERIAL_ELEMENTS = 32_768


def _serial_rows(t: torch.Tensor) -> int:
    """Rows per call that keep a host op on ``t`` under the parallel grain (0: no chunking needed)."""
    if t.device.type != "cpu" or not serial_kernels():
        return 0
    row = max(1, t[0].numel()) if t.dim() > 1 else 1
    return max(1, (SERIAL_ELEMENTS - 1) // row)


def gather_into(src: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``index_select(src, 0, idx, out=out)``, kept serial where :func:`~conduit.executor.serial_kernels` says so."""
    step = _serial_rows(src)
    if not step or idx.shape[0] <= step:
        return torch.index_select(src, 0, idx, out=out)
    for i in range(0, idx.shape[0], step):
        torch.index_select(src, 0, idx[i : i + step], out=out[i : i + step])
    return out


def fits(out: torch.Tensor | None, rows: int, src: torch.Tensor) -> bool:
    """Whether ``out`` can receive ``rows`` rows of ``src``: offered batch memory can be stale.

    The memory for a batch is picked before the buffer lock is taken, so a
    migration that widens a field can land in between; such a field then gets
    fresh memory instead.
    """
    return (
        out is not None
        and out.shape[0] == rows
        and out.shape[1:] == src.shape[1:]
        and out.dtype == src.dtype
        and out.device == src.device
    )


def copy_into(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> None:
    """``dst.copy_(src)``, kept serial for host tensors where :func:`~conduit.executor.serial_kernels` says so."""
    step = _serial_rows(dst) if src.device.type == "cpu" else 0
    if not step or dst.shape[0] <= step:
        dst.copy_(src, non_blocking=non_blocking)
        return
    for i in range(0, dst.shape[0], step):
        dst[i : i + step].copy_(src[i : i + step], non_blocking=non_blocking)


#: rows at least this large are copied one by one when picked out of a unit (no gathered temporary)
ROW_BY_ROW_BYTES = 16 << 10


def _scatter(dst: np.ndarray, slots: np.ndarray, src: np.ndarray, rows: np.ndarray | None) -> None:
    """``dst[slots] = src`` (or ``src[rows]``): picked rows of at least :data:`ROW_BY_ROW_BYTES` are copied
    one by one, which skips the temporary numpy's fancy indexing makes (or a torch ``index_select`` first):
    with the caches evicted, each large row is then copied once, not twice."""
    if rows is None:
        dst[slots] = src
    elif src.ndim > 1 and src[0].nbytes >= ROW_BY_ROW_BYTES:
        for slot, row in zip(slots.tolist(), rows.tolist()):
            dst[slot] = src[row]
    else:
        dst[slots] = src[rows]


def resolve_device(name: str | torch.device) -> tuple[torch.device, bool]:
    """``"pinned"`` -> (cpu, pinned); any torch device string -> (device, False)."""
    if isinstance(name, torch.device):
        return name, False
    if name == PINNED:
        return torch.device("cpu"), True
    return torch.device(name), False


class TensorStorage(Storage):
    """All rows on one device: pageable CPU, pinned CPU, or one GPU."""

    def __init__(self, spec: ExperienceSpec, rows: int, device: str | torch.device = "cpu") -> None:
        super().__init__(spec, rows)
        self.device, self.pinned = resolve_device(device)
        if self.pinned and not torch.cuda.is_available():
            raise PlacementError(
                "storage_device='pinned' needs CUDA (page-locked host memory is a CUDA feature); "
                "this machine has none: use 'cpu'"
            )
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise PlacementError(f"storage_device={str(self.device)!r} but CUDA is not available on this machine")
        self.huge_pages = 0  # fields whose memory was advised for transparent huge pages
        self.tensors: dict[str, torch.Tensor] = {
            f.name: self._alloc((rows, *f.shape), f.dtype) for f in spec
        }
        # fixed for the storage's life; write() runs once a push and reads them instead of recomputing
        self._on_gpu = self.device.type == "cuda"
        self._host = self.device.type == "cpu"
        self._may_pad = spec.has_growable  # else the spec's check has fixed every trailing shape already
        self._numpy = _numpy_views(self.tensors) if self._host else {}
        # what each field's memory is referenced by while no view of it is out (see in_use)
        self._idle_refs = {name: _use_count(t) for name, t in self.tensors.items()} if _use_count else None
        self._viewed = False  # whether view() ever handed rows out (then writes re-check their numpy views)
        self._streams: dict[str, int] = {}  # field -> rows from which a write streams (set_streaming)
        self._batch_shapes: tuple[int, dict[str, torch.Size]] | None = None  # (rows, field -> shape): _gather_into

    @property
    def streaming(self) -> bool:
        """Whether large writes bypass the caches (non-temporal stores: :mod:`conduit.storage.streaming`)."""
        return bool(self._streams)

    def set_streaming(self, enabled: bool) -> None:
        self._streams = {}
        if not enabled:
            return
        for name in self._numpy:  # host fields numpy can view: those a write copies itself
            t = self.tensors[name]
            rows = streaming.min_rows(t.element_size() * (t[0].numel() if t.dim() > 1 else 1))
            if rows is not None:
                self._streams[name] = rows

    def _alloc(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype, device=self.device, pin_memory=self.pinned)
        if hugepages.advise(t):  # before the first touch: random-row gathers miss the TLB far less
            self.huge_pages += 1
        # touch the pages now, not on the first write in the hot path
        step = _serial_rows(t)
        if not step:
            t.zero_()
        else:
            for i in range(0, shape[0], step):
                t[i : i + step].zero_()
        return t

    @property
    def devices(self) -> tuple[torch.device, ...]:
        return (self.device,)

    def write(self, start: int, data: Mapping[str, torch.Tensor]) -> None:
        n = next(iter(data.values())).shape[0]
        start %= self.rows
        end = start + n
        non_blocking = self._on_gpu
        if end <= self.rows and not self._may_pad and (non_blocking or not serial_kernels()):
            views = self._numpy_now()
            one_thread = bool(views) and torch.get_num_threads() == 1  # ATen would copy on this thread alone
            streams = self._streams
            for name, dst in self.tensors.items():  # the common case: one slice copy a field
                src = data[name]
                below = views.get(name)
                if below is not None and (one_thread or n < below[1]):
                    try:
                        s = src.numpy()
                    except (RuntimeError, TypeError):  # on a GPU, requires grad, a conj/neg bit: torch copies it
                        pass
                    else:
                        rows = streams.get(name)
                        if rows is not None and n >= rows and s.flags.c_contiguous:
                            nbytes = s.nbytes
                            at, frm = below[2] + start * (nbytes // n), src.data_ptr()
                            if frm >= at + nbytes or at >= frm + nbytes:  # a streaming copy is no memmove
                                streaming.copy(at, frm, nbytes)
                                continue
                        below[0][start:end] = s
                        continue
                dst[start:end].copy_(src, non_blocking=non_blocking)
            return
        first = min(n, self.rows - start)
        serial = serial_kernels() and not non_blocking
        for name, dst in self.tensors.items():
            src = data[name]
            if src.shape[1:] != dst.shape[1:]:
                src = _pad_to(src, dst.shape[1:])
            if not serial and first == n:
                dst[start : start + n].copy_(src, non_blocking=non_blocking)
                continue
            copy_into(dst[start : start + first], src[:first], non_blocking)
            if first < n:
                copy_into(dst[: n - first], src[first:], non_blocking)

    def write_slots(
        self, slots: np.ndarray, data: Mapping[str, torch.Tensor], rows: np.ndarray | None = None
    ) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        views = self._numpy_now()
        picked = None if rows is None else np.asarray(rows, dtype=np.int64)
        idx: torch.Tensor | None = None  # for the fields torch copies
        for name, dst in self.tensors.items():
            src = data[name]
            below = views.get(name)
            if below is not None and src.shape[1:] == dst.shape[1:]:
                try:  # numpy's row scatter: cheaper than index_copy_ (BENCHMARKS.md, "Delivery and ingestion")
                    _scatter(below[0], slots, src.numpy(), picked)
                    continue
                except (RuntimeError, TypeError):  # on a GPU, requires grad, a conj/neg bit: torch copies it
                    pass
            if picked is not None:
                src = src.index_select(0, torch.from_numpy(picked).to(src.device))
            if src.shape[1:] != dst.shape[1:]:
                src = _pad_to(src, dst.shape[1:])
            src = src.to(self.device, non_blocking=self.device.type == "cuda")
            if idx is None:
                idx = torch.from_numpy(slots).to(self.device)
            step = _serial_rows(dst) or idx.shape[0]
            for i in range(0, idx.shape[0], step):
                dst.index_copy_(0, idx[i : i + step], src[i : i + step])

    def gather(
        self, indices: torch.Tensor, device: torch.device | None = None, out: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        if device is None and out is None and self._host and not indices.is_cuda and not serial_kernels():
            # the hot path (a pull's fresh host batch): every attribute read here costs several times its
            # warm time right after a gather has streamed through the caches, so the device checks below are skipped
            return {name: torch.index_select(t, 0, indices) for name, t in self.tensors.items()}
        if out is not None and (device is None or device == self.device):
            return self._gather_into(indices, out)
        idx = indices if indices.device == self.device else indices.to(self.device)
        if device is not None and device.type == "cuda" and self.device.type == "cpu":
            # host rows bound for a GPU: gather into pinned memory so the copy is a real async DMA
            # (the caching host allocator keeps the block until the copy's stream is done with it)
            offered = out or {}
            result = {}
            for name, t in self.tensors.items():
                staged = gather_into(t, idx, torch.empty((idx.shape[0], *t.shape[1:]), dtype=t.dtype, pin_memory=True))
                dst = offered.get(name)
                if dst is not None and dst.device == device and dst.shape == staged.shape and dst.dtype == t.dtype:
                    result[name] = dst.copy_(staged, non_blocking=True)  # the learner's recycled batch memory
                else:
                    result[name] = staged.to(device, non_blocking=True)
            return result
        if self.device.type == "cpu" and serial_kernels():
            out = {
                name: gather_into(t, idx, t.new_empty((idx.shape[0], *t.shape[1:])))
                for name, t in self.tensors.items()
            }
        else:
            out = {name: torch.index_select(t, 0, idx) for name, t in self.tensors.items()}
        if device is not None and device != self.device:
            out = {k: v.to(device, non_blocking=device.type == "cuda") for k, v in out.items()}
        return out

    def _gather_into(self, indices: torch.Tensor, out: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The gather into offered memory on this device (recycled batch memory, a ``batch_pool``), where it fits.

        Offered memory can be stale (:func:`fits`). Here that is checked against
        the shapes of a batch of this size, made once per size: a pull pays for
        every attribute read right after the previous gather, and :func:`fits`
        slices trailing shapes and makes device objects, where this check compares
        sizes made once. The check stays inline: a function call per field would
        give back much of what it saves.
        """
        host = self._host
        idx = indices if (host and indices.is_cpu) or indices.device == self.device else indices.to(self.device)
        n = idx.shape[0]
        shapes = self._batch_shapes
        if shapes is None or shapes[0] != n:
            shapes = (n, {name: torch.Size((n, *t.shape[1:])) for name, t in self.tensors.items()})
            self._batch_shapes = shapes
        expected = shapes[1]
        serial = host and serial_kernels()  # once per gather, not per field
        result = {}
        for name, t in self.tensors.items():
            dst = out.get(name)  # memory is offered for large fields only (conduit.memory)
            if (
                dst is not None
                and dst.shape == expected[name]
                and dst.dtype == t.dtype
                and (dst.is_cpu if host else dst.device == self.device)
            ):
                result[name] = gather_into(t, idx, dst) if serial else torch.index_select(t, 0, idx, out=dst)
            elif serial:
                result[name] = gather_into(t, idx, t.new_empty((n, *t.shape[1:])))
            else:
                result[name] = torch.index_select(t, 0, idx)
        return result

    def _numpy_now(self) -> dict[str, tuple[np.ndarray, int, int]]:
        """The numpy views to write through, remade for any field whose memory moved since.

        Only a storage that handed out views can have its memory moved by someone else
        (``share_memory_()`` of a view: see :func:`_numpy_view`); a replay ring reads one flag.
        """
        if self._viewed:
            for name, t in self.tensors.items():
                below = self._numpy.get(name)
                if below is not None and below[2] != t.data_ptr():
                    self._numpy[name] = _numpy_view(t)  # type: ignore[assignment]
        return self._numpy

    @property
    def hands_out_views(self) -> bool:
        # host memory only: views of a GPU store would need the delivery stream ordered against the learner's
        return self._host and self._idle_refs is not None

    def view(self, start: int, n: int) -> dict[str, torch.Tensor] | None:
        """Host rows ``start .. start+n`` as views (see :attr:`hands_out_views`)."""
        if not self.hands_out_views or start < 0 or start + n > self.rows:
            return None
        self._viewed = True
        return {name: t[start : start + n] for name, t in self.tensors.items()}

    def in_use(self) -> bool:
        if self._idle_refs is None or _use_count is None:
            return False
        return any(_use_count(t) != self._idle_refs[name] for name, t in self.tensors.items())

    def read(self, start: int, n: int) -> dict[str, torch.Tensor]:
        start %= self.rows
        first = min(n, self.rows - start)
        out = {}
        for name, t in self.tensors.items():
            part = t[start : start + first]
            out[name] = torch.cat([part, t[: n - first]]) if first < n else part.clone()
        return out

    def close(self) -> None:
        self.tensors = {}
        self._numpy = {}  # its numpy views would keep the memory alive


def _storage_use_count(t: torch.Tensor) -> int:
    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))


#: how many tensors (views included) share a tensor's memory: torch's private counter, so it is
#: probed once here; where a torch lacks it, storages hand out no views (in_use could not tell)
_use_count: Callable[[torch.Tensor], int] | None = (
    _storage_use_count if hasattr(torch._C, "_storage_Use_Count") else None
)


def _numpy_views(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[np.ndarray, int, int]]:
    """Per host field: a numpy view of it, and the rows below which a write goes through that view.

    A slice copy through torch costs far more per call than one through numpy before it moves a
    byte (indexing, dispatch). That is most of a one-transition push (five fields), so writes
    that ATen would run on the calling thread alone — under its parallel grain, or with one
    intra-op thread — take numpy's ``memcpy``; larger ones stay with torch, which spreads them
    over its threads. Dtypes numpy lacks (bfloat16) stay with torch too.
    """
    out = {}
    for name, t in tensors.items():
        below = _numpy_view(t)
        if below is not None:
            out[name] = below
    return out


def _numpy_view(t: torch.Tensor) -> tuple[np.ndarray, int, int] | None:
    """``(view, rows below which a write takes it, the address it was made at)``; None for dtypes numpy lacks.

    A storage that handed out views checks the address before each write (``_numpy_now``):
    ``share_memory_()`` on any view of a field (an on-policy mini-batch handed out as a view, put on a
    ``torch.multiprocessing`` queue) moves the field's memory to shared memory and frees the old
    block, which a numpy view made earlier would still write into.
    """
    try:
        view = t.numpy()
    except (RuntimeError, TypeError):
        return None
    row = max(1, t[0].numel()) if t.dim() > 1 else 1
    return view, -(-SERIAL_ELEMENTS // row), t.data_ptr()


def _pad_to(src: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Zero-pad ``src``'s trailing dims up to ``shape`` (growable fields written after growth)."""
    out = src.new_zeros((src.shape[0], *shape))
    out[(slice(None), *(slice(0, s) for s in src.shape[1:]))] = src
    return out
