"""TorchRL's ``ReplayBuffer`` as a peer: what a PyTorch RL user picks by default.

``ReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=B)``, with and
without its ``prefetch`` (a thread pool that samples ahead), extended with
TensorDict chunks (built once, outside the timing: a TorchRL user already holds
TensorDicts) and sampled into a TensorDict training batch. The prefetching
buffer shares the storage of the plain one (TorchRL supports several buffers
attached to one storage). Prioritized replay uses TorchRL's
``PrioritizedSampler``, whose sum-tree lives in TorchRL's C++ extension; where
that extension does not load (built for another torch), the case is reported
missing with the reason.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from benchmarks.peers import Case, MicroData, Missing, Op, Peer, Role, Sampling

__all__ = ["TorchRLPeer"]

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, PrioritizedSampler, ReplayBuffer

for _name in ("torchrl", "tensordict"):  # TorchRL logs every storage it initializes at INFO
    logging.getLogger(_name).setLevel(logging.WARNING)


def extension_error() -> str | None:
    """Why TorchRL's C++ extension (its sum-tree) does not load here, or None when it does."""
    try:
        import torchrl._torchrl  # noqa: F401
    except ImportError as exc:
        import torch

        detail = str(exc).rsplit(".so: ", 1)[-1]  # "undefined symbol: ..." without the site-packages path
        if len(detail) > 90:
            detail = detail[:90] + "…"
        return f"TorchRL's C++ extension (its sum-tree) does not load with torch {torch.__version__}: {detail}"
    return None


class TorchRLPeer(Peer):
    library = "torchrl"

    def __init__(self, data: MicroData, prefetch: int = 3, alpha: float = 0.6, beta: float = 0.4) -> None:
        super().__init__(data)
        self.prefetch = prefetch
        self.pool = [TensorDict(dict(c), batch_size=[data.chunk]) for c in data.chunks]
        self.storage = LazyTensorStorage(data.capacity)
        self.rb = ReplayBuffer(storage=self.storage, batch_size=data.batch)
        self.rb_prefetch = (
            ReplayBuffer(storage=self.storage, batch_size=data.batch, prefetch=prefetch) if prefetch else None
        )
        self._missing: list[Missing] = []
        self.rb_prio: Any = None
        why = extension_error()
        if why is not None:
            self._missing.append(Missing("TorchRL PrioritizedSampler", self.library, why))
        else:
            sampler = PrioritizedSampler(data.capacity, alpha=alpha, beta=beta)
            self.rb_prio = ReplayBuffer(
                storage=LazyTensorStorage(data.capacity), sampler=sampler, batch_size=data.batch
            )
        self._k = 0

    def fill(self) -> None:
        for rb in (self.rb, self.rb_prio):
            if rb is not None:
                for k in range(self.data.fill_chunks):
                    rb.extend(TensorDict(self.data.fill_chunk(k), batch_size=[self.data.fill_n]))

    def _extend(self, rb: Any) -> Any:
        def block(n: int) -> None:
            for _ in range(n):
                rb.extend(self.pool[self._k % len(self.pool)])
                self._k += 1

        return block

    @staticmethod
    def _sample(rb: Any) -> Any:
        def block(n: int) -> None:
            for _ in range(n):
                rb.sample()

        return block

    def cases(self) -> list[Case]:
        lib, u, p = self.library, Sampling.UNIFORM, Sampling.PRIORITIZED
        out = [
            Case("TorchRL extend", lib, Op.INGEST, Role.TORCHRL, self._extend(self.rb)),
            Case("TorchRL sample", lib, Op.DELIVER, Role.TORCHRL, self._sample(self.rb), u),
        ]
        if self.rb_prefetch is not None:
            out.append(
                Case(
                    f"TorchRL sample (prefetch={self.prefetch})",
                    lib,
                    Op.DELIVER,
                    Role.TORCHRL_PREFETCH,
                    self._sample(self.rb_prefetch),
                    u,
                )
            )
        if self.rb_prio is not None:
            out += [
                Case("TorchRL extend (prioritized)", lib, Op.INGEST, Role.TORCHRL, self._extend(self.rb_prio), p),
                Case("TorchRL sample (prioritized)", lib, Op.DELIVER, Role.TORCHRL, self._sample(self.rb_prio), p),
            ]
        return out

    def missing(self) -> list[Missing]:
        return list(self._missing)

    def close(self) -> None:
        for rb in (self.rb_prefetch, self.rb, self.rb_prio):
            if rb is not None:
                rb.shutdown()
