"""Re-laying a ring over new shards: which rows move where, with every record keeping its slot.

Pure functions over :class:`~conduit.storage.sharded.RowLayout` values (no
device is touched). The buffer addresses records by ring slot, so a migration
must leave slot ``i`` holding the same record; the Eq. 3 plan only says how
many records each source shard sends to each target shard. :func:`plan_layout`
reconciles the two: it cuts each source shard's valid rows, in ring order, into
runs of the planned sizes, gives each target shard its runs in ring order (so a
target's rows stay sorted by slot and adjacent runs merge), then spreads the
empty slots ``valid .. rows`` over the targets' spare rows. The result is the
new layout plus the block copies that realise it.
"""

from __future__ import annotations

from collections.abc import Sequence

from conduit.errors import PlacementError
from conduit.placement.records import largest_remainder
from conduit.storage.sharded import RowCopy, RowLayout, Segment

__all__ = ["in_place_copies", "plan_layout", "shard_volumes", "target_volumes", "valid_segments"]


def valid_segments(layout: RowLayout, valid: int) -> list[list[Segment]]:
    """Per shard, its segments clipped to ring rows ``0 .. valid``, in ring order."""
    if not 0 <= valid <= layout.rows:
        raise PlacementError(f"valid: expected 0 <= valid <= {layout.rows} rows, received {valid}")
    out: list[list[Segment]] = [[] for _ in layout.shard_rows]
    for s in layout.segments:
        n = min(s.start + s.length, valid) - s.start
        if n > 0:
            out[s.shard].append(Segment(s.start, n, s.shard, s.offset))
    return out


def shard_volumes(layout: RowLayout, valid: int) -> tuple[int, ...]:
    """Valid rows per shard (``V_i`` of Eq. 3, in records)."""
    return tuple(sum(s.length for s in segs) for segs in valid_segments(layout, valid))


def target_volumes(shard_rows: Sequence[int], valid: int) -> tuple[int, ...]:
    """``V'_j``: ``valid`` records split in proportion to the target shards' rows (each within its rows)."""
    total = sum(shard_rows)
    if not 0 <= valid <= total:
        raise PlacementError(f"valid: expected 0 <= valid <= {total} rows, received {valid}")
    parts = list(largest_remainder([float(r) for r in shard_rows], valid))
    spill = sum(max(0, p - r) for p, r in zip(parts, shard_rows))
    parts = [min(p, r) for p, r in zip(parts, shard_rows)]
    for j, r in enumerate(shard_rows):  # never needed for a proportional split; kept for safety
        take = min(spill, r - parts[j])
        parts[j] += take
        spill -= take
    return tuple(parts)


def in_place_copies(layout: RowLayout, valid: int) -> tuple[RowCopy, ...]:
    """Copies re-laying the valid rows onto the same layout (a grown spec, same placement)."""
    return tuple(
        RowCopy(s.shard, s.offset, s.shard, s.offset, s.length) for segs in valid_segments(layout, valid) for s in segs
    )


def plan_layout(
    old: RowLayout, valid: int, flows: Sequence[Sequence[int]], new_rows: Sequence[int]
) -> tuple[RowLayout, tuple[RowCopy, ...]]:
    """The new layout and the copies moving ``flows[i][j]`` valid records from old shard ``i`` to new shard ``j``.

    ``flows`` rows must sum to the old shards' valid rows, and each column must
    fit its new shard; ``new_rows`` must sum to the ring's rows.
    """
    rows = [int(r) for r in new_rows]
    if sum(rows) != old.rows:
        raise PlacementError(f"new_rows: expected rows summing to {old.rows} (the ring), received {rows}")
    volumes = shard_volumes(old, valid)
    if len(flows) != len(volumes) or any(len(f) != len(rows) for f in flows):
        raise PlacementError(
            f"flows: expected a {len(volumes)}x{len(rows)} matrix (old shards x new shards), "
            f"received {[len(f) for f in flows]}"
        )
    for i, (f, v) in enumerate(zip(flows, volumes)):
        if sum(f) != v or any(n < 0 for n in f):
            raise PlacementError(
                f"flows[{i}]: expected non-negative flows summing to {v} valid rows, received {list(f)}"
            )
    received = [sum(f[j] for f in flows) for j in range(len(rows))]
    if any(n > r for n, r in zip(received, rows)):
        raise PlacementError(f"flows: expected each new shard to receive at most its rows {rows}, received {received}")

    runs: list[list[tuple[int, int, int, int]]] = [[] for _ in rows]  # per target: (ring, n, src shard, src row)
    for i, segs in enumerate(valid_segments(old, valid)):
        queue = [(j, n) for j, n in enumerate(flows[i]) if n > 0]
        q = 0
        for s in segs:
            at = 0
            while at < s.length:
                j, want = queue[q]
                n = min(want, s.length - at)
                runs[j].append((s.start + at, n, i, s.offset + at))
                at += n
                if n == want:
                    q += 1
                else:
                    queue[q] = (j, want - n)

    segments: list[Segment] = []
    copies: list[RowCopy] = []
    for j, target_runs in enumerate(runs):
        row = 0
        for ring, n, src, src_row in sorted(target_runs):
            segments.append(Segment(ring, n, j, row))
            copies.append(RowCopy(src, src_row, j, row, n))
            row += n
    ring = valid
    for j, r in enumerate(rows):  # empty slots fill each target's spare rows, in target order
        spare = r - received[j]
        if spare > 0:
            segments.append(Segment(ring, spare, j, received[j]))
            ring += spare
    return RowLayout(rows, segments), _merge_copies(copies)


def _merge_copies(copies: Sequence[RowCopy]) -> tuple[RowCopy, ...]:
    out: list[RowCopy] = []
    for c in copies:
        last = out[-1] if out else None
        if (
            last is not None
            and (last.src, last.dst) == (c.src, c.dst)
            and last.src_row + last.rows == c.src_row
            and last.dst_row + last.rows == c.dst_row
        ):
            out[-1] = RowCopy(c.src, last.src_row, c.dst, last.dst_row, last.rows + c.rows)
        else:
            out.append(c)
    return tuple(out)
