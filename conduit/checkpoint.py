"""Checkpoints: components' ``state_dict()`` written and read atomically, and never unpickled unsafely.

Format ``conduit-checkpoint`` version 2, one directory::

    MANIFEST.json   format, version, conduit version, policy, config, spec, schedule,
                    and the sha256 and size of every other file
    <name>.pt       one component's state dict (``buffer``, ``ingestion``, ``delivery``)
    COMPLETE        written last: the sha256 of MANIFEST.json

This module knows nothing of what the components hold: the runtime
(:meth:`conduit.Conduit.state_dict`) captures them at one consistent point, and a
state dict is primitives and tensors (numpy arrays become tensors on the way out).
Every ``.pt`` file is read with ``torch.load(weights_only=True)``, which unpickles
tensors and primitive containers and nothing else: a tampered file that would run
code when loaded fails with :class:`~conduit.errors.CheckpointError` instead.

Saving is atomic: everything is written to a sibling temporary directory
(``.<name>.tmp-<pid>-<host>-<id>``), flushed to disk, then renamed into place; the
directory it replaces is first renamed aside (``.<name>.old-<id>``) and removed
only after the new one is complete. A crash at any point leaves the previous
checkpoint loadable, and never a half-written one: when the crash came between
the two renames, ``path`` is missing and :func:`load` reads the aside copy (and
says so in a warning). A later save removes what killed saves left behind
(temporaries of processes no longer alive, and aside copies).

Only a previous checkpoint is ever replaced: anything else at the path (a file, a
directory of the user's, a checkpoint holding files no save wrote) is refused with
:class:`~conduit.errors.CheckpointError` and left as it was (:func:`check_target`).
The path is resolved once, so ``..`` and symbolic links lead where they point: saving
through a link replaces the checkpoint it points to, and the link stays a link.

A checkpoint that is there but damaged is an error, never silently replaced by
an older copy: ``fallback=True`` asks for the newest aside copy instead, with a
warning naming what was skipped.

The checksums find damage; they are not a signature: anyone can edit the manifest
and write its new sha256 into ``COMPLETE``. So the loader trusts no field of it:
every file it reads is a regular file named plainly inside the directory (never a
symbolic link, FIFO or device, opened without blocking), of the recorded size,
read to its end; every ``.pt`` is a torch archive of stored entries no larger than
the file; and the manifest's types are checked. Whatever is wrong fails with
:class:`~conduit.errors.CheckpointError`, in time bounded by the files' sizes and
before anything large is allocated (:mod:`conduit.snapshot` checks the runtime's
fields, such as a capacity, against the data files).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from conduit._version import __version__
from conduit.errors import CheckpointError
from conduit.executor import process_alive
from conduit.files import file_kind, open_regular, plain_name, read_regular

__all__ = [
    "FORMAT", "VERSION", "CheckpointError", "check_target", "load", "pack", "read_manifest", "save", "unpacked",
]

log = logging.getLogger("conduit")

#: this host in temporaries' names (no dash: the name's fields are split on it)
_HOST = socket.gethostname().replace("-", "_") or "host"

FORMAT = "conduit-checkpoint"
VERSION = 2
MANIFEST = "MANIFEST.json"
COMPLETE = "COMPLETE"
#: the formats a save may replace: this one, and the distributed one (a directory of these)
FORMATS = (FORMAT, "conduit-distributed-checkpoint")
#: the most a manifest ever holds (a few kilobytes of JSON are usual), and its marker (a sha256)
MANIFEST_LIMIT = 16 << 20
MARKER_LIMIT = 1024
#: what to do about a checkpoint that fails a check
DAMAGED = " (the checkpoint is damaged, or was edited or written by something else: load another checkpoint)"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _sha256_of(f: BinaryIO, size: int) -> tuple[str, int]:
    """The sha256 of ``f``'s first ``size`` bytes, and how many it held (up to one more: it grew)."""
    h, seen = hashlib.sha256(), 0
    while seen <= size:
        chunk = f.read(min(1 << 20, size + 1 - seen))
        if not chunk:
            break
        h.update(chunk)
        seen += len(chunk)
    return h.hexdigest(), seen


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _storable(obj: Any) -> Any:
    """A state dict as ``torch.save`` can write and ``weights_only`` can read: numpy becomes tensors."""
    if isinstance(obj, Mapping):
        return {k: _storable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_storable(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_storable(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    return obj


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


# -- save -------------------------------------------------------------------------
def save(path: str | Path, manifest: Mapping[str, Any], components: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write ``components`` (name -> state dict) and ``manifest`` (JSON) to ``path`` atomically; returns the
    path written, resolved.

    ``path`` is resolved once: through a symbolic link the checkpoint it points to is replaced and the
    link stays. Only a previous checkpoint (or an empty directory) there is replaced: anything else is
    refused with :class:`CheckpointError` before anything is written (:func:`check_target`).
    """
    target = resolve(path)
    check_target(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_temporaries(target)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{_HOST}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        for name, state in components.items():
            torch.save(_storable(state), tmp / f"{name}.pt")
        files = {}
        for f in sorted(tmp.iterdir()):
            files[f.name] = {"sha256": _sha256(f), "bytes": f.stat().st_size}
            _fsync(f)
        doc = {
            "format": FORMAT, "version": VERSION, "conduit_version": __version__, "created_unix": time.time(),
            **manifest, "components": sorted(components), "files": files,
        }
        commit(tmp, target, doc)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def resolve(path: str | Path) -> Path:
    """``path`` absolute, with ``..`` and symbolic links resolved (where a link leads, even where nothing is yet)."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError) as e:  # a loop of symbolic links
        raise CheckpointError(f"{path}: cannot be resolved to a place to save to ({e})") from None


def _written_by_save(target: Path) -> set[str] | None:
    """What a save put in the directory ``target``, per its manifest; None where it is no Conduit checkpoint."""
    try:
        doc = json.loads(read_regular(target / MANIFEST, MANIFEST_LIMIT, CheckpointError))
    except (CheckpointError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") not in FORMATS:
        return None
    files, shards = doc.get("files", {}), doc.get("shards", [])
    names = [*(files if isinstance(files, dict) else []), *(shards if isinstance(shards, list) else [])]
    return {MANIFEST, COMPLETE, *(n for n in names if plain_name(n))}


def check_target(target: Path) -> None:
    """Raise :class:`CheckpointError` unless a save may put a checkpoint at ``target`` (resolved): nothing is
    there, an empty directory, or a previous Conduit checkpoint holding only what its save wrote."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    what = "save() writes a checkpoint directory and replaces only a previous checkpoint"
    if not stat.S_ISDIR(st.st_mode):
        kind = "a file" if stat.S_ISREG(st.st_mode) else file_kind(st.st_mode)
        raise CheckpointError(f"{target} is {kind}: {what}; move it, or save to another path")
    names = sorted(os.listdir(target))
    if not names:
        return
    written = _written_by_save(target)
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    if written is None:
        raise CheckpointError(
            f"{target} is not a Conduit checkpoint (it holds {shown}): {what}; move what is there, or save to "
            "another path"
        )
    extra = [n for n in names if n not in written]
    if extra:
        raise CheckpointError(
            f"{target} is a Conduit checkpoint that also holds {', '.join(extra[:5])}, which no save wrote: "
            "replacing it would delete them; move them out, or save to another path"
        )


def _remove(p: Path) -> None:
    if p.is_symlink() or not p.is_dir():
        p.unlink(missing_ok=True)
    else:
        shutil.rmtree(p, ignore_errors=True)


def commit(tmp: Path, target: Path, manifest: Mapping[str, Any]) -> None:
    """Seal the directory ``tmp`` (its files written and synced) as the checkpoint ``target``, atomically.

    Writes ``manifest`` as ``MANIFEST.json`` and ``COMPLETE`` (its sha256) last, syncs, then sets any
    previous ``target`` aside, renames ``tmp`` into place and removes what was set aside (also by an
    earlier interrupted save). A crash at any point leaves the previous checkpoint whole. Shared by
    every checkpoint format (the distributed one seals its directory of shards with it). ``target`` is
    resolved (:func:`resolve`); anything but a previous checkpoint there is refused (:func:`check_target`),
    and ``tmp`` is then the caller's to remove.
    """
    (tmp / MANIFEST).write_text(json.dumps(_jsonable(manifest), indent=1))
    _fsync(tmp / MANIFEST)
    (tmp / COMPLETE).write_text(_sha256(tmp / MANIFEST))
    _fsync(tmp / COMPLETE)
    _fsync(tmp)
    check_target(target)  # again: what is there may have changed since the save began
    if os.path.lexists(target):
        os.replace(target, target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}"))
    os.replace(tmp, target)
    _fsync(target.parent)
    for old in _asides(target):  # this one, and any an earlier interrupted save left
        _remove(old)


def sealed(path: Path) -> bool:
    """Whether ``path`` holds a manifest whose ``COMPLETE`` marker matches it (what :func:`commit` writes);
    both regular files (:func:`conduit.files.open_regular`): never a link, FIFO or device."""
    try:
        manifest = read_regular(path / MANIFEST, MANIFEST_LIMIT, CheckpointError)
        marker = read_regular(path / COMPLETE, MARKER_LIMIT, CheckpointError)
    except CheckpointError:
        return False
    return marker.decode("ascii", "replace").strip() == hashlib.sha256(manifest).hexdigest()


def _remove_dead_temporaries(target: Path) -> None:
    """Temporaries of saves whose process was killed: on this host (in the name), its pid no longer alive.
    Another host's temporary (a shared file system) is left alone: its pid says nothing here."""
    for tmp in target.parent.glob(f".{target.name}.tmp-*"):
        parts = tmp.name.rsplit(".tmp-", 1)[1].split("-")
        if len(parts) == 3 and parts[1] == _HOST and parts[0].isdigit():
            pid = int(parts[0])
            if pid != os.getpid() and not process_alive(pid):
                shutil.rmtree(tmp, ignore_errors=True)


# -- load -------------------------------------------------------------------------
def _asides(target: Path) -> list[Path]:
    """Copies interrupted saves set aside, newest first."""
    return sorted(target.parent.glob(f".{target.name}.old-*"), key=lambda p: p.lstat().st_mtime, reverse=True)


def _verify(path: Path) -> dict[str, Any]:
    if path.is_file():
        raise CheckpointError(f"{path} is a file: a Conduit checkpoint is a directory (give the path save() wrote)")
    if not path.is_dir():
        raise CheckpointError(f"{path}: no checkpoint directory there")
    if not os.path.lexists(path / MANIFEST):
        raise CheckpointError(f"{path}: not a Conduit checkpoint (no {MANIFEST})")
    if not os.path.lexists(path / COMPLETE):
        raise CheckpointError(f"{path}: incomplete checkpoint (no {COMPLETE} marker: the save did not finish)")
    raw = read_regular(path / MANIFEST, MANIFEST_LIMIT, CheckpointError, DAMAGED)
    marker = read_regular(path / COMPLETE, MARKER_LIMIT, CheckpointError, DAMAGED)
    if marker.decode("ascii", "replace").strip() != hashlib.sha256(raw).hexdigest():
        raise CheckpointError(f"{path}: {MANIFEST} does not match its {COMPLETE} checksum (corrupt)")
    try:
        manifest = json.loads(raw)
    except ValueError as e:  # not JSON, or not UTF-8
        raise CheckpointError(f"{path}: {MANIFEST} is not valid JSON: {e}{DAMAGED}") from e
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: {MANIFEST} holds a JSON {type(manifest).__name__}, not a JSON object{DAMAGED}")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: expected format {FORMAT!r}, found {manifest.get('format')!r} (foreign)")
    if manifest.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {manifest.get('version')} is not supported (expected {VERSION})"
        )
    for name, (sha, size) in layout(path, manifest).items():
        f, real = open_regular(path / name, CheckpointError, DAMAGED)
        with f:
            if real != size:  # before reading it: a size the manifest made up costs nothing
                raise CheckpointError(
                    f"{path}: {name} does not match its recorded checksum (corrupt: it holds {real} bytes, "
                    f"the manifest records {size}){DAMAGED}"
                )
            if _sha256_of(f, size) != (sha, size):
                raise CheckpointError(f"{path}: {name} does not match its recorded checksum (corrupt){DAMAGED}")
    return manifest


def layout(path: Path, manifest: Mapping[str, Any]) -> dict[str, tuple[str, int]]:
    """The manifest's ``files`` (name -> sha256, bytes), checked: plain names inside the directory, a
    sha256 and a size each, and a ``.pt`` file for each of its ``components``; else :class:`CheckpointError`."""
    files, components = manifest.get("files"), manifest.get("components")
    if not isinstance(files, dict):
        raise CheckpointError(f"{path}: {MANIFEST} 'files' is {type(files).__name__}, not a mapping{DAMAGED}")
    out = {}
    for name, meta in files.items():
        if not plain_name(name) or name in (MANIFEST, COMPLETE):
            raise CheckpointError(f"{path}: {MANIFEST} 'files' names {name!r}, not a file name in the checkpoint"
                                  f"{DAMAGED}")
        sha, size = (meta.get("sha256"), meta.get("bytes")) if isinstance(meta, dict) else (None, None)
        if not (isinstance(sha, str) and _SHA256.fullmatch(sha) and type(size) is int and size >= 0):
            raise CheckpointError(f"{path}: {MANIFEST} 'files' entry of {name} is {meta!r}, not "
                                  f"{{'sha256': <64 hex digits>, 'bytes': <a size>}}{DAMAGED}")
        out[name] = (sha, size)
    if not isinstance(components, list):
        raise CheckpointError(f"{path}: {MANIFEST} 'components' is {type(components).__name__}, not a list{DAMAGED}")
    for name in components:
        if not plain_name(name) or f"{name}.pt" not in out:
            raise CheckpointError(f"{path}: {MANIFEST} 'components' names {name!r}, not a file name of the "
                                  f"checkpoint's 'files'{DAMAGED}")
    return out


def read_manifest(path: str | Path, *, fallback: bool = False) -> tuple[Path, dict[str, Any]]:
    """The checkpoint at ``path`` and its manifest.

    Where ``path`` is missing because a save was interrupted between its renames, the copy
    it set aside (the checkpoint before it), with a warning. Where ``path`` is there but
    damaged, :class:`CheckpointError` — or, with ``fallback=True``, the newest aside copy
    that verifies, with a warning.
    """
    target = Path(path)
    asides = _asides(target)
    if target.exists() or not asides:
        try:
            return target, _verify(target)
        except CheckpointError as e:
            if not (fallback and asides):
                hint = (
                    f"; an earlier checkpoint an interrupted save left beside it ({asides[0].name}) can be "
                    "loaded with fallback=True" if asides else ""
                )
                raise CheckpointError(f"{e}{hint}") from None
            log.warning("conduit: checkpoint %s is damaged (%s); falling back to an earlier copy, as asked", target, e)
    errors = []
    for candidate in asides:
        try:
            manifest = _verify(candidate)
        except CheckpointError as e:
            errors.append(str(e))
            continue
        log.warning("conduit: loading %s, the checkpoint an interrupted save set aside for %s", candidate.name, target)
        return candidate, manifest
    raise CheckpointError(f"{target}: no loadable checkpoint: " + "; ".join(errors))


def _load_state(where: Path, name: str) -> dict[str, Any]:
    if not plain_name(name):
        raise CheckpointError(f"{where}: component {name!r} is not a file name in the checkpoint{DAMAGED}")
    f, size = open_regular(where / f"{name}.pt", CheckpointError, DAMAGED)
    with f:
        _check_archive(f, size, where, name)
        try:
            state = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:  # weights_only refuses anything but tensors and primitive containers
            raise CheckpointError(f"{where}: {name}.pt cannot be loaded safely ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{where}: {name}.pt holds {type(state).__name__}, not a state dict")
    return state


def _check_archive(f: BinaryIO, size: int, where: Path, name: str) -> None:
    """``f`` is a torch archive whose entries are stored, not compressed (``torch.save`` never compresses),
    and hold at most the file's ``size`` bytes: loading it allocates no more than the file holds."""
    try:
        with zipfile.ZipFile(f) as z:
            entries = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise CheckpointError(f"{where}: {name}.pt cannot be loaded safely (not an archive torch.save writes: "
                              f"{e}){DAMAGED}") from None
    if any(e.compress_type != zipfile.ZIP_STORED for e in entries) or sum(e.file_size for e in entries) > size:
        raise CheckpointError(f"{where}: {name}.pt cannot be loaded safely (its entries are compressed or claim "
                              f"more than its {size} bytes: torch.save writes neither){DAMAGED}")
    f.seek(0)


def load(path: str | Path, *, fallback: bool = False) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The manifest and every component's state dict of the checkpoint at ``path`` (verified, loaded safely);
    ``fallback``: see :func:`read_manifest`."""
    where, manifest = read_manifest(path, fallback=fallback)
    return manifest, {name: _load_state(where, name) for name in manifest.get("components", [])}


# -- a checkpoint as bytes -------------------------------------------------------------------------------
#: the checkpoint directory's name inside the temporary folder of :func:`pack` / :func:`unpacked`
_PACKED = "conduit-checkpoint"


def pack(save: Callable[[Path], Path]) -> dict[str, bytes]:
    """A checkpoint as ``{relative path: bytes}``, for a framework that pickles its buffer object (SRL's
    ``save_buffer_on_exit``) or ships it as one value: ``save(path)`` writes it (``lambda p: edp.save(p)``)."""
    with tempfile.TemporaryDirectory(prefix="conduit-pack-") as tmp:
        root = save(Path(tmp) / _PACKED)
        return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


@contextlib.contextmanager
def unpacked(files: Mapping[str, bytes]) -> Iterator[Path]:
    """The checkpoint directory of :func:`pack`'s ``files`` for the block (``edp.restore(root)`` loads it, with
    every check a checkpoint on disk gets); a name outside the directory is refused."""
    with tempfile.TemporaryDirectory(prefix="conduit-pack-") as tmp:
        root = Path(tmp) / _PACKED
        for rel, data in files.items():
            target = (root / rel).resolve()
            if root.resolve() not in target.parents:
                raise CheckpointError(f"a packed checkpoint names a file outside its directory: {rel!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        yield root
