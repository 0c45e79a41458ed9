"""Rate limiting between actors and learners (Reverb's ``SampleToInsertRatio``, made exact).

The limiter keeps ``diff = inserts · samples_per_insert − samples`` inside a
band ``[min_diff, max_diff]`` around ``samples_per_insert · min_size`` of width
``± tolerance``: an insert that would push ``diff`` above ``max_diff`` waits for
learners to sample; a sample that would drop it below ``min_diff`` waits for
actors to insert. Units are transitions (rows).

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
    """``samples_per_insert=None`` limits nothing but ``min_size``."""

    min_size: int = 1
    samples_per_insert: float | None = None
    tolerance: float = float("inf")

    def __post_init__(self) -> None:
        if self.min_size < 1:
            raise ValueError(f"min_size must be >= 1, got {self.min_size}")
        if self.samples_per_insert is not None and self.samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert must be > 0, got {self.samples_per_insert}")
        if self.tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance}")
        spi, tol = self.samples_per_insert, self.tolerance
        self._spi = Fraction(spi).as_integer_ratio() if spi is not None else (0, 1)
        self._tol = Fraction(tol).as_integer_ratio() if math.isfinite(tol) else None  # None: no band
        self.inserts = 0  # rows admitted
        self.samples = 0  # rows delivered to learners
        self.reserved = 0  # rows sampled for staged batches not yet delivered
        self._lock = threading.Lock()

    def diff(self) -> float:
        spi = self.samples_per_insert or 0.0
        return self.inserts * spi - (self.samples + self.reserved)

    # The decisions compare in integers: the ratio p/q and the tolerance a/b are the floats' exact binary values,
    # so a decision never depends on the order counts were added in (float sums at the band's edge do).
    def _excess(self, inserts: int, samples: int) -> int:
        """``((inserts - min_size) · spi - samples) · q · b``: the diff from the band's centre, scaled to an int."""
        p, q = self._spi
        return ((inserts - self.min_size) * p - samples * q) * self._tol[1]

    def can_insert(self, rows: int) -> bool:
        if self.samples_per_insert is None or self.inserts + rows <= self.min_size or self._tol is None:
            return True
        return self._excess(self.inserts + rows, self.samples + self.reserved) <= self._tol[0] * self._spi[1]

    def insert_room(self) -> int:
        """Rows that may be inserted now: :meth:`can_insert` admits up to it and not one more; ``NO_LIMIT``
        without a ratio or a band."""
        if self.samples_per_insert is None or self._tol is None:
            return NO_LIMIT
        (p, q), (a, b) = self._spi, self._tol
        # the largest k with ((inserts + k - min) · p - samples · q) · b <= a · q
        top = (a * q + (self.samples + self.reserved) * q * b) // (p * b) + self.min_size - self.inserts
        return max(self.min_size - self.inserts, top, 0)

    def can_sample(self, rows: int, size: int) -> bool:
        if size < self.min_size:
            return False
        if self.samples_per_insert is None or self._tol is None:
            return True
        return self._excess(self.inserts, self.samples + self.reserved + rows) >= -self._tol[0] * self._spi[1]

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
        return (
            f"samples_per_insert={self.samples_per_insert}, tolerance={self.tolerance}: "
            f"{self.inserts} rows inserted, {self.samples} sampled, {self.reserved} reserved"
        )

    def state_dict(self) -> dict[str, float]:
        """Rows inserted and sampled (reservations belong to staged batches, which restore their own)."""
        return {"inserts": self.inserts, "samples": self.samples}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.inserts, self.samples, self.reserved = int(state["inserts"]), int(state["samples"]), 0
