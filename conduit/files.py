"""One reader for the JSON and YAML files users hand Conduit (topologies, workload configs), and a safe
opener for the files Conduit reads back from a directory it wrote (checkpoints).

PyYAML earns its place: the shipped topologies are YAML, commented as people
write them. Every failure is the caller's error class with the file named and
what is wrong with it (cannot be read, not valid YAML at which line, not a
mapping), never a parser's traceback.

A directory Conduit wrote holds plain files with plain names, and nothing else:
:func:`open_regular` opens one only where it is a regular file (never a symbolic
link, which might lead out of the directory or to ``/dev/zero``; never a FIFO or a
device, which would block or never end), without following a link and without
blocking, so whatever was put in its place fails at once with the caller's error.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from conduit.errors import ConfigError

__all__ = ["file_format", "file_kind", "open_regular", "plain_name", "read_mapping", "read_regular"]


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


def plain_name(name: object) -> bool:
    """Whether ``name`` names a file directly inside a directory: no folder part, no ``..``, not absolute."""
    return (
        isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")
    )


def file_kind(mode: int) -> str:
    """What ``mode`` (``st_mode``) says the file is, in words."""
    for test, kind in (
        (stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def open_regular(path: Path, error: type[Exception], hint: str = "") -> tuple[BinaryIO, int]:
    """``path`` opened for reading and its size, where it is a regular file (see the module docstring);
    else ``error`` naming it and what it is instead (``hint`` appended: what to do)."""
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        raise error(f"{path} is missing{hint}") from None
    except OSError as e:
        raise error(f"{path} cannot be read ({e.strerror or e}){hint}") from None
    if not stat.S_ISREG(before.st_mode):
        where = f" to {os.readlink(path)}" if stat.S_ISLNK(before.st_mode) else ""
        raise error(f"{path} is {file_kind(before.st_mode)}{where}, not a regular file{hint}")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)  # swapped since the lstat: a link fails (O_NOFOLLOW), a FIFO does not block
    except OSError as e:
        raise error(f"{path} cannot be opened as a regular file ({e.strerror or e}){hint}") from None
    now = os.fstat(fd)
    if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
        os.close(fd)
        raise error(f"{path} was replaced while being opened ({file_kind(now.st_mode)}){hint}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), now.st_size


def read_regular(path: Path, limit: int, error: type[Exception], hint: str = "") -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_regular`), refused beyond ``limit`` bytes."""
    f, size = open_regular(path, error, hint)
    with f:
        if size > limit:
            raise error(f"{path} holds {size} bytes, more than the {limit} such a file ever holds{hint}")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise error(f"{path} grew past {limit} bytes while being read{hint}")
    return data
