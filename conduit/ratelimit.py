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
        self.inserts = 0  # rows admitted
        self.samples = 0  # rows delivered to learners
        self.reserved = 0  # rows sampled for staged batches not yet delivered
        self._lock = threading.Lock()

    @property
    def _centre(self) -> float:
        assert self.samples_per_insert is not None
        return self.samples_per_insert * self.min_size

    def diff(self) -> float:
        spi = self.samples_per_insert or 0.0
        return self.inserts * spi - (self.samples + self.reserved)

    def can_insert(self, rows: int) -> bool:
        if self.samples_per_insert is None or self.inserts + rows <= self.min_size:
            return True
        return self.diff() + rows * self.samples_per_insert <= self._centre + self.tolerance

    def insert_room(self) -> int:
        """Rows that may be inserted now: :meth:`can_insert` admits up to it and not one more (rounding of the
        band's edge included); ``NO_LIMIT`` without a ratio."""
        if self.samples_per_insert is None:
            return NO_LIMIT
        band = (self._centre + self.tolerance - self.diff()) / self.samples_per_insert
        k = max(self.min_size - self.inserts, math.floor(band) + 1, 0)
        while k > 0 and not self.can_insert(k):  # floor(band) + 1 at most; a step or two where rounding bites
            k -= 1
        return k

    def can_sample(self, rows: int, size: int) -> bool:
        if size < self.min_size:
            return False
        if self.samples_per_insert is None:
            return True
        return self.diff() - rows >= self._centre - self.tolerance

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
