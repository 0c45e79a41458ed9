"""Peers of the micro-benchmark: what a user would pick instead of Conduit.

A *peer* owns one replay storage of the benchmark's transitions and offers
timed *cases* on it (an ingestion case extends it in chunks, a delivery case
samples training batches from it). This module holds the protocol, the data,
the plain baselines that need nothing but torch and numpy — a preallocated
torch ring written by slice copies and gathered with ``index_select(out=)``,
the memcpy bound (the same bytes copied contiguously), a numpy ring with fancy
indexing — and :func:`load_peer`, which imports the optional peers (TorchRL,
cpprb: the ``bench`` extra) lazily and reports a peer it cannot load as
:class:`Missing` with the reason, never dropping it silently.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any

import numpy as np
import torch

from conduit.storage import hugepages

__all__ = [
    "PEERS",
    "Case",
    "MicroData",
    "Missing",
    "NumpyRing",
    "Op",
    "Peer",
    "Role",
    "Sampling",
    "TorchPlain",
    "index_select_into",
    "load_peer",
]

INSTALL_HINT = 'pip install ".[bench]" (in a clone of Conduit)'


class Op(str, Enum):
    INGEST = "ingest"
    DELIVER = "deliver"


class Sampling(str, Enum):
    UNIFORM = "uniform"
    PRIORITIZED = "prioritized"
    NONE = "-"


class Role(str, Enum):
    """What a case stands for when ratios are computed."""

    SLICE_COPY = "slice_copy"  # ingestion bound: contiguous slice copies into preallocated storage
    INDEX_SELECT = "index_select"  # delivery baseline: torch.index_select(out=) on preallocated storage
    # the same baseline on Conduit's own ring: the same memory as Conduit's pulls, so a ratio holds no storage luck
    INDEX_SELECT_SAME = "index_select_same_storage"
    MEMCPY = "memcpy"  # delivery bound: the batch's bytes copied contiguously
    CONDUIT = "conduit"  # the headline: push / pull, inline g=1
    CONDUIT_VARIANT = "conduit_variant"  # another schedule (granularity, overlap)
    CONDUIT_GATHER = "conduit_gather"  # the raw gather operator, edp.buffer.sample
    CONDUIT_POOLED = "conduit_pooled"  # the headline pull with recycled batch memory (batch_pool=2)
    TORCHRL = "torchrl"
    TORCHRL_PREFETCH = "torchrl_prefetch"
    CPPRB = "cpprb"
    NUMPY = "numpy"


Block = Callable[[int], None]


@dataclass(frozen=True)
class Case:
    """One timed operation: ``block(n)`` runs ``n`` of them (and completes them)."""

    name: str
    library: str
    op: Op
    role: Role
    block: Block = field(repr=False, compare=False)
    sampling: Sampling = Sampling.NONE
    note: str = ""


@dataclass(frozen=True)
class Missing:
    """A peer (or one of its cases) that could not run here, and why."""

    name: str
    library: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "library": self.library, "reason": self.reason}


FIELDS = ("obs", "next_obs", "action", "reward", "done")


@dataclass(frozen=True)
class MicroData:
    """The transitions: float32 obs/next_obs of ``dim``, int64 action, float32 reward, bool done."""

    dim: int
    capacity: int
    chunk: int = 256  # transitions per timed ingestion call (1: one environment step at a time)
    batch: int = 512
    seed: int = 0
    pool: int = 4
    fill_rows: int = 256  # transitions per call of the untimed initial fill, whatever ``chunk`` is

    @property
    def bytes_per_transition(self) -> int:
        return 2 * self.dim * 4 + 8 + 4 + 1

    @property
    def chunk_bytes(self) -> int:
        return self.chunk * self.bytes_per_transition

    @property
    def batch_bytes(self) -> int:
        return self.batch * self.bytes_per_transition

    @property
    def fill_n(self) -> int:
        """Rows per fill chunk (never more than the storage holds)."""
        return min(self.fill_rows, self.capacity)

    @property
    def fill_chunks(self) -> int:
        """Fill chunks (:meth:`fill_chunk`) that fill a storage to capacity (the ring then wraps)."""
        return -(-self.capacity // self.fill_n)

    @cached_property
    def chunks(self) -> list[dict[str, torch.Tensor]]:
        """A small pool of random chunks, reused round-robin (making data is not ingestion)."""
        return self._pool(self.chunk, self.seed)

    @cached_property
    def fill_pool(self) -> list[dict[str, torch.Tensor]]:
        return self.chunks if self.fill_n == self.chunk else self._pool(self.fill_n, self.seed + 7)

    def _pool(self, n: int, seed: int) -> list[dict[str, torch.Tensor]]:
        g = torch.Generator().manual_seed(seed)
        d = self.dim
        return [
            {
                "obs": torch.randn(n, d, generator=g),
                "next_obs": torch.randn(n, d, generator=g),
                "action": torch.randint(0, 16, (n,), generator=g),
                "reward": torch.randn(n, generator=g),
                "done": torch.rand(n, generator=g) < 0.01,
            }
            for _ in range(self.pool)
        ]

    @cached_property
    def numpy_chunks(self) -> list[dict[str, np.ndarray]]:
        return [{k: v.numpy() for k, v in c.items()} for c in self.chunks]

    def fill_chunk(self, k: int) -> dict[str, torch.Tensor]:
        """Chunk ``k`` of the initial fill: a pool chunk whose rows are stamped unique.

        Every stored row (and so every memory page) differs from every other, as
        real experience does: a ring of a few repeated chunks would let the host
        deduplicate pages and then pay copy-on-write on the first overwrite.
        """
        base = self.fill_pool[k % self.pool]
        stamp = torch.arange(k * self.fill_n, (k + 1) * self.fill_n, dtype=torch.float32)
        out = dict(base)
        for name in ("obs", "next_obs"):
            t = base[name].clone()
            t[:, 0] = stamp
            out[name] = t
        return out

    def numpy_fill_chunk(self, k: int) -> dict[str, np.ndarray]:
        return {name: t.numpy() for name, t in self.fill_chunk(k).items()}


class Peer(ABC):
    """One storage of ``data.capacity`` transitions and the cases it offers."""

    library: str = "peer"

    def __init__(self, data: MicroData) -> None:
        self.data = data

    @abstractmethod
    def fill(self) -> None:
        """Write the storage full (untimed: every later case sees a full, touched ring)."""

    @abstractmethod
    def cases(self) -> list[Case]:
        """The timed cases."""

    def missing(self) -> list[Missing]:
        """Cases of this peer that cannot run here."""
        return []

    def trace(self, tracer: Any, operations: int) -> None:
        """Run a few operations with ``tracer`` recording (peers that support a timeline)."""
        del tracer, operations

    def close(self) -> None:
        """Release threads and memory."""


def _ring_positions(pos: int, n: int, capacity: int) -> list[tuple[int, int, int]]:
    """``(dst_start, src_start, length)`` pieces of writing ``n`` rows at ``pos`` of a ring (two at the wrap)."""
    first = min(n, capacity - pos)
    out = [(pos, 0, first)]
    if first < n:
        out.append((0, first, n - first))
    return out


def index_select_into(
    storage: dict[str, torch.Tensor], out: dict[str, torch.Tensor], rows: int, batch: int, gen: torch.Generator, n: int
) -> None:
    """The plain delivery baseline ``n`` times: draw ``batch`` of ``rows`` (torch), ``index_select(out=)`` per field."""
    for _ in range(n):
        idx = torch.randint(0, rows, (batch,), generator=gen)
        for name, t in storage.items():
            torch.index_select(t, 0, idx, out=out[name])


def _huge_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype)
    hugepages.advise(t)
    return t.zero_()


class TorchPlain(Peer):
    """Preallocated torch tensors: slice-copy writes, ``index_select(out=)`` gathers, and the memcpy bound."""

    library = "torch"

    def __init__(self, data: MicroData) -> None:
        super().__init__(data)
        example = data.chunks[0]
        cap = data.capacity
        # on the same huge-page advice as Conduit's storage, so the bound measures the kernel, not the page size
        self.storage = {k: _huge_zeros((cap, *v.shape[1:]), v.dtype) for k, v in example.items()}
        self.out = {k: torch.empty((data.batch, *v.shape[1:]), dtype=v.dtype) for k, v in example.items()}
        self.pos = 0
        self.gen = torch.Generator().manual_seed(data.seed + 1)
        self.rng = np.random.default_rng(data.seed + 1)
        self._k = 0

    def _write(self, chunk: dict[str, torch.Tensor]) -> None:
        n = chunk["done"].shape[0]  # a timed chunk or a fill chunk
        for dst, src, length in _ring_positions(self.pos, n, self.data.capacity):
            for name, t in self.storage.items():
                t[dst : dst + length].copy_(chunk[name][src : src + length])
        self.pos = (self.pos + n) % self.data.capacity

    def fill(self) -> None:
        for k in range(self.data.fill_chunks):
            self._write(self.data.fill_chunk(k))

    def ingest(self, n: int) -> None:
        pool = self.data.chunks
        for _ in range(n):
            self._write(pool[self._k % len(pool)])
            self._k += 1

    def gather(self, n: int) -> None:
        index_select_into(self.storage, self.out, self.data.capacity, self.data.batch, self.gen, n)

    def memcpy(self, n: int) -> None:
        cap, b = self.data.capacity, self.data.batch
        for _ in range(n):
            start = int(self.rng.integers(0, cap - b + 1))
            for name, t in self.storage.items():
                self.out[name].copy_(t[start : start + b])

    def cases(self) -> list[Case]:
        return [
            Case("torch slice copy", self.library, Op.INGEST, Role.SLICE_COPY, self.ingest),
            Case(
                "torch index_select(out=)", self.library, Op.DELIVER, Role.INDEX_SELECT, self.gather, Sampling.UNIFORM
            ),
            Case(
                "memcpy (same bytes, contiguous)",
                "memcpy",
                Op.DELIVER,
                Role.MEMCPY,
                self.memcpy,
                Sampling.UNIFORM,
                note="the physical bound of a gather: the batch's bytes copied from one random contiguous range",
            ),
        ]

    def close(self) -> None:
        self.storage = {}
        self.out = {}


class NumpyRing(Peer):
    """A numpy ring: slice assignment in, fancy indexing out (``from_numpy``: no extra copy)."""

    library = "numpy"

    def __init__(self, data: MicroData) -> None:
        super().__init__(data)
        example = data.numpy_chunks[0]
        self.storage = {k: np.zeros((data.capacity, *v.shape[1:]), dtype=v.dtype) for k, v in example.items()}
        self.pos = 0
        self.rng = np.random.default_rng(data.seed + 2)
        self._k = 0

    def _write(self, chunk: dict[str, np.ndarray]) -> None:
        n = chunk["done"].shape[0]  # a timed chunk or a fill chunk
        for dst, src, length in _ring_positions(self.pos, n, self.data.capacity):
            for name, a in self.storage.items():
                a[dst : dst + length] = chunk[name][src : src + length]
        self.pos = (self.pos + n) % self.data.capacity

    def fill(self) -> None:
        for k in range(self.data.fill_chunks):
            self._write(self.data.numpy_fill_chunk(k))

    def ingest(self, n: int) -> None:
        pool = self.data.numpy_chunks
        for _ in range(n):
            self._write(pool[self._k % len(pool)])
            self._k += 1

    def sample(self, n: int) -> None:
        cap, b = self.data.capacity, self.data.batch
        for _ in range(n):
            idx = self.rng.integers(0, cap, b)
            {name: torch.from_numpy(a[idx]) for name, a in self.storage.items()}

    def cases(self) -> list[Case]:
        return [
            Case("numpy ring (slice assign)", self.library, Op.INGEST, Role.NUMPY, self.ingest),
            Case("numpy ring (fancy indexing)", self.library, Op.DELIVER, Role.NUMPY, self.sample, Sampling.UNIFORM),
        ]

    def close(self) -> None:
        self.storage = {}


#: peer name -> (library, "module:Class"); optional peers are imported only when asked for
PEERS: dict[str, tuple[str, str]] = {
    "conduit": ("conduit", "benchmarks.peers_conduit:ConduitPeer"),
    "torch": ("torch", "benchmarks.peers:TorchPlain"),
    "numpy": ("numpy", "benchmarks.peers:NumpyRing"),
    "torchrl": ("torchrl", "benchmarks.peers_torchrl:TorchRLPeer"),
    "cpprb": ("cpprb", "benchmarks.peers_cpprb:CpprbPeer"),
}


def load_peer(name: str, data: MicroData, **options: Any) -> Peer | Missing:
    """Build peer ``name`` for ``data``, or say why it cannot run here."""
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; expected one of {sorted(PEERS)}")
    library, target = PEERS[name]
    module_name, cls_name = target.split(":")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except ImportError as exc:
        missing = exc.name or library
        return Missing(name, library, f"not installed ({missing}): {INSTALL_HINT}")
    try:
        return cls(data, **options)  # type: ignore[no-any-return]
    except ImportError as exc:
        return Missing(name, library, f"not installed ({exc.name or library}): {INSTALL_HINT}")
    except Exception as exc:  # a peer that is installed but cannot run here (ABI mismatch, no memory)
        return Missing(name, library, f"{type(exc).__name__}: {exc}")
