"""SRL samples <-> Conduit's flat fields, and SRL's batching on axis 1.

An SRL sample is a nested ``NamedArray`` (a ``SampleBatch``: ``obs``, ``action``,
``reward``, ``policy_version_steps``, ``analyzed_result.ret`` ...) whose leaves are
arrays of shape ``[T, ...]`` (actors batch along time, axis 0) or ``None``. Conduit
stores flat fields, so a sample is flattened to dotted names (``analyzed_result.ret``)
and rebuilt as a ``NamedArray`` of the same nesting — the way SRL's own replay
buffers rebuild theirs (a plain ``NamedArray``, not the producer's subclass).

Buffers batch along axis 1: ``B`` samples of ``[T, ...]`` become one ``[T, B, ...]``
(time-major) sample. :class:`Layout` records the first sample's structure; every
later sample must match it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from conduit.errors import SpecError

__all__ = ["HOST_FIELDS", "Layout", "build", "flatten", "is_numeric"]

#: fields a GPU learner still gets as host numpy: SRL's trainer filters stale samples with numpy on them
HOST_FIELDS = ("policy_version_steps",)


def _nested(v: Any) -> bool:
    return callable(getattr(v, "items", None)) and not hasattr(v, "shape")


def flatten(sample: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``[(dotted name, leaf)]`` of a nested ``NamedArray`` (or mapping), in its own field order."""
    out: list[tuple[str, Any]] = []
    for k, v in sample.items():
        name = f"{prefix}{k}"
        if _nested(v):
            out += flatten(v, f"{name}.")
        else:
            out.append((name, v))
    return out


def build(pairs: Sequence[tuple[str, Any]], cls: Callable[..., Any]) -> Any:
    """A nested ``cls`` (a ``NamedArray`` class) from ``[(dotted name, leaf)]``."""
    top: dict[str, Any] = {}
    groups: dict[str, list[tuple[str, Any]]] = {}
    for name, v in pairs:
        head, dot, rest = name.partition(".")
        if dot:
            groups.setdefault(head, []).append((rest, v))
        else:
            top[head] = v
    for head, sub in groups.items():
        top[head] = build(sub, cls)
    return cls(**top)


def is_numeric(v: Any) -> bool:
    """A leaf Conduit can store: a numeric or bool array, or a tensor."""
    return isinstance(v, torch.Tensor) or (isinstance(v, np.ndarray) and v.dtype.kind in "biufc")


@dataclass(frozen=True)
class Layout:
    """The structure of a stream's samples, learned from the first one.

    Attributes:
        names: every leaf's dotted name, in the sample's order.
        none: leaves that are ``None`` (handed back as ``None``).
        other: non-numeric leaves (strings, objects): a queue buffer keeps them, a replay buffer cannot.
        length: the sample's length on axis 0 (time), ``T``.
    """

    names: tuple[str, ...]
    none: frozenset[str]
    other: frozenset[str]
    length: int

    @classmethod
    def of(cls, sample: Any) -> Layout:
        pairs = flatten(sample)
        if not pairs:
            raise SpecError("an SRL sample with no fields")
        none = frozenset(k for k, v in pairs if v is None)
        other = frozenset(k for k, v in pairs if v is not None and not is_numeric(v))
        flat = [k for k, v in pairs if k not in none and k not in other and getattr(v, "ndim", 0) < 1]
        if flat:
            raise SpecError(f"fields {flat}: every array of an SRL sample has a time axis (axis 0), these have none")
        lengths = {int(v.shape[0]) for k, v in pairs if k not in none and getattr(v, "ndim", 0) >= 1}
        if len(lengths) != 1:
            raise SpecError(
                f"an SRL sample's fields must share their length on axis 0 (time), got {sorted(lengths)}"
            )
        return cls(tuple(k for k, _ in pairs), none, other, lengths.pop())

    @property
    def numeric(self) -> tuple[str, ...]:
        """The leaves Conduit stores, in order."""
        return tuple(k for k in self.names if k not in self.none and k not in self.other)

    def leaves(self, sample: Any) -> dict[str, Any]:
        """``sample``'s leaves by dotted name, checked against this layout (``SpecError`` naming the difference)."""
        leaves = dict(flatten(sample))
        if tuple(leaves) != self.names and set(leaves) != set(self.names):
            missing, extra = sorted(set(self.names) - set(leaves)), sorted(set(leaves) - set(self.names))
            raise SpecError(f"an SRL sample's fields differ from the stream's first: missing {missing}, extra {extra}")
        for k, v in leaves.items():
            if (v is None) != (k in self.none):
                raise SpecError(f"field {k!r}: None in some samples and an array in others")
        return leaves

    def rebuild(self, leaves: Mapping[str, Any], cls: Callable[..., Any]) -> Any:
        """A ``cls`` sample from leaves by name (``None`` leaves filled in)."""
        return build([(k, None if k in self.none else leaves[k]) for k in self.names], cls)
