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
  a rank whose process is gone is named as dead;
* every surviving rank then marks itself alive in a small ``TCPStore`` of our
  own (hosted by rank 0) and waits, briefly and bounded, for the others' marks:
  a rank that leaves no mark is named as stalled or unreachable. Where the store
  itself is gone, rank 0 (its host) is named.

The first failure is latched: every later call on any runtime using this group
raises the same error (the process groups are unusable after a failed
collective).

**Collectives started ahead.** :meth:`RankGroup.ahead` runs a function that
calls this group's collectives (an overlapped exchange) on the group's lane
(:class:`conduit.executor.Lane`), while the caller goes on; every collective the
caller starts afterwards, through any method here, first waits for it. So the
collectives of every rank keep the program's order, whoever calls them.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from conduit.errors import ConduitTimeout, RuntimeClosed, RuntimeFailed
from conduit.executor import FailureBox, Lane, process_alive

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
        self.failure = FailureBox()
        self._lane: Lane | None = None
        self._ahead: tuple[Future[Any], float] | None = None  # the call started ahead, and its deadline
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

    # -- collectives started ahead ---------------------------------------------------------
    def ahead(self, fn: Callable[..., T], *args: Any, bound_s: float) -> Future[T]:
        """Start ``fn(*args)`` (which runs this group's collectives) on the group's lane; the caller's next
        collective waits for it first. ``bound_s``: the longest it can take (its collectives are bounded)."""
        if self._lane is None:
            self._lane = Lane(f"rank{self.rank}-collectives")
        future = self._lane.submit(fn, *args)
        self._ahead = (future, time.monotonic() + bound_s)
        return future

    @property
    def on_lane(self) -> bool:
        """Whether the calling thread is the lane's (a call started ahead)."""
        return self._lane is not None and self._lane.current

    def settle(self) -> None:
        """Wait until the call started ahead, if any, has ended (its outcome is its owner's to read)."""
        if self._ahead is None or self.on_lane:
            return
        future, deadline = self._ahead
        try:
            future.exception(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            raise ConduitTimeout(f"rank {self.rank}: a collective started ahead did not end in its bound") from None
        self._ahead = None

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
        """Raise the group's latched failure, if any."""
        self.failure.check()

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

    def _diagnose(self, what: str, exc: BaseException) -> RankFailed:
        """Which ranks are dead or stalled (see the module docstring); bounded by a short window."""
        self.epoch += 1
        me = socket.gethostname()
        dead = [r for r, p in enumerate(self.peers) if r != self.rank and p and p["host"] == me
                and not process_alive(int(p["pid"]))]
        silent: list[int] = []
        store_down = False
        window = min(1.0, max(0.1, 0.25 * self.timeout))
        if self._store is not None:
            key = f"conduit/fail/{self.epoch}/"
            try:
                self._store.set(f"{key}{self.rank}", "1")
                deadline = time.monotonic() + window
                keys = [f"{key}{r}" for r in range(self.world) if r not in dead]
                while time.monotonic() < deadline and not self._store.check(keys):
                    time.sleep(0.02)
                silent = [r for r in range(self.world) if r not in dead and not self._store.check([f"{key}{r}"])]
            except Exception:  # the store's host (rank 0) is gone
                store_down = True
        parts = []
        if dead:
            parts.append(f"rank(s) {dead} died (process gone)")
        if silent:
            parts.append(f"rank(s) {silent} did not answer within {self.timeout + window:.3g}s (stalled or lost)")
        if store_down and 0 not in dead:
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
        """End the lane after its call in flight, drop the store connection and this object's references to its
        process groups: from here they belong to torch.distributed alone (``destroy_process_group`` frees them, in
        the caller's thread), never to an object that a reference cycle keeps until the interpreter's last
        collection, when freeing a gloo group aborts the process."""
        if self._lane is not None:
            self._lane.close()
        self._store = None
        self.closed = True
        self.meta = self.rows = None  # type: ignore[assignment]


def _multi_host() -> bool:
    return os.environ.get("CONDUIT_MULTI_HOST", "0") == "1" or bool(os.environ.get("MASTER_ADDR", "").strip()
                                                                    not in ("", "127.0.0.1", "localhost"))


def _host_addr() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
