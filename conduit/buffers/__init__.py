"""The Experience Buffer: one protocol (:mod:`.base`), off-policy replay (:mod:`.replay`), on-policy iterations
(:mod:`.iterations`)."""

from conduit.buffers.base import ExperienceBuffer, Ticket
from conduit.buffers.iterations import Iteration, IterationBuffer
from conduit.buffers.replay import ReplayBuffer, Sampled

__all__ = ["ExperienceBuffer", "Iteration", "IterationBuffer", "ReplayBuffer", "Sampled", "Ticket"]
