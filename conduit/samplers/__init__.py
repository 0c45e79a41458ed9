"""Which rows a delivery reads: uniform, prioritized, on-policy mini-batches."""

from __future__ import annotations

from conduit.samplers.base import Draw, Sampler
from conduit.samplers.minibatch import minibatch_plan
from conduit.samplers.prioritized import PrioritizedSampler
from conduit.samplers.sumtree import SumTree
from conduit.samplers.uniform import FifoSampler, LifoSampler, UniformSampler

__all__ = [
    "Draw",
    "FifoSampler",
    "LifoSampler",
    "PrioritizedSampler",
    "Sampler",
    "SumTree",
    "UniformSampler",
    "minibatch_plan",
]
