"""Where buffer-resident experience lives: preallocated per-field storage."""

from __future__ import annotations

from conduit.storage.base import Storage
from conduit.storage.host import HostGatherStorage, HostGatherStoragePolicy
from conduit.storage.policy import FixedStorage, StoragePolicy, copy_rows
from conduit.storage.sharded import RowLayout, ShardedStorage
from conduit.storage.tensor import TensorStorage, resolve_device

__all__ = [
    "FixedStorage",
    "HostGatherStorage",
    "HostGatherStoragePolicy",
    "RowLayout",
    "ShardedStorage",
    "Storage",
    "StoragePolicy",
    "TensorStorage",
    "copy_rows",
    "resolve_device",
]
