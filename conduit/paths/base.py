"""The spine both paths share: the worker, pausing, mode switches, closing.

A path runs its operator graph (:mod:`conduit.operators`) either inline, in the
caller's thread at push or pull, or on the path's worker thread, overlapped with
the caller's rollout and update (docs/design.md §5). :class:`DataPath` owns what that
takes on both paths — the condition every wait uses, the worker and its loop, the
locks that keep inline invocations of one lane apart, pausing between invocations
(checkpoints capture that point) and switching modes while running — and a
subclass says what one invocation is: :meth:`DataPath._claim_work` takes the
next one under the condition, :meth:`DataPath._work` runs it outside.

Lock order — the one rule for save, push and pull (take locks left to right,
never a lock to the left of one already held):

    ingestion's invocation lock -> delivery's invocation locks (lane order)
      -> delivery's condition -> ingestion's condition -> the buffer's lock -> leaves

A save (:meth:`conduit.Conduit.state_dict`) walks it whole: it pauses ingestion,
then delivery (their invocation locks), settles the delivery's counts (its
condition), reads the buffer's admissions under the ingestion's condition, and
copies the rows holding no path lock. A push or pull takes a prefix of it. No
thread waits for data or for room while it holds an invocation lock: an inline
pull waiting for rows waits on the condition alone, so a save never waits for
data and data never waits for a save. Buffer callbacks (``on_data``,
``on_room``) run outside the buffer's lock and take one path's condition.
Leaves (the rate limiter's lock, the spec holder's) take nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from conduit.core import Mode
from conduit.errors import ConduitTimeout
from conduit.executor import POLL_S, FailureBox, Worker, wait_until
from conduit.operators import Graph, Operator
from conduit.trace import Tracer

__all__ = ["DataPath"]

log = logging.getLogger("conduit")


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
        self._pauser: int | None = None  # the thread holding the pause: it may pause again inside (re-entrant)
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
    def _acquire(self, lock: threading.Lock, timeout: float, doing: str) -> None:
        """Take an invocation lock within ``timeout``, or raise ConduitTimeout naming what holds it up."""
        if not lock.acquire(timeout=max(0.0, timeout)):
            raise self._held_up(timeout, doing)

    def _held_up(self, timeout: float, doing: str) -> ConduitTimeout:
        busy = self.doing(f"another thread is running a {self.name} invocation")
        return ConduitTimeout(f"timed out after {timeout:.3g}s waiting to {doing}: {busy}")

    @contextlib.contextmanager
    def _all_invocations(self, timeout: float, doing: str) -> Iterator[None]:
        """Hold every lane's invocation lock (taken within ``timeout`` in all): no inline invocation runs."""
        deadline = time.monotonic() + timeout
        with contextlib.ExitStack() as stack:
            for lock in self._invoke_locks:
                self._acquire(lock, deadline - time.monotonic(), doing)
                stack.callback(lock.release)
            yield

    @contextlib.contextmanager
    def paused(self, timeout: float | None = None) -> Iterator[None]:
        """No invocation runs inside this block (pushes still queue; staged batches can still be pulled).

        Re-entrant for the thread that holds it: a checkpoint taken inside
        :meth:`~conduit.Conduit.quiesced` captures the point the caller holds (an adapter reads its own
        bookkeeping there, beside the runtime's state).
        """
        if self._pauser == threading.get_ident():
            yield
            return
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._all_invocations(timeout, f"pause {self.name}"):  # no inline invocation starts
            with self.cond:
                self._paused = True  # the worker starts none either
                try:
                    wait_until(self.cond, lambda: not self._working, max(0.0, deadline - time.monotonic()),
                               self.failure, lambda: f"{self.name} to pause: " + self.doing("the worker is busy"))
                except BaseException:
                    self._paused = False
                    raise
            self._pauser = threading.get_ident()
            try:
                yield
            finally:
                with self.cond:
                    self._pauser = None
                    self._paused = False
                    self.cond.notify_all()

    def set_mode(self, mode: Mode, timeout: float | None = None) -> None:
        """Switch timing and granularity while running; callers waiting on the old mode are handed to the new one.

        Within ``timeout``: an inline invocation that does not finish by then (a hook that hangs) makes
        the switch raise ConduitTimeout with the mode unchanged.
        """
        if mode == self.mode:
            return
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self._before_switch(timeout)
        with self._all_invocations(deadline - time.monotonic(), f"switch {self.name} to {mode}"):
            with self.cond:  # no inline invocation of the old mode is in flight, and none starts
                old, self.worker = self.worker, None
                self._use_mode(mode)  # a retiring worker sees the new mode and claims nothing more
                self.cond.notify_all()
        if old is not None and not old.stop(max(0.0, deadline - time.monotonic())):
            log.warning(  # it has retired (the new mode is in place) and ends after its invocation
                "conduit: the %s worker of the old mode is still inside an invocation: %s", self.name,
                self.doing("busy"),
            )
        self.start()
        self._after_switch()

    def _before_switch(self, timeout: float) -> None:
        """What must happen under the old mode before a switch."""

    def _after_switch(self) -> None:
        """What the new mode picks up after a switch."""

    def activity(self) -> list[str]:
        """What each thread inside an invocation of this path is doing now (for timeouts and ``close``)."""
        return self.graph.activity()

    def doing(self, otherwise: str) -> str:
        """:meth:`activity` as one phrase for a message, or ``otherwise`` when no invocation is under way."""
        return "; ".join(self.graph.activity()) or otherwise

    def close(self, timeout: float) -> list[str]:
        """Stop the worker, waiting at most ``timeout``; returns what is left behind: every thread still inside
        an invocation (the worker, or a caller's inline one, which close never waits for)."""
        worker = self.worker
        stopped = worker.stop(timeout) if worker is not None else True
        left = self.activity()
        if not stopped and worker is not None and worker.thread.ident not in self.graph.running:
            left.append(f"the {self.name} worker thread {worker.thread.name!r} did not stop within {timeout:.3g}s")
        return left
