"""Uniform replay: every valid slot equally likely, with replacement."""

from __future__ import annotations

import numpy as np

from conduit.samplers.base import Draw, Sampler

__all__ = ["UniformSampler"]


class UniformSampler(Sampler):
    def sample(self, n: int, size: int, rng: np.random.Generator) -> Draw:
        if size <= 0:
            raise ValueError("cannot sample from an empty buffer")
        return Draw(rng.integers(0, size, n, dtype=np.int64))
