"""A topology file's validation errors in the file's own words: its keys, its units, each problem once.

The models validate canonical keys in bytes and bytes/s (:mod:`conduit.placement.units`
rewrites ``host_memory_gib: 512`` to ``host_memory_bytes``), and a per-GPU scalar is
repeated per GPU before validation; pydantic's errors speak of what it validated. This
module maps each error back to the key the file wrote, the value as written, and
says a problem of a repeated scalar once. For a key the models do not know, it
names the closest valid key and lists them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from conduit.errors import suggest

__all__ = ["explain_file_errors"]


_UNITLESS = ("name", "description", "notes", "nodes")  # keys written as they are named, with no unit


def _spellings(field: str) -> list[str]:
    """The keys a file may write for canonical ``field``: unit-suffixed first."""
    if field in _UNITLESS:
        return [field]
    if field.endswith("_bytes"):
        base = field.removesuffix("_bytes")
        return [f"{base}_gib", f"{base}_gb", field]
    return [f"{field}_gb_per_s", field]


def _written(raw: Mapping[str, Any] | None, field: str) -> tuple[str, Any] | None:
    """The key ``raw`` wrote for canonical ``field`` and its value as written, if any."""
    if raw is None:
        return None
    for key in _spellings(field):
        if key in raw:
            return key, raw[key]
    return None


def _valid_keys(model: type[BaseModel], extra: tuple[str, ...] = ()) -> list[str]:
    keys = set(extra)
    for name in model.model_fields:
        if name.startswith("_"):
            continue
        spellings = _spellings(name)
        keys.update(spellings[:1])
    return sorted(keys)


def explain_file_errors(
    error: ValidationError,
    what: str,
    raw: Mapping[str, Any],
    model: type[BaseModel],
    nested: Mapping[str, type[BaseModel]] | None = None,
) -> str:
    """One line per problem, in the file's keys and units, each said once.

    ``raw``: the mapping as the file (or caller) wrote it; ``nested``: list fields of ``model``
    whose items are models of their own (a topology's ``nodes``).
    """
    lines: list[str] = []
    for item in error.errors():
        loc = tuple(item.get("loc", ()))
        msg = str(item.get("msg", "")).removeprefix("Value error, ")
        owner, where, scope = model, "", raw
        inner = (nested or {}).get(str(loc[0])) if loc else None
        if inner is not None and len(loc) >= 2 and isinstance(loc[1], int):
            items = raw.get(str(loc[0]))
            scope = items[loc[1]] if isinstance(items, list) and loc[1] < len(items) else None
            owner, where, loc = inner, f"{loc[0]}[{loc[1]}].", loc[2:]
        if not loc:
            if msg.startswith("invalid ") and "\n" in msg:  # a nested model's own report: re-root its lines
                lines += [f"{where}{sub.strip()}" for sub in msg.splitlines()[1:]]
            else:
                lines.append(f"{where}{msg}")
            continue
        field, rest = str(loc[0]), loc[1:]
        written = _written(scope if isinstance(scope, Mapping) else None, field)
        key = written[0] if written else _spellings(field)[0]
        if item.get("type") == "extra_forbidden":
            valid = _valid_keys(owner, ("gpus",) if "gpu_memory_bytes" in owner.model_fields else ())
            lines.append(f"{where}{key}: not a known key; {suggest(key, valid, 'valid keys')}")
            continue
        if item.get("type") == "missing":
            lines.append(f"{where}{key}: required, not given; add it to the file")
            continue
        value = written[1] if written else item.get("input")
        if rest and isinstance(value, (list, tuple)):
            for index in rest:  # a list the file wrote: point into it
                if isinstance(value, (list, tuple)) and isinstance(index, int) and index < len(value):
                    key, value = f"{key}[{index}]", value[index]
        line = f"{where}{key}: {msg}"
        if item.get("type") != "value_error" and not isinstance(value, (dict, list, tuple)):
            line += f" (received {value!r})"
        if line not in lines:  # a scalar the file wrote once, repeated per GPU: one problem
            lines.append(line)
    return "\n".join([f"invalid {what}:", *("  " + line for line in lines)])
