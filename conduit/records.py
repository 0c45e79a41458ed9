"""Nested records <-> the buffer's flat fields, and batching sequence samples time-major.

Conduit stores flat fields. A sample that nests -- a mapping of mappings, or a record
type with ``keys()`` / ``items()`` such as SRL's ``NamedArray`` (``obs`` itself a record,
``analyzed_result.ret`` ...) -- is flattened to dotted names (:func:`flatten_record`) and rebuilt
with the same nesting by the record class the consumer wants (:func:`build_record`). Leaves are
arrays or tensors, or ``None``.

Sequence samples (every leaf ``[T, ...]``, time on axis 0, as actors post them) are
batched on axis 1: ``B`` samples become one time-major ``[T, B, ...]`` sample.
:class:`RecordLayout` records a stream's first sample's structure; every later sample must
match it, except where a stream may legitimately differ: a leaf or a whole record
``None`` in some samples (zero-filled, as an aggregation of such samples fills it;
:func:`unify_records` / :func:`conform_record` for a batch formed at once).

A record is told from a leaf by its type, never by a ``shape`` attribute: SRL's
``NamedArray`` has a ``shape`` property too. Used by the SRL adapter; usable by any
workload whose samples nest (:mod:`conduit.ext` exports it).
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from conduit import SpecError

__all__ = [
    "RecordLayout", "as_row", "build_record", "conform_record", "flatten_record", "is_numeric_leaf", "is_record",
    "stack_rows", "stack_time_major", "unify_records",
]


def is_record(v: Any) -> bool:
    """Whether ``v`` is a nested record (a mapping, or a record type such as SRL's ``NamedArray``), not a leaf.

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


def unify_records(flats: Sequence[Mapping[str, Any]]) -> list[str]:
    """The leaf names of samples laid out as the first one, which may differ where a nested field is ``None``.

    An actor's sample leaves a whole record ``None`` (``info``, ``policy_state``) at steps
    where others hold it; an aggregation then fills zeros of the others' shapes. The
    first sample's fields name the result (as SRL's aggregation takes them), in their most
    detailed form: a ``None`` name is replaced by the children others have there. A field
    only later samples have is left out; one a later sample lacks raises ``SpecError``.
    """
    first = tuple(flats[0])
    if all(tuple(f) == first for f in flats[1:]):  # the common case: every sample has the same fields
        return list(first)
    holes = [k for k in first if flats[0][k] is None]  # where the first sample left a record None
    names: list[str] = []
    for flat in flats:
        for k in flat:
            if k not in names and (k in flats[0] or any(k.startswith(h + ".") for h in holes)):
                names.append(k)
    names = [k for k in names if not any(o.startswith(k + ".") for o in names)]
    for flat in flats:
        missing = [k for k in names if k not in flat and not _none_ancestor(k, flat)]
        if missing:
            raise SpecError(f"a sample lacks fields {missing} that other samples of the stream have")
    return names


def conform_record(flat: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """``flat``'s leaves under ``names``: a leaf under a ``None`` record is ``None``."""
    out: dict[str, Any] = {}
    for k in names:
        if k in flat:
            out[k] = flat[k]
        elif _none_ancestor(k, flat):
            out[k] = None
        else:
            raise SpecError(f"a sample lacks field {k!r} that the stream's first sample has")
    return out


#: whether a value of a type is a nested record (:func:`is_record`), by type: flatten runs per sample and per get
_RECORD: dict[type, bool] = {}


def flatten_record(sample: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``[(dotted name, leaf)]`` of a nested record, in its own field order."""
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
            record = _RECORD[type(v)] = is_record(v)
        if record:
            out += flatten_record(v, f"{prefix}{k}.")
        else:
            out.append((prefix + k if prefix else k, v))
    return out


def build_record(pairs: Sequence[tuple[str, Any]], cls: Callable[..., Any]) -> Any:
    """A nested ``cls`` (a record class taking fields as keywords: ``dict``, a ``NamedArray``) from
    ``[(dotted name, leaf)]``."""
    top: dict[str, Any] = {}
    groups: dict[str, list[tuple[str, Any]]] = {}
    for name, v in pairs:
        head, dot, rest = name.partition(".")
        if dot:
            groups.setdefault(head, []).append((rest, v))
        else:
            top[head] = v
    for head, sub in groups.items():
        top[head] = build_record(sub, cls)
    return cls(**top)


def is_numeric_leaf(v: Any) -> bool:
    """A leaf Conduit can store: a numeric or bool array, or a tensor."""
    if type(v) is np.ndarray:
        return v.dtype.kind in "biufc"
    return isinstance(v, torch.Tensor) or (isinstance(v, np.ndarray) and v.dtype.kind in "biufc")


@dataclass(frozen=True)
class RecordLayout:
    """The structure of a stream's samples, learned from the first one.

    Attributes:
        names: every leaf's dotted name, in the sample's order.
        none: leaves that are ``None`` (handed back as ``None``).
        other: non-numeric leaves (strings, objects): a queue keeps them, a replay buffer cannot.
        length: the sample's length on axis 0 (time), ``T``.
        shapes: each stored leaf's ``[T, ...]`` shape and dtype (what a later ``None`` is filled with).
    """

    names: tuple[str, ...]
    none: frozenset[str]
    other: frozenset[str]
    length: int
    shapes: Mapping[str, tuple[tuple[int, ...], Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, sample: Any) -> RecordLayout:
        pairs = flatten_record(sample)
        if not pairs:
            raise SpecError("a sample with no fields")
        none = frozenset(k for k, v in pairs if v is None)
        other = frozenset(k for k, v in pairs if v is not None and not is_numeric_leaf(v))
        flat = [k for k, v in pairs if k not in none and k not in other and getattr(v, "ndim", 0) < 1]
        if flat:
            raise SpecError(f"fields {flat}: every array of a sequence sample has a time axis (axis 0), these lack one")
        lengths = {int(v.shape[0]) for k, v in pairs if k not in none and getattr(v, "ndim", 0) >= 1}
        if len(lengths) != 1:
            raise SpecError(
                f"a sequence sample's fields must share their length on axis 0 (time), got {sorted(lengths)}"
            )
        shapes = {k: (tuple(v.shape), v.dtype) for k, v in pairs if k not in none and k not in other}
        return cls(tuple(k for k, _ in pairs), none, other, lengths.pop(), shapes)

    @functools.cached_property
    def numeric(self) -> tuple[str, ...]:
        """The leaves Conduit stores, in order (read at every put and get: worked out once)."""
        return tuple(k for k in self.names if k not in self.none and k not in self.other)

    def leaves(self, sample: Any) -> dict[str, Any]:
        """``sample``'s leaves by dotted name, checked against this layout (``SpecError`` naming the difference).

        As a storage laid out from the first sample does (SRL's replay storage): a leaf that is
        ``None`` here but stored (or under a ``None`` record) is written as zeros; a leaf (or
        record) the first sample had as ``None`` is not stored, so what is there later is
        dropped; an array of another dtype, or of a shape that broadcasts to the stored one, is
        written as numpy's assignment writes it (cast, broadcast).
        """
        flat = dict(flatten_record(sample))
        if tuple(flat) != self.names:
            known = set(self.names)
            extra = sorted(
                k for k in flat
                if k not in known
                and not any(k.startswith(n + ".") for n in self.none)  # under a record the first left None
                and not (flat[k] is None and any(n.startswith(k + ".") for n in known))  # a record left None
            )
            missing = [k for k in self.names if k not in flat and k not in self.none and not _none_ancestor(k, flat)]
            if missing or extra:
                raise SpecError(
                    f"a sample's fields differ from the stream's first: missing {missing}, extra {extra}"
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
            elif k == self.numeric[0]:  # the sample's length is its first stored field's, as SRL's length(0) reads
                out[k] = self._conformed(k, v, broadcast=False)  # it: the caller checks it, never stretched
            else:
                out[k] = self._conformed(k, v)
        return out

    def _conformed(self, name: str, v: Any, broadcast: bool = True) -> Any:
        """An array as the stored leaf ``name`` holds it (numpy's assignment: cast, and broadcast)."""
        if type(v) is not np.ndarray:
            return v
        shape, dtype = getattr(self, "shapes", {}).get(name, (None, None))
        if not isinstance(dtype, np.dtype) or (v.dtype == dtype and v.shape == shape):
            return v
        if v.dtype != dtype and v.dtype.kind in "biufc":
            v = v.astype(dtype)
        if broadcast and v.shape != shape:
            try:
                v = np.broadcast_to(v, shape)
            except ValueError:  # (the caller's checks name what is wrong: a length, a shape)
                pass
        return v

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: plain values, so it loads whatever module this class lives in."""
        return {"names": self.names, "none": self.none, "other": self.other, "length": self.length,
                "shapes": dict(getattr(self, "shapes", {}))}

    @classmethod
    def from_state(cls, state: Mapping[str, Any] | RecordLayout) -> RecordLayout:
        """The layout :meth:`state` kept (a layout object pickled as itself is taken as it is)."""
        return state if isinstance(state, RecordLayout) else cls(**state)

    def rebuild(self, leaves: Mapping[str, Any], cls: Callable[..., Any]) -> Any:
        """A ``cls`` sample from leaves by name (``None`` leaves filled in)."""
        return build_record([(k, None if k in self.none else leaves[k]) for k in self.names], cls)


def as_row(v: Any) -> Any:
    """One sample's leaf as a row of one (a leading axis of 1)."""
    return v.unsqueeze(0) if isinstance(v, torch.Tensor) else np.asarray(v)[None]


def stack_rows(vs: list[Any]) -> Any:
    """Samples' leaves stacked on a new leading axis (one row each)."""
    return torch.stack(vs) if isinstance(vs[0], torch.Tensor) else np.stack(vs)


def stack_time_major(
    samples: Sequence[Any], take: Callable[[dict[str, tuple[tuple[int, ...], torch.dtype]]], dict[str, torch.Tensor]]
) -> tuple[list[str], dict[str, Any], dict[str, torch.Tensor]]:
    """``B`` nested samples of ``[T, ...]`` stacked on axis 1 into one time-major ``[T, B, ...]`` sample.

    Returns the leaf names (:func:`unify_records`: a record left ``None`` in some samples contributes its leaves,
    zero-filled there), the leaves that are not numeric (``None`` where every sample has ``None``, else stacked
    numpy objects), and the numeric leaves written once into memory ``take`` hands out for
    ``{name: (shape, dtype)}`` (a staging allocator). :func:`build_record` nests the result again.
    """
    fast = _uniform_columns(samples)
    if fast is not None:
        return _stack_uniform(*fast, take)
    return _stack_general(samples, take)


def _stack_general(
    samples: Sequence[Any], take: Callable[[dict[str, tuple[tuple[int, ...], torch.dtype]]], dict[str, torch.Tensor]]
) -> tuple[list[str], dict[str, Any], dict[str, torch.Tensor]]:
    """:func:`stack_time_major` for any samples: flattened one by one, fields unified, leaves stacked."""
    raw = [dict(flatten_record(x)) for x in samples]
    names = unify_records(raw)
    key = tuple(names)
    flats = [f if tuple(f) == key else conform_record(f, names) for f in raw]
    numeric: dict[str, list[Any]] = {}
    leaves: dict[str, Any] = {}
    for k in names:
        vals = [f[k] for f in flats]
        present = [v for v in vals if v is not None]
        if not present:
            leaves[k] = None
            continue
        if len(present) < len(vals):  # the samples missing a field get zeros of its shape
            vals = [np.zeros_like(present[0]) if v is None else v for v in vals]
        vals = [v.astype(v.dtype.newbyteorder("=")) if type(v) is np.ndarray and not v.dtype.isnative else v
                for v in vals]  # (torch reads native byte order only)
        if _same_numeric(vals) or all(is_numeric_leaf(v) for v in vals):
            numeric[k] = vals
        else:
            leaves[k] = np.stack([np.asarray(v) for v in vals], axis=1)
    blocks = take({k: _time_major_shape(vals) for k, vals in numeric.items()}) if numeric else {}
    for k, vals in numeric.items():
        if all(isinstance(v, np.ndarray) for v in vals) and blocks[k].dtype is not torch.bfloat16:
            np.stack(vals, axis=1, out=blocks[k].numpy())  # numpy's stack: less per-sample overhead
        else:
            torch.stack([torch.as_tensor(v) for v in vals], dim=1, out=blocks[k])
    return names, leaves, blocks


def _record_nodes(sample: Any, prefix: str = "") -> list[tuple[str, tuple[str, ...]]] | None:
    """Every nested record of ``sample`` as ``(dotted path, its field names)``, when each is an attribute record
    (a ``NamedArray``: ``_fields`` a tuple); else None."""
    fields = getattr(sample, "_fields", None)
    if type(fields) is not tuple:
        return None
    nodes = [(prefix, fields)]
    for k in fields:
        v = getattr(sample, k)
        if v is None or type(v) is np.ndarray:
            continue
        record = _RECORD.get(type(v))
        if record is None:
            record = _RECORD[type(v)] = is_record(v)
        if record:
            sub = _record_nodes(v, f"{prefix}{k}.")
            if sub is None:
                return None
            nodes += sub
    return nodes


def _uniform_columns(samples: Sequence[Any]) -> tuple[list[str], dict[str, list[Any]]] | None:
    """The common case of :func:`stack_time_major`, read column by column at C speed: every sample an attribute
    record of the first one's structure (the same fields at every level), every leaf either ``None`` in all
    samples or a numeric array of one dtype and shape in all. Returns the leaf names and their columns, or
    None for anything else (the general path then decides, with its errors)."""
    nodes = _record_nodes(samples[0])
    if nodes is None:
        return None
    try:
        for path, fields in nodes:
            got = map(operator.attrgetter(path + "_fields"), samples) if path else map(_FIELDS, samples)
            if not all(map(operator.eq, itertools.repeat(fields), got)):
                return None
        names = [k for k, _ in flatten_record(samples[0])]
        columns = {k: list(map(operator.attrgetter(k), samples)) for k in names}
    except AttributeError:
        return None
    for col in columns.values():
        kinds = set(map(type, col))
        if kinds == {type(None)}:
            continue
        if kinds != {np.ndarray} or len(set(map(_DTYPE, col))) != 1 or len(set(map(_SHAPE, col))) != 1:
            return None
        if col[0].dtype.kind not in "biufc" or col[0].ndim < 1 or not col[0].dtype.isnative:
            return None
    return names, columns


def _stack_uniform(
    names: list[str], columns: dict[str, list[Any]],
    take: Callable[[dict[str, tuple[tuple[int, ...], torch.dtype]]], dict[str, torch.Tensor]],
) -> tuple[list[str], dict[str, Any], dict[str, torch.Tensor]]:
    """:func:`stack_time_major` for :func:`_uniform_columns`' columns: each block filled by one numpy assignment of
    the whole list (no per-sample view, as ``np.stack`` makes)."""
    leaves: dict[str, Any] = {k: None for k, col in columns.items() if col[0] is None}
    numeric = {k: col for k, col in columns.items() if col[0] is not None}
    specs = {}
    for k, col in numeric.items():
        first = col[0]
        specs[k] = ((first.shape[0], len(col), *first.shape[1:]), torch.from_numpy(first[:0]).dtype)
    blocks = take(specs) if specs else {}
    for k, col in numeric.items():
        block = blocks[k]
        if block.dtype is torch.bfloat16:  # (no numpy view of a bfloat16 block)
            torch.stack([torch.as_tensor(v) for v in col], dim=1, out=block)
        else:
            block.numpy().swapaxes(0, 1)[...] = col
    return names, leaves, blocks


_FIELDS, _DTYPE, _SHAPE = operator.attrgetter("_fields"), operator.attrgetter("dtype"), operator.attrgetter("shape")


def _same_numeric(vals: list[Any]) -> bool:
    """Whether every value is a numeric numpy array of the first one's dtype (the common case, checked cheaply)."""
    first = vals[0]
    if type(first) is not np.ndarray or first.dtype.kind not in "biufc":
        return False
    d = first.dtype
    return all(type(v) is np.ndarray and v.dtype == d for v in vals)


def _time_major_shape(vals: list[Any]) -> tuple[tuple[int, ...], torch.dtype]:
    """The ``[T, B, ...]`` block's shape and dtype: the samples' dtypes promoted as ``np.stack`` promotes them (SRL's
    own stacking), so a later sample of a wider dtype is never narrowed into the first one's."""
    first = torch.as_tensor(vals[0])
    if first.dim() < 1:
        raise SpecError("every array of a sequence sample has a time axis (axis 0)")
    dtype = first.dtype
    if not _same_numeric(vals):
        dtypes = [v.dtype if isinstance(v, np.ndarray) else torch.as_tensor(v).dtype for v in vals]
        if torch.bfloat16 in dtypes:  # (no numpy dtype: torch's promotion)
            dtype = functools.reduce(torch.promote_types, (torch.as_tensor(v).dtype for v in vals))
        else:  # numpy's promotion, tensors among them (as np.stack would promote their arrays)
            as_np = [d if isinstance(d, np.dtype) else torch.empty(0, dtype=d).numpy().dtype for d in dtypes]
            dtype = torch.from_numpy(np.empty(0, np.result_type(*as_np))).dtype
    return (int(first.shape[0]), len(vals), *first.shape[1:]), dtype
