"""Storage policies: which storage a buffer allocates, and how it moves when the spec grows.

A buffer asks its policy for storage when the spec is first known
(:meth:`StoragePolicy.create`) and again when a growable field outgrows the
layout (:meth:`StoragePolicy.migrate`, called with ingestion and delivery paused
under the buffer's lock). The placement planner supplies a policy that picks the
placement by the per-sample size and moves rows by a makespan-optimal plan;
:class:`FixedStorage` keeps everything on one device.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from conduit.spec import ExperienceSpec
from conduit.storage.base import Storage
from conduit.storage.tensor import TensorStorage

__all__ = ["FixedStorage", "StoragePolicy", "copy_rows"]


@runtime_checkable
class StoragePolicy(Protocol):
    def create(self, spec: ExperienceSpec, rows: int) -> Storage:
        """New, empty storage for ``rows`` rows of ``spec``."""
        ...

    def migrate(self, old: Storage, spec: ExperienceSpec, valid: int) -> Storage:
        """Storage for ``spec`` holding rows ``0..valid`` of ``old`` (padded); ``old`` may be released."""
        ...


def copy_rows(old: Storage, new: Storage, valid: int, chunk: int = 65_536) -> None:
    """Copy rows ``0..valid`` from ``old`` to ``new`` in bounded chunks (pads grown fields)."""
    for start in range(0, valid, chunk):
        n = min(chunk, valid - start)
        new.write(start, old.read(start, n))


class FixedStorage:
    """All rows on one device (``"cpu"``, ``"pinned"``, ``"cuda:0"``)."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = device

    def create(self, spec: ExperienceSpec, rows: int) -> Storage:
        return TensorStorage(spec, rows, self.device)

    def migrate(self, old: Storage, spec: ExperienceSpec, valid: int) -> Storage:
        new = self.create(spec, old.rows)
        copy_rows(old, new, valid)
        old.close()
        return new

    def __repr__(self) -> str:
        return f"FixedStorage({str(self.device)!r})"
