"""The spine both paths share: the worker, pausing, mode switches, closing.

A path runs its operator graph (:mod:`conduit.operators`) either inline, in the
caller's thread at push or pull, or on the path's worker thread, overlapped with
the caller's rollout and update (DESIGN.md §5). :class:`DataPath` owns what that
takes on both paths — the condition every wait uses, the worker and its loop, the
locks that keep inline invocations of one lane apart, pausing between invocations
(checkpoints capture that point) and switching modes while running — and a
subclass says what one invocation is: :meth:`DataPath._claim_work` takes the
next one under the condition, :meth:`DataPath._work` runs it outside.

Lock order: a path's invocation lock, then its condition, then the buffer's lock.
Buffer callbacks (``on_data``, ``on_room``) run outside the buffer's lock and take
a path's condition.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from conduit.core import Mode
from conduit.executor import POLL_S, FailureBox, Worker, wait_until
from conduit.operators import Graph, Operator
from conduit.trace import Tracer

__all__ = ["DataPath"]


class DataPath(ABC):
    """A path's mode, worker, pausing and closing; subclasses say what an invocation is."""

    #: the path's name: its graph's and its worker thread's (``conduit-<name>``)
    name: ClassVar[str] = "path"

    def __init__(
        self,
        *,
        mode: Mode,
        failure: FailureBox,
        timeout: float,
        tracer: Tracer,
        operators: Sequence[Operator],
        lanes: int = 1,
    ) -> None:
        self._use_mode(mode)
        self.failure = failure
        self.timeout = timeout
        # the condition's lock by name: ``with self._lock`` enters and leaves in C, ``with self.cond`` through two
        # Python methods around it (the inline hot paths take it once per call)
        self._lock = threading.RLock()
        self.cond = threading.Condition(self._lock)
        #: one per lane (a learner rank; ingestion has one): inline invocations of a lane run one at a time,
        #: and whoever pauses the path holds them all
        self._invoke_locks = [threading.Lock() for _ in range(lanes)]
        self._paused = False
        self._working = 0  # worker invocations in flight
        self.worker: Worker | None = None
        self.graph = Graph(self.name, operators, tracer)

    def _use_mode(self, mode: Mode) -> None:
        """Adopt ``mode`` (caller holds cond, or the path is not running yet).

        Its numbers are kept as plain attributes beside it, because Fraction arithmetic
        is Python code and every push and pull reads them.
        """
        g = mode.granularity
        #: units (ingestion) or training batches (off-policy delivery) one invocation takes; 1 below g = 1
        self.g_units = int(g) if g >= 1 else 1
        self.g_float = float(g)
        self.mode = mode

    # -- the worker -------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker where the mode overlaps (idempotent)."""
        if self.mode.overlap and self.worker is None:
            worker = Worker(self.name, self._step, self.failure, self.cond)
            worker.start()
            with self.cond:
                self.worker = worker
                self.cond.notify_all()

    def _step(self) -> None:
        """One turn of the worker's loop: claim an invocation under the condition, run it outside."""
        with self.cond:
            job = self._claim_work() if self.mode.overlap and not self._paused else None
            if job is None:  # nothing to do, paused, or retired by a switch to inline
                self._idle()
                return
            self._working += 1
        try:
            self._work(job)
        finally:
            with self.cond:
                self._working -= 1
                self.cond.notify_all()

    @abstractmethod
    def _claim_work(self) -> Any | None:
        """The worker's next invocation, claimed (caller holds the condition); None when there is none."""

    @abstractmethod
    def _work(self, job: Any) -> None:
        """Run a claimed invocation on the worker (outside the condition)."""

    def _idle(self) -> None:
        """Wait a bounded while for work (caller holds the condition)."""
        self.cond.wait(POLL_S)

    # -- control ------------------------------------------------------------------------
    @contextlib.contextmanager
    def paused(self, timeout: float | None = None) -> Iterator[None]:
        """No invocation runs inside this block (pushes still queue; staged batches can still be pulled)."""
        timeout = self.timeout if timeout is None else timeout
        with contextlib.ExitStack() as stack:
            for lock in self._invoke_locks:  # no inline invocation starts
                stack.enter_context(lock)
            with self.cond:
                self._paused = True  # the worker starts none either
                try:
                    wait_until(self.cond, lambda: not self._working, timeout, self.failure,
                               lambda: f"{self.name} to pause")
                except BaseException:
                    self._paused = False
                    raise
            try:
                yield
            finally:
                with self.cond:
                    self._paused = False
                    self.cond.notify_all()

    def set_mode(self, mode: Mode, timeout: float | None = None) -> None:
        """Switch timing and granularity while running; callers waiting on the old mode are handed to the new one."""
        if mode == self.mode:
            return
        timeout = self.timeout if timeout is None else timeout
        self._before_switch(timeout)
        with self.cond:
            old, self.worker = self.worker, None
            self._use_mode(mode)  # a retiring worker sees the new mode and claims nothing more
            self.cond.notify_all()
        if old is not None:
            old.stop(timeout)
        for lock in self._invoke_locks:  # no inline invocation of the old mode in flight
            with lock:
                pass
        self.start()
        self._after_switch()

    def _before_switch(self, timeout: float) -> None:
        """What must happen under the old mode before a switch."""

    def _after_switch(self) -> None:
        """What the new mode picks up after a switch."""

    def close(self, timeout: float) -> bool:
        """Stop the worker; True when no thread is left."""
        worker = self.worker
        return worker.stop(timeout) if worker is not None else True
