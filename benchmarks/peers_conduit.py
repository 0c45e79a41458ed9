"""Conduit as a peer of the micro-benchmark, measured through its public API.

Ingestion is ``edp.push`` of the benchmark's chunks (256 transitions by default; then ``flush`` so
overlapped ingestion is timed to completion); delivery is ``edp.pull`` of a
training batch. The headline is the inline schedule at ``g = 1`` (an RLlib-style
buffer with Conduit's data path); the other schedules — granularities
``g`` inline and overlapped — are timed too so the best one can be reported.
The raw gather operator, ``edp.buffer.sample``, is timed separately.

All schedules share one preallocated ring through a storage policy
(``Conduit(storage=...)``, the public extension point), so the benchmark holds
one copy of the data for every variant; each runtime still writes every row it
serves through its own push path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from benchmarks.peers import Case, MicroData, Op, Peer, Role, Sampling, index_select_into
from conduit.config import Tuning
from conduit.core import Mode, SamplerKind, Schedule
from conduit.runtime import Conduit
from conduit.spec import ExperienceSpec
from conduit.storage import Storage, TensorStorage
from conduit.trace import Tracer

__all__ = ["ConduitPeer", "SharedStorage"]


class SharedStorage:
    """A storage policy that hands every runtime a handle on the same host ring (variants of one benchmark).

    A closing runtime frees its storage at once; here it only drops its handle,
    and the ring is freed when the last handle goes, so the other runtimes'
    workers never read a freed ring.
    """

    def __init__(self) -> None:
        self.storage: TensorStorage | None = None
        self.handles = 0

    def create(self, spec: ExperienceSpec, rows: int) -> Storage:
        if self.storage is None:
            self.storage = TensorStorage(spec, rows, "cpu")
        elif self.storage.spec != spec or self.storage.rows != rows:
            raise ValueError(
                f"SharedStorage holds {self.storage.rows} rows of {self.storage.spec}; asked for {rows} rows of {spec}"
            )
        self.handles += 1
        return _Handle(self, self.storage)

    def migrate(self, old: Storage, spec: ExperienceSpec, valid: int) -> Storage:
        raise NotImplementedError("the micro-benchmark's spec never grows")

    def release(self) -> None:
        self.handles -= 1
        if self.handles <= 0 and self.storage is not None:
            self.storage.close()
            self.storage = None


class _Handle(Storage):
    """One runtime's view of the shared ring: every call goes to the ring, ``close`` drops the handle."""

    def __init__(self, owner: SharedStorage, ring: TensorStorage) -> None:
        super().__init__(ring.spec, ring.rows)
        self._owner: SharedStorage | None = owner
        self.ring = ring
        # the hot calls go straight to the ring, as a runtime that owns its storage makes them: a forwarding
        # frame costs a pull ~1-2 us right after a gather (the methods below stay for the Storage interface)
        self.write = ring.write  # type: ignore[method-assign]
        self.gather = ring.gather  # type: ignore[method-assign]

    @property
    def devices(self) -> tuple[torch.device, ...]:
        return self.ring.devices

    @property
    def streaming(self) -> bool:
        return self.ring.streaming

    def set_streaming(self, enabled: bool) -> None:
        self.ring.set_streaming(enabled)

    def write(self, start: int, data: Mapping[str, torch.Tensor]) -> None:
        self.ring.write(start, data)

    def write_slots(self, slots: np.ndarray, data: Mapping[str, torch.Tensor]) -> None:
        self.ring.write_slots(slots, data)

    def gather(
        self, indices: torch.Tensor, device: torch.device | None = None, out: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        return self.ring.gather(indices, device, out)

    def read(self, start: int, n: int) -> dict[str, torch.Tensor]:
        return self.ring.read(start, n)

    def close(self) -> None:
        if self._owner is not None:
            self._owner.release()
            self._owner = None


def micro_spec(dim: int) -> ExperienceSpec:
    return ExperienceSpec.of(
        obs=((dim,), "float32"),
        next_obs=((dim,), "float32"),
        action=((), "int64"),
        reward=((), "float32"),
        done=((), "bool"),
    )


class ConduitPeer(Peer):
    library = "conduit"

    def __init__(self, data: MicroData, granularities: Sequence[int] = (1, 2, 4), overlap: bool = True) -> None:
        super().__init__(data)
        self.shared = SharedStorage()
        self.spec = micro_spec(data.dim)
        self.granularities = tuple(sorted(set(granularities) | {1}))
        self.g_max = max(self.granularities)
        one = Mode(False, 1)
        self.headline = self._runtime(Schedule(one, one))
        self.variants: dict[Mode, Conduit] = {}
        for overlapped in (False, True) if overlap else (False,):
            for g in self.granularities:
                mode = Mode(overlapped, g)
                if mode != one:
                    self.variants[mode] = self._runtime(Schedule(mode, mode))
        self.prioritized = self._runtime(Schedule(one, one), SamplerKind.PRIORITIZED)
        # the headline with recycled batch memory (Tuning.batch_pool): what index_select(out=) gets for free
        self.pooled = self._runtime(Schedule(one, one), batch_pool=2)
        # the headline gathering every batch into fresh memory (Tuning.recycle_batches=False): what recycling buys
        self.fresh = self._runtime(Schedule(one, one), recycle=False)
        self._k = 0
        self._same_out: dict[str, torch.Tensor] | None = None

    def _runtime(
        self,
        schedule: Schedule,
        sampler: SamplerKind = SamplerKind.UNIFORM,
        tracer: Tracer | None = None,
        batch_pool: int = 0,
        recycle: bool = True,
    ) -> Conduit:
        d = self.data
        return Conduit(
            spec=self.spec,
            storage=self.shared,
            tracer=tracer or Tracer(enabled=False),
            policy="off_policy",
            train_batch_size=d.batch,
            capacity=d.capacity,
            rollout_unit_size=d.chunk,
            sampler=sampler,
            seed=d.seed,
            g_max=self.g_max,
            pinned=schedule,
            tuning=Tuning(batch_pool=batch_pool, recycle_batches=recycle),
            copy_on_push=False,  # nothing writes into a pushed chunk again: handed over, as fresh rollouts are
            timeout_s=120.0,
        ).start()

    @property
    def runtimes(self) -> list[Conduit]:
        return [self.headline, *self.variants.values(), self.prioritized, self.pooled, self.fresh]

    def fill(self) -> None:
        for edp in self.runtimes:
            for k in range(self.data.fill_chunks):
                edp.push(self.data.fill_chunk(k))
            edp.flush()

    def _push(self, edp: Conduit) -> Any:
        pool = self.data.chunks

        def block(n: int) -> None:
            for _ in range(n):
                edp.push(pool[self._k % len(pool)])
                self._k += 1
            edp.flush()

        return block

    @staticmethod
    def _pull(edp: Conduit) -> Any:
        def block(n: int) -> None:
            for _ in range(n):
                edp.pull()

        return block

    def _gather(self, edp: Conduit) -> Any:
        batch = self.data.batch

        def block(n: int) -> None:
            buf = edp.buffer
            assert buf is not None
            for _ in range(n):
                buf.sample(batch)  # type: ignore[union-attr]

        return block

    def _index_select_same(self) -> Any:
        """``index_select(out=)`` from the ring Conduit's pulls read: TorchPlain's gather, on the same memory."""
        data = self.data
        gen = torch.Generator().manual_seed(data.seed + 5)

        def block(n: int) -> None:
            ring = self.shared.storage
            assert ring is not None
            tensors = ring.tensors
            out = self._same_out
            if out is None:
                out = self._same_out = {
                    k: torch.empty((data.batch, *t.shape[1:]), dtype=t.dtype) for k, t in tensors.items()
                }
            index_select_into(tensors, out, ring.rows, data.batch, gen, n)

        return block

    def cases(self) -> list[Case]:
        lib, u, p = self.library, Sampling.UNIFORM, Sampling.PRIORITIZED
        head = str(self.headline.schedule.delivery)
        out = [
            Case(f"Conduit push ({head})", lib, Op.INGEST, Role.CONDUIT, self._push(self.headline)),
            Case(f"Conduit pull ({head})", lib, Op.DELIVER, Role.CONDUIT, self._pull(self.headline), u),
            Case(
                "Conduit gather op (buffer.sample)",
                lib,
                Op.DELIVER,
                Role.CONDUIT_GATHER,
                self._gather(self.headline),
                u,
                note="the raw gather operator: sampler + index_select per field (fields of 1 MiB and up into "
                "dropped batches' memory, as a pull), no pull bookkeeping",
            ),
            Case(
                "torch index_select(out=), Conduit's storage",
                "torch",
                Op.DELIVER,
                Role.INDEX_SELECT_SAME,
                self._index_select_same(),
                u,
                note="the plain baseline gathering from the ring Conduit's pulls read: two storages' memory "
                "gathers at different speeds in one process, so this ratio holds Conduit's own cost alone",
            ),
        ]
        for mode, edp in self.variants.items():
            out.append(Case(f"Conduit push ({mode})", lib, Op.INGEST, Role.CONDUIT_VARIANT, self._push(edp)))
            out.append(Case(f"Conduit pull ({mode})", lib, Op.DELIVER, Role.CONDUIT_VARIANT, self._pull(edp), u))
        out.append(
            Case(
                f"Conduit pull ({head}, batch_pool=2)",
                lib,
                Op.DELIVER,
                Role.CONDUIT_POOLED,
                self._pull(self.pooled),
                u,
                note="recycled batch memory: each batch stays valid for one more pull, then is overwritten",
            )
        )
        out.append(
            Case(
                f"Conduit pull ({head}, fresh batch memory)",
                lib,
                Op.DELIVER,
                Role.CONDUIT_VARIANT,
                self._pull(self.fresh),
                u,
                note="recycle_batches=False: every batch gathered into newly allocated memory",
            )
        )
        out += [
            Case(f"Conduit push ({head}, prioritized)", lib, Op.INGEST, Role.CONDUIT, self._push(self.prioritized), p),
            Case(f"Conduit pull ({head}, prioritized)", lib, Op.DELIVER, Role.CONDUIT, self._pull(self.prioritized), p),
            Case(
                "Conduit gather op (buffer.sample, prioritized)",
                lib,
                Op.DELIVER,
                Role.CONDUIT_GATHER,
                self._gather(self.prioritized),
                p,
            ),
        ]
        return out

    def trace(self, tracer: Any, operations: int) -> None:
        """Push and pull a few times through traced runtimes: inline g=1 and the largest overlapped g."""
        one = Mode(False, 1)
        last = Mode(True, self.g_max)
        for schedule in (Schedule(one, one), Schedule(last, last)):
            with tracer.span("conduit micro", cat="bench", schedule=str(schedule)):
                edp = self._runtime(schedule, tracer=tracer)
                try:
                    pool = self.data.chunks
                    for k in range(-(-self.data.batch // self.data.chunk)):  # enough rows to sample from
                        edp.push(pool[k % len(pool)])
                    edp.flush()
                    for k in range(operations):
                        edp.push(pool[k % len(pool)])
                        edp.pull()
                    edp.flush()
                finally:
                    edp.close()

    def close(self) -> None:
        self._same_out = None
        for edp in self.runtimes:
            edp.close()
