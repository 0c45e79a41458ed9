"""``conduit bench micro``: ingestion and delivery throughput against the peers, in one run.

Per transition dimension: every peer gets its own storage of ``capacity``
transitions (smaller where the memory budget requires, and the result says so),
each is written full once, untimed (in chunks of 256 whatever ``chunk`` is), so
every case runs on a full, touched ring; then every case — ingestion of
``chunk``-transition chunks (256; 1 for a loop that adds every environment step
as it comes), delivery of a 512-batch,
uniform and prioritized — is timed in interleaved repeats (``timing``), and the
medians are compared as ratios (``report``): Conduit against ``index_select`` on
preallocated storage, the memcpy bound, a slice copy, TorchRL and cpprb.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.machine import machine_info, memcpy_bandwidth
from benchmarks.peers import Case, MicroData, Missing, Op, Peer, Role, Sampling, load_peer
from benchmarks.timing import Stat, calls_for, interleaved, torch_threads

__all__ = ["ALL_PEERS", "CaseResult", "DimResult", "MicroResult", "MicroSettings", "capacity_for", "run_micro"]

ALL_PEERS = ("conduit", "torch", "numpy", "torchrl", "cpprb")
#: storages each peer allocates (Conduit's schedules share one ring; TorchRL and cpprb: uniform + prioritized)
STORAGES = {"conduit": 1, "torch": 1, "numpy": 1, "torchrl": 2, "cpprb": 2}

#: ``progress(done, total, message)``
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class MicroSettings:
    dims: tuple[int, ...] = (128, 1000, 5000)
    capacity: int = 100_000
    memory_gib: float = 6.0  # all storages of one dimension together
    chunk: int = 256
    batch: int = 512
    repeats: int = 9
    block_s: float = 0.05  # target length of one timed block
    granularities: tuple[int, ...] = (1, 2, 4)
    overlap: bool = True  # also time Conduit's overlapped schedules
    prefetch: int = 3  # TorchRL's prefetch
    peers: tuple[str, ...] = ALL_PEERS
    threads: int | None = 1  # torch intra-op threads during the run (None: leave as is)
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def capacity_for(dim: int, settings: MicroSettings) -> tuple[int, str | None]:
    """The capacity every storage gets at ``dim``, and a note when it is below the requested one."""
    bpt = MicroData(dim, 1).bytes_per_transition
    storages = sum(STORAGES.get(p, 1) for p in settings.peers)
    fit = int(settings.memory_gib * 2**30) // (storages * bpt)
    if fit >= settings.capacity:
        return settings.capacity, None
    cap = max(settings.batch * max(settings.granularities), fit // 1000 * 1000 or fit)
    note = (
        f"capacity {cap:,} instead of {settings.capacity:,}: {storages} storages x {bpt:,} B/transition "
        f"must fit the {settings.memory_gib:g} GiB memory budget (--memory-gib)"
    )
    return cap, note


@dataclass(frozen=True)
class CaseResult:
    name: str
    library: str
    op: Op
    role: Role
    sampling: Sampling
    stat: Stat
    bytes_per_op: int
    calls: int
    note: str = ""

    @property
    def seconds(self) -> float:
        return self.stat.median

    @property
    def ms(self) -> float:
        return self.stat.median * 1e3

    @property
    def gbps(self) -> float:
        return self.bytes_per_op / self.stat.median / 1e9

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "library": self.library,
            "op": self.op.value,
            "role": self.role.value,
            "sampling": self.sampling.value,
            "ms": self.ms,
            "gb_per_s": self.gbps,
            "bytes_per_op": self.bytes_per_op,
            "calls_per_block": self.calls,
            "stat": self.stat.to_json(),
            "note": self.note,
        }


@dataclass
class DimResult:
    dim: int
    capacity: int
    capacity_note: str | None
    bytes_per_transition: int
    cases: list[CaseResult] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)
    seconds: float = 0.0

    def find(self, op: Op, role: Role, sampling: Sampling | None = None) -> CaseResult | None:
        if sampling is None:
            sampling = Sampling.UNIFORM if op is Op.DELIVER else Sampling.NONE
        return next((c for c in self.cases if c.op is op and c.role is role and c.sampling is sampling), None)

    def best(self, op: Op, roles: tuple[Role, ...], sampling: Sampling | None = None) -> CaseResult | None:
        if sampling is None:
            sampling = Sampling.UNIFORM if op is Op.DELIVER else Sampling.NONE
        pool = [c for c in self.cases if c.op is op and c.role in roles and c.sampling is sampling]
        return min(pool, key=lambda c: c.seconds) if pool else None

    def best_conduit(self, op: Op) -> CaseResult | None:
        return self.best(op, (Role.CONDUIT, Role.CONDUIT_VARIANT, Role.CONDUIT_POOLED))

    def best_torchrl(self) -> CaseResult | None:
        return self.best(Op.DELIVER, (Role.TORCHRL, Role.TORCHRL_PREFETCH))

    def to_json(self) -> dict[str, Any]:
        """The measured records; :func:`benchmarks.report.micro_json` adds the ratios."""
        return {
            "dim": self.dim,
            "capacity": self.capacity,
            "capacity_note": self.capacity_note,
            "bytes_per_transition": self.bytes_per_transition,
            "seconds": self.seconds,
            "cases": [c.to_json() for c in self.cases],
            "missing": [m.to_json() for m in self.missing],
        }


@dataclass
class MicroResult:
    settings: MicroSettings
    machine: dict[str, Any]
    dims: list[DimResult] = field(default_factory=list)
    memcpy_gbps: float | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The measured records; :func:`benchmarks.report.micro_json` adds the ratios and the targets."""
        return {
            "settings": self.settings.to_json(),
            "machine": self.machine,
            "memcpy_gb_per_s": self.memcpy_gbps,
            "seconds": self.seconds,
            "dims": [d.to_json() for d in self.dims],
        }


def _bytes_per_op(case: Case, data: MicroData) -> int:
    return data.chunk_bytes if case.op is Op.INGEST else data.batch_bytes


def _calls(cases: list[Case], op: Op, anchor: Role, target_s: float, multiple: int) -> int:
    ref = next((c for c in cases if c.op is op and c.role is anchor), None)
    ref = ref or next((c for c in cases if c.op is op), None)
    if ref is None:
        return multiple
    n = calls_for(ref.block, target_s)
    return max(multiple, math.ceil(n / multiple) * multiple)


def run_dim(
    dim: int,
    settings: MicroSettings,
    *,
    progress: Progress | None = None,
    tracer: Any = None,
    step: tuple[int, int] = (0, 1),
) -> DimResult:
    """Benchmark every peer at one transition dimension."""
    t0 = time.perf_counter()
    capacity, note = capacity_for(dim, settings)
    data = MicroData(dim, capacity, settings.chunk, settings.batch, settings.seed)
    result = DimResult(dim, capacity, note, data.bytes_per_transition)
    done, total = step

    def say(msg: str, advance: int = 0) -> None:
        nonlocal done
        done += advance
        if progress is not None:
            progress(done, total, f"dim {dim:,}: {msg}")

    peers: list[Peer] = []
    options: dict[str, dict[str, Any]] = {
        "conduit": {"granularities": settings.granularities, "overlap": settings.overlap},
        "torchrl": {"prefetch": settings.prefetch},
    }
    try:
        for name in settings.peers:
            say(f"building {name}")
            peer = load_peer(name, data, **options.get(name, {}))
            if isinstance(peer, Missing):
                result.missing.append(peer)
            else:
                peers.append(peer)
                result.missing.extend(peer.missing())
            say(f"filling {name}")
            if not isinstance(peer, Missing):
                peer.fill()
            say(f"filled {name}", 1)
        cases = [c for p in peers for c in p.cases()]
        multiple = math.lcm(*settings.granularities)
        n_ing = _calls(cases, Op.INGEST, Role.SLICE_COPY, settings.block_s, multiple)
        n_del = _calls(cases, Op.DELIVER, Role.INDEX_SELECT, settings.block_s, multiple)
        calls = {c.name: n_ing if c.op is Op.INGEST else n_del for c in cases}
        say(f"timing {len(cases)} cases x {settings.repeats} repeats")
        stats = interleaved(
            {c.name: c.block for c in cases},
            calls,
            settings.repeats,
            on_repeat=lambda r: say(f"repeat {r + 1}/{settings.repeats}", 1),
        )
        for c in cases:
            result.cases.append(
                CaseResult(
                    c.name,
                    c.library,
                    c.op,
                    c.role,
                    c.sampling,
                    stats[c.name],
                    _bytes_per_op(c, data),
                    calls[c.name],
                    c.note,
                )
            )
        if tracer is not None:
            say("tracing")
            for p in peers:
                p.trace(tracer, 8)
    finally:
        for p in peers:
            p.close()
        peers.clear()
        gc.collect()
    result.seconds = time.perf_counter() - t0
    return result


def run_micro(
    settings: MicroSettings = MicroSettings(), *, progress: Progress | None = None, tracer: Any = None
) -> MicroResult:
    """The whole micro-benchmark: every dimension, every peer, interleaved repeats."""
    t0 = time.perf_counter()
    with torch_threads(settings.threads):
        result = MicroResult(settings, machine_info())
        result.memcpy_gbps = memcpy_bandwidth() / 1e9
        per_dim = len(settings.peers) + settings.repeats
        total = per_dim * len(settings.dims)
        for i, dim in enumerate(settings.dims):
            result.dims.append(
                run_dim(dim, settings, progress=progress, tracer=tracer if i == 0 else None, step=(i * per_dim, total))
            )
    result.seconds = time.perf_counter() - t0
    return result
