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

A checkpoint that is there but damaged is an error, never silently replaced by
an older copy: ``fallback=True`` asks for the newest aside copy instead, with a
warning naming what was skipped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from conduit._version import __version__
from conduit.errors import CheckpointError
from conduit.executor import process_alive

__all__ = ["FORMAT", "VERSION", "CheckpointError", "load", "read_manifest", "save"]

log = logging.getLogger("conduit")

#: this host in temporaries' names (no dash: the name's fields are split on it)
_HOST = socket.gethostname().replace("-", "_") or "host"

FORMAT = "conduit-checkpoint"
VERSION = 2
MANIFEST = "MANIFEST.json"
COMPLETE = "COMPLETE"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
    """Write ``components`` (name -> state dict) and ``manifest`` (JSON) to ``path`` atomically; returns ``path``."""
    target = Path(path)
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


def commit(tmp: Path, target: Path, manifest: Mapping[str, Any]) -> None:
    """Seal the directory ``tmp`` (its files written and synced) as the checkpoint ``target``, atomically.

    Writes ``manifest`` as ``MANIFEST.json`` and ``COMPLETE`` (its sha256) last, syncs, then sets any
    previous ``target`` aside, renames ``tmp`` into place and removes what was set aside (also by an
    earlier interrupted save). A crash at any point leaves the previous checkpoint whole. Shared by
    every checkpoint format (the distributed one seals its directory of shards with it).
    """
    (tmp / MANIFEST).write_text(json.dumps(_jsonable(manifest), indent=1))
    _fsync(tmp / MANIFEST)
    (tmp / COMPLETE).write_text(_sha256(tmp / MANIFEST))
    _fsync(tmp / COMPLETE)
    _fsync(tmp)
    if target.exists():
        os.replace(target, target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}"))
    os.replace(tmp, target)
    _fsync(target.parent)
    for old in _asides(target):  # this one, and any an earlier interrupted save left
        shutil.rmtree(old, ignore_errors=True)


def sealed(path: Path) -> bool:
    """Whether ``path`` holds a manifest whose ``COMPLETE`` marker matches it (what :func:`commit` writes)."""
    marker, manifest = path / COMPLETE, path / MANIFEST
    return manifest.exists() and marker.exists() and marker.read_text().strip() == _sha256(manifest)


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
    return sorted(target.parent.glob(f".{target.name}.old-*"), key=lambda p: p.stat().st_mtime, reverse=True)


def _verify(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise CheckpointError(f"{path}: no checkpoint directory there")
    if not (path / MANIFEST).exists():
        raise CheckpointError(f"{path}: not a Conduit checkpoint (no {MANIFEST})")
    if not (path / COMPLETE).exists():
        raise CheckpointError(f"{path}: incomplete checkpoint (no {COMPLETE} marker: the save did not finish)")
    if (path / COMPLETE).read_text().strip() != _sha256(path / MANIFEST):
        raise CheckpointError(f"{path}: {MANIFEST} does not match its {COMPLETE} checksum (corrupt)")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: {MANIFEST} is not valid JSON: {e}") from e
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: expected format {FORMAT!r}, found {manifest.get('format')!r} (foreign)")
    if manifest.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {manifest.get('version')} is not supported (expected {VERSION})"
        )
    for name, meta in manifest.get("files", {}).items():
        f = path / name
        if not f.exists():
            raise CheckpointError(f"{path}: {name} is missing")
        if f.stat().st_size != meta["bytes"] or _sha256(f) != meta["sha256"]:
            raise CheckpointError(f"{path}: {name} does not match its recorded checksum (corrupt)")
    return manifest


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
    try:
        state = torch.load(where / f"{name}.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses anything but tensors and primitive containers
        raise CheckpointError(f"{where}: {name}.pt cannot be loaded safely ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{where}: {name}.pt holds {type(state).__name__}, not a state dict")
    return state


def load(path: str | Path, *, fallback: bool = False) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The manifest and every component's state dict of the checkpoint at ``path`` (verified, loaded safely);
    ``fallback``: see :func:`read_manifest`."""
    where, manifest = read_manifest(path, fallback=fallback)
    return manifest, {name: _load_state(where, name) for name in manifest.get("components", [])}
