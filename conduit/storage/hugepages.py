"""Transparent huge pages for large host storage (Linux).

A replay gather reads rows at random across hundreds of MB. With 4 KB pages
nearly every row of a batch is a TLB miss (and, in a VM, a nested page walk);
backing the storage with 2 MB pages removes most of them, and touching the
storage at allocation then faults in one page per 2 MB instead of one per 4 KB.

Most distributions ship THP in ``madvise`` mode: only regions that ask get huge
pages. :func:`advise` asks for the 2 MB-aligned interior of a fresh, untouched
CPU tensor with ``madvise(MADV_HUGEPAGE)``; the pages are then allocated huge
when first touched. It is advice: where the kernel has THP off, the platform is
not Linux or the call fails, nothing changes and the storage works as before.
ctypes (the standard library) reaches ``madvise`` for an arbitrary address;
Python's ``mmap.madvise`` only covers mappings it made itself.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys

import torch

__all__ = ["HUGE_PAGE", "MIN_BYTES", "advise", "mode"]

#: x86-64's and arm64's (4 KB granule) transparent huge page size.
HUGE_PAGE = 2 << 20
#: Tensors smaller than this are left alone (fewer than two huge pages would fit inside them).
MIN_BYTES = 4 * HUGE_PAGE

_SYSFS = "/sys/kernel/mm/transparent_hugepage/enabled"


@functools.cache
def mode() -> str:
    """The kernel's THP mode (``always``, ``madvise``, ``never``), or ``unavailable``."""
    if not sys.platform.startswith("linux"):
        return "unavailable"
    try:
        with open(_SYSFS) as f:
            text = f.read()
    except OSError:
        return "unavailable"
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else "unavailable"


@functools.cache
def _madvise() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def advise(t: torch.Tensor) -> bool:
    """Ask for huge pages under ``t``'s memory; True when the kernel accepted the advice.

    Call it before the tensor's pages are first touched (right after
    ``torch.empty``): pages already faulted in stay 4 KB until the kernel's
    background compaction merges them.
    """
    if t.device.type != "cpu" or t.is_pinned() or mode() not in ("madvise", "always"):
        return False
    nbytes = t.untyped_storage().nbytes()
    if nbytes < MIN_BYTES:
        return False
    fn = _madvise()
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if fn is None or advice is None:
        return False
    ptr = t.untyped_storage().data_ptr()
    start = (ptr + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
    end = (ptr + nbytes) // HUGE_PAGE * HUGE_PAGE
    if end <= start:
        return False
    return fn(start, end - start, advice) == 0
