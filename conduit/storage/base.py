"""The storage protocol: rows of a fixed spec, written by range, read by index.

A storage knows nothing of rings, samplers or generations (the buffer owns
those); it holds ``rows`` preallocated rows per field and moves bytes. New
placements (sharded, tiered) are new storages, not new options on the buffer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import numpy as np
import torch

from conduit.spec import ExperienceSpec

__all__ = ["Storage", "take_rows"]


def take_rows(data: Mapping[str, torch.Tensor], rows: np.ndarray) -> dict[str, torch.Tensor]:
    """Rows ``rows`` of every field (a copy), wherever the field lives."""
    idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
    return {k: v.index_select(0, idx if v.device.type == "cpu" else idx.to(v.device)) for k, v in data.items()}


class Storage(ABC):
    """``rows`` preallocated rows of ``spec``."""

    def __init__(self, spec: ExperienceSpec, rows: int) -> None:
        if rows <= 0:
            raise ValueError(f"rows must be > 0, got {rows}")
        self.spec = spec
        self.rows = rows

    @property
    @abstractmethod
    def devices(self) -> tuple[torch.device, ...]:
        """The devices holding rows (one for a single placement)."""

    @property
    def nbytes(self) -> int:
        return self.rows * self.spec.bytes_per_sample

    @abstractmethod
    def write(self, start: int, data: Mapping[str, torch.Tensor]) -> None:
        """Write ``n`` rows at ``start, start+1, ... (mod rows)``; ``n <= rows``.

        ``data`` is already validated against the spec.
        """

    def write_slots(
        self, slots: np.ndarray, data: Mapping[str, torch.Tensor], rows: np.ndarray | None = None
    ) -> None:
        """Write row ``i`` of ``data`` (row ``rows[i]`` when given) to slot ``slots[i]`` (any order).

        Runs of consecutive slots are one copy.
        """
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0:
            return
        if rows is not None:
            data = take_rows(data, rows)
        breaks = np.flatnonzero(np.diff(slots) != 1) + 1
        starts = np.concatenate([[0], breaks])
        ends = np.concatenate([breaks, [slots.size]])
        for a, b in zip(starts.tolist(), ends.tolist()):
            self.write(int(slots[a]), {k: v[a:b] for k, v in data.items()})

    @abstractmethod
    def gather(
        self, indices: torch.Tensor, device: torch.device | None = None, out: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """Rows ``indices`` (int64, host) of every field, as new tensors on ``device``.

        ``device=None`` returns them where they live (a single-device storage)
        or on the first device (a sharded one). ``out`` offers preallocated
        tensors of the right shapes to gather into (recycled batch memory); a
        storage may ignore it and allocate.
        """

    @property
    def streaming(self) -> bool:
        """Whether large writes bypass the caches (:mod:`conduit.storage.streaming`)."""
        return False

    def set_streaming(self, enabled: bool) -> None:
        """Let large writes bypass the caches: for rows read back long after they are written (a replay ring).

        A hint: a storage that cannot stream ignores it.
        """
        del enabled

    @property
    def hands_out_views(self) -> bool:
        """Whether :meth:`view` gives views (and :meth:`in_use` can tell when they are gone)."""
        return False

    def view(self, start: int, n: int) -> dict[str, torch.Tensor] | None:
        """Rows ``start .. start+n`` as views of the storage itself (no copy), or None where it cannot.

        Whoever hands such views out must not reuse the storage while :meth:`in_use`.
        """
        return None

    def in_use(self) -> bool:
        """Whether a view from :meth:`view` (or a view of one) is still alive somewhere."""
        return False

    @abstractmethod
    def read(self, start: int, n: int) -> dict[str, torch.Tensor]:
        """A copy of rows ``start .. start+n`` (mod rows), for checkpoints and migration."""

    def close(self) -> None:
        """Release memory early (optional)."""
