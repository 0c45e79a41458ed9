"""Actors in other processes pushing into one runtime.

``torch.multiprocessing`` earns its place: its queues move tensors through
shared memory instead of pickling their bytes, and it is the engine the torch
ecosystem already uses for multi-process data loading — no home-made transport.

::

    channel = edp.actor_channel()              # in the learner process
    proc = mp.get_context("spawn").Process(target=actor_main, args=(channel.actor(),))

    def actor_main(actor):                     # in the actor process
        with actor:                            # exiting waits until every unit was received
            for _ in range(n):
                actor.push(rollout())          # blocks (bounded) when the channel is full

A receiver thread in the runtime's process drains the channel into
``Conduit.push``. When the runtime fails or closes, a shared flag tells remote
actors, whose next ``push`` raises instead of blocking forever.

Shared-memory tensors need their sending process alive until the receiver has
taken them, so each actor counts what it sent, the receiver acknowledges per
actor, and ``actor.flush()`` (or leaving ``with actor:``) waits for the acks.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import torch
import torch.multiprocessing as mp

from conduit.errors import ConduitTimeout, RuntimeClosed
from conduit.executor import POLL_S, FailureBox, Worker, wait_until
from conduit.spec import Data, as_tensors

__all__ = ["ActorChannel", "RemoteActor"]


def _shared_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` in shared memory (CPU), or on its device (CUDA: sent by IPC handle)."""
    if t.is_cuda:
        return t.clone(memory_format=torch.contiguous_format)
    return torch.empty(t.shape, dtype=t.dtype).share_memory_().copy_(t)


class RemoteActor:
    """A picklable handle an actor process pushes through."""

    def __init__(self, q: Any, stopped: Any, acks: Any, index: int, timeout: float) -> None:
        self._queue = q
        self._stopped = stopped
        self._acks = acks
        self.index = index
        self.timeout = timeout
        self.sent = 0

    def push(self, data: Data, timeout: float | None = None, copy: bool = True) -> None:
        """Send one rollout unit to the runtime; the actor may write into its arrays again when this returns.

        The queue pickles in a background thread after ``put`` returns, and a
        tensor travels as shared memory the receiver maps — so without a copy a
        later write by the actor would reach the runtime. ``copy=True`` copies
        the unit straight into fresh shared memory here (the copy pickling would
        make anyway, made before returning); ``copy=False`` hands the tensors
        over: the actor must not write into them again.
        """
        if self._stopped.is_set():
            raise RuntimeClosed("the Conduit runtime this actor pushes to has stopped")
        tensors = {k: _shared_copy(v) if copy else v.contiguous() for k, v in as_tensors(data).items()}
        limit = self.timeout if timeout is None else timeout
        try:
            self._queue.put((self.index, tensors), timeout=limit)
        except queue.Full as e:
            raise ConduitTimeout(
                f"push timed out after {limit:.3g}s: the actor channel is full (the runtime is not ingesting)"
            ) from e
        self.sent += 1

    def flush(self, timeout: float | None = None) -> None:
        """Wait until the runtime has received every unit this actor pushed."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while self._acks[self.index] < self.sent:
            if self._stopped.is_set():
                raise RuntimeClosed("the Conduit runtime stopped before receiving every pushed unit")
            if time.monotonic() > deadline:
                raise ConduitTimeout(
                    f"flush timed out after {limit:.3g}s: {self.sent - self._acks[self.index]} unit(s) not received"
                )
            time.sleep(0.005)

    def __enter__(self) -> RemoteActor:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.flush()


class ActorChannel:
    """A bounded multi-process queue feeding one runtime's ``push``."""

    def __init__(
        self,
        push: Any,
        failure: FailureBox,
        maxsize: int = 8,
        timeout: float = 60.0,
        context: str = "spawn",
        max_actors: int = 256,
    ) -> None:
        ctx = mp.get_context(context)
        self._queue = ctx.Queue(maxsize)
        self._stopped = ctx.Event()
        self._acks = ctx.Array("q", max_actors, lock=False)
        self._actors = 0
        self.max_actors = max_actors
        self._push = push
        self._failure = failure
        self._timeout = timeout
        self.received = 0
        self._cond = threading.Condition()
        self._worker = Worker("actor-channel", self._step, failure, self._cond)
        self._worker.start()

    def actor(self) -> RemoteActor:
        """A handle to pass to one actor process (one handle per process)."""
        if self._actors >= self.max_actors:
            raise ValueError(f"this channel serves at most {self.max_actors} actors")
        self._actors += 1
        return RemoteActor(self._queue, self._stopped, self._acks, self._actors - 1, self._timeout)

    def _step(self) -> None:
        try:
            index, item = self._queue.get(timeout=POLL_S)
        except queue.Empty:
            return
        try:
            self._push(item, copy=False)  # the actor copied it, or handed it over: nothing else writes it
            self._acks[index] += 1  # only the receiver thread writes acks
        except BaseException:
            self._stopped.set()  # remote actors stop instead of blocking on a dead runtime
            raise
        with self._cond:
            self.received += 1
            self._cond.notify_all()

    def drain(self, units: int, timeout: float | None = None) -> None:
        """Wait until ``units`` items in total have been received from actors."""
        with self._cond:
            wait_until(
                self._cond, lambda: self.received >= units, self._timeout if timeout is None else timeout,
                self._failure, lambda: f"{units} units from remote actors ({self.received} received)",
            )

    def close(self, timeout: float = 5.0) -> bool:
        self._stopped.set()
        ok = self._worker.stop(timeout)
        self._queue.cancel_join_thread()
        self._queue.close()
        return ok

