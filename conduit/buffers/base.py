"""The buffer protocol: what ingestion, delivery, the runtime and checkpoints need of an Experience Buffer.

Two buffers implement it: :class:`~conduit.buffers.replay.ReplayBuffer` (off-policy
replay, with Reverb's rate limiter as its admission control) and
:class:`~conduit.buffers.iterations.IterationBuffer` (on-policy, one store per
iteration, never mixed). Everything that differs between the policies is a method
here, so the paths and the runtime never ask which buffer they hold.

Push side, in this order (the ingestion path holds its condition for the first two):

1. :meth:`~ExperienceBuffer.room` — whether a unit of ``rows`` may be admitted now
   (back-pressure: the rate limiter, or the iterations in flight);
   :meth:`~ExperienceBuffer.refuse` raises instead of waiting where waiting is not wanted;
2. :meth:`~ExperienceBuffer.admit` — count the unit in and say where it goes (a :class:`Ticket`);
3. :meth:`~ExperienceBuffer.store` — write the unit's pieces (on the ingestion worker or inline);
4. :meth:`~ExperienceBuffer.stored` — a piece is in (on-policy: an iteration whose pieces are all
   in is sealed for delivery).

Callbacks run outside the buffer's lock: ``on_data`` when rows or an iteration
become deliverable (delivery waits for them), ``on_room`` when room to push opens
(ingestion waits for it).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from conduit.errors import RuntimeClosed, SemanticsError
from conduit.spec import Data, ExperienceSpec

__all__ = ["ANYWHERE", "ExperienceBuffer", "Ticket"]


class Ticket(NamedTuple):
    """Where an admitted unit's rows go, and how it is written."""

    #: on-policy: the iteration the unit joins (None off-policy)
    iteration: int | None = None
    #: the pieces the ingestion writes the unit in
    pieces: int = 1
    #: the unit completes its iteration at the size its plan was drawn for, and the buffer
    #: releases that iteration's mini-batches as their rows are written: one piece, written whole
    closes: bool = False


#: the ticket of an off-policy unit: no iteration, written as pushed
ANYWHERE = Ticket()


class ExperienceBuffer(ABC):
    """The protocol both buffers implement (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.inserted = 0  # rows ever written == next transition id == buffer version
        self.released = False  # the runtime closed: storage freed, no write may land
        self.migrations = 0  # re-layouts after the spec grew
        #: called (outside the lock) when rows or an iteration became deliverable
        self.on_data: list[Callable[[], None]] = []
        #: called (outside the lock) when room to push opened
        self.on_room: list[Callable[[], None]] = []

    # -- what it holds -------------------------------------------------------------
    @property
    @abstractmethod
    def spec(self) -> ExperienceSpec | None:
        """The experience spec (None until declared or inferred from the first write)."""

    @property
    @abstractmethod
    def rows(self) -> int:
        """Live rows (for stats)."""

    @abstractmethod
    def validate(self, parts: Sequence[Data]) -> list[dict[str, torch.Tensor]]:
        """Validate without storing (raises SpecError; changes nothing)."""

    # -- push side -----------------------------------------------------------------
    @property
    def free_admission(self) -> bool:
        """Whether every unit is admitted at once, as pushed: no limit to wait for, no iteration to assign.

        Then an inline push may write straight away (``admit`` and ``stored`` do nothing).
        """
        return False

    def room(self, rows: int) -> bool:
        """Whether a unit of ``rows`` may be admitted now (caller holds the ingestion path's condition)."""
        return True

    def refuse(self, rows: int) -> None:
        """Raise instead of waiting for :meth:`room`, where the configuration says not to wait."""

    def describe_room(self, rows: int) -> str:
        """What a push waiting for :meth:`room` waits for (for timeouts)."""
        return f"room for {rows} rows"

    @abstractmethod
    def admit(self, rows: int, pieces: int) -> Ticket:
        """Count a unit of ``rows``, to be written in ``pieces``, in (caller holds the ingestion's condition)."""

    @abstractmethod
    def store(self, parts: Sequence[Data], ticket: Ticket, *, validated: bool = False) -> int:
        """Write one invocation's parts; returns the rows written. All-or-nothing per write."""

    def stored(self, ticket: Ticket) -> None:
        """One piece of an admitted unit is written (on-policy: seal an iteration once all of it is in)."""

    def close_open(self) -> int | None:
        """End the iteration being pushed now (on-policy; caller holds the ingestion path's condition, as for
        :meth:`admit`): its index, or None when there is nothing to end. :meth:`seal_closed` seals it."""
        return None

    def seal_closed(self, iteration: int) -> None:
        """Seal ``iteration``, ended by :meth:`close_open`, if every piece of it is written (outside the
        ingestion's condition: sealing notifies the delivery path); else :meth:`stored` will."""

    # -- replay state the learner feeds back -----------------------------------------
    def update_priorities(
        self, indices: np.ndarray, ids: np.ndarray, priorities: np.ndarray, *, beta: float | None = None
    ) -> int:
        """Prioritized replay: apply priorities where the slot still holds the sampled transition; ``beta``: the
        importance-sampling exponent of the draws after this feedback (a framework's annealing schedule)."""
        raise SemanticsError("update_priorities needs off-policy replay with sampler='prioritized'")

    # -- lifecycle -------------------------------------------------------------------
    @abstractmethod
    def state_dict(self, *, rows: bool = True) -> dict[str, Any]:
        """Everything needed to continue exactly where this buffer is (tensors, arrays and primitives only).

        ``rows=False`` leaves the stored rows out: only a write changes them, so a checkpoint copies them
        (:meth:`rows_state`) after reading the rest at one point with the delivery's counts.
        """

    def rows_state(self) -> dict[str, torch.Tensor]:
        """A host copy of the stored rows, for :meth:`state_dict` (empty where none are kept)."""
        return {}

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (into a buffer that holds no data yet)."""

    def check_state(self, state: dict[str, Any]) -> None:
        """Raise CheckpointError where :meth:`load_state_dict` would refuse ``state`` (this buffer's shape)."""

    def _notify(self, callbacks: list[Callable[[], None]]) -> None:
        """Run callbacks outside the lock (they take other paths' locks: see the lock order in the runtime)."""
        for fn in list(callbacks):
            fn()

    @abstractmethod
    def release(self) -> None:
        """Free the storage (the runtime closed); set :attr:`released`."""

    def _check_open(self) -> None:
        """A write after :meth:`release` (an invocation that outlived ``close()``) lands nowhere."""
        if self.released:
            raise RuntimeClosed("the buffer was released (the runtime closed) before this write")
