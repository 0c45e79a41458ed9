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
Free GPU memory comes from ``torch.cuda.mem_get_info`` before any buffer is
allocated.

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
from collections.abc import Callable, Sequence
from typing import Any

from conduit.errors import PlacementError
from conduit.placement.topology import Node, Topology
from conduit.placement.units import MIB

__all__ = ["host_available_bytes", "profile_topology"]

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

    def __init__(self, nbytes: int, warmup: int, repeats: int, budget_s: float) -> None:
        self.nbytes, self.warmup, self.repeats = nbytes, warmup, repeats
        self.deadline = time.perf_counter() + budget_s
        self.truncated = False

    def bandwidth(self, copy: Callable[[], object], sync: Callable[[], None]) -> float:
        for _ in range(self.warmup):
            if time.perf_counter() > self.deadline:
                self.truncated = True
                break
            copy()
        sync()
        times: list[float] = []
        for _ in range(self.repeats):
            sync()
            t0 = time.perf_counter()
            copy()
            sync()
            times.append(time.perf_counter() - t0)
            if time.perf_counter() > self.deadline:
                self.truncated = len(times) < self.repeats or self.truncated
                break
        return self.nbytes / max(statistics.median(times), 1e-9)


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
    dst = torch.empty(nbytes, dtype=torch.uint8).fill_(0)
    host_memcpy = timer.bandwidth(lambda: dst.copy_(src), lambda: None)

    cuda = torch.cuda.is_available()
    ordinals = list(range(torch.cuda.device_count())) if cuda and gpus is None else list(gpus or [])
    if ordinals and not cuda:
        raise PlacementError(f"gpus: expected none on a machine without CUDA, received {ordinals}")
    node_data: dict[str, Any] = {"host_memory_bytes": host_memory, "host_memcpy": host_memcpy}
    if not cuda:
        notes.append("no CUDA device: no GPUs, and no pinned host memory (pinning needs CUDA in torch)")
    else:
        node_data.update(_profile_gpus(torch, timer, ordinals, src, dst, peer))
        node_data["pinned_memory_bytes"] = max(1, int(host_memory * pinned_fraction))
        notes.append(f"pinned host memory: {pinned_fraction:.0%} of available host memory (a policy)")
        if not peer and len(ordinals) > 1:
            notes.append("peer copies not measured: GPU<->GPU set to the GPU->pinned->GPU bottleneck")
    if timer.truncated:
        notes.append(f"time budget of {time_budget_s} s reached: some medians use fewer repeats")
    log.debug("profiled topology in %.3f s", time.perf_counter() - started)
    return Topology(name=name, description="profiled live", notes=tuple(notes), nodes=(Node(**node_data),))


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
