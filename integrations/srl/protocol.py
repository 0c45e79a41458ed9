"""Local stand-ins for SRL's buffer types, used when SRL's own buffer layer is not loaded.

SRL (``openpsi-projects/srl``, package ``rlsrl``; ``openpsi-project/srl``, the monorepo) is
not on PyPI, so the adapter must work, and be tested, without it. These classes are
written from SRL's documented protocol (docs/srl.md: what a buffer must do for SRL's trainer worker), not
from its code, and are structurally identical where SRL's trainer reads them:

- :class:`ReplayEntry`: what ``Buffer.get()`` returns — ``reuses_left``,
  ``receive_time``, ``sample``, ``reuses``, ``sampling_indices``, ordered by
  ``(reuses_left, receive_time)`` (``order=True``; ``sample`` and ``reuses`` do not
  take part in comparisons).
- :class:`Buffer`: the four-method protocol ``put`` / ``get`` / ``empty`` / ``qsize``.
- :class:`PrioritizedReplayBuffer`: the class SRL's trainer gates priority feedback on
  (``isinstance(buffer, PrioritizedReplayBuffer)``).
- :class:`NamedArray`: a nested record of arrays (fields may be records or ``None``)
  with the methods SRL's trainer calls on a sample (``length``, ``average_of``,
  ``min_of``, ``register_metadata``, settable existing fields such as ``policy_name``)
  and, like SRL's, a ``shape`` property (a dict of its fields' shapes).

When SRL's buffer module is loaded, :mod:`.locate` hands out SRL's own classes instead.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["Buffer", "NamedArray", "PrioritizedReplayBuffer", "ReplayEntry"]


@dataclass(order=True)
class ReplayEntry:
    """One item handed to SRL's trainer: a (possibly reused) sample and its reuse bookkeeping."""

    reuses_left: int
    receive_time: float
    sample: Any = field(compare=False)
    reuses: float = field(default=0, compare=False)
    sampling_indices: np.ndarray | None = field(default=None, compare=False)

    def __len__(self) -> int:
        return len(self.sample)


class Buffer:
    """SRL's buffer protocol: the whole of it (no ``close``, no thread-safety promised)."""

    def put(self, x: Any) -> Any:
        raise NotImplementedError

    def get(self) -> ReplayEntry:
        raise NotImplementedError

    def empty(self) -> bool:
        raise NotImplementedError

    def qsize(self) -> int:
        raise NotImplementedError


class PrioritizedReplayBuffer(Buffer):
    """The marker SRL's trainer checks before calling ``update_priorities(indices, priorities)``."""

    def update_priorities(self, idxes: np.ndarray, priorities: np.ndarray) -> None:
        raise NotImplementedError


class NamedArray:
    """A nested record of arrays (fields sorted by name; ``None`` allowed), like SRL's ``NamedArray``."""

    _RESERVED = ("_fields", "_metadata")

    def __init__(self, **kwargs: Any) -> None:
        object.__setattr__(self, "_fields", tuple(sorted(kwargs)))
        object.__setattr__(self, "_metadata", types.MappingProxyType({}))
        for k, v in kwargs.items():
            object.__setattr__(self, k, v)

    # -- fields -----------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._fields:
            raise AttributeError(f"cannot add new attribute {name!r} to {type(self).__name__}")
        object.__setattr__(self, name, value)

    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str):
            raise TypeError("the stand-in NamedArray indexes by field name only")
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self._fields

    def __iter__(self) -> Iterator[Any]:
        return (getattr(self, k) for k in self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def keys(self) -> Iterator[str]:
        return iter(self._fields)

    def values(self) -> Iterator[Any]:
        return iter(self)

    def items(self) -> Iterator[tuple[str, Any]]:
        return ((k, getattr(self, k)) for k in self._fields)

    # -- metadata -----------------------------------------------------------------------------
    @property
    def metadata(self) -> types.MappingProxyType[str, Any]:
        return self._metadata

    def register_metadata(self, **kwargs: Any) -> None:
        clash = sorted(set(kwargs) & set(self._fields))
        if clash:
            raise KeyError(f"metadata keys must differ from data fields, got {clash}")
        object.__setattr__(self, "_metadata", types.MappingProxyType({**self._metadata, **kwargs}))

    # -- what SRL's trainer reads -----------------------------------------------------------------
    def length(self, dim: int = 0) -> int:
        """The size of dimension ``dim`` of the first array field (at this level, not nested) that has one."""
        for _, v in self.items():
            if isinstance(v, (np.ndarray, torch.Tensor)) and dim < v.ndim:
                return int(v.shape[dim])
        raise IndexError(f"no field has a dimension {dim}")

    @property
    def shape(self) -> dict[str, Any]:
        """Each field's shape, nested records as nested dicts and ``None`` fields as ``None`` (as SRL's has it:
        so a record has a ``shape`` too, and code must not take "has a shape" to mean "is an array")."""
        return {
            k: v.shape if isinstance(v, NamedArray) else (None if v is None else tuple(v.shape))
            for k, v in self.items()
        }

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dicts of the fields."""
        return {k: v.to_dict() if isinstance(v, NamedArray) else v for k, v in self.items()}

    def _masked(self, name: str, ignore_negative: bool) -> np.ndarray:
        values = np.asarray(self[name], dtype=np.float64)
        return np.where(values >= 0, values, np.nan) if ignore_negative else values

    def average_of(self, name: str, ignore_negative: bool = True) -> float | None:
        values = self._masked(name, ignore_negative)
        return _reduce(np.nanmean, values)

    def min_of(self, name: str, ignore_negative: bool = True) -> float | None:
        values = self._masked(name, ignore_negative)
        return _reduce(np.nanmin, values)

    def max_of(self, name: str, ignore_negative: bool = True) -> float | None:
        values = self._masked(name, ignore_negative)
        return _reduce(np.nanmax, values)

    # -- pickling ----------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {"fields": dict(self.items()), "metadata": dict(self._metadata)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        NamedArray.__init__(self, **state["fields"])
        self.register_metadata(**state["metadata"])

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={getattr(v, 'shape', v)!r}" for k, v in self.items())
        return f"{type(self).__name__}({inner})"


def _reduce(fn: Any, values: np.ndarray) -> float | None:
    """``fn`` (a nan-ignoring reduction) of ``values``: None when empty, NaN (no warning) when every value is NaN."""
    if not values.size:
        return None
    return float(fn(values)) if not np.all(np.isnan(values)) else float("nan")
