"""SRL samples <-> Conduit's flat fields, and SRL's batching on axis 1.

An SRL sample is a nested ``NamedArray`` (a ``SampleBatch``: ``obs``, ``action``,
``reward``, ``policy_version_steps``, ``analyzed_result.ret`` ...) whose leaves are
arrays of shape ``[T, ...]`` (actors batch along time, axis 0) or ``None``. Conduit
stores flat fields, so a sample is flattened to dotted names (``analyzed_result.ret``)
and rebuilt as a ``NamedArray`` of the same nesting — the way SRL's own replay
buffers rebuild theirs (a plain ``NamedArray``, not the producer's subclass).

Buffers batch along axis 1: ``B`` samples of ``[T, ...]`` become one ``[T, B, ...]``
(time-major) sample. :class:`Layout` records the first sample's structure; every
later sample must match it, except where SRL itself tolerates a difference: a leaf or
a whole record ``None`` in some samples (zero-filled, as SRL's aggregation fills it).

A record is told from a leaf by its type, never by a ``shape`` attribute: SRL's
``NamedArray`` has a ``shape`` property too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from conduit import SpecError

__all__ = ["HOST_FIELDS", "Layout", "as_row", "build", "conform", "flatten", "is_numeric", "stack_rows", "unify"]

#: fields a GPU learner still gets as host numpy: SRL's trainer filters stale samples with numpy on them
HOST_FIELDS = ("policy_version_steps",)


def _nested(v: Any) -> bool:
    """Whether ``v`` is a nested record (an SRL ``NamedArray`` or a mapping), not a leaf.

    Decided by type, not by a ``shape`` attribute: SRL's ``NamedArray`` has a ``shape``
    property (a dict of its fields' shapes) and is still a record of fields.
    """
    if v is None or isinstance(v, (np.ndarray, np.generic, torch.Tensor, str, bytes)):
        return False
    return callable(getattr(v, "items", None)) and callable(getattr(v, "keys", None))


def _none_ancestor(name: str, flat: Mapping[str, Any]) -> bool:
    """Whether a parent record of dotted ``name`` is ``None`` in ``flat`` (a whole nested field left out)."""
    parts = name.split(".")
    return any(flat.get(".".join(parts[:i]), 0) is None for i in range(1, len(parts)))


def unify(flats: Sequence[Mapping[str, Any]]) -> list[str]:
    """The leaf names of samples that may differ only where a nested field is ``None`` in some of them.

    An actor's sample leaves a whole record ``None`` (``info``, ``policy_state``) at steps
    where others hold it; SRL's aggregation then fills zeros of the others' shapes. The
    union keeps the most detailed form: a ``None`` name is replaced by its children.
    Other differences raise ``SpecError`` naming them.
    """
    first = tuple(flats[0])
    if all(tuple(f) == first for f in flats[1:]):  # the common case: every sample has the same fields
        return list(first)
    names: list[str] = []
    for flat in flats:
        for k in flat:
            if k not in names:
                names.append(k)
    names = [k for k in names if not any(o.startswith(k + ".") for o in names)]
    for flat in flats:
        missing = [k for k in names if k not in flat and not _none_ancestor(k, flat)]
        if missing:
            raise SpecError(f"an SRL sample lacks fields {missing} that other samples of the stream have")
    return names


def conform(flat: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """``flat``'s leaves under ``names``: a leaf under a ``None`` record is ``None``."""
    out: dict[str, Any] = {}
    for k in names:
        if k in flat:
            out[k] = flat[k]
        elif _none_ancestor(k, flat):
            out[k] = None
        else:
            raise SpecError(f"an SRL sample lacks field {k!r} that the stream's first sample has")
    return out


#: whether a value of a type is a nested record (:func:`_nested`), by type: flatten runs per sample and per get
_RECORD: dict[type, bool] = {}


def flatten(sample: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``[(dotted name, leaf)]`` of a nested ``NamedArray`` (or mapping), in its own field order."""
    out: list[tuple[str, Any]] = []
    fields = getattr(sample, "_fields", None)
    # an SRL NamedArray's items() are its ``_fields`` read by getattr, through two generators: read them directly
    items = zip(fields, map(sample.__getattribute__, fields)) if type(fields) is tuple else sample.items()
    for k, v in items:
        if v is None or type(v) is np.ndarray:  # the common leaves first
            out.append((prefix + k if prefix else k, v))
            continue
        record = _RECORD.get(type(v))
        if record is None:
            record = _RECORD[type(v)] = _nested(v)
        if record:
            out += flatten(v, f"{prefix}{k}.")
        else:
            out.append((prefix + k if prefix else k, v))
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
    if type(v) is np.ndarray:
        return v.dtype.kind in "biufc"
    return isinstance(v, torch.Tensor) or (isinstance(v, np.ndarray) and v.dtype.kind in "biufc")


@dataclass(frozen=True)
class Layout:
    """The structure of a stream's samples, learned from the first one.

    Attributes:
        names: every leaf's dotted name, in the sample's order.
        none: leaves that are ``None`` (handed back as ``None``).
        other: non-numeric leaves (strings, objects): a queue buffer keeps them, a replay buffer cannot.
        length: the sample's length on axis 0 (time), ``T``.
        shapes: each stored leaf's ``[T, ...]`` shape and dtype (what a later ``None`` is filled with).
    """

    names: tuple[str, ...]
    none: frozenset[str]
    other: frozenset[str]
    length: int
    shapes: Mapping[str, tuple[tuple[int, ...], Any]] = field(default_factory=dict)

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
        shapes = {k: (tuple(v.shape), v.dtype) for k, v in pairs if k not in none and k not in other}
        return cls(tuple(k for k, _ in pairs), none, other, lengths.pop(), shapes)

    @functools.cached_property
    def numeric(self) -> tuple[str, ...]:
        """The leaves Conduit stores, in order (read at every put and get: worked out once)."""
        return tuple(k for k in self.names if k not in self.none and k not in self.other)

    def leaves(self, sample: Any) -> dict[str, Any]:
        """``sample``'s leaves by dotted name, checked against this layout (``SpecError`` naming the difference).

        As SRL's replay storage does (it is laid out from the first sample): a leaf that is
        ``None`` here but stored (or under a ``None`` record) is written as zeros; a leaf the
        first sample had as ``None`` is not stored, so an array there is dropped.
        """
        flat = dict(flatten(sample))
        if tuple(flat) != self.names:
            known = set(self.names)
            extra = sorted(
                k for k in flat
                if k not in known
                and not any(k.startswith(n + ".") for n in self.none)  # under a record the first left None
                and not (flat[k] is None and any(n.startswith(k + ".") for n in known))  # a record left None
            )
            missing = [k for k in self.names if k not in flat and not _none_ancestor(k, flat)]
            if missing or extra:
                raise SpecError(
                    f"an SRL sample's fields differ from the stream's first: missing {missing}, extra {extra}"
                )
        out: dict[str, Any] = {}
        for k in self.names:
            v = flat.get(k)
            if k in self.none:
                out[k] = None
            elif v is None:
                shapes = getattr(self, "shapes", {})  # absent from a layout pickled before shapes were kept
                shape, dtype = shapes.get(k, ((self.length,), np.float32))
                out[k] = torch.zeros(shape, dtype=dtype) if isinstance(dtype, torch.dtype) else np.zeros(shape, dtype)
            else:
                out[k] = v
        return out

    def rebuild(self, leaves: Mapping[str, Any], cls: Callable[..., Any]) -> Any:
        """A ``cls`` sample from leaves by name (``None`` leaves filled in)."""
        return build([(k, None if k in self.none else leaves[k]) for k in self.names], cls)


def as_row(v: Any) -> Any:
    """One sample's leaf as a row of one (a leading axis of 1)."""
    return v.unsqueeze(0) if isinstance(v, torch.Tensor) else np.asarray(v)[None]


def stack_rows(vs: list[Any]) -> Any:
    """Samples' leaves stacked on a new leading axis (one row each)."""
    return torch.stack(vs) if isinstance(vs[0], torch.Tensor) else np.stack(vs)
