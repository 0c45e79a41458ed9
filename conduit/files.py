"""One reader for the JSON and YAML files users hand Conduit (topologies, workload configs).

PyYAML earns its place: the shipped topologies are YAML, commented as people
write them. Every failure is the caller's error class with the file named and
what is wrong with it (cannot be read, not valid YAML at which line, not a
mapping), never a parser's traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from conduit.errors import ConfigError

__all__ = ["file_format", "read_mapping"]


def file_format(path: Path, what: str, error: type[Exception] = ConfigError) -> str:
    """``json`` or ``yaml`` by the file's extension; anything else is ``error``."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    raise error(f"{what} {str(path)!r}: expected a .json, .yaml or .yml extension, received {suffix!r}")


def read_mapping(path: str | Path, what: str, error: type[Exception] = ConfigError) -> dict[str, Any]:
    """The mapping at the top of a JSON or YAML file (raises ``error`` naming ``what`` and the file)."""
    p = Path(path)
    fmt = file_format(p, what, error)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise error(f"{what} {str(p)!r}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise error(f"{what} {str(p)!r}: not a text file (expected UTF-8 JSON or YAML)") from None
    try:
        data = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise error(f"{what} {str(p)!r}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"{what} {str(p)!r}: not valid YAML ({where}{problem})") from None
    if not isinstance(data, dict):
        raise error(f"{what} {str(p)!r}: expected a mapping at the top level, received {type(data).__name__}")
    return data
