"""Rate limiting between actors and learners (Reverb's ``SampleToInsertRatio``, made exact).

The limiter keeps ``diff = inserts · samples_per_insert − samples`` inside a
band ``[min_diff, max_diff]``: ``± tolerance`` around ``samples_per_insert · min_size``,
or the two edges given (Reverb's ``error_buffer`` as a pair; its ``Queue(size)`` is
``samples_per_insert=1``, ``[0, size]``: a full queue makes the writer wait). An insert
that would push ``diff`` above ``max_diff`` waits for learners to sample; a sample that
would drop it below ``min_diff`` waits for actors to insert. Inserts up to ``min_size``
are always admitted. Units are transitions (rows).

Counting is exact where Reverb's is not: a batch staged by a prefetching
delivery *reserves* its rows (so prefetch cannot outrun the ratio) and only
counts as sampled when a learner pulls it; reservations of batches that are
never delivered are released, never counted.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["NO_LIMIT", "RateLimiter"]

#: :meth:`RateLimiter.insert_room` without a ratio
NO_LIMIT = 1 << 62


@dataclass
class RateLimiter:
    """``samples_per_insert=None`` limits nothing but ``min_size``; ``min_diff``/``max_diff`` replace the band
    ``tolerance`` makes."""

    min_size: int = 1
    samples_per_insert: float | None = None
    tolerance: float = float("inf")
    min_diff: float | None = None
    max_diff: float | None = None

    def __post_init__(self) -> None:
        if self.min_size < 1:
            raise ValueError(f"min_size must be >= 1, got {self.min_size}")
        if self.samples_per_insert is not None and self.samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert must be > 0, got {self.samples_per_insert}")
        if self.tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance}")
        if (self.min_diff is None) != (self.max_diff is None):
            raise ValueError("min_diff and max_diff come together")
        if self.min_diff is not None and not self.min_diff < self.max_diff:  # type: ignore[operator]
            raise ValueError(f"min_diff={self.min_diff} must be below max_diff={self.max_diff}")
        spi = Fraction(self.samples_per_insert) if self.samples_per_insert is not None else Fraction(0)
        if self.min_diff is not None:
            band: tuple[Fraction, Fraction] | None = (Fraction(self.min_diff), Fraction(self.max_diff))
        elif math.isfinite(self.tolerance):
            centre, tol = spi * self.min_size, Fraction(self.tolerance)
            band = (centre - tol, centre + tol)
        else:
            band = None  # no band
        # The decisions compare integers: the ratio and the band edges are the floats' exact binary values scaled
        # by one common denominator, so a decision never depends on the order counts were added in (float sums at
        # the band's edge do): inserts · P - samples · L against L · [min_diff, max_diff]
        scale = math.lcm(spi.denominator, *(e.denominator for e in band or ()))
        self._p, self._l = int(spi * scale), scale
        self._band = (int(band[0] * scale), int(band[1] * scale)) if band is not None else None
        self.inserts = 0  # rows admitted
        self.samples = 0  # rows delivered to learners
        self.reserved = 0  # rows sampled for staged batches not yet delivered
        self._lock = threading.Lock()

    def diff(self) -> float:
        spi = self.samples_per_insert or 0.0
        return self.inserts * spi - (self.samples + self.reserved)

    def _scaled(self, inserts: int, samples: int) -> int:
        """``(inserts · spi - samples) · L``: the diff, an exact integer."""
        return inserts * self._p - samples * self._l

    def _insert_side_samples(self) -> int:
        """The samples an insert is measured against: with ``± tolerance`` a staged batch's reserved rows count
        as sampled (prefetch frees room, as Reverb's sampling ahead does); with edges given, only delivered
        ones, for rows a staged batch holds keep their slots until delivered (a queue's size is its rows)."""
        return self.samples + (self.reserved if self.min_diff is None else 0)

    def can_insert(self, rows: int) -> bool:
        if self.samples_per_insert is None or self.inserts + rows <= self.min_size or self._band is None:
            return True
        return self._scaled(self.inserts + rows, self._insert_side_samples()) <= self._band[1]

    def insert_room(self) -> int:
        """Rows that may be inserted now: :meth:`can_insert` admits up to it and not one more; ``NO_LIMIT``
        without a ratio or a band."""
        if self.samples_per_insert is None or self._band is None:
            return NO_LIMIT
        # the largest k with (inserts + k) · P - samples · L <= max_diff · L
        top = (self._band[1] + self._insert_side_samples() * self._l) // self._p - self.inserts
        return max(self.min_size - self.inserts, top, 0)

    def can_sample(self, rows: int, size: int) -> bool:
        if size < self.min_size:
            return False
        if self.samples_per_insert is None or self._band is None:
            return True
        return self._scaled(self.inserts, self.samples + self.reserved + rows) >= self._band[0]

    def insert(self, rows: int) -> None:
        with self._lock:
            self.inserts += rows

    def reserve(self, rows: int) -> None:
        with self._lock:
            self.reserved += rows

    def commit(self, rows: int) -> None:
        """Reserved rows reached a learner: they are now sampled."""
        with self._lock:
            self.reserved -= rows
            self.samples += rows

    def sampled(self, rows: int) -> None:
        """Rows sampled and handed to a learner in one step (an inline pull): no reservation between."""
        with self._lock:
            self.samples += rows

    def release(self, rows: int) -> None:
        """Reserved rows were never delivered."""
        with self._lock:
            self.reserved -= rows

    def describe(self) -> str:
        if self.samples_per_insert is None:
            return f"min_size={self.min_size}"
        band = (f"min_diff={self.min_diff}, max_diff={self.max_diff}" if self.min_diff is not None
                else f"tolerance={self.tolerance}")
        return (
            f"samples_per_insert={self.samples_per_insert}, {band}: "
            f"{self.inserts} rows inserted, {self.samples} sampled, {self.reserved} reserved"
        )

    def state_dict(self) -> dict[str, float]:
        """Rows inserted and sampled (reservations belong to staged batches, which restore their own)."""
        return {"inserts": self.inserts, "samples": self.samples}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.inserts, self.samples, self.reserved = int(state["inserts"]), int(state["samples"]), 0
