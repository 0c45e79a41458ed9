"""Where buffer-resident experience lives: preallocated per-field storage."""

from __future__ import annotations

from conduit.storage.base import Storage
from conduit.storage.tensor import TensorStorage, resolve_device

__all__ = ["Storage", "TensorStorage", "resolve_device"]
