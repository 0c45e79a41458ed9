"""Where a batch handed to SRL's trainer lives: time-major, pinned where CUDA is, recycled.

SRL's replay buffers keep pinned storage but gather each batch by fancy indexing
into a *new pageable* array, so the trainer's ``PyTorchGPUPrefetcher`` copy
(``torch.from_numpy(x).cuda(non_blocking=True)``) reads pageable memory and the
driver stages it synchronously. Here every batch is laid out, once, in memory the
copy can read asynchronously:

- with CUDA: page-locked blocks from torch's caching host allocator (which recycles
  them), kept alive by :class:`HandoffGuard` until the learner's stream has passed
  the copies a one-step prefetcher makes from them — a copy from a numpy view of a
  block is invisible to the allocator's own event tracking;
- without CUDA (``pin_memory`` raises on CPU builds of torch): pageable memory,
  recycled through Conduit's :class:`~conduit.memory.BatchMemory` once the learner has
  dropped the batch. :attr:`Staging.pinned` says which one is in use.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import torch

from conduit.errors import ConfigError
from conduit.memory import BatchMemory
from conduit.spec import ExperienceSpec, FieldSpec

__all__ = ["HandoffGuard", "Staging"]

#: a field's full shape (time-major ``[T, B, ...]``) and dtype
Shape = tuple[tuple[int, ...], torch.dtype]


class Staging:
    """Blocks for one time-major batch at a time (thread-safe: ``BatchMemory`` and the allocator lock)."""

    def __init__(self, pinned: bool | None = None) -> None:
        available = torch.cuda.is_available()
        if pinned and not available:
            raise ConfigError(
                "pinned staging needs CUDA (page-locked host memory is a CUDA feature); "
                "leave pinned=None to fall back to pageable memory on this machine"
            )
        #: whether blocks are page-locked (True only where CUDA is available)
        self.pinned: bool = available if pinned is None else bool(pinned)
        self._memory = None if self.pinned else BatchMemory()
        self._specs: dict[tuple[tuple[str, tuple[int, ...], torch.dtype], ...], tuple[int, ExperienceSpec]] = {}

    def take(self, shapes: Mapping[str, Shape]) -> dict[str, torch.Tensor]:
        """Uninitialised blocks of ``shapes`` (contents undefined; nothing alive is ever handed out twice)."""
        if self.pinned:
            return {k: torch.empty(s, dtype=d, pin_memory=True) for k, (s, d) in shapes.items()}
        assert self._memory is not None
        key = tuple((k, s, d) for k, (s, d) in shapes.items())
        hit = self._specs.get(key)
        if hit is None:
            rows = next(iter(shapes.values()))[0][0]
            if any(s[0] != rows for s, _ in shapes.values()):  # not one leading dim: no shared spec, plain memory
                return {k: torch.empty(s, dtype=d) for k, (s, d) in shapes.items()}
            spec = ExperienceSpec({k: FieldSpec(k, tuple(s[1:]), d) for k, (s, d) in shapes.items()})
            hit = self._specs[key] = (rows, spec)
        rows, spec = hit
        got = self._memory.take(spec, rows) or {}
        return {k: got[k] if k in got else torch.empty(s, dtype=d) for k, (s, d) in shapes.items()}


class HandoffGuard:
    """Holds blocks handed to the learner until the learner's CUDA stream has passed their copies.

    SRL's prefetcher copies batch ``t`` on a side stream while batch ``t-1`` trains, and
    the learner's stream waits for that copy before batch ``t`` trains — which the
    stream reaches before anything enqueued after the hand-out of batch ``t+2``. So the
    blocks of hand-out ``k`` are released once an event recorded on the learner's
    current stream at hand-out ``k + lag`` has completed. Without CUDA it holds nothing.
    """

    def __init__(self, lag: int = 2, bound: int = 16) -> None:
        self.lag = lag
        self.bound = bound  # a GPU this far behind: wait for it rather than hold more memory
        self.enabled = torch.cuda.is_available()
        self._held: deque[tuple[torch.cuda.Event, Sequence[torch.Tensor]]] = deque()

    def handed(self, blocks: Sequence[torch.Tensor]) -> None:
        """Blocks just handed to the learner (call on the learner's thread, its stream current)."""
        if not self.enabled:
            return
        event = torch.cuda.Event()
        event.record()
        held = self._held
        held.append((event, blocks))
        while len(held) > self.lag and (len(held) > self.bound or held[self.lag][0].query()):
            if len(held) > self.bound:
                held[self.lag][0].synchronize()
            held.popleft()

    def __len__(self) -> int:
        return len(self._held)
