"""``conduit_queue``: SRL's default buffer (``priority_queue``, on-policy batches with reuse), thread-safe.

SRL's semantics, kept exactly (docs/srl.md, Guarantees):

- ``put`` collects samples and, every ``batch_size`` of them, stacks them on axis 1
  into one time-major ``[T, B, ...]`` entry with ``reuses_left = reuses`` and
  ``receive_time = time.time()``; it returns ``True`` when it formed an entry.
  With ``batch_size`` falsy each sample is an entry of its own (``put`` returns ``False``).
- Entries are ordered by ``(reuses_left, receive_time)``; ``get`` takes the one with
  the most reuses left, the newest among equals (ties: the one inserted last),
  decrements ``reuses_left``, increments ``reuses`` and puts it back while
  ``reuses_left > 0`` and the queue is not full. The same entry object comes back
  each time it is reused, as in SRL.
- Over ``max_size`` entries, the one with the fewest reuses left and the oldest
  arrival is dropped (SRL is lossy by design under back-pressure; :attr:`dropped` counts).

The queue itself is the core's :class:`conduit.ext.ReuseQueue` (its order, its one lock, its
drops); this module forms SRL's entries. The stack is written once into staging memory
(:class:`conduit.ext.Staging`: pinned where CUDA is, so the trainer's ``non_blocking`` copy
is a real DMA, and recycled), on the stream thread that calls ``put`` -- which overlaps the
trainer thread by construction. With ``learner_device="cuda:N"`` the stacked batch is also
copied to that GPU at ``put`` (on the core's side stream; the trainer's stream waits on the
copy's event at ``get``); ``policy_version_steps`` stays host numpy for SRL's staleness filter.
"""

from __future__ import annotations

import queue
import time
from typing import Any, ClassVar

import numpy as np
import torch

from conduit import ConfigError
from conduit.ext import (
    HandoffGuard,
    ReuseQueue,
    Staging,
    StreamSet,
    build_record,
    flatten_record,
    handoff,
    stack_time_major,
)

from .locate import HOST_FIELDS, SRLTypes, types_named

__all__ = ["ConduitQueueBuffer"]


class ConduitQueueBuffer:
    """``conduit_queue``: see the module docstring."""

    NAME: ClassVar[str] = "conduit_queue"

    def __init__(
        self,
        max_size: int = 16,
        reuses: int = 1,
        batch_size: int | None = 1,
        *,
        learner_device: str = "cpu",
        srl_types: SRLTypes | None = None,
    ) -> None:
        if not isinstance(max_size, (int, float, np.integer, np.floating)) or max_size < 1:
            raise ConfigError(f"max_size: expected >= 1, got {max_size!r}")
        if not isinstance(reuses, (int, np.integer)) or reuses < 1:
            raise ConfigError(f"reuses: expected an int >= 1, got {reuses!r}")
        if batch_size is not None and (not isinstance(batch_size, (int, np.integer)) or batch_size < 0):
            raise ConfigError(f"batch_size: expected an int >= 0 or None, got {batch_size!r}")
        max_size, reuses = (int(max_size) if isinstance(max_size, np.integer) else max_size), int(reuses)
        batch_size = int(batch_size) if batch_size is not None else None
        self.max_size, self.reuses, self.batch_size = max_size, reuses, batch_size
        self.learner_device = torch.device(learner_device)
        if self.learner_device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"learner_device={learner_device!r}: CUDA is not available on this machine")
        self.types = srl_types or types_named(None)
        self._kwargs: dict[str, Any] = dict(
            max_size=max_size, reuses=reuses, batch_size=batch_size, learner_device=learner_device
        )
        self._setup()

    def _setup(self) -> None:
        self.staging = Staging()
        self._guard = HandoffGuard()
        # a GPU learner's entries are copied to it on the core's side stream at put
        self._stream = StreamSet(self.learner_device) if self.learner_device.type == "cuda" else None
        self.queue: ReuseQueue[Any] = ReuseQueue(self.max_size, self.batch_size or 1, self._form)

    @property
    def formed(self) -> int:
        """Entries formed."""
        return self.queue.formed

    @property
    def dropped(self) -> int:
        """Entries dropped on overflow."""
        return self.queue.dropped

    @property
    def handed(self) -> int:
        """Entries handed out (reuses included)."""
        return self.queue.handed

    # -- SRL's buffer protocol -------------------------------------------------------------------
    def put(self, x: Any) -> bool:
        """Add a sample; ``True`` when it completed an entry of ``batch_size`` samples (the stream thread)."""
        formed = self.queue.put(x)
        return bool(self.batch_size) and formed is not None

    def put_many(self, xs: list[Any]) -> int:
        """``put`` each sample (what :class:`~.consumer.ConduitSampleConsumer` calls); returns how many."""
        for x in xs:
            self.put(x)
        return len(xs)

    def get(self) -> Any:
        """The entry with the most reuses left, newest first (the trainer thread; ``queue.Empty`` when empty)."""
        got = self.queue.get()
        if got is None:
            raise queue.Empty("the Conduit SRL queue buffer is empty")
        entry, event = got
        self._hand_over(entry, event)
        return entry

    def empty(self) -> bool:
        return len(self.queue) == 0

    def qsize(self) -> int:
        return len(self.queue)

    def full(self) -> bool:
        return self.queue.full()

    def _form(self, group: list[Any]) -> tuple[Any, torch.cuda.Event | None]:
        """One SRL entry from a group: a sample as it came (``batch_size`` falsy), else the group stacked."""
        if not self.batch_size:
            sample, event = group[0], None
        else:
            sample, event = self._stack(group)
        return self.types.replay_entry(reuses_left=self.reuses, sample=sample, receive_time=time.time()), event

    # -- batching on axis 1 -------------------------------------------------------------------------
    def _stack(self, group: list[Any]) -> tuple[Any, torch.cuda.Event | None]:
        """``B`` samples of ``[T, ...]`` -> one ``[T, B, ...]`` sample, numeric leaves in staging memory (a record
        left None in some samples: its leaves zero-filled, as SRL's aggregation fills them)."""
        names, leaves, blocks = stack_time_major(group, self.staging.take)
        event = None
        if blocks:
            placed, event = self._place(blocks)
            leaves.update(placed)
        return build_record([(k, leaves[k]) for k in names], self.types.named_array), event

    def _place(self, blocks: dict[str, torch.Tensor]) -> tuple[dict[str, Any], torch.cuda.Event | None]:
        """Host numpy views of the blocks, or (a GPU learner) device tensors copied on a side stream, and the
        event that copy's completion records."""
        if self._stream is None:
            return {k: b.numpy() for k, b in blocks.items()}, None
        out: dict[str, Any] = {}
        with self._stream.active():
            for k, b in blocks.items():
                out[k] = b.numpy() if k in HOST_FIELDS else b.to(self.learner_device, non_blocking=True)
        return out, self._stream.record()

    def _hand_over(self, entry: Any, event: torch.cuda.Event | None) -> None:
        """The trainer thread receives ``entry``: its stream waits for the entry's device copy, or its pinned host
        blocks are guarded until the trainer's own prefetcher has copied them."""
        if self._stream is not None:
            handoff({k: v for k, v in flatten_record(entry.sample) if isinstance(v, torch.Tensor) and v.is_cuda}, event)
        elif self.staging.pinned:
            self._guard.handed([v for _, v in flatten_record(entry.sample) if isinstance(v, np.ndarray)])

    # -- persistence ----------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """Entries and pending samples pickle as they are (SRL's ``save_buffer_on_exit``): host numpy, and for a
        GPU learner device tensors, which unpickle where that device exists."""
        entries, pending, counts = self.queue.snapshot()
        return {
            "kwargs": self._kwargs, "entries": entries, "pending": pending, "counts": counts,
            "srl_module": self.types.module.__name__,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state["kwargs"], srl_types=types_named(state.get("srl_module")))  # type: ignore[misc]
        self.queue.restore(state["entries"], state["pending"], state["counts"])

    def __repr__(self) -> str:
        return (
            f"ConduitQueueBuffer(max_size={self.max_size}, reuses={self.reuses}, batch_size={self.batch_size}, "
            f"entries={len(self.queue)}, staging={'pinned' if self.staging.pinned else 'pageable'})"
        )
