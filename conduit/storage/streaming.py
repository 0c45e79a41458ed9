"""Writes that bypass the caches, for replay rings.

A replay ring's rows are read back long after they are written, at random and
mostly from memory, so a push gains nothing from caching what it writes. An
ordinary store reads each destination line into the cache before writing it (a
read for ownership): three memory transfers per line copied. A non-temporal
store writes the line straight to memory: two. glibc's ``memcpy`` (which numpy's
slice copy calls) switches to such stores only above three quarters of the
last-level cache, and a VM that reports its host's whole L3 never gets there;
torch's ``copy_`` never uses them.

Streaming pays only for copies large enough: on a small copy the closing fence
and write-combining buffers that fill only a few lines cost more than the saved
reads. So a field's copy streams from ``MIN_BYTES`` up; below that it stays
numpy's (BENCHMARKS.md, "Delivery and ingestion").

Only replay storage streams (:meth:`Storage.set_streaming`, which the replay
buffer calls): an on-policy iteration is read back by its own mini-batches
right after it is written, where the cache is worth having. A gather does not
stream either: its rows are small scattered copies, each too short for streaming
stores to pay, and the learner reads the batch right away, from the cache an
ordinary store has left it in.

The copy is in the optional C extension ``conduit._native`` (x86-64; SSE2's
``_mm_stream_si128``); without it, or on other CPUs, :data:`AVAILABLE` is False
and every write is numpy's. No library on PyPI offers a streaming copy.
"""

from __future__ import annotations

try:
    from conduit import _native
except ImportError:  # built without a C compiler: numpy copies
    _native = None

__all__ = ["AVAILABLE", "MIN_BYTES", "copy", "min_rows"]

#: whether this install copies with non-temporal stores (the extension is built, for a CPU that has them)
AVAILABLE: bool = _native is not None and bool(_native.NONTEMPORAL)

#: the smallest copy that streams (see the module docstring for why)
MIN_BYTES = 128 << 10


def min_rows(row_bytes: int) -> int | None:
    """Rows of ``row_bytes`` bytes from which a copy streams; None where nothing streams here."""
    if not AVAILABLE or row_bytes <= 0:
        return None
    return -(-MIN_BYTES // row_bytes)


def copy(dst: int, src: int, nbytes: int) -> None:
    """Copy ``nbytes`` from address ``src`` to address ``dst`` with non-temporal stores, fenced.

    The ranges must not overlap and must stay alive for the call (the GIL is
    released during it). Only where :data:`AVAILABLE`.
    """
    if _native is None:
        raise RuntimeError("conduit._native is not built (no C compiler at install): streaming copies are off")
    _native.copy(dst, src, nbytes)
