"""The one place for threads and CUDA streams.

- :class:`FailureBox` keeps the first failure of any operator, hook or worker,
  with its traceback, so every later push/pull re-raises it (as a value sent
  back, the torchdata ``_populate_queue`` pattern).
- :class:`Worker` is the background loop every path uses: it calls a step
  function until stopped; the step waits on the path's condition with a timeout
  (no wait is unbounded); an exception is captured in the failure box and the
  loop ends. ``stop()`` joins with a timeout and reports a thread that would not
  stop instead of hanging. Each worker runs its torch ops with an OpenMP team of
  one (its own setting; the learner's threads keep theirs), so a worker never
  oversubscribes the cores next to the learner (:func:`serial_kernels`).
- :class:`StreamSet` gives each path a dedicated CUDA stream on a device, the
  events for hand-off, and ``record_stream`` so the caching allocator never
  reuses memory another stream still reads. Without CUDA everything here is a
  no-op and paths run on plain threads.
- :func:`wait_until` is the bounded condition wait used by push, pull and flush.
- :class:`Lane` runs calls one at a time, in the order submitted, on one daemon
  thread, each call's result or exception handed back as a
  :class:`concurrent.futures.Future`: a rank's collectives run on one lane so that
  a collective started ahead (an overlapped exchange) and the caller's next one
  keep the program's order on every rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any, NoReturn

import torch

from conduit.errors import ConduitTimeout, RuntimeClosed, RuntimeFailed, classify

__all__ = [
    "FailureBox",
    "Lane",
    "StreamOrder",
    "StreamSet",
    "Worker",
    "fail",
    "handoff",
    "in_worker",
    "one_intra_op_thread",
    "process_alive",
    "serial_kernels",
    "wait_until",
]

log = logging.getLogger("conduit")

#: How long a worker waits on its condition before re-checking stop flags.
POLL_S = 0.05

_local = threading.local()


def in_worker() -> bool:
    """Whether the calling thread is a Conduit worker."""
    return getattr(_local, "worker", False)


def serial_kernels() -> bool:
    """Whether host tensor kernels on this thread must be kept under ATen's parallel grain by the caller.

    ATen parallelises a CPU op above its grain with an OpenMP team, and a second
    team started from a worker thread while the learner's thread runs its own
    oversubscribes the cores: both teams spin-wait for threads the other holds,
    so the learner's ops and the worker's gathers each slow the other down. A
    worker therefore limits its own OpenMP team to itself
    (:func:`one_intra_op_thread`), which covers every op it runs, hooks
    included. Where that cannot be done (another OpenMP runtime, another ATen
    backend) this is True and storage kernels chunk their calls under the grain
    instead, which makes large gathers slower (many serial calls in place of one
    parallel one).
    """
    return getattr(_local, "serial", False)


def one_intra_op_thread(threads: int = 1) -> bool:
    """Give the calling thread an OpenMP team of one (or of ``threads``); True when ATen confirms it.

    ``omp_set_num_threads`` sets the calling thread's own ICV. Not
    ``torch.set_num_threads(1)``: besides that ICV it stores a process-wide
    default which every thread that has not yet asked for its count -- the
    learner's main thread included -- then inherits (a main thread that has run
    no parallel op yet reads 1 after a worker has called it).
    """
    torch.get_num_threads()  # ATen sets a thread's team from its process-wide default on first use: let it go first
    try:
        ctypes.CDLL(None).omp_set_num_threads(threads)
    except Exception:  # no OpenMP symbol in the process (or no dlopen(NULL)): the caller chunks instead
        return False
    return torch.get_num_threads() == threads


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:  # no procfs: the signal check is all there is
        return True


class FailureBox:
    """The first failure of the runtime; thread-safe, set once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._error: RuntimeFailed | None = None
        self.closed = False

    def set(self, where: str, exc: BaseException) -> RuntimeFailed:
        with self._lock:
            if self._error is None:
                tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                self._error = classify(where, exc, tb)
                first = (str(exc).strip().splitlines() or [""])[0]
                log.error(
                    "conduit: %s failed with %s: %s (re-raised, with its traceback, from the next call)",
                    where, type(exc).__name__, first,
                )
            return self._error

    @property
    def error(self) -> RuntimeFailed | None:
        return self._error

    def check(self) -> None:
        """Raise the recorded failure, or RuntimeClosed after close()."""
        err = self._error
        if err is not None:
            raise err
        if self.closed:
            raise RuntimeClosed("the Conduit runtime is closed")


def fail(failure: FailureBox, where: str, exc: BaseException) -> NoReturn:
    """Record ``exc`` as the runtime's failure and raise it (typed, original traceback attached).

    An invocation that outlived ``close()`` (a hook that hung past its timeout) does not fail the
    closed runtime: it ends with :class:`RuntimeClosed` in its own thread.
    """
    if failure.closed and failure.error is None:
        raise RuntimeClosed(f"the Conduit runtime was closed while this {where} ran") from exc
    err = failure.set(where, exc)
    if err is exc:
        raise err
    raise err from exc


def wait_until(
    cond: threading.Condition,
    predicate: Callable[[], bool],
    timeout: float,
    failure: FailureBox,
    what: Callable[[], str],
) -> None:
    """Wait (holding ``cond``) until ``predicate()``; bounded, failure-aware.

    Raises the runtime's failure as soon as it is recorded, and
    :class:`ConduitTimeout` with ``what()`` in the message after ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        failure.check()
        left = deadline - time.monotonic()
        if left <= 0:
            raise ConduitTimeout(f"timed out after {timeout:.3g}s waiting for {what()}")
        cond.wait(min(left, POLL_S))
    failure.check()


class Worker:
    """A daemon thread that runs ``step()`` until stopped or failed.

    ``step`` does one unit of work or waits briefly (bounded) for some; it must
    return promptly once ``stopping`` is set.
    """

    def __init__(self, name: str, step: Callable[[], None], failure: FailureBox, wake: threading.Condition) -> None:
        self.name = name
        self._step = step
        self._failure = failure
        self._wake = wake
        self.stopping = threading.Event()
        self.nice = int(os.environ.get("CONDUIT_WORKER_NICE", "0"))
        self._thread = threading.Thread(target=self._run, name=f"conduit-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def _run(self) -> None:
        _local.worker = True
        _local.serial = not one_intra_op_thread()
        if self.nice:
            try:  # Linux: a thread's nice value is its own
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except (AttributeError, OSError, PermissionError):
                pass
        try:
            while not self.stopping.is_set() and self._failure.error is None:
                # before each turn, hand the interpreter to a thread waiting for it: a turn mostly starts because a
                # learner's pull woke the worker, and that learner, which lets the interpreter go for a moment
                # whenever it frees a batch's tensors, must not then wait out the worker's Python (BENCHMARKS.md, SRL)
                time.sleep(0)
                self._step()
        except BaseException as exc:
            if not (isinstance(exc, RuntimeClosed) and self._failure.closed):  # an invocation that outlived close()
                self._failure.set(f"{self.name} worker", exc)
        finally:
            with self._wake:
                self._wake.notify_all()

    def stop(self, timeout: float) -> bool:
        """Ask the loop to end and join it; True when the thread is gone."""
        self.stopping.set()
        with self._wake:
            self._wake.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()


class Lane:
    """One daemon thread that runs submitted calls one at a time, in submission order (a Conduit worker: torch
    ops on it keep to one OpenMP thread where :func:`serial_kernels` says so, or to ``threads``: a framework's own
    logic run on a lane keeps its caller's team, so its reductions give the caller's bits).

    A daemon, unlike :class:`concurrent.futures.ThreadPoolExecutor`'s threads, so that a call blocked in a
    collective whose peers are gone (it ends at its own timeout) never holds up the interpreter's exit.
    """

    def __init__(self, name: str, threads: int = 1) -> None:
        self._threads = threads
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"conduit-{name}", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` on the lane after every call submitted before it (refused once closed)."""
        if self._closed:
            raise RuntimeClosed(f"{self._thread.name}: the lane is closed")
        future: Future[Any] = Future()
        self._calls.put((future, fn, args))
        return future

    @property
    def current(self) -> bool:
        """Whether the calling thread is this lane's."""
        return threading.current_thread() is self._thread

    def _run(self) -> None:
        _local.worker = True
        limited = one_intra_op_thread(self._threads)
        _local.serial = not limited and self._threads == 1
        while (item := self._calls.get()) is not None:
            future, fn, args = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:
                    future.set_exception(exc)
            # an idle lane holds nothing: what the call reached (a process group, say) is freed by its owner's
            # thread, never by this one while the interpreter shuts down
            del item, future, fn, args

    def close(self, timeout: float = 5.0) -> bool:
        """End the thread after the calls already submitted and join it (bounded); True when it is gone."""
        self._closed = True
        self._calls.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()


class StreamSet:
    """A dedicated CUDA stream for one path on one device (no-op on CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        if self.stream is None:
            yield
        else:
            with torch.cuda.stream(self.stream):
                yield

    def record(self) -> torch.cuda.Event | None:
        """An event marking everything queued on this stream so far."""
        if self.stream is None:
            return None
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev

    def wait(self, event: torch.cuda.Event | None) -> None:
        """Make this stream wait for ``event`` (recorded on another stream)."""
        if self.stream is not None and event is not None:
            self.stream.wait_event(event)


def handoff(tensors: Mapping[str, torch.Tensor], event: torch.cuda.Event | None) -> None:
    """Hand tensors produced on a side stream to the caller's current stream.

    The caller's stream waits on ``event`` (no host sync), and each CUDA tensor
    is recorded on it so the caching allocator keeps its memory until the
    caller's work on it is done.
    """
    if event is None:
        return
    consumers: dict[torch.device, torch.cuda.Stream] = {}
    for t in tensors.values():
        if t.device.type != "cuda":
            continue
        stream = consumers.get(t.device)
        if stream is None:
            stream = torch.cuda.current_stream(t.device)
            stream.wait_event(event)
            consumers[t.device] = stream
        t.record_stream(stream)


def mark_producers(tensors: Mapping[str, torch.Tensor]) -> dict[torch.device, torch.cuda.Event] | None:
    """Events marking the caller's current stream, now, on each CUDA device ``tensors`` live on (None on host).

    A unit pushed from CUDA memory may still be being written by kernels the
    actor queued on its stream; the worker that ingests it later, on its own
    stream, waits for these events first (:func:`adopt`).
    """
    events: dict[torch.device, torch.cuda.Event] | None = None
    for t in tensors.values():
        if t.is_cuda and (events is None or t.device not in events):
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(t.device))
            if events is None:
                events = {}
            events[t.device] = ev
    return events


def adopt(tensors: Mapping[str, torch.Tensor], events: dict[torch.device, torch.cuda.Event] | None) -> None:
    """Take tensors another thread produced: wait for their producers, keep their memory for this stream.

    The current stream waits for ``events`` (from :func:`mark_producers`; no
    host sync), and each CUDA tensor is recorded on it, so the caching
    allocator does not hand the memory out again — once the producer drops its
    last reference — before this stream's reads of it are done.
    """
    if not events:
        return
    for device, ev in events.items():
        torch.cuda.current_stream(device).wait_event(ev)
    for t in tensors.values():
        if t.is_cuda:
            t.record_stream(torch.cuda.current_stream(t.device))


class StreamOrder:
    """Orders writes and reads of one storage across streams, on each CUDA device it spans.

    Writers (ingestion stream) and readers (delivery stream, or the caller's
    stream inline) run on different streams; before a read the current stream
    waits for the last write of every other stream (RAW), and before a write for
    the last read of every other stream (WAR: a gather still reading a slot the
    ring is about to overwrite). Call under the buffer's lock. A no-op for host
    storage.
    """

    def __init__(self, devices: torch.device | Iterable[torch.device]) -> None:
        devs = [devices] if isinstance(devices, torch.device) else list(devices)
        self.devices = list(dict.fromkeys(d for d in devs if d.type == "cuda"))
        self.enabled = bool(self.devices)
        self._writes: dict[tuple[torch.device, int], torch.cuda.Event] = {}
        self._reads: dict[tuple[torch.device, int], torch.cuda.Event] = {}

    def _mark(self, into: dict[tuple[torch.device, int], torch.cuda.Event]) -> None:
        for device in self.devices:
            stream = torch.cuda.current_stream(device)
            ev = torch.cuda.Event()
            ev.record(stream)
            into[(device, stream.cuda_stream)] = ev

    def _wait(self, events: dict[tuple[torch.device, int], torch.cuda.Event]) -> None:
        for device in self.devices:
            stream = torch.cuda.current_stream(device)
            for (dev, sid), ev in events.items():
                if dev == device and sid != stream.cuda_stream:
                    stream.wait_event(ev)

    def before_write(self) -> None:
        if self.enabled:
            self._wait(self._reads)

    def after_write(self) -> None:
        if self.enabled:
            self._mark(self._writes)

    def before_read(self) -> None:
        if self.enabled:
            self._wait(self._writes)

    def after_read(self) -> None:
        if self.enabled:
            self._mark(self._reads)
