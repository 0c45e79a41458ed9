"""The ranks of a distributed Conduit and every collective they run, each one bounded and failure-aware.

All data moves through ``torch.distributed``: gloo for metadata (and for rows on
CPU), NCCL for rows where the learners' group is NCCL. No transport of our own.

:class:`RankGroup` builds its own process groups over the caller's ranks
(``new_group``), with the runtime's timeout, so no collective here waits longer
than ``timeout`` whatever timeout the caller's default group was made with.
A rank that dies (``kill -9``) breaks gloo's connections at once; a rank that
stalls leaves the others waiting until the timeout. Either way the failing
collective raises, and :class:`RankGroup` then finds out *which* rank failed
before raising :class:`RankFailed`:

* ranks on this host are checked by process id (registered at construction):
  a rank whose process is gone is named as dead (checked again after the
  window: a process just killed may break its connections before it is gone),
  one whose process is stopped (SIGSTOP, a debugger) as stalled;
* every surviving rank then marks itself alive in a small ``TCPStore`` of our
  own (hosted by rank 0) and waits, briefly and bounded, for the others' marks:
  a rank that leaves no mark is named as stalled or unreachable. Where the store
  itself is gone or does not answer (rank 0 stalled), rank 0 (its host) is named,
  unless its mark was seen (it closed its store once its own diagnosis ended).

**The bound.** A call waiting on a collective that a dead or stalled rank never
joins raises :class:`RankFailed` at most :attr:`RankGroup.failure_bound_s` after
that collective began: ``timeout_s`` (the collective's own timeout; a dead rank
on this host usually breaks it at once) plus the diagnosis window,
``min(1 s, max(0.1 s, timeout_s / 4))`` (3.75 s at ``timeout_s=3``), whichever
rank stalled, rank 0 included. No store request waits past its bound: a store
whose host stopped answering never returns a request (the client's own timeout
does not cover it), so every request runs on a thread of its own and is given up
on at its bound (:meth:`RankGroup.propose`, the diagnosis).

The first failure is latched: every later call on any runtime using this group
raises the same error (the process groups are unusable after a failed
collective).

**Collectives started ahead.** An overlapped exchange calls this group's collectives
on the delivery path's worker (:class:`conduit.distributed.replay.GroupDelivery`) while
the caller goes on; every collective the caller starts afterwards, through any method
here, first waits until no such exchange is queued or running (:attr:`RankGroup.before_call`).
So the collectives of every rank keep the program's order, whoever calls them.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from conduit.errors import ConduitTimeout, RuntimeClosed, RuntimeFailed
from conduit.executor import FailureBox, process_alive

__all__ = ["RankFailed", "RankGroup"]

log = logging.getLogger("conduit")

T = TypeVar("T")


class RankFailed(RuntimeFailed):
    """A collective failed because other ranks died or stalled; :attr:`ranks` names them (group ranks)."""

    def __init__(self, where: str, original: BaseException, ranks: Sequence[int], detail: str) -> None:
        self.ranks = tuple(ranks)
        self.detail = detail
        super().__init__(f"{where}: {detail}", original)


class RankGroup:
    """The ranks of one distributed Conduit: its process groups, its liveness registry, its collectives.

    Args:
        timeout: bound of every collective, in seconds.
        group: the caller's process group (default: the world); its ranks are this group's.
        rows_backend: the backend rows move on (``None``: the caller group's, gloo on CPU).
    """

    def __init__(self, timeout: float, group: dist.ProcessGroup | None = None, rows_backend: str | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "conduit.distributed needs an initialized torch.distributed process group "
                "(torch.distributed.init_process_group, torchrun, or conduit.distributed.launch)"
            )
        self.timeout = float(timeout)
        #: the longest a failure diagnosis waits for the ranks' marks (module docstring)
        self.window = min(1.0, max(0.1, 0.25 * self.timeout))
        #: the longest a call waits on a collective a dead or stalled rank never joins before it raises RankFailed
        self.failure_bound_s = self.timeout + self.window
        self.failure = FailureBox()
        #: what must end before a collective of the calling thread (set by the runtime: its delivery path's quiesce)
        self.before_call: Callable[[], None] | None = None
        self.closed = False
        ranks = None if group is None else dist.get_process_group_ranks(group)
        td = datetime.timedelta(seconds=self.timeout)
        backend = "nccl" if "nccl" in str(rows_backend or dist.get_backend(group)) else "gloo"
        #: metadata (counts, stats, small payloads): always gloo on host tensors
        self.meta = dist.new_group(ranks=ranks, backend="gloo", timeout=td)
        #: rows: the caller's backend (NCCL where learners run on GPUs), else the metadata group
        self.rows = self.meta if backend == "gloo" else dist.new_group(ranks=ranks, backend=backend, timeout=td)
        self.rows_backend = backend
        self.rank = dist.get_rank(self.meta)
        self.world = dist.get_world_size(self.meta)
        #: the device rows travel on (NCCL: this rank's GPU)
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        store_port = 0
        self._store: dist.TCPStore | None = None
        if self.rank == 0:
            self._store = dist.TCPStore("0.0.0.0" if _multi_host() else "127.0.0.1", 0, None, True,
                                        timeout=td, wait_for_workers=False)
            store_port = self._store.port
        me = {"pid": os.getpid(), "host": socket.gethostname(), "addr": _host_addr(), "port": store_port}
        peers: list[Any] = [None] * self.world
        self._call("registering the ranks", lambda: dist.all_gather_object(peers, me, group=self.meta))
        self.peers: list[dict[str, Any]] = peers
        if self.rank != 0:
            host = "127.0.0.1" if peers[0]["host"] == me["host"] else peers[0]["addr"]
            self._store = dist.TCPStore(host, int(peers[0]["port"]), None, False, timeout=td)
        self.epoch = 0  # failure diagnoses of this group

    @property
    def local_ranks(self) -> int:
        """Ranks of this group on this rank's host (this one included)."""
        me = self.peers[self.rank]["host"]
        return sum(1 for p in self.peers if p and p["host"] == me)

    # -- what runs before a collective ---------------------------------------------------
    def settle(self) -> None:
        """Wait for what must end before this thread's collective (:attr:`before_call`: the delivery path's queued
        exchange, whose collectives come first on every rank)."""
        if self.before_call is not None:
            self.before_call()

    # -- the collectives ---------------------------------------------------------------
    def gather(self, vec: torch.Tensor, what: str) -> torch.Tensor:
        """``all_gather`` of a small host vector: a ``[world, len]`` tensor."""
        out = [torch.empty_like(vec) for _ in range(self.world)]
        meta = self.meta  # read now: close() may clear it while a call started ahead still runs
        self._call(what, lambda: dist.all_gather(out, vec, group=meta))
        return torch.stack(out)

    def exchange(self, send: torch.Tensor, send_sizes: Sequence[int], recv_sizes: Sequence[int], what: str,
                 *, rows: bool = True) -> torch.Tensor:
        """``all_to_all_single`` of a flat byte tensor: ``send_sizes[r]`` bytes to rank ``r``, ``recv_sizes[r]``
        from it (both known to every side beforehand). ``rows``: on the rows group (else the metadata one)."""
        group = self.rows if rows else self.meta
        dev = self.device if rows else torch.device("cpu")
        out = torch.empty(int(sum(recv_sizes)), dtype=torch.uint8, device=dev)
        src = send if send.device == dev else send.to(dev)
        self._call(what, lambda: dist.all_to_all_single(out, src, list(recv_sizes), list(send_sizes), group=group))
        return out

    def gather_object(self, obj: Any, what: str) -> list[Any]:
        out: list[Any] = [None] * self.world
        meta = self.meta
        self._call(what, lambda: dist.all_gather_object(out, obj, group=meta))
        return out

    def barrier(self, what: str) -> None:
        self.gather(torch.zeros(1), what)

    # -- failure ---------------------------------------------------------------------
    def check(self) -> None:
        """Raise the group's latched failure, if any, else ``RuntimeClosed`` once this rank closed: a call that
        would queue work for later collectives (a routed push, a priority update) is refused, as one process
        refuses it."""
        self.failure.check()
        if self.closed:
            raise RuntimeClosed(f"rank {self.rank}: the rank group is closed")

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        if self.closed:
            raise RuntimeClosed(f"rank {self.rank}: {what}: the rank group is closed")
        self.settle()
        self.failure.check()
        try:
            return fn()
        except Exception as e:  # gloo/NCCL errors are RuntimeError (DistBackendError, DistNetworkError...)
            err = self._diagnose(what, e)
            self.failure.set(what, err)
            raise err from e

    # -- the group's store (never a collective) ------------------------------------------------------
    def propose(self, key: str, value: str) -> str:
        """The group's value of ``key``: ``value`` if no rank set it before, else what the first one set (one
        request to the store, bounded by ``timeout``; a store that does not answer fails the group, naming
        rank 0). Used by a rank's first push to agree on the experience spec without a collective."""
        self.failure.check()
        store = self._store
        if self.closed or store is None:
            raise RuntimeClosed(f"rank {self.rank}: the rank group is closed")
        what = f"agreeing on {key!r} through the group's store"
        try:
            answer = _bounded(lambda: store.compare_set(f"conduit/agree/{key}", "", value), self.timeout)
        except Exception as e:
            err = self._diagnose(what, e)
            self.failure.set(what, err)
            raise err from e
        return answer.decode() if isinstance(answer, bytes) else str(answer)

    def _marks(self, key: str, ranks: list[int], meanwhile: Callable[[], None]) -> tuple[set[int], bool, bool]:
        """Leave this rank's mark under ``key`` and wait, at most the window, for ``ranks``' marks (running
        ``meanwhile`` a fifth of the way in): the ranks whose marks were seen, whether the store answered at all,
        and whether it failed (a request raised, or did not return in time: rank 0, its host, is gone, stalled,
        or closed it once its own diagnosis ended)."""
        store = self._store
        seen: set[int] = set()
        answered = [False]
        start = time.monotonic()
        if store is None:
            meanwhile()
            return seen, False, True
        stop = threading.Event()
        deadline = start + 0.8 * self.window

        def probe() -> None:
            store.set(f"{key}{self.rank}", "1")
            while not stop.is_set():
                for r in ranks:
                    if r not in seen and store.check([f"{key}{r}"]):
                        seen.add(r)
                    answered[0] = True
                if seen.issuperset(ranks) or time.monotonic() > deadline:
                    return
                time.sleep(0.02)

        request = _Request(probe)
        request.thread.join(0.2 * self.window)
        meanwhile()
        try:
            request.result(start + self.window, stop)
        except Exception:
            return seen, answered[0], True
        return seen, answered[0], False

    def _diagnose(self, what: str, exc: BaseException) -> RankFailed:
        """Which ranks are dead or stalled (see the module docstring); bounded by the window."""
        self.epoch += 1
        me = socket.gethostname()
        here = [r for r, p in enumerate(self.peers) if r != self.rank and p and p["host"] == me]
        gone = [r for r in here if not process_alive(int(self.peers[r]["pid"]))]
        dead: list[int] = []

        def look_again() -> None:  # a process killed just now may break its connections a moment before it is
            # gone; later, a rank may have ended after its own diagnosis: that is no death to name
            dead.extend(r for r in here if r in gone or not process_alive(int(self.peers[r]["pid"])))

        seen, answered, store_down = self._marks(f"conduit/fail/{self.epoch}/",
                                                 [r for r in range(self.world) if r not in gone], look_again)
        dead = [r for r in dead if r in gone or r not in seen]
        stopped = [r for r in here if r not in dead and _stopped(int(self.peers[r]["pid"]))]
        # marks not seen say something only where the store answered (if it failed after, what was seen stands)
        silent = sorted({r for r in range(self.world) if answered and r not in seen and r not in dead
                         and r != self.rank} | set(stopped))
        parts = []
        if dead:
            parts.append(f"rank(s) {dead} died (process gone)")
        if silent:
            parts.append(f"rank(s) {silent} did not answer within {self.failure_bound_s:.3g}s (stalled or lost)")
        if store_down and self.rank != 0 and 0 not in dead and 0 not in seen:
            parts.append("rank 0 is unreachable (it hosts the group's store)")
            silent.append(0)
        if not parts:
            parts.append("no rank was found dead or stalled (the collective itself failed)")
        named = sorted(set(dead) | set(silent))
        detail = (f"collective '{what}' failed on rank {self.rank} of {self.world}: " + "; ".join(parts)
                  + f" [{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}]")
        log.error("conduit.distributed: %s", detail)
        return RankFailed(f"rank {self.rank}", exc, named, detail)

    def close(self) -> None:
        """Drop the store connection and this object's references to its
        process groups: from here they belong to torch.distributed alone (``destroy_process_group`` frees them, in
        the caller's thread), never to an object that a reference cycle keeps until the interpreter's last
        collection, when freeing a gloo group aborts the process."""
        if self.rank == 0 and self._store is not None:
            # rank 0 hosts the group's store, and close is not collective: a peer may still be finishing a request
            # (the spec agreement of its last push) after this rank closed. The server outlives the group, so that
            # request is answered rather than cut; the most recent few are kept, older ones go.
            _HOSTED.append(self._store)
            del _HOSTED[:-_KEEP_HOSTED]
        self._store = None
        self.closed = True
        self.meta = self.rows = None  # type: ignore[assignment]


#: store servers of closed groups this process hosted, kept for peers still finishing a request (newest last)
_HOSTED: list[dist.TCPStore] = []
_KEEP_HOSTED = 16


class _Request:
    """``fn()`` (a store request) on a thread of its own, so that the caller can give up on it: a request the
    store never answers (its host stopped) leaves its daemon thread blocked until the connection breaks; the
    group has failed by then, and makes no further request."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.out: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, args=(fn,), name="rank-store-request", daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.out["value"] = fn()
        except BaseException as e:  # handed to the caller
            self.out["error"] = e

    def result(self, deadline: float, stop: threading.Event | None = None) -> Any:
        """What ``fn`` returned by ``deadline`` (monotonic), or raised; ``ConduitTimeout`` if it had not ended.
        ``stop`` is set a moment before the deadline, for a polling ``fn`` to end between two requests."""
        grace = min(0.1, 0.2 * max(0.0, deadline - time.monotonic())) if stop is not None else 0.0
        self.thread.join(max(0.0, deadline - grace - time.monotonic()))
        if stop is not None:
            stop.set()
            self.thread.join(max(0.0, deadline - time.monotonic()))
        if "error" in self.out:
            raise self.out["error"]
        if self.thread.is_alive() or "value" not in self.out:
            raise ConduitTimeout("the group's store did not answer in time")
        return self.out["value"]


def _bounded(fn: Callable[[], T], seconds: float) -> T:
    """``fn()`` (a store request), given up on after ``seconds`` (:class:`_Request`)."""
    return _Request(fn).result(time.monotonic() + seconds)  # type: ignore[no-any-return]


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` of this host is stopped (SIGSTOP, a debugger): stalled, whatever its store says."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):  # gone, or no procfs
        return False


def _multi_host() -> bool:
    return os.environ.get("CONDUIT_MULTI_HOST", "0") == "1" or bool(os.environ.get("MASTER_ADDR", "").strip()
                                                                    not in ("", "127.0.0.1", "localhost"))


def _host_addr() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
