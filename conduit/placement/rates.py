"""Rates that depend on the row size, and the runtime's fixed cost per call (pure functions).

A host ring's write and gather rates are not one number: a gather of 512 rows of
64 B is dominated by per-row work, one of 512 rows of 64 KiB by memory bandwidth,
and a batch small enough to stay in the cache runs faster than one that does not.
The live profile measures both at several row sizes, as the runtime runs them
(a unit of rows written into a ring, a training batch of rows gathered out of
it), into tables of ``(row_bytes, bytes_per_second)`` pairs; the model reads
them at the workload's rows.

:func:`rate_at` interpolates a table linearly in log(row) and log(rate), and
holds the end values beyond the measured range (an extrapolation would invent a
trend). :func:`effective_rate` is the rate of a sample made of several columns,
each gathered or written separately: the bytes over the sum of the columns'
times.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

__all__ = ["RateTable", "check_table", "effective_rate", "rate_at"]

RateTable = tuple[tuple[int, float], ...]
"""``((row_bytes, bytes_per_second), ...)``, row sizes strictly ascending."""


def check_table(name: str, table: RateTable) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``table`` is non-empty, ascending and positive."""
    if not table:
        raise ValueError(f"{name}: expected at least one (row_bytes, bytes_per_second) pair, received none")
    rows = [r for r, _ in table]
    if any(b <= a for a, b in itertools.pairwise(rows)):
        raise ValueError(f"{name}: expected row sizes strictly ascending, received {rows}")
    bad = [(r, v) for r, v in table if not (r > 0 and v > 0 and math.isfinite(v))]
    if bad:
        raise ValueError(f"{name}: expected row sizes > 0 B and finite rates > 0 B/s, received {bad}")


def rate_at(table: RateTable, row_bytes: float) -> float:
    """The table's rate at ``row_bytes``: log-log interpolation inside, the end values outside."""
    rows = [r for r, _ in table]
    if row_bytes <= rows[0]:
        return table[0][1]
    if row_bytes >= rows[-1]:
        return table[-1][1]
    i = bisect.bisect_right(rows, row_bytes)
    (r0, v0), (r1, v1) = table[i - 1], table[i]
    if row_bytes == r0:
        return v0  # a measured row size reads its measured rate, not exp(log(v)) one ulp off
    f = (math.log(row_bytes) - math.log(r0)) / (math.log(r1) - math.log(r0))
    rate = math.exp(math.log(v0) + f * (math.log(v1) - math.log(v0)))
    return min(max(rate, min(v0, v1)), max(v0, v1))  # rounding must not leave the bracket


def effective_rate(table: RateTable, rows: Sequence[int]) -> float:
    """Bytes per second of a sample whose columns have ``rows`` bytes each, column by column."""
    total = math.fsum(rows)
    return total / math.fsum(r / rate_at(table, r) for r in rows)
