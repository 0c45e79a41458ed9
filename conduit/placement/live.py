"""Profile the live machine into a :class:`~conduit.placement.topology.Topology`.

torch earns its place: the buffer moves bytes with torch copies, so the
effective bandwidths that matter are those of ``Tensor.copy_`` on this stack
(pageable vs pinned host memory, copy engines, peer access), measured the same
way. torch is imported when profiling runs, not when this module is imported.
psutil is used for available host memory when it is installed (never required);
otherwise ``MemAvailable`` from ``/proc/meminfo``.

Method: for each path, copy ``nbytes`` (default 64 MiB) ``warmup`` times, then
time ``repeats`` copies (synchronizing the devices involved) and keep the median;
bandwidth = bytes copied / median seconds. Every measurement stops early (after
at least one timed copy) once ``time_budget_s`` is spent, and the notes say so.

Host memory is measured as a replay ring uses it. ``host_memcpy`` writes into
the next ``nbytes`` of a ring of ``RING_COPIES * nbytes`` each time, so that the
destination is not still in a large last-level cache from the copy before:
copies into one destination would write to that cache rather than to memory,
and overstate the bandwidth a ring push sees. ``host_gather`` gathers
``nbytes`` of random ``GATHER_ROW_BYTES`` rows out of that ring (fresh rows each
time; into pinned memory where CUDA is, as a GPU learner's batches are staged):
the CPU's share of a delivery from host memory, which a contiguous copy
overstates.
Free GPU memory comes from ``torch.cuda.mem_get_info`` before any buffer is
allocated.

The host rates also depend on the row size (per-row work against bandwidth) and
on whether a unit or a batch stays in the cache, so they are measured the way the
runtime runs them at each of :data:`ROW_SIZES` (``host_write_by_row``: a unit of
:data:`WRITE_UNIT` rows written by the storage class into successive slots of a
ring, from :data:`SOURCE_UNITS` units in turn; ``host_gather_by_row``: a batch of :data:`DELIVERY_BATCH` random rows
gathered out of it), each net of the fixed cost of one such call on rows of 4 B.
The model reads them at the workload's rows. The runtime's own fixed cost per
push and per pull (``push_call_s`` ..., :meth:`Node.call_seconds`) is measured on
the real runtime where the caller passes ``calls``
(:func:`conduit.scheduling.calls.runtime_call_costs`).

Delivery onto each GPU is also measured the way the runtime runs it
(``gpu_gather``, ``host_deliver_to_gpu``, ``pinned_deliver_to_gpu``): a training
batch of ``DELIVERY_BATCH`` random rows gathered by the real storage class
(:class:`~conduit.storage.TensorStorage`) out of a ring on the GPU, in pageable
and in pinned host memory, onto the GPU, synchronized. Raw copy rates overstate
such a pull by a factor that depends on the path, and Alg. 1 compares paths.

Without CUDA the topology has one node with pageable host memory only: pinned
memory needs a CUDA device in torch, so it is recorded as absent (a note says
why). The default profile then takes well under a second (after importing torch).
"""

from __future__ import annotations

import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from conduit.errors import PlacementError
from conduit.placement.topology import Node, Topology
from conduit.placement.units import MIB

__all__ = [
    "GATHER_ROW_BYTES", "RING_COPIES", "ROW_SIZES", "cap_pageable", "host_available_bytes", "profile_topology",
]

#: bytes per row of the host gather (float32 rows; a transition of dimension 1,000 is ~8 KB)
GATHER_ROW_BYTES = 8 << 10
#: the host ring the copies and gathers run over, in multiples of ``nbytes``
RING_COPIES = 4
#: rows in the training batch a delivery measurement gathers (the profile's default off-policy batch)
DELIVERY_BATCH = 512
#: rows per unit a write measurement pushes (the profile's default rollout unit)
WRITE_UNIT = 256
#: row sizes the host write and gather rates are measured at, bytes (a float32 row of dim 16 .. 32,768)
ROW_SIZES = (64, 512, 4 << 10, 32 << 10, 64 << 10, 128 << 10)
#: rollout units the write measurement takes its rows from in turn (an actor's units in flight: not all cached)
SOURCE_UNITS = 4
#: the fewest bytes a unit or batch of the row-size measurements moves (small rows take more of them)
MIN_TIMED_BYTES = 1 << 20

log = logging.getLogger(__name__)


def host_available_bytes() -> int:
    """Host memory available to new allocations (psutil, else ``/proc/meminfo``, else sysconf)."""
    try:
        import psutil  # optional

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError) as e:
        raise PlacementError("host memory: cannot read the available host memory on this platform") from e


class _Timer:
    """Median bandwidth of a copy, within a shared time budget."""

    def __init__(
        self, nbytes: int, warmup: int, repeats: int, budget_s: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.nbytes, self.warmup, self.repeats = nbytes, warmup, repeats
        self.clock = clock  # the wall clock; a test passes a virtual one
        self.deadline = clock() + budget_s
        self.truncated = False

    def bandwidth(self, copy: Callable[[], object], sync: Callable[[], None]) -> float:
        for _ in range(self.warmup):
            if self.clock() > self.deadline:
                self.truncated = True
                break
            copy()
        sync()
        times: list[float] = []
        for _ in range(self.repeats):
            sync()
            t0 = self.clock()
            copy()
            sync()
            times.append(self.clock() - t0)
            if self.clock() > self.deadline:
                self.truncated = len(times) < self.repeats or self.truncated
                break
        return self.nbytes / max(statistics.median(times), 1e-9)

    def seconds(self, call: Callable[[], object], repeats: int) -> float:
        """Median seconds of ``call`` (one untimed first), at least once, within the budget."""
        call()
        times: list[float] = []
        for _ in range(repeats):
            t0 = self.clock()
            call()
            times.append(self.clock() - t0)
            if self.clock() > self.deadline:
                self.truncated = len(times) < repeats or self.truncated
                break
        return max(statistics.median(times), 1e-9)


def _check(name: str, value: Any, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise PlacementError(f"{name}: expected a number >= {minimum}, received {value!r}")


def profile_topology(
    *,
    name: str = "live",
    nbytes: int = 64 * MIB,
    warmup: int = 1,
    repeats: int = 5,
    gpus: Sequence[int] | None = None,
    peer: bool = True,
    pinned_fraction: float = 0.5,
    time_budget_s: float = 60.0,
    calls: Callable[[], Mapping[str, float]] | None = None,
) -> Topology:
    """Measure this machine (one node): host memcpy, host<->GPU (pageable, pinned), peer copies.

    Args:
        name: the topology's name.
        nbytes: bytes per timed copy (realistic: tens of MiB).
        warmup: untimed copies before timing each path.
        repeats: timed copies per path; the median is kept.
        gpus: CUDA ordinals to profile (default: all visible).
        peer: measure GPU<->GPU copies for every ordered pair.
        pinned_fraction: share of available host memory the buffer may pin.
        time_budget_s: wall-clock budget for all measurements together.
        calls: measures the runtime's fixed seconds per call (``push_call_s`` ...:
            :func:`conduit.scheduling.calls.runtime_call_costs`, which the placement layer cannot import: the
            runtime builds on it); ``None``: not measured (0). They never change a choice among candidates on
            one node, only the modeled time of an iteration.
    """
    _check("nbytes", nbytes, 1)
    _check("warmup", warmup, 0)
    _check("repeats", repeats, 1)
    _check("time_budget_s", time_budget_s, 0)
    if not 0.0 < pinned_fraction <= 1.0:
        raise PlacementError(f"pinned_fraction: expected 0 < fraction <= 1, received {pinned_fraction!r}")
    import torch

    started = time.perf_counter()
    timer = _Timer(int(nbytes), int(warmup), int(repeats), float(time_budget_s))
    host_memory = host_available_bytes()
    notes = [
        f"profiled live on {platform.node() or 'this host'} with torch {torch.__version__}: "
        f"{nbytes} B copies, {warmup} warm-up, median of {repeats}"
    ]

    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)  # touch the pages before timing
    cuda = torch.cuda.is_available()
    host_memcpy, host_gather = _profile_host(torch, timer, src, pinned=cuda)

    ordinals = list(range(torch.cuda.device_count())) if cuda and gpus is None else list(gpus or [])
    if ordinals and not cuda:
        raise PlacementError(f"gpus: expected none on a machine without CUDA, received {ordinals}")
    node_data: dict[str, Any] = {
        "host_memory_bytes": host_memory, "host_memcpy": host_memcpy, "host_gather": host_gather,
        **_profile_host_rows(torch, timer), **(dict(calls()) if calls is not None else {}),
    }
    notes.append(
        f"host memcpy into a {RING_COPIES}x ring; host gather of random {GATHER_ROW_BYTES // 1024} KiB rows out of "
        f"it{' into pinned memory' if cuda else ''}; host writes of {WRITE_UNIT}-row units and gathers of "
        f"{DELIVERY_BATCH}-row batches by the storage class at rows of {', '.join(map(str, ROW_SIZES))} B"
        + ("; the runtime's fixed cost per push and pull" if calls is not None else "")
    )
    if not cuda:
        notes.append("no CUDA device: no GPUs, and no pinned host memory (pinning needs CUDA in torch)")
    else:
        dst = torch.empty(nbytes, dtype=torch.uint8).fill_(0)  # pageable GPU -> host copies land here
        tables = _profile_gpus(torch, timer, ordinals, src, dst, peer)
        capped = cap_pageable(tables, host_memcpy)
        if capped:
            notes.append(
                f"pageable host<->GPU copies measured faster than host memcpy ({', '.join(capped)}): capped at "
                "host memcpy, since each is a host memcpy into the driver's staging memory plus a DMA"
            )
        node_data.update(tables)
        node_data.update(_profile_deliveries(torch, timer, ordinals))
        notes.append(
            f"delivery onto each GPU as the runtime runs it: {DELIVERY_BATCH} random {GATHER_ROW_BYTES // 1024} KiB "
            "rows gathered by the storage class out of a GPU, a pageable and a pinned ring"
        )
        node_data["pinned_memory_bytes"] = max(1, int(host_memory * pinned_fraction))
        notes.append(f"pinned host memory: {pinned_fraction:.0%} of available host memory (a policy)")
        if not peer and len(ordinals) > 1:
            notes.append("peer copies not measured: GPU<->GPU set to the GPU->pinned->GPU bottleneck")
    if timer.truncated:
        notes.append(f"time budget of {time_budget_s} s reached: some medians use fewer repeats")
    log.debug("profiled topology in %.3f s", time.perf_counter() - started)
    return Topology(name=name, description="profiled live", notes=tuple(notes), nodes=(Node(**node_data),))


def _profile_host(torch: Any, timer: _Timer, src: Any, pinned: bool) -> tuple[float, float]:
    """``host_memcpy`` (writes into the next slot of a ring) and ``host_gather`` (random rows out of it)."""
    n = timer.nbytes
    cols = GATHER_ROW_BYTES // 4
    rows = max(2, -(-RING_COPIES * n // GATHER_ROW_BYTES))
    ring = torch.empty((rows, cols), dtype=torch.float32).fill_(1.0)
    flat = ring.view(-1).view(torch.uint8)
    slots = flat.numel() // n
    at = [0]

    def write() -> None:
        k = at[0] % slots
        at[0] += 1
        flat[k * n : (k + 1) * n].copy_(src)

    memcpy = timer.bandwidth(write, lambda: None)
    batch = max(1, n // GATHER_ROW_BYTES)
    out = torch.empty((batch, cols), dtype=torch.float32, pin_memory=pinned)
    gen = torch.Generator().manual_seed(0)

    def gather() -> None:
        torch.index_select(ring, 0, torch.randint(0, rows, (batch,), generator=gen), out=out)

    gathered = timer.bandwidth(gather, lambda: None) * (batch * GATHER_ROW_BYTES) / n
    return memcpy, gathered


def _profile_host_rows(torch: Any, timer: _Timer) -> dict[str, list[list[float]]]:
    """``host_write_by_row`` and ``host_gather_by_row``: the storage class's unit write and batch gather on a host
    ring of at least ``RING_COPIES * nbytes``, per row size, each net of the same call's time on rows of 4 B."""
    from conduit.spec import ExperienceSpec
    from conduit.storage import TensorStorage

    gen = torch.Generator().manual_seed(0)

    def timings(row: int, least_bytes: int = MIN_TIMED_BYTES) -> tuple[float, float, int, int]:
        cols = max(1, row // 4)
        # small rows in bigger units and batches (at least MIN_TIMED_BYTES), so that a rate is not noise over
        # a fixed cost; such units and batches stay in the cache either way
        unit_rows = max(WRITE_UNIT, -(-least_bytes // row))
        batch_rows = max(DELIVERY_BATCH, -(-least_bytes // row))
        rows = max(4 * max(batch_rows, unit_rows), -(-RING_COPIES * timer.nbytes // (cols * 4)))
        storage = TensorStorage(ExperienceSpec.of(obs=((cols,), "float32")), rows, "cpu")
        try:
            storage.write(0, {"obs": torch.ones(rows, cols)})  # touch every page before timing
            units = [{"obs": torch.full((unit_rows, cols), float(k))} for k in range(SOURCE_UNITS)]
            out = {"obs": torch.empty(batch_rows, cols)}  # the runtime's recycled batch memory
            slots, at = rows // unit_rows, [0]

            def write() -> None:
                storage.write((at[0] % slots) * unit_rows, units[at[0] % SOURCE_UNITS])
                at[0] += 1

            def gather() -> None:
                storage.gather(torch.randint(0, rows, (batch_rows,), generator=gen), out=out)

            repeats = max(timer.repeats, 15 if row >= 4096 else 45)
            return timer.seconds(write, repeats), timer.seconds(gather, repeats), unit_rows, batch_rows
        finally:
            storage.close()

    write0, gather0, _, _ = timings(4, 0)  # the fixed cost: a unit and a batch of the runtime's sizes
    table: dict[str, list[list[float]]] = {"host_write_by_row": [], "host_gather_by_row": []}
    for row in ROW_SIZES:
        w, g, unit_rows, batch_rows = timings(row)
        # net of the fixed cost, never below a twentieth of the call: noise must not make a rate infinite
        table["host_write_by_row"].append([row, unit_rows * row / max(w - write0, w / 20)])
        table["host_gather_by_row"].append([row, batch_rows * row / max(g - gather0, g / 20)])
    return table


def _profile_deliveries(torch: Any, timer: _Timer, ordinals: list[int]) -> dict[str, list[float]]:
    """``gpu_gather``, ``host_deliver_to_gpu``, ``pinned_deliver_to_gpu`` per GPU: a training batch out of a ring
    by the runtime's storage class, onto that GPU (bytes of the batch per second)."""
    from conduit.spec import ExperienceSpec
    from conduit.storage import TensorStorage

    cols = GATHER_ROW_BYTES // 4
    spec = ExperienceSpec.of(obs=((cols,), "float32"))
    rows = max(DELIVERY_BATCH * 4, min(-(-RING_COPIES * timer.nbytes // GATHER_ROW_BYTES), 1 << 16))
    batch_bytes = DELIVERY_BATCH * GATHER_ROW_BYTES
    gen = torch.Generator().manual_seed(0)
    out: dict[str, list[float]] = {"gpu_gather": [], "host_deliver_to_gpu": [], "pinned_deliver_to_gpu": []}
    for g in ordinals:
        target = torch.device(f"cuda:{g}")
        for key, where in (("gpu_gather", f"cuda:{g}"), ("host_deliver_to_gpu", "cpu"),
                           ("pinned_deliver_to_gpu", "pinned")):
            storage = TensorStorage(spec, rows, where)
            try:
                storage.write(0, {"obs": torch.ones(rows, cols)})

                def pull(storage: Any = storage, target: Any = target) -> None:
                    idx = torch.randint(0, rows, (DELIVERY_BATCH,), generator=gen)
                    storage.gather(idx, target)

                def sync(g: int = g) -> None:
                    torch.cuda.synchronize(g)

                out[key].append(timer.bandwidth(pull, sync) * batch_bytes / timer.nbytes)
            finally:
                storage.close()
        torch.cuda.empty_cache()
    return out


def cap_pageable(tables: dict[str, Any], host_memcpy: float) -> list[str]:
    """Cap pageable host<->GPU bandwidths at ``host_memcpy`` in place; the entries capped, named.

    A pageable copy to or from a GPU is a host memcpy into (or out of) the driver's pinned staging memory
    plus a DMA, so it cannot run faster than a host memcpy. A measurement that says otherwise is noise (a
    busy host slows the memcpy timed first more than the DMA-bound copies after it), and left in, Eq. 1
    would route CPU-to-CPU traffic through a GPU.
    """
    capped = []
    for key in ("host_to_gpu", "gpu_to_host"):
        for g, bw in enumerate(tables[key]):
            if bw > host_memcpy:
                tables[key][g] = host_memcpy
                capped.append(f"{key}[{g}]")
    return capped


def _profile_gpus(
    torch: Any, timer: _Timer, ordinals: list[int], host_src: Any, host_dst: Any, peer: bool
) -> dict[str, Any]:
    """Per-GPU tables (free memory first, then copies)."""
    n = timer.nbytes
    visible = torch.cuda.device_count()
    bad = [g for g in ordinals if not 0 <= g < visible]
    if bad:
        raise PlacementError(f"gpus: expected CUDA ordinals in 0..{visible - 1}, received {list(ordinals)}")
    free = [int(torch.cuda.mem_get_info(g)[0]) for g in ordinals]
    pinned_src = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(1)
    pinned_dst = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    bufs = {
        g: (
            torch.empty(n, dtype=torch.uint8, device=f"cuda:{g}").fill_(1),
            torch.empty(n, dtype=torch.uint8, device=f"cuda:{g}"),
        )
        for g in ordinals
    }

    def sync(*gs: int) -> Callable[[], None]:
        def run() -> None:
            for g in gs:
                torch.cuda.synchronize(g)

        return run

    def copy(dst: Any, src: Any, non_blocking: bool = False) -> Callable[[], object]:
        return lambda: dst.copy_(src, non_blocking=non_blocking)

    names = ("gpu_local", "host_to_gpu", "gpu_to_host", "pinned_to_gpu", "gpu_to_pinned")
    table: dict[str, list[float]] = {k: [] for k in names}
    for g in ordinals:
        a, b = bufs[g]
        s = sync(g)
        table["gpu_local"].append(timer.bandwidth(copy(b, a), s))
        table["host_to_gpu"].append(timer.bandwidth(copy(b, host_src), s))
        table["gpu_to_host"].append(timer.bandwidth(copy(host_dst, a), s))
        table["pinned_to_gpu"].append(timer.bandwidth(copy(b, pinned_src, True), s))
        table["gpu_to_pinned"].append(timer.bandwidth(copy(pinned_dst, a, True), s))
    matrix = [[0.0] * len(ordinals) for _ in ordinals]
    for i, gi in enumerate(ordinals):
        for j, gj in enumerate(ordinals):
            if i == j:
                continue
            if peer:
                matrix[i][j] = timer.bandwidth(copy(bufs[gj][1], bufs[gi][0]), sync(gi, gj))
            else:
                matrix[i][j] = min(table["gpu_to_pinned"][i], table["pinned_to_gpu"][j])
    del bufs
    torch.cuda.empty_cache()
    return {"gpu_memory_bytes": free, "gpu_to_gpu": matrix, **table}
