"""The machine (or cluster) placement plans against: devices, free memory, bandwidths.

pydantic (v2) earns its place here: frozen, typed models whose validation names
the field, the expected and the received value, and JSON/YAML round-trips for
free. PyYAML reads and writes the human-edited files (the topologies shipped in
``conduit/placement/topologies/`` are YAML).

A topology is a tuple of :class:`Node` tables plus one inter-node bandwidth.
Each node has pageable host memory (device ``cpu``), optionally pinned host
memory (device ``pinned``; only where CUDA is) and ``G`` GPUs (``cuda:0`` ..
``cuda:G-1``). In a multi-node topology ids carry the node: ``node1/cuda:3``; a
bare id (``cuda:3``) means node 0. Devices are derived from the node tables, so
ids and tables cannot disagree.

Units: bytes and bytes/s (see :mod:`conduit.placement.units` for the suffixed
keys files may use instead, e.g. ``host_to_gpu_gb_per_s: 72``).

Cross-node paths (:meth:`Topology.bandwidth`): transfers between nodes are
pipelined (RDMA / NCCL move chunks through the NIC while the next chunk is read),
so the path runs at its **bottleneck** — ``min(local leg out, inter_node, local
leg in)`` — not at the serial sum of the legs' times. The local legs: a GPU's
host link (``gpu_to_pinned`` / ``pinned_to_gpu``, or the pageable ones on a node
without pinned memory, i.e. its PCIe path to the NIC); ``host_memcpy`` for
pageable memory (staged into registered buffers); none for pinned memory (the
NIC reads and writes it directly).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from conduit.errors import PlacementError
from conduit.files import file_format, read_mapping
from conduit.placement.explain import explain_file_errors
from conduit.placement.rates import RateTable, check_table, effective_rate
from conduit.placement.units import expand_unit_keys

__all__ = ["Device", "DeviceKind", "Node", "Topology", "endpoint_ids"]

PositiveFloat = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(gt=0)]
Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]

_ID_RE = re.compile(r"^(?:node(\d+)/)?(cpu|pinned|cuda:(\d+))$")
#: the node tables with one value per GPU (files may give a scalar for all)
PER_GPU_FIELDS = (
    "gpu_memory_bytes", "gpu_local", "host_to_gpu", "gpu_to_host", "pinned_to_gpu", "gpu_to_pinned", "gpu_gather",
    "host_deliver_to_gpu", "pinned_deliver_to_gpu",
)


class _Model(BaseModel):
    """Frozen, strict-keyed; construction errors surface as :class:`PlacementError`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            nested = {"nodes": Node} if isinstance(self, Topology) else None
            raise PlacementError(explain_file_errors(e, type(self).__name__, data, type(self), nested)) from None


class DeviceKind(str, Enum):
    """The memory a device id names."""

    CPU = "cpu"
    """Pageable host memory."""
    PINNED = "pinned"
    """Page-locked host memory (DMA-able; needs CUDA)."""
    GPU = "gpu"


class Device(_Model):
    """One place a buffer shard can live (derived from a :class:`Node`)."""

    id: str
    kind: DeviceKind
    node: Annotated[int, Field(ge=0)]
    memory_bytes: PositiveInt
    """Free memory usable by the buffer (before the solver's headroom)."""
    ordinal: Annotated[int, Field(ge=0)] | None = None
    """GPU index on its node (``cuda:<ordinal>``); ``None`` for host memory."""

    @property
    def local_id(self) -> str:
        """The id without the node prefix: what ``torch.device`` understands (``pinned`` is host)."""
        return self.id.rsplit("/", 1)[-1]


def _broadcast(data: dict[str, Any], gpus: int) -> None:
    """Scalars in per-GPU fields become one value per GPU; a scalar matrix fills the off-diagonal."""
    for key in PER_GPU_FIELDS:
        value = data.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            data[key] = [value] * gpus
    matrix = data.get("gpu_to_gpu")
    if isinstance(matrix, (int, float)) and not isinstance(matrix, bool):
        data["gpu_to_gpu"] = [[0.0 if i == j else float(matrix) for j in range(gpus)] for i in range(gpus)]


class Node(_Model):
    """Memory and bandwidth tables of one node (bytes, bytes/s; GPU tables indexed by ordinal).

    Files may write ``gpus: 8`` and give any per-GPU value as a scalar (it is
    repeated per GPU); ``gpu_to_gpu`` as a scalar fills every off-diagonal entry.
    """

    host_memory_bytes: PositiveInt
    """Pageable host memory usable by the buffer (e.g. MemAvailable)."""
    pinned_memory_bytes: PositiveInt | None = None
    """Pinned host memory the buffer may lock; ``None``: no pinned memory (no CUDA)."""
    gpu_memory_bytes: tuple[PositiveInt, ...] = ()
    """Free memory per GPU; its length is the node's GPU count."""
    host_memcpy: PositiveFloat
    """Host-to-host copy (pageable<->pageable, pageable<->pinned), bytes copied per second."""
    host_gather: PositiveFloat | None = None
    """A batch of random rows gathered out of a host ring, bytes per second (the CPU's share of delivering
    host rows, which a contiguous copy overstates); ``None``: deliveries from host memory run at the copy
    rates (:meth:`Topology.deliver_bandwidth`)."""
    gpu_local: tuple[PositiveFloat, ...] = ()
    """On-device copy bandwidth per GPU (a learner reading a shard on its own GPU)."""
    host_to_gpu: tuple[PositiveFloat, ...] = ()
    """Pageable host -> GPU, per GPU."""
    gpu_to_host: tuple[PositiveFloat, ...] = ()
    """GPU -> pageable host, per GPU."""
    pinned_to_gpu: tuple[PositiveFloat, ...] | None = None
    """Pinned host -> GPU, per GPU (required with pinned memory and GPUs)."""
    gpu_to_pinned: tuple[PositiveFloat, ...] | None = None
    """GPU -> pinned host, per GPU."""
    gpu_to_gpu: tuple[tuple[float, ...], ...] = ()
    """Peer copies, ``[src][dst]``; the diagonal is 0 (a GPU to itself is ``gpu_local``)."""
    gpu_gather: tuple[PositiveFloat, ...] | None = None
    """Delivery as the runtime runs it, per GPU: a training batch of random rows gathered out of a ring on that
    GPU by the real storage class, bytes per second (``None``: ``gpu_local``, a copy rate)."""
    host_deliver_to_gpu: tuple[PositiveFloat, ...] | None = None
    """The same out of a pageable host ring onto that GPU (CPU gather, staging, copy: the whole pull)."""
    pinned_deliver_to_gpu: tuple[PositiveFloat, ...] | None = None
    """The same out of a pinned host ring onto that GPU."""
    host_write_by_row: RateTable | None = None
    """A unit of rows written into a host ring by the storage class, ``((row_bytes, bytes/s), ...)`` ascending:
    ingestion into host memory at the workload's row size (``None``: ``host_memcpy``)."""
    host_gather_by_row: RateTable | None = None
    """A training batch of random rows gathered out of a host ring onto the host by the storage class, by row
    size (``None``: ``host_gather``)."""
    push_call_s: Seconds = 0.0
    """The runtime's fixed seconds per push of one column, whatever its size (Python, locks, bookkeeping)."""
    push_column_s: Seconds = 0.0
    """The fixed seconds each further column adds to a push (one more write call)."""
    pull_call_s: Seconds = 0.0
    """The runtime's fixed seconds per pull of one column, whatever its size."""
    pull_column_s: Seconds = 0.0
    """The fixed seconds each further column adds to a pull (one more gather call)."""

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        out = expand_unit_keys(data)
        gpus = out.pop("gpus", None)
        if gpus is not None:
            if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
                raise ValueError(f"gpus: expected a GPU count >= 0, received {gpus!r}")
            memory = out.get("gpu_memory_bytes")
            if isinstance(memory, (list, tuple)) and len(memory) != gpus:
                raise ValueError(f"gpu_memory_bytes: expected {gpus} values (gpus: {gpus}), received {len(memory)}")
            _broadcast(out, gpus)
        matrix = out.get("gpu_to_gpu")
        if isinstance(matrix, (list, tuple)):
            out["gpu_to_gpu"] = [
                [0.0 if (i == j and v is None) else v for j, v in enumerate(row)]
                if isinstance(row, (list, tuple))
                else row
                for i, row in enumerate(matrix)
            ]
        return out

    @model_validator(mode="after")
    def _check_tables(self) -> Node:
        g = self.gpu_count
        for name in ("gpu_local", "host_to_gpu", "gpu_to_host"):
            got = len(getattr(self, name))
            if got != g:
                raise ValueError(f"{name}: expected {g} values (one per GPU; gpu_memory_bytes has {g}), received {got}")
        has_pinned = self.pinned_memory_bytes is not None
        for name in ("pinned_to_gpu", "gpu_to_pinned"):
            value = getattr(self, name)
            if has_pinned and g and value is None:
                raise ValueError(f"{name}: expected {g} values (the node has pinned memory), received None")
            if not has_pinned and value is not None:
                raise ValueError(
                    f"{name}: expected None (pinned_memory_bytes is None: no pinned memory), received {list(value)}"
                )
            if value is not None and len(value) != g:
                raise ValueError(f"{name}: expected {g} values (one per GPU), received {len(value)}")
        for name in ("gpu_gather", "host_deliver_to_gpu", "pinned_deliver_to_gpu"):
            value = getattr(self, name)
            if value is not None and len(value) != g:
                raise ValueError(f"{name}: expected {g} values (one per GPU), received {len(value)}")
        for name in ("host_write_by_row", "host_gather_by_row"):
            table = getattr(self, name)
            if table is not None:
                check_table(name, table)
        if self.pinned_deliver_to_gpu is not None and not has_pinned:
            raise ValueError("pinned_deliver_to_gpu: expected None (pinned_memory_bytes is None: no pinned memory)")
        rows = self.gpu_to_gpu
        if len(rows) != g or any(len(r) != g for r in rows):
            shape = f"{len(rows)} rows of lengths {[len(r) for r in rows]}"
            raise ValueError(f"gpu_to_gpu: expected a {g}x{g} matrix ([src][dst]), received {shape}")
        for i, row in enumerate(rows):
            for j, v in enumerate(row):
                if i == j and v != 0.0:
                    raise ValueError(
                        f"gpu_to_gpu[{i}][{j}]: expected 0 or null on the diagonal (use gpu_local), received {v}"
                    )
                if i != j and not v > 0.0:
                    raise ValueError(f"gpu_to_gpu[{i}][{j}]: expected a bandwidth > 0 bytes/s, received {v}")
        return self

    @classmethod
    def from_units(cls, **data: Any) -> Node:
        """A node from file-style keys: ``gpus=8``, ``host_memory_gib=512``, ``host_to_gpu_gb_per_s=72``, ...

        The same as ``Node(**data)``; spelled as a classmethod so type checkers accept the keys.
        """
        return cls(**data)

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_memory_bytes)

    @property
    def has_pinned(self) -> bool:
        return self.pinned_memory_bytes is not None

    def call_seconds(self, columns: int) -> tuple[float, float]:
        """The runtime's fixed seconds of one push and one pull of ``columns`` columns."""
        extra = max(0, columns - 1)
        return self.push_call_s + extra * self.push_column_s, self.pull_call_s + extra * self.pull_column_s


def _local_id(kind: DeviceKind, ordinal: int | None) -> str:
    return f"cuda:{ordinal}" if kind is DeviceKind.GPU else kind.value


class Topology(_Model):
    """Nodes, their devices and every path's bandwidth; see the module docstring."""

    name: Annotated[str, Field(min_length=1)]
    description: str = ""
    notes: tuple[str, ...] = ()
    """Provenance: where numbers came from, what could not be measured."""
    nodes: tuple[Node, ...]
    inter_node: PositiveFloat | None = None
    """One transfer path between two nodes (per GPU / NIC), bytes/s; required with >1 node."""

    _devices: dict[str, Device] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data: Any) -> Any:
        return expand_unit_keys(data) if isinstance(data, Mapping) else data

    @model_validator(mode="after")
    def _check(self) -> Topology:
        if not self.nodes:
            raise ValueError("nodes: expected at least one node, received none")
        if len(self.nodes) > 1 and self.inter_node is None:
            raise ValueError(
                f"inter_node: expected a bandwidth for a topology with {len(self.nodes)} nodes, received None"
            )
        return self

    def model_post_init(self, __context: Any) -> None:
        multi = len(self.nodes) > 1
        devices: dict[str, Device] = {}
        for n, node in enumerate(self.nodes):
            entries: list[tuple[DeviceKind, int, int | None]] = [(DeviceKind.CPU, node.host_memory_bytes, None)]
            if node.pinned_memory_bytes is not None:
                entries.append((DeviceKind.PINNED, node.pinned_memory_bytes, None))
            entries += [(DeviceKind.GPU, m, g) for g, m in enumerate(node.gpu_memory_bytes)]
            for kind, memory, ordinal in entries:
                local = _local_id(kind, ordinal)
                dev_id = f"node{n}/{local}" if multi else local
                devices[dev_id] = Device(id=dev_id, kind=kind, node=n, memory_bytes=memory, ordinal=ordinal)
        self._devices = devices

    # -- devices -------------------------------------------------------------
    @property
    def devices(self) -> tuple[Device, ...]:
        return tuple(self._devices.values())

    @property
    def is_multi_node(self) -> bool:
        return len(self.nodes) > 1

    def canonical_id(self, device_id: str) -> str:
        """``cuda:0`` -> ``node0/cuda:0`` in a multi-node topology (and back in a single-node one)."""
        m = _ID_RE.match(device_id.strip()) if isinstance(device_id, str) else None
        if m is not None:
            node = int(m.group(1) or 0)
            candidate = f"node{node}/{m.group(2)}" if self.is_multi_node else m.group(2)
            if candidate in self._devices and (self.is_multi_node or node == 0):
                return candidate
        known = ", ".join(self._devices)
        raise PlacementError(f"device: expected one of {known}; received {device_id!r}")

    def device(self, device_id: str) -> Device:
        return self._devices[self.canonical_id(device_id)]

    def gpus(self, node: int | None = None) -> tuple[Device, ...]:
        """GPUs of one node (or of all nodes), by node then ordinal."""
        return tuple(d for d in self._devices.values() if d.kind is DeviceKind.GPU and (node is None or d.node == node))

    def host(self, node: int, kind: DeviceKind = DeviceKind.CPU) -> Device | None:
        """The node's ``cpu`` or ``pinned`` device (``None`` when the node has no pinned memory)."""
        local = kind.value
        dev_id = f"node{node}/{local}" if self.is_multi_node else local
        return self._devices.get(dev_id)

    # -- bandwidth -----------------------------------------------------------
    def bandwidth(self, src: str, dst: str) -> float:
        """Effective bytes/s of a copy from ``src`` to ``dst`` (same device: its local copy rate)."""
        s, d = self.device(src), self.device(dst)
        if s.node == d.node:
            return self._intra(self.nodes[s.node], s, d)
        assert self.inter_node is not None  # validated for multi-node topologies
        return min(self._leg_out(s), self.inter_node, self._leg_in(d))

    def ingest_bandwidth(self, src: str, dst: str, rows: Sequence[int] | None = None) -> float:
        """Effective bytes/s of writing samples made in ``src`` into a buffer on ``dst``.

        A copy (:meth:`bandwidth`), unless both are host memory of a node that measured ``host_write_by_row``
        and the sample's column sizes ``rows`` are given: then the write rate at those rows (a ring written
        unit by unit runs at a rate that depends on the row size and on what stays in the cache).
        """
        s, d = self.device(src), self.device(dst)
        node = self.nodes[d.node]
        host = (DeviceKind.CPU, DeviceKind.PINNED)
        if rows and s.node == d.node and s.kind in host and d.kind in host and node.host_write_by_row:
            return effective_rate(node.host_write_by_row, rows)
        return self.bandwidth(src, dst)

    def deliver_bandwidth(self, src: str, dst: str, rows: Sequence[int] | None = None) -> float:
        """Effective bytes/s of delivering sampled rows of a buffer on ``src`` to a learner on ``dst``.

        Where the node measured delivery the way the runtime runs it (``gpu_gather``, ``host_deliver_to_gpu``,
        ``pinned_deliver_to_gpu``: a training batch gathered by the real storage class onto the learner's
        GPU), that rate: raw copy rates overstate a pull of scattered rows, and by how much depends on the
        path, so Eq. 1 over copy rates placed a GPU learner's buffer in host memory where a GPU-resident one
        measured faster (issue #34). Otherwise a copy (:meth:`bandwidth`), unless the rows are in host memory
        of a node that measured a gather: the runtime gathers them on the CPU (into pinned staging when
        the learner is on a GPU) and then copies the batch, one after the other, so the two times add:
        ``1 / (1 / gather + 1 / copy)``, the copy being the pinned one to a GPU and none to the host. The
        gather is ``host_gather_by_row`` at the sample's column sizes ``rows`` where both are known, else
        ``host_gather``.
        """
        s, d = self.device(src), self.device(dst)
        node = self.nodes[s.node]
        if s.node == d.node and d.kind is DeviceKind.GPU:
            assert d.ordinal is not None
            measured = {
                DeviceKind.GPU: node.gpu_gather if s.ordinal == d.ordinal else None,
                DeviceKind.CPU: node.host_deliver_to_gpu,
                DeviceKind.PINNED: node.pinned_deliver_to_gpu,
            }.get(s.kind)
            if measured is not None:
                return measured[d.ordinal]
        gather = effective_rate(node.host_gather_by_row, rows) if rows and node.host_gather_by_row else None
        gather = gather or node.host_gather
        if s.kind is DeviceKind.GPU or s.node != d.node or gather is None:
            return self.bandwidth(src, dst)
        if d.kind is not DeviceKind.GPU:
            return gather
        assert d.ordinal is not None
        pinned = node.pinned_to_gpu[d.ordinal] if node.pinned_to_gpu is not None else node.host_to_gpu[d.ordinal]
        return 1.0 / (1.0 / gather + 1.0 / pinned)

    def _leg_out(self, dev: Device) -> float:
        node = self.nodes[dev.node]
        if dev.kind is DeviceKind.PINNED:
            return math.inf  # the NIC reads pinned memory directly
        if dev.kind is DeviceKind.CPU:
            return node.host_memcpy  # staged into registered memory
        assert dev.ordinal is not None
        table = node.gpu_to_pinned if node.gpu_to_pinned is not None else node.gpu_to_host
        return table[dev.ordinal]

    def _leg_in(self, dev: Device) -> float:
        node = self.nodes[dev.node]
        if dev.kind is DeviceKind.PINNED:
            return math.inf
        if dev.kind is DeviceKind.CPU:
            return node.host_memcpy
        assert dev.ordinal is not None
        table = node.pinned_to_gpu if node.pinned_to_gpu is not None else node.host_to_gpu
        return table[dev.ordinal]

    @staticmethod
    def _intra(node: Node, s: Device, d: Device) -> float:
        gpu = DeviceKind.GPU
        if s.kind is not gpu and d.kind is not gpu:
            return node.host_memcpy
        if s.kind is gpu and d.kind is gpu:
            assert s.ordinal is not None and d.ordinal is not None
            if s.ordinal == d.ordinal:
                return node.gpu_local[s.ordinal]
            return node.gpu_to_gpu[s.ordinal][d.ordinal]
        if d.kind is gpu:
            assert d.ordinal is not None
            table = node.pinned_to_gpu if s.kind is DeviceKind.PINNED else node.host_to_gpu
            assert table is not None
            return table[d.ordinal]
        assert s.ordinal is not None
        table = node.gpu_to_pinned if d.kind is DeviceKind.PINNED else node.gpu_to_host
        assert table is not None
        return table[s.ordinal]

    # -- files ---------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Topology:
        """Validate a mapping (canonical or unit-suffixed keys); errors are :class:`PlacementError`."""
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        """Canonical units (bytes, bytes/s); ``from_dict(to_dict())`` is the identity."""
        return self.model_dump(mode="json")

    @classmethod
    def load(cls, path: str | Path) -> Topology:
        """Read a ``.json``, ``.yaml`` or ``.yml`` file."""
        p = Path(path)
        data = read_mapping(p, "topology file", PlacementError)
        try:
            return cls(**dict(data))
        except PlacementError as e:
            raise PlacementError(str(e).replace("invalid Topology:", f"invalid topology file {str(p)!r}:", 1)) from None

    def save(self, path: str | Path) -> None:
        """Write canonical units; the format follows the extension (``.json``, ``.yaml``, ``.yml``)."""
        p = Path(path)
        fmt = file_format(p, "topology file", PlacementError)
        data = self.to_dict()
        if fmt == "json":
            p.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        else:
            p.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=None), encoding="utf-8")


def endpoint_ids(topology: Topology, ids: str | Sequence[str], what: str) -> tuple[str, ...]:
    """Canonical, de-duplicated ids of actor or learner devices (order kept)."""
    raw = (ids,) if isinstance(ids, str) else tuple(ids)
    if not raw:
        raise PlacementError(f"{what}: expected at least one device id, received none")
    out: list[str] = []
    for r in raw:
        try:
            c = topology.canonical_id(r)
        except PlacementError as e:
            raise PlacementError(f"{what}: {e}") from e
        if c not in out:
            out.append(c)
    return tuple(out)
