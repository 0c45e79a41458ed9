"""Units for topology files: bytes and bytes/s inside, readable units outside.

No dependency. Every quantity Conduit computes with is in **bytes** (memory) and **bytes per
second** (bandwidth). Topology files may instead use suffixed keys so that a
person can read and write them:

============================  =====================================  =============
key suffix                    meaning                                example
============================  =====================================  =============
``<name>_gb_per_s``           GB/s, 10**9 bytes per second           ``72``
``<name>_gib``                GiB, 2**30 bytes (stored as ``_bytes``)  ``64``
``<name>_gb``                 GB, 10**9 bytes (stored as ``_bytes``)   ``2000``
============================  =====================================  =============

So ``host_to_gpu_gb_per_s: 72`` is ``host_to_gpu: 72e9`` and
``host_memory_gib: 512`` is ``host_memory_bytes: 549755813888``. Bandwidths are
never written in bits per second (a 200 Gb/s InfiniBand port is 25 GB/s).
Values may be scalars, lists or lists of lists; every number is scaled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "GB",
    "GIB",
    "MIB",
    "expand_unit_keys",
    "format_bandwidth",
    "format_bytes",
]

GB: int = 10**9
"""One gigabyte (SI), the unit of the ``_gb`` and ``_gb_per_s`` suffixes."""
GIB: int = 2**30
"""One gibibyte, the unit of the ``_gib`` suffix."""
MIB: int = 2**20

# suffix -> (replacement suffix, factor, round to int)
_SUFFIXES: tuple[tuple[str, str, int, bool], ...] = (
    ("_gb_per_s", "", GB, False),
    ("_gib", "_bytes", GIB, True),
    ("_gb", "_bytes", GB, True),
)


def _scale(value: Any, factor: int, to_int: bool, key: str) -> Any:
    if value is None:
        return None  # "not given" (e.g. the diagonal of gpu_to_gpu) stays not given
    if isinstance(value, bool):
        raise ValueError(f"{key}: expected a number or a list of numbers, received {value!r}")
    if isinstance(value, (int, float)):
        scaled = value * factor
        return round(scaled) if to_int else float(scaled)
    if isinstance(value, (list, tuple)):
        return [_scale(v, factor, to_int, key) for v in value]
    raise ValueError(f"{key}: expected a number or a list of numbers, received {value!r}")


def expand_unit_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """Rewrite suffixed keys of one mapping into canonical byte units.

    ``{"host_memcpy_gb_per_s": 20}`` becomes ``{"host_memcpy": 2e10}``. A key
    given both ways (``host_memcpy`` and ``host_memcpy_gb_per_s``) is an error
    that names both. Nested mappings are left alone: each model expands its own.
    """
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, value in data.items():
        target, scaled = key, value
        for suffix, replacement, factor, to_int in _SUFFIXES:
            if isinstance(key, str) and key.endswith(suffix):
                target = key[: -len(suffix)] + replacement
                scaled = _scale(value, factor, to_int, key)
                break
        if target in out:
            raise ValueError(f"{target}: given twice (as {origin[target]!r} and as {key!r}); expected one of them")
        out[target] = scaled
        origin[target] = key
    return out


def format_bytes(n: float) -> str:
    """``81_920_000_000 -> '76.3 GiB'`` (binary units, for messages and tables)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024.0 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024.0
    raise AssertionError("unreachable")


def format_bandwidth(bytes_per_s: float) -> str:
    """``7.2e10 -> '72.0 GB/s'`` (SI, as interconnects are quoted)."""
    if bytes_per_s == float("inf"):
        return "inf"
    return f"{bytes_per_s / GB:.1f} GB/s"
