"""Rows between ranks: one ``all_to_all_single`` of one flat byte buffer per exchange, laid out so that
nothing is copied twice.

Every field of a block of ``n`` rows occupies one contiguous, 8-byte-aligned run
of the buffer (``[field 0 rows][field 1 rows]...``), and a rank's block for each
peer is contiguous, so:

* the owner gathers its rows *straight into* the send buffer (``index_select``
  with ``out=`` a typed view of the bytes): no staging copy;
* the receiver reads each field of each peer's block as a typed view of the
  receive buffer: no unpacking copy, only the final ``cat`` that builds the batch.

Both sides know every block's row count before the exchange (the request matrix
is computed alike on every rank, :mod:`conduit.distributed.sampling`), so no
sizes travel. Small irregular payloads (units routed to another shard, priority
updates) travel as ``torch.save`` bytes and are read back with
``torch.load(weights_only=True)``: tensors and containers, never code.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from conduit.spec import ExperienceSpec

__all__ = ["META_ID", "META_SLOT", "META_WEIGHT", "RowLayout", "dumps", "loads"]

#: per-row metadata a shard sends with sampled rows (names no user field can take: not identifiers)
META_SLOT = "conduit:slot"
META_ID = "conduit:id"
META_WEIGHT = "conduit:weight"

#: every field's bytes start at a multiple of this: complex128, the widest element, views only at 16
_ALIGN = 16


@dataclass(frozen=True)
class RowLayout:
    """Fields (name, trailing shape, dtype) as laid out in an exchange block."""

    fields: tuple[tuple[str, tuple[int, ...], torch.dtype], ...]

    @classmethod
    def of(cls, spec: ExperienceSpec, *, meta: bool = False, weights: bool = False) -> RowLayout:
        fields = [(f.name, tuple(f.shape), f.dtype) for f in spec]
        if meta:
            fields += [(META_SLOT, (), torch.int64), (META_ID, (), torch.int64)]
        if weights:
            fields.append((META_WEIGHT, (), torch.float32))
        return cls(tuple(fields))

    def field_bytes(self, n: int) -> list[int]:
        return [_aligned(n * math.prod(shape) * _itemsize(dtype)) for _, shape, dtype in self.fields]

    def block_bytes(self, n: int) -> int:
        """Bytes of a block of ``n`` rows."""
        return sum(self.field_bytes(n))

    def views(self, buf: torch.Tensor, offset: int, n: int) -> dict[str, torch.Tensor]:
        """Typed views ``name -> [n, *shape]`` of the block of ``n`` rows at byte ``offset`` of ``buf``."""
        out = {}
        at = offset
        for (name, shape, dtype), nbytes in zip(self.fields, self.field_bytes(n), strict=True):
            used = n * math.prod(shape) * _itemsize(dtype)
            out[name] = buf[at : at + used].view(dtype).view(n, *shape)
            at += nbytes
        return out


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def blocks(layout: RowLayout, rows: Sequence[Sequence[int]]) -> list[int]:
    """Bytes per peer, where the block for peer ``r`` is sub-blocks of ``rows[r][k]`` rows each."""
    return [sum(layout.block_bytes(int(n)) for n in per_peer) for per_peer in rows]


def put(dst: Mapping[str, torch.Tensor], src: Mapping[str, torch.Tensor]) -> None:
    """Copy ``src`` into the views ``dst`` unless a gather already wrote there (same memory)."""
    for name, t in src.items():
        d = dst[name]
        if t.data_ptr() != d.data_ptr() or t.device != d.device:
            d.copy_(t)


def dumps(obj: Any) -> torch.Tensor:
    """``obj`` (tensors, numbers, strings, containers) as a uint8 tensor."""
    f = io.BytesIO()
    torch.save(obj, f)
    return torch.frombuffer(bytearray(f.getbuffer()), dtype=torch.uint8)


def loads(buf: torch.Tensor) -> Any:
    """What :func:`dumps` wrote, read safely (``weights_only``: tensors and containers only)."""
    return torch.load(io.BytesIO(buf.cpu().numpy().tobytes()), map_location="cpu", weights_only=True)
