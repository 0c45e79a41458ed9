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
  Those are split evenly: until the next collective each rank may push its
  ``1/world`` of them. The ranks' pushes together never exceed the room, so the
  ratio holds over the group exactly as on one buffer; the price is that a rank
  whose actors push faster than the others' waits for the learners' next pull
  (the next sync), where one buffer would have let it use the others' part.

Rows are counted as pushed (before ingestion hooks), on the rank that pushed them,
wherever routing sends them. A pull waits for the inserts its draw needs (syncing,
so that waiting pushes see fresh room), or with ``block=False`` raises
:class:`~conduit.errors.RateLimited` on every rank at once (they decide on the same
state). A unit larger than any rank's part of the largest room the band allows
could never be admitted, so it is refused at once, saying so.
"""

from __future__ import annotations

import math
import threading
import time

from conduit.config import RateLimit
from conduit.errors import ConduitTimeout, ConfigError, RateLimited, RuntimeClosed
from conduit.ratelimit import RateLimiter

__all__ = ["GroupRateLimit"]


class GroupRateLimit:
    """One rank's view of the group's ratio: the group's counts as of the last sync, this rank's pushes since.

    Args:
        rate: the config's ratio and band (``block``: wait, else raise :class:`RateLimited`).
        min_size: rows the group holds before any sample (``min_size_to_sample``).
        world: ranks sharing the room between collectives.
    """

    def __init__(self, rate: RateLimit, min_size: int, world: int) -> None:
        self.limiter = RateLimiter(min_size, rate.samples_per_insert, rate.tolerance)  # the group's counts
        self.block = rate.block
        self.world = world
        self._cond = threading.Condition()
        self._pushed = 0  # rows this rank admitted, ever
        self._base = 0  # ... when its count went into the last sync
        self._part = self._share(self.limiter.insert_room())  # rows it may admit beyond _base
        self._closed = False

    def _share(self, room: float) -> int:
        return math.floor(room / self.world) if math.isfinite(room) else 1 << 62

    @property
    def most_per_rank(self) -> int:
        """The largest part of the room a rank can ever get: the band's whole width (``2 · tolerance`` of
        samples), or the rows before ``min_size`` and the band's upper half, whichever is more."""
        spi, tol = self.limiter.samples_per_insert, self.limiter.tolerance
        assert spi is not None
        return self._share(max(2 * tol / spi, self.limiter.min_size + tol / spi))

    # -- push side (an actor's thread) ---------------------------------------------------------
    def admit(self, rows: int, timeout: float) -> None:
        """Count ``rows`` as pushed by this rank once the ratio admits them (waits for a sync, or raises)."""
        if rows > self.most_per_rank:
            raise ConfigError(
                f"a unit of {rows} rows can never be admitted: the ratio lets each of {self.world} ranks insert at "
                f"most {self.most_per_rank} rows between collectives ({self.limiter.describe()}); push smaller "
                f"units or widen rate_limit.tolerance"
            )
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pushed + rows - self._base > self._part:
                if self._closed:
                    raise RuntimeClosed("the runtime closed while a push waited for the ratio")
                if not self.block:
                    raise RateLimited(f"push of {rows} rows would break the group's sample/insert ratio "
                                      f"({self._describe()})")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ConduitTimeout(f"push of {rows} rows waited {timeout:.3g}s for learners to sample "
                                         f"({self._describe()})")
                self._cond.wait(left)
            self._pushed += rows

    def give_back(self, rows: int) -> None:
        """A counted push was refused (its spec): it inserted nothing."""
        with self._cond:
            self._pushed -= rows
            self._cond.notify_all()

    def _describe(self) -> str:
        return (f"{self.limiter.describe()} over the group at the last sync; this rank pushed "
                f"{self._pushed - self._base} of its {self._part} rows since")

    # -- collectives (the learner's thread or its lane) -----------------------------------------
    def snapshot(self) -> int:
        """This rank's admitted rows, for the sync's state vector. The part left carries on from here (pushes
        before :meth:`synced` use it, and are charged to the next part too: the sync did not count them)."""
        with self._cond:
            self._part -= self._pushed - self._base
            self._base = self._pushed
            return self._pushed

    def synced(self, inserts: int) -> None:
        """The group's admitted rows as of the snapshots: the room is shared out afresh, less what this rank
        pushed since its snapshot."""
        with self._cond:
            self.limiter.inserts = inserts
            self._part = self._share(self.limiter.insert_room()) - (self._pushed - self._base)
            self._base = self._pushed
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
    @property
    def sampled(self) -> int:
        return self.limiter.samples

    def restored(self, pushed: int, sampled: int) -> None:
        """Continue a checkpoint's counts: the group's samples on every rank, its pushes on one."""
        with self._cond:
            self._pushed += pushed
            self.limiter.samples = sampled

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
