"""Where buffer-resident experience lives: preallocated per-field storage."""

from __future__ import annotations

from conduit.storage.base import Storage
from conduit.storage.policy import FixedStorage, StoragePolicy, copy_rows
from conduit.storage.tensor import TensorStorage, resolve_device

__all__ = ["FixedStorage", "Storage", "StoragePolicy", "TensorStorage", "copy_rows", "resolve_device"]
