"""cpprb as a peer: a C++/Cython replay buffer over numpy arrays, popular for its speed.

``ReplayBuffer`` and ``PrioritizedReplayBuffer`` with the benchmark's fields,
``add`` of numpy chunks (256 transitions by default), ``sample`` of a batch; the batch is
turned into torch tensors with ``torch.from_numpy`` (no copy), which is what a
torch learner does with it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from benchmarks.peers import Case, MicroData, Op, Peer, Role, Sampling

__all__ = ["CpprbPeer"]

import cpprb


def _env_dict(dim: int) -> dict[str, dict[str, Any]]:
    return {
        "obs": {"shape": dim, "dtype": np.float32},
        "next_obs": {"shape": dim, "dtype": np.float32},
        "action": {"dtype": np.int64},
        "reward": {"dtype": np.float32},
        "done": {"dtype": np.bool_},
    }


class CpprbPeer(Peer):
    library = "cpprb"

    def __init__(self, data: MicroData, alpha: float = 0.6, beta: float = 0.4) -> None:
        super().__init__(data)
        env = _env_dict(data.dim)
        self.beta = beta
        self.rb = cpprb.ReplayBuffer(data.capacity, env)
        self.per = cpprb.PrioritizedReplayBuffer(data.capacity, env, alpha=alpha)
        self._k = 0

    def fill(self) -> None:
        for rb in (self.rb, self.per):
            for k in range(self.data.fill_chunks):
                rb.add(**self.data.numpy_fill_chunk(k))

    def _add(self, rb: Any) -> Any:
        pool = self.data.numpy_chunks

        def block(n: int) -> None:
            for _ in range(n):
                rb.add(**pool[self._k % len(pool)])
                self._k += 1

        return block

    def _sample(self, rb: Any, **kw: Any) -> Any:
        b = self.data.batch

        def block(n: int) -> None:
            for _ in range(n):
                {k: torch.from_numpy(v) for k, v in rb.sample(b, **kw).items()}

        return block

    def cases(self) -> list[Case]:
        lib, u, p = self.library, Sampling.UNIFORM, Sampling.PRIORITIZED
        return [
            Case("cpprb add", lib, Op.INGEST, Role.CPPRB, self._add(self.rb)),
            Case("cpprb sample", lib, Op.DELIVER, Role.CPPRB, self._sample(self.rb), u),
            Case("cpprb add (prioritized)", lib, Op.INGEST, Role.CPPRB, self._add(self.per), p),
            Case("cpprb sample (prioritized)", lib, Op.DELIVER, Role.CPPRB, self._sample(self.per, beta=self.beta), p),
        ]

    def close(self) -> None:
        self.rb = self.per = None
