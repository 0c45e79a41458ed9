"""Actors in other processes pushing into one runtime, and surviving the loss of any of them.

The engine is the standard library's and torch's: each actor has its own
``multiprocessing`` pipe, and a unit travels as ``torch.multiprocessing``'s
ForkingPickler writes it — tensors in shared memory, handed over by file
descriptor, never their bytes. No transport of our own: one pipe per actor is
what lets one actor die without touching the others' data.

::

    channel = edp.actor_channel()              # in the learner process
    proc = mp.get_context("spawn").Process(target=actor_main, args=(channel.actor(),))

    def actor_main(actor):                     # in the actor process
        with actor:                            # exiting waits until every unit was received
            for _ in range(n):
                actor.push(rollout())          # waits (bounded) while maxsize units are unacknowledged

A receiver thread in the runtime's process waits on every actor's pipe and
feeds each unit into ``Conduit.push``, then acknowledges it to that actor (a
shared counter): an acknowledged unit is in the runtime's hands. Each actor
has at most ``maxsize`` units unacknowledged, which bounds the shared memory in
flight per actor.

**An actor that dies** (``kill -9``, preemption, a crashed environment) is noticed
by its process id (registered when the handle is unpickled in the actor, checked
every :data:`LIVENESS_S`) or by a unit that can no longer be received (its
shared memory went with the process). The runtime keeps serving the others; the
loss is counted, logged once, passed to ``on_actor_lost`` and listed by
:meth:`ActorChannel.stats`: every unit the actor had acknowledged is in the
runtime, and the units it had sent but not yet handed over are counted as
lost. Only the runtime's own failure stops the channel. A unit the runtime
refuses (``SpecError``) is counted for its actor, whose next ``push`` raises.

A unit is sent as one pipe message, which the kernel writes atomically up to
``PIPE_BUF`` bytes (a dozen fields); a larger one is sent in parts of fields, so
a writer killed mid-unit never leaves a partial message in the pipe.
"""

from __future__ import annotations

import logging
import multiprocessing.connection as mpc
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.multiprocessing as mp

from conduit.errors import ConduitTimeout, RuntimeClosed, SpecError
from conduit.executor import POLL_S, FailureBox, Worker, process_alive, wait_until
from conduit.spec import Data, as_tensors

__all__ = ["LIVENESS_S", "ActorChannel", "ActorLoss", "ChannelStats", "RemoteActor"]

log = logging.getLogger("conduit")

#: how often the receiver checks that actors which have not closed are still alive
LIVENESS_S = 0.2
#: the largest message a pipe write delivers whole (the header's four bytes included)
_ATOMIC = getattr(select, "PIPE_BUF", 4096) - 4


@dataclass(frozen=True)
class ActorLoss:
    """An actor process that died before closing its handle."""

    actor: int
    pid: int
    #: units received from it, all of them in the runtime (its acknowledged units)
    received: int
    #: units it had sent that could not be received (their shared memory went with the process)
    lost_in_transit: int


@dataclass
class ChannelStats:
    actors: int = 0
    received: int = 0
    refused: int = 0
    lost: list[ActorLoss] = field(default_factory=list)
    #: units received from each actor, by its index
    received_by: list[int] = field(default_factory=list)


def _shared_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` in shared memory (CPU), or on its device (CUDA: sent by IPC handle)."""
    if t.is_cuda:
        return t.clone(memory_format=torch.contiguous_format)
    return torch.empty(t.shape, dtype=t.dtype).share_memory_().copy_(t)


def _messages(unit: int, tensors: dict[str, torch.Tensor]) -> list[bytes]:
    """``(unit, part, parts, fields)`` messages, each under the pipe's atomic write size (a single field's
    handle always is: shared memory travels by file descriptor, never by its bytes)."""
    groups = [list(tensors)]
    while True:
        sizes = [len(ForkingPickler.dumps((unit, 0, len(groups), {n: tensors[n] for n in g}))) for g in groups]
        big = [i for i, (g, size) in enumerate(zip(groups, sizes)) if size > _ATOMIC and len(g) > 1]
        if not big:
            break
        for i in reversed(big):  # halve every part still too large
            g = groups[i]
            groups[i : i + 1] = [g[: len(g) // 2], g[len(g) // 2 :]]
    return [bytes(ForkingPickler.dumps((unit, k, len(groups), {n: tensors[n] for n in g})))
            for k, g in enumerate(groups)]


class RemoteActor:
    """A picklable handle one actor process pushes through (one handle per process)."""

    def __init__(self, conn: Any, shared: Any, index: int, maxsize: int, timeout: float) -> None:
        self._conn = conn
        self._shared = shared
        self.index = index
        self.maxsize = maxsize
        self.timeout = timeout
        self.sent = 0
        self._refused_seen = 0

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "sent"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.sent = 0
        self._shared.pids[self.index] = os.getpid()  # the receiver watches this process from now on

    def _check(self) -> None:
        if self._shared.stopped.is_set():
            raise RuntimeClosed("the Conduit runtime this actor pushes to has stopped")
        refused = self._shared.refused[self.index]
        if refused > self._refused_seen:
            new, self._refused_seen = refused - self._refused_seen, refused
            raise SpecError(
                f"the runtime refused {new} unit(s) this actor pushed (they do not match the experience spec; "
                "the learner's log names the field)"
            )

    def push(self, data: Data, timeout: float | None = None, copy: bool = True) -> None:
        """Send one rollout unit to the runtime; the actor may write into its arrays again when this returns.

        ``copy=True`` copies the unit into fresh shared memory first; ``copy=False``
        hands the tensors over (moved to shared memory in place): the actor must not
        write into them again. Waits (bounded) while ``maxsize`` units are unacknowledged.
        """
        self._check()
        self._wait_acks(self.maxsize - 1, timeout, lambda: f"push: {self.maxsize} units unacknowledged (the "
                        "runtime is not ingesting)")
        tensors = {k: _shared_copy(v) if copy else v.share_memory_() for k, v in as_tensors(data).items()}
        for message in _messages(self.sent, tensors):
            self._conn.send_bytes(message)
        self.sent += 1

    def flush(self, timeout: float | None = None) -> None:
        """Wait until the runtime has received every unit this actor pushed."""
        self._wait_acks(0, timeout, lambda: f"flush: {self.sent - self._shared.acks[self.index]} unit(s) not received")
        self._check()

    def _wait_acks(self, unacknowledged: int, timeout: float | None, what: Callable[[], str]) -> None:
        """Wait (bounded) until at most ``unacknowledged`` units this actor sent are not acknowledged yet."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while self.sent - self._shared.acks[self.index] > unacknowledged:
            self._check()
            if time.monotonic() > deadline:
                raise ConduitTimeout(f"timed out after {limit:.3g}s: {what()}")
            time.sleep(0.001)

    def close(self, timeout: float | None = None) -> None:
        """This actor is done: wait until the runtime received its units (their shared memory lives in this
        process until then), then tell it to stop watching this process."""
        try:
            if not self._shared.stopped.is_set():
                self.flush(timeout)
        finally:
            self._shared.closed[self.index] = 1
            self._conn.close()

    def __enter__(self) -> RemoteActor:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:  # the actor failed: what it sent and was received stays; nothing more is waited for
            self._shared.closed[self.index] = 1
            self._conn.close()


class _Shared:
    """What the runtime and every actor process share: counters per actor, the stop flag."""

    def __init__(self, ctx: Any, max_actors: int) -> None:
        self.stopped = ctx.Event()
        self.acks = ctx.Array("q", max_actors, lock=False)  # written by the receiver only
        self.refused = ctx.Array("q", max_actors, lock=False)  # written by the receiver only
        self.pids = ctx.Array("q", max_actors, lock=False)  # written by each actor, once
        self.closed = ctx.Array("b", max_actors, lock=False)  # written by each actor, once


@dataclass
class _Actor:
    """The receiver's record of one actor."""

    reader: Any
    parts: dict[int, tuple[int, dict[str, torch.Tensor]]] = field(default_factory=dict)
    received: int = 0
    failed: int = 0
    gone: bool = False


class ActorChannel:
    """Actor processes' pipes feeding one runtime's ``push`` (see the module docstring)."""

    def __init__(
        self,
        push: Callable[..., None],
        failure: FailureBox,
        maxsize: int = 8,
        timeout: float = 60.0,
        context: str = "spawn",
        max_actors: int = 256,
        on_actor_lost: Callable[[ActorLoss], None] | None = None,
    ) -> None:
        self._ctx = mp.get_context(context)
        self._shared = _Shared(self._ctx, max_actors)
        self.max_actors = max_actors
        self.maxsize = maxsize
        self._push = push
        self._failure = failure
        self._timeout = timeout
        self._on_lost = on_actor_lost
        self._actors: list[_Actor] = []
        self._stats = ChannelStats()
        self._cond = threading.Condition()
        self._checked = 0.0
        self._worker = Worker("actor-channel", self._step, failure, self._cond)
        self._worker.start()

    @property
    def received(self) -> int:
        return self._stats.received

    def actor(self) -> RemoteActor:
        """A handle to pass to one actor process."""
        with self._cond:
            index = len(self._actors)
            if index >= self.max_actors:
                raise ValueError(f"this channel serves at most {self.max_actors} actors")
            reader, writer = self._ctx.Pipe(duplex=False)
            self._actors.append(_Actor(reader))
            self._stats.actors += 1
        return RemoteActor(writer, self._shared, index, self.maxsize, self._timeout)

    def stats(self) -> ChannelStats:
        """Actors served, units received and refused, and every actor lost (a copy)."""
        with self._cond:
            s = self._stats
            return ChannelStats(s.actors, s.received, s.refused, list(s.lost), [a.received for a in self._actors])

    # -- the receiver -------------------------------------------------------------------
    def _step(self) -> None:
        if self._shared.stopped.is_set():  # closing: nothing read now is a death, and the pipes are ours to close
            self._close_pipes()
            self._worker.stopping.set()
            return
        with self._cond:
            live = {a.reader: i for i, a in enumerate(self._actors) if not a.gone}
        if live:
            for reader in mpc.wait(list(live), timeout=POLL_S):
                self._receive(live[reader])
        else:
            time.sleep(POLL_S)
        if time.monotonic() - self._checked > LIVENESS_S:
            self._checked = time.monotonic()
            self._check_liveness()

    def _receive(self, index: int) -> None:
        actor = self._actors[index]
        try:
            message = actor.reader.recv_bytes()
        except (EOFError, OSError):  # every writer closed: the actor is done, or died
            self._retire(index, died=self._shared.closed[index] == 0)
            return
        if not self._take(index, message):
            pid = self._shared.pids[index]
            if pid <= 0 or not process_alive(pid):
                self._retire(index, died=self._shared.closed[index] == 0)

    def _take(self, index: int, message: bytes) -> bool:
        """Receive one message of actor ``index`` into the runtime; False where it cannot be received."""
        actor = self._actors[index]
        try:
            unit, _, parts, tensors = ForkingPickler.loads(message)
        except Exception as exc:  # the unit's shared memory went with its process
            actor.failed += 1
            log.debug("conduit: a unit from actor %d cannot be received: %s: %s", index, type(exc).__name__, exc)
            return False
        if parts > 1:  # a unit sent in parts: pushed once every part is in
            count, fields = actor.parts.get(unit, (0, {}))
            if count + 1 < parts:
                actor.parts[unit] = (count + 1, {**fields, **tensors})
                return True
            actor.parts.pop(unit, None)
            tensors = {**fields, **tensors}
        try:
            self._push(tensors, copy=False)  # the actor copied it, or handed it over: nothing else writes it
        except SpecError as exc:
            self._shared.refused[index] += 1  # its next push raises
            with self._cond:
                self._stats.refused += 1
            log.warning("conduit: refused a unit from actor %d: %s", index, exc)
        except BaseException:
            self._shared.stopped.set()  # the runtime failed: remote actors stop instead of blocking on it
            raise
        self._shared.acks[index] += 1  # only the receiver thread writes acks
        with self._cond:
            actor.received += 1
            self._stats.received += 1
            self._cond.notify_all()
        return True

    def _check_liveness(self) -> None:
        for index, actor in enumerate(self._actors):
            pid = self._shared.pids[index]
            if actor.gone or pid <= 0 or self._shared.closed[index] or process_alive(pid):
                continue
            self._retire(index, died=True)

    def _retire(self, index: int, died: bool) -> None:
        """Stop reading an actor: take what it wrote before it went, then record it (a loss if it died unclosed)."""
        if self._shared.stopped.is_set():
            return  # the channel is closing: its pipes are closed on purpose
        actor = self._actors[index]
        actor.gone = True
        while True:
            try:
                if not actor.reader.poll(0):
                    break
                message = actor.reader.recv_bytes()
            except (EOFError, OSError):
                break
            self._take(index, message)
        actor.failed += len(actor.parts)  # units it had sent only part of
        actor.parts.clear()
        actor.reader.close()
        if not died:
            return
        loss = ActorLoss(index, int(self._shared.pids[index]), actor.received, actor.failed)
        with self._cond:
            self._stats.lost.append(loss)
            self._cond.notify_all()
        log.warning(
            "conduit: actor %d (pid %d) died: its %d received unit(s) are in the runtime, %d sent unit(s) were "
            "lost in transit; the runtime goes on with the other actors",
            index, loss.pid, loss.received, loss.lost_in_transit,
        )
        if self._on_lost is not None:
            try:
                self._on_lost(loss)
            except Exception:
                log.exception("conduit: the on_actor_lost callback raised (ignored)")

    def drain(self, units: int, timeout: float | None = None) -> None:
        """Wait until ``units`` items in total have been received from actors."""
        with self._cond:
            wait_until(
                self._cond, lambda: self._stats.received >= units, self._timeout if timeout is None else timeout,
                self._failure, lambda: f"{units} units from remote actors ({self._stats.received} received)",
            )

    def close(self, timeout: float = 5.0) -> bool:
        """Stop the receiver; its pipes are closed once it has stopped (else it closes them as it ends)."""
        self._shared.stopped.set()
        ok = self._worker.stop(timeout)
        if ok:
            self._close_pipes()
        return ok

    def _close_pipes(self) -> None:
        for actor in self._actors:
            if not actor.gone:
                actor.gone = True
                actor.reader.close()
