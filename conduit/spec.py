"""The experience spec: field names, trailing shapes, dtypes, bytes per sample.

Data moving through Conduit is a mapping ``field -> tensor`` with a leading batch
dimension. The spec is declared up front or inferred from the first write; every
later write is checked against it *before* anything is stored, so a bad write
raises :class:`~conduit.errors.SpecError` and leaves the buffer untouched.

numpy arrays are accepted and converted without a copy (``torch.from_numpy``);
dtypes that ``torch.can_cast`` allows are cast when every value survives the cast
(an integer within the target's range, a finite float still finite), anything
else is rejected — or clamped into range where the field says ``clamp=True``.
Only dense tensors are accepted, and a tensor that requires grad is stored
detached: data, never its autograd history.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from conduit.errors import SpecError

__all__ = [
    "Data",
    "ExperienceSpec",
    "FieldSpec",
    "SpecHolder",
    "as_tensors",
    "batch_size_of",
    "rows_of",
]

#: What users may hand Conduit: a mapping of field name to tensor or array.
Data = Mapping[str, torch.Tensor | np.ndarray]

_DTYPE_NAMES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
        torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
    )
}


def dtype_from_name(name: str | torch.dtype) -> torch.dtype:
    """``"float32"`` / ``"torch.float32"`` / ``torch.float32`` -> ``torch.float32``."""
    if isinstance(name, torch.dtype):
        return name
    key = name.removeprefix("torch.")
    if key not in _DTYPE_NAMES:
        raise SpecError(f"unknown dtype {name!r}; expected one of {sorted(_DTYPE_NAMES)}")
    return _DTYPE_NAMES[key]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class FieldSpec:
    """One field: trailing shape (without the batch dimension) and dtype.

    ``growable`` marks a field whose trailing shape may grow during a run
    (longer sequences, larger observations); growth triggers re-layout instead
    of a :class:`SpecError`. ``finite`` rejects NaN/inf values and
    ``contiguous`` rejects non-contiguous tensors (otherwise copied as needed).
    ``clamp`` clamps values a cast would not keep (an int64 beyond int32's range,
    a float64 beyond float16's) into the target's range instead of rejecting them.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    growable: bool = False
    finite: bool = False
    contiguous: bool = False
    clamp: bool = False

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise SpecError(f"field name must be a non-empty string, got {self.name!r}")
        if any((not isinstance(s, int)) or s < 0 for s in self.shape):
            raise SpecError(f"field {self.name!r}: shape must be non-negative ints, got {self.shape!r}")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes_per_sample(self) -> int:
        return self.numel * _itemsize(self.dtype)

    def to_json(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape), "dtype": dtype_name(self.dtype), "growable": self.growable,
            "finite": self.finite, "contiguous": self.contiguous, "clamp": self.clamp,
        }

    @classmethod
    def from_json(cls, name: str, d: Mapping[str, Any]) -> FieldSpec:
        return cls(
            name, tuple(int(s) for s in d["shape"]), dtype_from_name(d["dtype"]), bool(d.get("growable", False)),
            bool(d.get("finite", False)), bool(d.get("contiguous", False)), bool(d.get("clamp", False)),
        )

    def cast(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (of a dtype ``torch.can_cast`` allows) as this field's dtype, every value kept (or clamped).

        Raises :class:`SpecError` naming the field, the values that do not fit and the target's range.
        """
        dst = self.dtype
        if dst.is_floating_point or dst.is_complex:
            out = t.to(dst)
            lost = torch.isfinite(t) & ~torch.isfinite(out) if t.dtype != torch.bool else None
            if lost is not None and bool(lost.any()):
                top = torch.finfo(dst).max
                if self.clamp and not t.is_complex():
                    return t.clamp(-top, top).to(dst)
                raise SpecError(
                    f"field {self.name!r}: {int(lost.sum())} {dtype_name(t.dtype)} value(s) overflow "
                    f"{dtype_name(dst)} (it holds ±{top:.4g}), e.g. {_first(t, lost)}; cast the data yourself, "
                    "or declare the field with clamp=True"
                )
            return out
        if t.dtype == torch.bool or dst == torch.bool or t.numel() == 0:
            return t.to(dst)
        info = torch.iinfo(dst)
        lo, hi = _int_range(t)
        if lo < info.min or hi > info.max:
            if self.clamp:
                return torch.from_numpy(np.clip(_numpy(t), info.min, info.max)).to(t.device).to(dst)
            bad = (lo if lo < info.min else hi)
            raise SpecError(
                f"field {self.name!r}: {dtype_name(t.dtype)} values {lo}..{hi} do not fit {dtype_name(dst)} "
                f"({info.min}..{info.max}), e.g. {bad} would be stored as {_wrapped(bad, dst)}; cast the data "
                "yourself, or declare the field with clamp=True"
            )
        return t.to(dst)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _int_range(t: torch.Tensor) -> tuple[int, int]:
    """Smallest and largest value of a non-empty integer tensor, as Python ints (numpy: torch lacks uint64 min/max)."""
    a = _numpy(t)
    return int(a.min()), int(a.max())


def _wrapped(value: int, dtype: torch.dtype) -> int:
    """What a plain cast would store for ``value``: its low bits, as two's complement."""
    bits = torch.iinfo(dtype).bits
    v = value & ((1 << bits) - 1)
    return v - (1 << bits) if dtype != torch.uint8 and v >= 1 << (bits - 1) else v


def _first(t: torch.Tensor, mask: torch.Tensor) -> float:
    return float(t[mask].flatten()[0])


@dataclass(frozen=True)
class ExperienceSpec:
    """The field layout of every transition in a buffer."""

    fields: Mapping[str, FieldSpec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.fields:
            raise SpecError("an experience spec needs at least one field")
        for name, f in self.fields.items():
            if name != f.name:
                raise SpecError(f"field key {name!r} does not match FieldSpec.name {f.name!r}")
        # derived once: every push reads them (a property would walk the fields on every push)
        object.__setattr__(self, "_growable", any(f.growable for f in self.fields.values()))
        object.__setattr__(
            self, "_fast", None if any(f.finite or f.contiguous for f in self.fields.values())
            else tuple((name, f.dtype, len(f.shape) + 1, torch.Size(f.shape)) for name, f in self.fields.items()),
        )

    # -- construction -------------------------------------------------------
    @classmethod
    def of(cls, **fields: tuple[tuple[int, ...], torch.dtype | str] | FieldSpec) -> ExperienceSpec:
        """``ExperienceSpec.of(obs=((4,), "float32"), action=((), torch.int64))``."""
        out: dict[str, FieldSpec] = {}
        for name, f in fields.items():
            if isinstance(f, FieldSpec):
                out[name] = replace(f, name=name)
            else:
                shape, dt = f
                out[name] = FieldSpec(name, tuple(shape), dtype_from_name(dt))
        return cls(out)

    @classmethod
    def infer(cls, data: Data, growable: frozenset[str] = frozenset()) -> ExperienceSpec:
        """The spec of a batch: trailing shapes and dtypes of its fields."""
        tensors = as_tensors(data)
        batch_size_of(tensors)  # checks leading dims agree
        return cls(
            {
                k: FieldSpec(k, tuple(t.shape[1:]), t.dtype, k in growable)
                for k, t in tensors.items()
            }
        )

    # -- properties ---------------------------------------------------------
    @property
    def bytes_per_sample(self) -> int:
        return sum(f.bytes_per_sample for f in self.fields.values())

    @property
    def has_growable(self) -> bool:
        return self._growable  # type: ignore[attr-defined,no-any-return]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.fields)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.fields.values())

    def __len__(self) -> int:
        return len(self.fields)

    def __getitem__(self, name: str) -> FieldSpec:
        return self.fields[name]

    def to_json(self) -> dict[str, Any]:
        return {name: f.to_json() for name, f in self.fields.items()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ExperienceSpec:
        return cls({name: FieldSpec.from_json(name, v) for name, v in d.items()})

    def describe(self) -> str:
        parts = [f"{f.name}: {dtype_name(f.dtype)}{list(f.shape)}" for f in self]
        return "{" + ", ".join(parts) + f"}} ({self.bytes_per_sample} B/sample)"

    # -- validation ---------------------------------------------------------
    def validate(self, data: Data, *, device: torch.device | None = None) -> dict[str, torch.Tensor]:
        """Check ``data`` against the spec; return tensors cast to the spec's dtypes.

        Raises :class:`SpecError` naming the field, the expected and the received
        value. Never mutates ``data``. A growable field may arrive with a larger
        trailing shape; the caller (the buffer) decides how to grow.
        """
        if not isinstance(data, Mapping):
            raise SpecError(f"a write must be a mapping of field -> tensor, got {type(data).__name__}")
        fast = self._fast_path(data, device)
        if fast is not None:
            return fast
        missing = [k for k in self.fields if k not in data]
        extra = [k for k in data if k not in self.fields]
        if missing or extra:
            raise SpecError(
                f"fields do not match the experience spec: missing {missing}, unexpected {extra}; "
                f"expected exactly {list(self.fields)}"
            )
        tensors = as_tensors(data)
        n = batch_size_of(tensors)
        if n == 0:
            raise SpecError("empty write: the leading (batch) dimension is 0 for every field")
        out: dict[str, torch.Tensor] = {}
        for name, f in self.fields.items():
            t = tensors[name]
            if t.layout != torch.strided:
                raise SpecError(f"field {name!r}: expected a dense tensor, received {t.layout} (call .to_dense())")
            if t.requires_grad:
                t = t.detach()  # store data, not its autograd history
            trailing = tuple(t.shape[1:])
            if trailing != f.shape:
                grows = f.growable and len(trailing) == len(f.shape)
                if not grows:
                    raise SpecError(
                        f"field {name!r}: expected trailing shape {f.shape}, received {trailing} "
                        f"(full shape {tuple(t.shape)})"
                    )
            if t.dtype != f.dtype:
                if not torch.can_cast(t.dtype, f.dtype):
                    raise SpecError(
                        f"field {name!r}: expected dtype {dtype_name(f.dtype)}, received "
                        f"{dtype_name(t.dtype)}, which cannot be cast safely"
                    )
                t = f.cast(t)
            if t.device.type not in ("cpu", "cuda") or (
                device is not None and t.device.type != "cpu" and t.device != device
            ):
                where = f"the host or {device}" if device is not None else "the host or a GPU"
                raise SpecError(f"field {name!r}: expected a tensor on {where}, received one on {t.device}")
            if f.contiguous and not t.is_contiguous():
                raise SpecError(f"field {name!r}: expected a contiguous tensor, received strides {t.stride()}")
            if f.finite and (t.is_floating_point() or t.is_complex()):
                bad = int((~torch.isfinite(t)).sum())
                if bad:
                    raise SpecError(f"field {name!r}: expected finite values, received {bad} NaN/inf of {t.numel()}")
            out[name] = t
        return out

    def _fast_path(self, data: Mapping[str, Any], device: torch.device | None) -> dict[str, torch.Tensor] | None:
        """The common case in one pass: host/GPU tensors (or writeable numpy arrays) of exactly the declared
        shapes and dtypes, with no ``finite``/``contiguous`` checks to run.

        Returns None to fall back to the full check (which produces the error messages). This runs
        on every push, and a push of one transition is little more than its checks and five tiny
        copies, so it reads the per-field facts made once with the spec and nothing else.
        """
        fast = self._fast  # type: ignore[attr-defined]
        if fast is None or device is not None or len(data) != len(fast):
            return None
        n = -1
        out: dict[str, torch.Tensor] = {}
        for name, dtype, ndim, trailing in fast:
            t = data.get(name)
            if type(t) is not torch.Tensor:
                if type(t) is not np.ndarray or not t.flags.writeable:
                    return None
                try:
                    t = torch.from_numpy(t)  # no copy
                except (TypeError, ValueError):  # negative strides, a dtype torch lacks: the general path
                    return None
            if t.dtype != dtype or t.dim() != ndim or (ndim > 1 and t.shape[1:] != trailing):
                return None
            if t.requires_grad or t.layout is not torch.strided:
                return None  # the full check detaches, or names the layout
            rows = t.shape[0]
            if rows != n and n != -1:
                return None
            n = rows
            out[name] = t
        if n <= 0:
            return None
        for t in out.values():
            if not (t.is_cpu or t.is_cuda):
                return None
        return out

    def grown_by(self, tensors: Mapping[str, torch.Tensor]) -> ExperienceSpec | None:
        """The spec after growable fields take the elementwise max shape, or None if unchanged."""
        if not self.has_growable:
            return None
        changed: dict[str, FieldSpec] = {}
        for name, f in self.fields.items():
            trailing = tuple(tensors[name].shape[1:])
            if f.growable and trailing != f.shape:
                new_shape = tuple(max(a, b) for a, b in zip(f.shape, trailing))
                if new_shape != f.shape:
                    changed[name] = replace(f, shape=new_shape)
        if not changed:
            return None
        return ExperienceSpec({name: changed.get(name, f) for name, f in self.fields.items()})


def as_tensors(data: Data) -> dict[str, torch.Tensor]:
    """Convert a mapping of arrays/tensors to tensors without copying."""
    if not isinstance(data, Mapping):
        raise SpecError(
            f"a write must be a mapping of field -> array or tensor with a leading batch dimension, got "
            f"{type(data).__name__} (e.g. push({{'obs': obs, 'reward': reward}}))"
        )
    out: dict[str, torch.Tensor] = {}
    for k, v in data.items():
        if isinstance(v, torch.Tensor):
            out[k] = v
        elif isinstance(v, np.ndarray):
            if v.dtype.kind not in "biufc":
                raise SpecError(
                    f"field {k!r}: expected a numeric or bool array, received numpy dtype {v.dtype} "
                    "(strings, dates and objects are not experience data: encode them as numbers)"
                )
            if not v.flags.writeable or any(s < 0 for s in v.strides):
                v = np.array(v)  # torch.from_numpy needs writeable, positively strided memory
            try:
                out[k] = torch.from_numpy(v)
            except TypeError as e:  # a numeric dtype torch has no tensor type for
                raise SpecError(f"field {k!r}: numpy dtype {v.dtype} has no torch equivalent: {e}") from e
        elif isinstance(v, (list, tuple, int, float, bool, np.generic)):
            arr = np.asarray(v)
            if arr.dtype.kind not in "biufc":
                raise SpecError(
                    f"field {k!r}: expected numbers or bools, received {type(v).__name__} of numpy dtype {arr.dtype}"
                )
            try:
                out[k] = torch.as_tensor(arr)
            except (TypeError, ValueError) as e:
                raise SpecError(f"field {k!r}: cannot convert {type(v).__name__} to a tensor: {e}") from e
        else:
            raise SpecError(f"field {k!r}: expected a torch.Tensor or numpy.ndarray, received {type(v).__name__}")
        if out[k].dim() == 0:
            raise SpecError(f"field {k!r}: expected a leading batch dimension, received a scalar")
    return out


def rows_of(tensors: Mapping[str, torch.Tensor]) -> int:
    """The leading dimension of tensors that passed :meth:`ExperienceSpec.validate` (their fields agree on it)."""
    return next(iter(tensors.values())).shape[0]


def batch_size_of(tensors: Mapping[str, torch.Tensor]) -> int:
    """The common leading dimension of all fields (SpecError when they disagree)."""
    sizes = {k: int(t.shape[0]) for k, t in tensors.items()}
    if not sizes:
        raise SpecError("empty write: no fields")
    distinct = set(sizes.values())
    if len(distinct) != 1:
        raise SpecError(f"fields disagree on the leading (batch) dimension: {sizes}")
    return distinct.pop()


class SpecHolder:
    """A buffer's experience spec: declared, or inferred from the first write, and every write checked against it.

    The first write that validates defines the spec (when none was declared),
    so a later, different write is rejected even if the first one has not
    reached storage yet (overlapped ingestion).
    """

    def __init__(self, spec: ExperienceSpec | None, growable: frozenset[str]) -> None:
        self.spec = spec
        self.growable = growable
        self._lock = threading.Lock()

    def check(self, parts: Sequence[Data], commit: bool = True) -> list[dict[str, torch.Tensor]]:
        """Validate every part (inferring the spec from the first if unknown); all or nothing."""
        with self._lock:
            spec = self.spec
            out = []
            for part in parts:
                if spec is None:
                    tensors = as_tensors(part)
                    if batch_size_of(tensors) == 0:
                        raise SpecError("empty write: the leading (batch) dimension is 0 for every field")
                    spec = ExperienceSpec.infer(tensors, self.growable)
                out.append(spec.validate(part))
            if commit and self.spec is None:
                self.spec = spec
            return out
