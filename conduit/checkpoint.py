"""Checkpoint and restore: a buffer that survives restarts.

Format ``conduit-checkpoint`` version 1, one directory::

    MANIFEST.json   format, version, conduit version, config, spec, schedule, counters,
                    and the sha256 and size of every other file
    rows.pt         the stored rows, field -> tensor on the host (slots [0, high))
    state.npz       slot table (ids, times sampled, validity), sampler arrays
    staged.pt       batches staged for learners but not yet delivered (data + provenance)
    pending.pt      units pushed (acknowledged) but not yet ingested
    COMPLETE        written last: the sha256 of MANIFEST.json

Saving is atomic: everything is written to a sibling temporary directory,
flushed to disk, then renamed into place; the directory it replaces is first
renamed aside and removed only after the new one is complete. A crash at any
point leaves the previous checkpoint loadable (``load`` falls back to the
aside copy when the rename did not finish), and never a half-written one.

The runtime is quiesced while its state is captured: both paths pause between
invocations, so the checkpoint is one consistent point of the run; units
pushed but not yet ingested are saved as such (acknowledged data is never
lost) and ingested after a restore exactly when they would have been.
Learners can still take staged batches and update priorities meanwhile: what
those change (staged batches, pull counts, the rate limiter, rows' sample
counts, sampler state) is read at one instant, with no pull between taking a
batch and counting its rows (``Delivery.settled``). A
restored runtime continues where the saved one stopped — with the same seed
its sample sequence equals an uninterrupted run's — on any device or
placement (pass another ``storage_device`` or storage policy).

On-policy runtimes are checkpointed between iterations (their data is used
once; RLlib does not checkpoint it either).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from conduit.batch import DrawnRows
from conduit.buffer import ReplayBuffer
from conduit.errors import ConduitError, SemanticsError
from conduit.executor import adopt
from conduit.iterations import IterationBuffer
from conduit.spec import ExperienceSpec

if TYPE_CHECKING:
    from conduit.runtime import Conduit

__all__ = ["FORMAT", "VERSION", "CheckpointError", "load_into", "read_manifest", "save"]

FORMAT = "conduit-checkpoint"
VERSION = 1
MANIFEST = "MANIFEST.json"
COMPLETE = "COMPLETE"


class CheckpointError(ConduitError, ValueError):
    """A checkpoint is missing, corrupt, foreign, or does not fit the runtime."""


# -- helpers ----------------------------------------------------------------------
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


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    return obj


def _info_to_json(info: dict[str, Any]) -> dict[str, Any]:
    out = dict(info)
    out["mode"] = info["mode"].to_json()
    drawn: DrawnRows = out.pop("rows")  # written as arrays (made here if they were not yet)
    out["indices"], out["ids"] = drawn.indices, drawn.ids
    for key in ("indices", "ids", "weights"):
        if out.get(key) is not None:
            out[key] = np.asarray(out[key]).tolist()
    return out


def _info_from_json(d: dict[str, Any]) -> dict[str, Any]:
    from conduit.scheduling.space import Mode

    out = dict(d)
    out["mode"] = Mode(bool(d["mode"]["overlap"]), d["mode"]["granularity"])
    out["rows"] = DrawnRows(np.asarray(out.pop("indices"), dtype=np.int64), np.asarray(out.pop("ids"), dtype=np.int64))
    out["weights"] = None if d.get("weights") is None else np.asarray(d["weights"], dtype=np.float32)
    return out


# -- save -------------------------------------------------------------------------
def save(runtime: Conduit, path: str | Path, *, timeout: float | None = None) -> Path:
    """Write the runtime's whole buffer state to ``path`` atomically; returns ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        with runtime.quiesced(timeout):
            manifest = _write_state(runtime, tmp)
        files = {}
        for f in sorted(tmp.iterdir()):
            files[f.name] = {"sha256": _sha256(f), "bytes": f.stat().st_size}
            _fsync(f)
        manifest["files"] = files
        (tmp / MANIFEST).write_text(json.dumps(_jsonable(manifest), indent=1))
        _fsync(tmp / MANIFEST)
        (tmp / COMPLETE).write_text(_sha256(tmp / MANIFEST))
        _fsync(tmp / COMPLETE)
        _fsync(tmp)
        aside = None
        if target.exists():
            aside = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(target, aside)
        os.replace(tmp, target)
        _fsync(target.parent)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _write_state(rt: Conduit, out: Path) -> dict[str, Any]:
    from conduit import __version__

    buf = rt.buffer
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "conduit_version": __version__,
        "created_unix": time.time(),
        "config": json.loads(rt.config.model_dump_json()),
        "spec": buf.spec.to_json() if buf is not None and buf.spec is not None else None,
        "schedule": rt.schedule.to_json(),
    }
    if isinstance(buf, ReplayBuffer):
        manifest["buffer"] = _save_replay(rt, buf, out)
    elif isinstance(buf, IterationBuffer):
        manifest["buffer"] = _save_iterations(rt, buf)
    return manifest


def _save_replay(rt: Conduit, buf: ReplayBuffer, out: Path) -> dict[str, Any]:
    dlv = rt.delivery
    limiter = getattr(dlv, "limiter", None)
    # Staged batches can still be pulled while delivery is paused, and a learner can update priorities:
    # the counts a pull changes (staged, pull counts, limiter, rows' sample counts) are read at one point,
    # with no pull between taking a batch and counting it, and the buffer's state under its lock.
    with dlv.settled() if dlv is not None else contextlib.nullcontext():
        held = [list(q) for q in dlv.staged] if dlv is not None else []
        pulls = list(dlv.pulls) if dlv is not None else []
        invocation = getattr(dlv, "_invocation", 0)
        limits = limiter.state() if limiter is not None else None
        with buf.lock:
            table = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in buf.table.state().items()}
            sampler = {k: np.array(v, copy=True) for k, v in buf.sampler.state_dict().items()}
            rng = buf.rng.bit_generator.state
            inserted, evicted = buf.inserted, buf.evicted_by_sampling
    # the rows themselves change only while ingesting (paused), so they are copied without holding up pulls
    rows = buf.storage.read(0, buf.table.high) if buf.storage is not None and buf.table.high else {}
    torch.save({k: v.cpu() for k, v in rows.items()}, out / "rows.pt")
    arrays = {f"table_{k}": v for k, v in table.items() if isinstance(v, np.ndarray)}
    arrays.update({f"sampler_{k}": v for k, v in sampler.items()})
    np.savez(out / "state.npz", **arrays)
    staged = [[{"data": {k: v.cpu() for k, v in s.data.items()}, "info": _info_to_json(s.info)} for s in q]
              for q in held]
    torch.save(staged, out / "staged.pt")
    _save_pending(rt, out)
    return {
        "kind": "replay",
        "inserted": inserted,
        "evicted_by_sampling": evicted,
        "table": {k: v for k, v in table.items() if not isinstance(v, np.ndarray)},
        "sampler": type(buf.sampler).__name__,
        "sampler_scalars": {k: v.item() for k, v in sampler.items() if v.ndim == 0},
        "rng": rng,
        "pulls": pulls,
        "invocation": invocation,
        "limiter": limits,
    }


def _save_pending(rt: Conduit, out: Path) -> None:
    ing = rt.ingestion
    queued: list[Any] = []
    pending_units = 0
    if ing is not None:
        with ing.cond:  # pushes still queue while ingestion is paused: take the queue and its unit count together
            queued, pending_units = list(ing.queue), ing.pending_units
    pieces = []
    for p in queued:
        adopt(p.data, p.producers)  # a unit pushed from CUDA memory: after the actor's kernels that wrote it
        pieces.append({"data": {k: v.cpu() for k, v in p.data.items()}, "rows": p.rows, "unit_end": p.unit_end})
    torch.save({"pieces": pieces, "pending_units": pending_units}, out / "pending.pt")


def _load_pending(rt: Conduit, where: Path) -> None:
    from conduit.ingestion import _Piece

    ing = rt.ingestion
    assert ing is not None
    saved = torch.load(where / "pending.pt", weights_only=True)
    with ing.cond:
        for p in saved["pieces"]:
            ing.queue.append(_Piece(p["data"], int(p["rows"]), bool(p["unit_end"])))
        ing.pending_units += int(saved["pending_units"])
        ing.cond.notify_all()


def _save_iterations(rt: Conduit, buf: IterationBuffer) -> dict[str, Any]:
    ing0 = rt.ingestion
    queued = False
    if ing0 is not None:
        with ing0.cond:
            queued = bool(ing0.queue or ing0.pending_units)
    if buf.iterations or queued:
        raise SemanticsError(
            f"an on-policy runtime is checkpointed between iterations; {len(buf.iterations)} iteration(s) "
            "are being collected or delivered"
        )
    ing, dlv = rt.ingestion, rt.delivery
    return {
        "kind": "iterations",
        "inserted": buf.inserted,
        "consumed": buf.consumed,
        "rng": buf.rng.bit_generator.state,
        "push_iteration": ing._push_iter if ing else buf.consumed,
        "pulls": list(dlv.pulls) if dlv else [],
        "cursor": [list(c) for c in getattr(dlv, "cursor", [])],
    }


# -- load -------------------------------------------------------------------------
def _candidates(target: Path) -> list[Path]:
    asides = sorted(target.parent.glob(f".{target.name}.old-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    return [target, *asides]


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


def read_manifest(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The newest complete checkpoint at ``path`` (or its aside copy after a crash) and its manifest."""
    target = Path(path)
    errors = []
    for candidate in _candidates(target):
        try:
            return candidate, _verify(candidate)
        except CheckpointError as e:
            errors.append(str(e))
    raise CheckpointError("no loadable checkpoint: " + "; ".join(errors))


def load_into(runtime: Conduit, path: str | Path) -> dict[str, Any]:
    """Restore a checkpoint into a runtime that has not pushed or pulled yet."""
    where, manifest = read_manifest(path)
    if runtime._started and runtime.buffer is not None and runtime.buffer.inserted:
        raise CheckpointError("restore into a fresh runtime (this one already holds data)")
    saved_policy = manifest["config"]["policy"]
    if saved_policy != runtime.config.policy.value:
        raise CheckpointError(f"checkpoint is {saved_policy}, the runtime is {runtime.config.policy.value}")
    if manifest["spec"] is not None and runtime.spec_declared is not None:
        if ExperienceSpec.from_json(manifest["spec"]) != runtime.spec_declared:
            raise CheckpointError("the checkpoint's experience spec differs from the runtime's declared spec")
    runtime.start()
    state = manifest["buffer"]
    if state["kind"] == "replay":
        _load_replay(runtime, where, manifest, state)
    else:
        _load_iterations(runtime, state)
    return manifest


def _load_replay(rt: Conduit, where: Path, manifest: dict[str, Any], state: dict[str, Any]) -> None:
    buf = rt.buffer
    assert isinstance(buf, ReplayBuffer)
    if manifest["config"]["capacity"] != buf.capacity:
        raise CheckpointError(f"capacity: checkpoint has {manifest['config']['capacity']}, runtime has {buf.capacity}")
    if state["sampler"] != type(buf.sampler).__name__:
        raise CheckpointError(f"sampler: checkpoint used {state['sampler']}, runtime uses {type(buf.sampler).__name__}")
    rows = torch.load(where / "rows.pt", weights_only=True)
    arrays = np.load(where / "state.npz")
    with buf.lock:
        if manifest["spec"] is not None:
            spec = ExperienceSpec.from_json(manifest["spec"])
            buf._specs.spec = spec
            storage = buf.policy.create(spec, buf.capacity)
            buf.use_storage(storage)
            if rows:
                storage.write(0, rows)
        table_state = {k: v for k, v in state["table"].items()}
        table_state.update({k[len("table_"):]: arrays[k] for k in arrays.files if k.startswith("table_")})
        buf.table.load(table_state)
        sampler_state = {k[len("sampler_"):]: arrays[k] for k in arrays.files if k.startswith("sampler_")}
        sampler_state.update(state.get("sampler_scalars", {}))
        buf.sampler.load_state_dict(sampler_state)
        buf.inserted = int(state["inserted"])
        buf.evicted_by_sampling = int(state["evicted_by_sampling"])
        buf.rng.bit_generator.state = state["rng"]
    dlv = rt.delivery
    staged = torch.load(where / "staged.pt", weights_only=False)
    with dlv.cond:
        dlv.pulls = [int(p) for p in state["pulls"]] or dlv.pulls
        dlv._invocation = int(state["invocation"])  # type: ignore[attr-defined]
        from conduit.delivery.base import _Staged

        for rank, items in enumerate(staged[: dlv.num_learners]):
            for item in items:
                data = {k: v.to(dlv.devices[rank]) for k, v in item["data"].items()}
                dlv.staged[rank].append(_Staged(data, _info_from_json(item["info"]), None))
        if state.get("limiter") is not None:
            dlv.limiter.load(state["limiter"])  # type: ignore[attr-defined]
            dlv.limiter.reserve(sum(len(s.info["rows"]) for q in dlv.staged for s in q))  # type: ignore[attr-defined]
    _load_pending(rt, where)


def _load_iterations(rt: Conduit, state: dict[str, Any]) -> None:
    buf = rt.buffer
    assert isinstance(buf, IterationBuffer)
    with buf.lock:
        buf.inserted = int(state["inserted"])
        buf.consumed = int(state["consumed"])
        buf.rng.bit_generator.state = state["rng"]
    ing, dlv = rt.ingestion, rt.delivery
    with ing.cond:
        ing._push_iter = int(state["push_iteration"])
    with dlv.cond:
        dlv.pulls = [int(p) for p in state["pulls"]] or dlv.pulls
        dlv.cursor = [tuple(c) for c in state["cursor"]] or dlv.cursor  # type: ignore[attr-defined]
