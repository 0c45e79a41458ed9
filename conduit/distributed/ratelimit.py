"""The samples-per-insert ratio over a sharded buffer: exact over the group, with no collective in ``push``.

One buffer's limiter (:class:`conduit.ratelimit.RateLimiter`) counts rows inserted
and rows sampled, and admits a push or a pull while the two stay in ratio. Over
ranks each count is known where it is made:

- **samples** are made only by collective pulls, from the request matrix every
  rank computes alike (:mod:`conduit.distributed.replay`): every rank counts the
  group's samples exactly, ``world · g · train_batch_size`` rows an exchange, when
  the exchange draws them (a batch drawn ahead counts at once, as one buffer's
  limiter reserves a prefetched batch's rows);
- **inserts** are made by ``push``, which never communicates. Every sync gathers
  each rank's admitted rows, so every rank then knows the group's inserts, and
  from them the rows the ratio still admits (:meth:`RateLimiter.insert_room`).
  Every rank shares that room out alike (:func:`allocate`): first whole units to
  the ranks with a push waiting (or refused) for room, longest waiting first, and
  none to anyone while the first of them does not fit (the room grows as learners
  sample, so it is served next); the rest evenly. Until the next sync each rank
  admits only its part, and while a sync is under way (between its state going
  out and the parts coming back) it admits nothing, so the ranks' pushes together
  never exceed the room: the ratio holds over the group exactly as on one buffer.

Rows are counted as pushed (before ingestion hooks), on the rank that pushed them,
wherever routing sends them. A pull waits for the inserts its draw needs (syncing,
so that waiting pushes get their parts), or with ``block=False`` raises
:class:`~conduit.errors.RateLimited` on every rank at once (they decide on the same
state). A unit larger than ``tolerance / samples_per_insert`` rows may never fit
the room once learners sample, so it is refused at once, saying so.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from conduit.config import RateLimit
from conduit.errors import ConduitTimeout, RateLimited, RuntimeClosed, SemanticsError
from conduit.ratelimit import NO_LIMIT, RateLimiter

__all__ = ["GroupRateLimit", "allocate"]

_POLL_S = 0.1  # how often a waiting push looks at the group's health
_REFUSED = "refused"  # the head's key when it is a refused push (its retry is another call)


def allocate(room: int, wants: Sequence[int], since: Sequence[int]) -> list[int]:
    """Each rank's part of ``room`` rows (pure: every rank computes it alike from the gathered state).

    ``wants[r]``: rows of rank ``r``'s push waiting for room (0: none), waiting since sync ``since[r]``. The
    longest waiting are served first, a whole unit each; where one does not fit, nobody gets more (the room
    is kept for it). What is left is split evenly.
    """
    world = len(wants)
    parts = [0] * world
    left = room
    for r in sorted((r for r in range(world) if wants[r] > 0), key=lambda r: (since[r], r)):
        if wants[r] > left:
            return parts
        parts[r] = int(wants[r])
        left -= int(wants[r])
    even = left // world
    return [p + even for p in parts]


class GroupRateLimit:
    """One rank's view of the group's ratio: the group's counts as of the last sync, this rank's pushes since.

    Args:
        rate: the config's ratio and band (``block``: wait, else raise :class:`RateLimited`).
        min_size: rows the group holds before any sample (``min_size_to_sample``).
        rank, world: this rank, and the ranks sharing the room.
        check: raises if the group failed (a waiting push gives up with the group's error).
        patience_s: how long a refused push (``block=False``) keeps its claim on room without a retry.
    """

    def __init__(self, rate: RateLimit, min_size: int, rank: int, world: int,
                 check: Callable[[], None] = lambda: None, patience_s: float = 60.0) -> None:
        assert rate.tolerance is not None  # (a min_diff/max_diff band is refused across ranks: options.validate)
        self.limiter = RateLimiter(min_size, rate.samples_per_insert, rate.tolerance)  # the group's counts
        self.patience_s = patience_s
        self.block = rate.block
        self.rank, self.world = rank, world
        self._check = check
        self._cond = threading.Condition()
        self._pushed = 0  # rows this rank admitted, ever
        self._base = 0  # ... as of the last sync
        self._part = self.limiter.insert_room() // world  # rows beyond _base: an even part (no push waits yet)
        self._syncs = 0  # syncs so far: the same count on every rank
        self._syncing = False
        self._waiting: dict[object, tuple[int, int]] = {}  # pushes waiting for room: (rows, since which sync)
        #: the last push refused at once (block=False), not yet retried: rows, since which sync, when refused
        self._refused: tuple[int, int, float] | None = None
        self._head: tuple[object, int] | None = None  # the push the last snapshot asked room for, and its rows
        self._closed = False

    @property
    def most_rows(self) -> int:
        """The largest unit that always fits, in time: the room the band leaves once learners sample down to
        its floor (from ``2·tolerance`` less one draw, at least ``tolerance``, in samples)."""
        assert self.limiter.samples_per_insert is not None
        if not math.isfinite(self.limiter.tolerance):
            return NO_LIMIT
        return int(self.limiter.tolerance / self.limiter.samples_per_insert)

    @property
    def pushed(self) -> int:
        with self._cond:
            return self._pushed

    # -- push side (an actor's thread) ---------------------------------------------------------
    def admit(self, rows: int, timeout: float) -> None:
        """Count ``rows`` as pushed by this rank once the ratio admits them (waits for a sync, or raises)."""
        if rows > self.most_rows:
            raise SemanticsError(
                f"a unit of {rows} rows may never fit the group's sample/insert ratio, which admits at most "
                f"{self.most_rows} rows at once once learners sample ({self.limiter.describe()}); push smaller "
                f"units or widen rate_limit.tolerance"
            )
        deadline = time.monotonic() + timeout
        token = object()
        with self._cond:
            try:
                while self._syncing or rows > self._room_for(token, rows):
                    if self._closed:
                        raise RuntimeClosed("the runtime closed while a push waited for the ratio")
                    if not self.block and not self._syncing:
                        old = self._refused
                        kept = old is not None and old[0] == rows  # a retry keeps its place in line
                        self._refused = (rows, old[1] if kept else self._syncs, time.monotonic())
                        raise RateLimited(f"push of {rows} rows would break the group's sample/insert ratio "
                                          f"({self._describe()}); syncs keep room for a retry within "
                                          f"{self.patience_s:.3g}s")
                    self._waiting.setdefault(token, (rows, self._syncs))
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ConduitTimeout(f"push of {rows} rows waited {timeout:.3g}s for learners to sample "
                                             f"({self._describe()})")
                    self._check()
                    self._cond.wait(min(left, _POLL_S))
                self._pushed += rows
                if self._is_head(token, rows):
                    self._head = None
                    if self._refused is not None and self._refused[0] == rows:
                        self._refused = None
            finally:
                self._waiting.pop(token, None)
                if self._head is not None and self._head[0] is token:
                    self._head = None  # it gave up: its rows are anyone's
                    self._cond.notify_all()

    def _is_head(self, token: object, rows: int) -> bool:
        """Whether this push is the one the last sync kept room for (a waiting push, or a refused one retried)."""
        head = self._head
        return head is not None and (head[0] is token or (head[0] == _REFUSED and head[1] == rows))

    def _room_for(self, token: object, rows: int) -> int:
        """Rows this push may take of the rank's part: all of it for the head, what the head leaves for others."""
        left = self._part - (self._pushed - self._base)
        if self._head is not None and not self._is_head(token, rows):
            left -= self._head[1]
        return left

    def give_back(self, rows: int) -> None:
        """A counted push failed before it inserted anything."""
        with self._cond:
            self._pushed -= rows
            self._cond.notify_all()

    def _describe(self) -> str:
        return (f"{self.limiter.describe()} over the group at the last sync; this rank pushed "
                f"{self._pushed - self._base} of its {self._part} rows since")

    # -- collectives (the learner's thread or its lane) -----------------------------------------
    def snapshot(self) -> tuple[int, int, int]:
        """This rank's admitted rows and its push longest in want of room (rows, waiting since which sync), for
        the sync's state vector. No push is admitted from here until :meth:`synced` (or :meth:`end_sync`)."""
        with self._cond:
            self._syncing = True
            if self._refused is not None and time.monotonic() - self._refused[2] > self.patience_s:
                self._refused = None  # never retried: it holds no room any longer
            wants: list[tuple[object, int, int]] = [(k, r, s) for k, (r, s) in self._waiting.items()]
            if self._refused is not None:
                wants.append((_REFUSED, self._refused[0], self._refused[1]))
            head = min(wants, key=lambda w: (w[2], -w[1]), default=None)
            self._head = (head[0], head[1]) if head is not None else None
            return self._pushed, head[1] if head else 0, head[2] if head else 0

    def synced(self, pushed: np.ndarray, wants: np.ndarray, since: np.ndarray) -> None:
        """The group's gathered snapshots: its inserts, and this rank's part of the room (its head's rows kept
        for it within the part, until it takes them or gives up)."""
        with self._cond:
            self.limiter.inserts = int(pushed.sum())
            self._part = allocate(self.limiter.insert_room(), wants.astype(int).tolist(),
                                  since.astype(int).tolist())[self.rank]
            self._base = self._pushed
            self._syncs += 1
            self._syncing = False
            self._cond.notify_all()

    def end_sync(self) -> None:
        """The sync ended, whether or not it reached :meth:`synced` (a failed collective)."""
        with self._cond:
            if self._syncing:
                self._syncing = False
                self._cond.notify_all()

    def can_draw(self, rows: int, size: int) -> bool:
        """Whether the group may sample ``rows`` more (every rank decides alike on the same sync)."""
        return self.limiter.can_sample(rows, size)

    def drew(self, rows: int) -> None:
        """The group sampled ``rows`` (an exchange); the room grows at the next sync."""
        self.limiter.sampled(rows)

    def refused(self, rows: int, size: int) -> RateLimited:
        return RateLimited(f"a draw of {rows} rows over {size} would break the group's sample/insert ratio "
                           f"({self.limiter.describe()})")

    # -- checkpoints and lifecycle ---------------------------------------------------------------
    def restored(self, inserts: int, mine: int, samples: int) -> None:
        """Continue a checkpoint's counts: the group's ``inserts`` and ``samples``, ``mine`` of the inserts
        counted on this rank (all on one), and the room shared out afresh."""
        with self._cond:
            self._pushed += mine
            self._base = self._pushed
            self.limiter.inserts, self.limiter.samples = inserts, samples
            self._part = self.limiter.insert_room() // self.world  # an even part: no push waits on a fresh rank
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
