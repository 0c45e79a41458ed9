"""Collective checkpoints of a sharded buffer: every rank its shard, one manifest, atomic; restore onto any
number of ranks.

Layout (a directory on a file system every rank sees)::

    MANIFEST.json       format conduit-distributed-checkpoint, world size, policy, global config, spec,
                        per-shard capacities and row counts, the shared generator, the group's counters
    shard-00000/ ...    each rank's shard: a single-process Conduit checkpoint (conduit.checkpoint), itself
                        verified by checksum and read with weights_only
    COMPLETE            written last: the sha256 of MANIFEST.json

Atomic as the core's: every rank writes into one temporary sibling directory, rank 0
writes the manifest and its marker once every rank reported success, then renames the
directory into place (the previous checkpoint set aside first, removed after). A
crash at any point leaves the previous checkpoint whole; a failed rank makes every
rank's ``save`` raise and the temporary is removed.

**Restore onto the same ranks** loads each shard into its rank exactly (sampler and
generators included) and the shared generator: the run continues draw for draw.
**Onto a different number of ranks** the rows are re-dealt: the checkpoint's live
rows, shard after shard, each shard's oldest first, are split over the new ranks in
proportion to their capacities; a rank reads only the old shards its range
overlaps, writes their rows into its fresh shard (no ingestion hook: they were
ingested once) and restores their priorities. Every row survives exactly once; the
samplers' generators start afresh (another world draws differently anyway).
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from conduit import checkpoint as core_checkpoint
from conduit.core import SamplerKind
from conduit.errors import CheckpointError
from conduit.placement.records import largest_remainder
from conduit.runtime import Conduit

#: the rank's :class:`~conduit.distributed.runtime.DistributedConduit` (not imported: it imports this module)
DistributedConduit = Any

__all__ = ["FORMAT", "restore", "save"]

FORMAT = "conduit-distributed-checkpoint"
VERSION = 1
MANIFEST, COMPLETE = core_checkpoint.MANIFEST, core_checkpoint.COMPLETE  # sealed as the core seals its own


def _shard_dir(rank: int) -> str:
    return f"shard-{rank:05d}"


def save(edp: DistributedConduit, path: str | Path) -> Path:
    """Collective: see the module docstring. Returns ``path`` on every rank."""
    edp.sync()  # routed units and priority updates land first: nothing is in flight in a checkpoint
    target = Path(path).resolve()
    names = edp.group.gather_object(f".{target.name}.dtmp-{uuid.uuid4().hex[:10]}", "save (temporary name)")
    tmp = target.parent / names[0]
    report: dict[str, Any] = {"ok": True}
    try:
        if edp.rank == 0:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
        edp.group.barrier("save (temporary directory)")
        where = tmp / _shard_dir(edp.rank)
        if edp.shard is not None:
            edp.shard.save(where)
            report["rows"] = edp.shard.buffer.rows if edp.shard.buffer is not None else 0
        else:
            assert edp.on_policy is not None
            state = edp.on_policy.state_dict()
            core_checkpoint.save(where, {"policy": "on_policy"}, {"onpolicy": state})
            rows = state["rows"]
            report["rows"] = int(next(iter(rows.values())).shape[0]) if rows else 0
        report["counts"] = edp.counters()
        report["rate_pushed"] = edp.rate.pushed if edp.rate is not None else 0
        report["ahead"] = len(edp.replay.ready) if edp.replay is not None else 0
    except Exception as e:  # every rank must still reach the gather below, or the others time out
        report = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    reports = edp.group.gather_object(report, "save (shards written)")
    failed = {r: rep["error"] for r, rep in enumerate(reports) if not rep["ok"]}
    if failed:
        if edp.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        edp.group.barrier("save (abandoned)")
        raise CheckpointError(f"{target}: ranks failed to save their shards: {failed}")
    if edp.rank == 0:
        _commit(edp, target, tmp, reports)
    edp.group.barrier("save (committed)")
    return target


def _commit(edp: DistributedConduit, target: Path, tmp: Path, reports: list[dict[str, Any]]) -> None:
    totals = {k: sum(int(r["counts"][k]) for r in reports) for k in reports[0]["counts"]}
    spec = edp.spec
    doc = {
        "format": FORMAT, "version": VERSION, "world": edp.world, "policy": edp.config.policy.value,
        "config": edp.config.model_dump(mode="json"), "spec": spec.to_json() if spec else None,
        "capacities": list(edp.capacities), "rows": [int(r["rows"]) for r in reports],
        "shards": [_shard_dir(r) for r in range(edp.world)], "counts": totals,
        "shared_rng": edp.shared_rng.bit_generator.state,
        "rate": _rate_counts(edp, reports),
    }
    core_checkpoint.commit(tmp, target, doc)


def _rate_counts(edp: DistributedConduit, reports: list[dict[str, Any]]) -> dict[str, int] | None:
    """The group's rate-limit counts as saved: its admitted rows, and its samples less those of the batches
    drawn ahead and not yet handed out (the checkpoint does not hold them: they were never delivered)."""
    if edp.rate is None:
        return None
    ahead = sum(int(r["ahead"]) for r in reports)  # batches each learner holds drawn, not yet handed out
    samples = edp.rate.limiter.samples - ahead * edp.config.train_batch_size
    return {"inserts": sum(int(r["rate_pushed"]) for r in reports), "samples": samples}


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The verified manifest of the distributed checkpoint at ``path`` (shards are verified when loaded)."""
    p = Path(path)
    if not (p / MANIFEST).exists():
        raise CheckpointError(f"{p}: not a distributed Conduit checkpoint (no {MANIFEST})")
    if not core_checkpoint.sealed(p):
        raise CheckpointError(f"{p}: incomplete or corrupt ({COMPLETE} missing or not matching {MANIFEST})")
    doc = json.loads((p / MANIFEST).read_text())
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise CheckpointError(f"{p}: expected {FORMAT} version {VERSION}, found {doc.get('format')!r} "
                              f"version {doc.get('version')!r}")
    return doc


def restore(edp: DistributedConduit, path: str | Path) -> dict[str, Any]:
    """Collective: load the checkpoint at ``path`` into this fresh group (see the module docstring)."""
    p = Path(path)
    doc = read_manifest(p)
    if doc["policy"] != edp.config.policy.value:
        raise CheckpointError(f"{p}: checkpoint is {doc['policy']}, the runtime is {edp.config.policy.value}")
    same = doc["world"] == edp.world and list(doc["capacities"]) == list(edp.capacities)
    error = None
    try:
        if same and edp.shard is not None:
            edp.shard.restore(p / doc["shards"][edp.rank])
        else:
            _redeal(edp, p, doc)
        if edp.rank == 0:
            edp.add_counts(doc["counts"])
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    errors = edp.group.gather_object(error, "restore (shards loaded)")
    failed = {r: e for r, e in enumerate(errors) if e is not None}
    if failed:
        raise CheckpointError(f"{p}: ranks failed to restore: {failed}")
    edp.shared_rng.bit_generator.state = doc["shared_rng"]
    if edp.rate is not None and doc.get("rate") is not None:  # the ratio continues (saved without one: anew)
        inserts, samples = int(doc["rate"]["inserts"]), int(doc["rate"]["samples"])
        edp.rate.restored(inserts, inserts if edp.rank == 0 else 0, samples)
    return doc


def _redeal(edp: DistributedConduit, p: Path, doc: dict[str, Any]) -> None:
    old_rows = [int(n) for n in doc["rows"]]
    total = sum(old_rows)
    weights = list(edp.capacities) if edp.shard is not None else [1.0] * edp.world
    take = largest_remainder(weights, total)
    lo = sum(take[: edp.rank])
    hi = lo + take[edp.rank]
    if edp.shard is not None and take[edp.rank] > edp.capacities[edp.rank]:
        raise CheckpointError(f"{p}: {total} rows do not fit a buffer of capacity {sum(edp.capacities)}")
    parts: list[dict[str, torch.Tensor]] = []
    leaves: list[np.ndarray] = []
    max_priority = 1.0
    start = 0
    for k, n in enumerate(old_rows):
        a, b = max(lo, start), min(hi, start + n)
        if a < b:
            rows, leaf, mp = _read_shard(edp, p / doc["shards"][k])
            parts.append({f: t[a - start : b - start] for f, t in rows.items()})
            if leaf is not None:
                leaves.append(leaf[a - start : b - start])
                max_priority = max(max_priority, mp)
        start += n
    if not parts:
        return
    merged = {f: torch.cat([part[f] for part in parts]) for f in parts[0]}
    if edp.on_policy is not None:
        edp.on_policy.load_rows(merged)
        return
    assert edp.shard is not None
    edp.shard.start()
    buf = edp.shard.buffer
    assert buf is not None
    if buf.inserted:
        raise CheckpointError("restore into a fresh runtime (this rank's shard already holds data)")
    buf.write([merged])
    if leaves and edp.config.sampler is SamplerKind.PRIORITIZED:
        slots, _ = buf.oldest_first()
        buf.restore_priorities(slots, np.concatenate(leaves), max_priority)


def _read_shard(edp: DistributedConduit, where: Path) -> tuple[dict[str, torch.Tensor], np.ndarray | None, float]:
    """An old shard's live rows (oldest first) and their priorities (``p^alpha``), read through a core runtime."""
    if edp.on_policy is not None:
        _, comps = core_checkpoint.load(where)
        rows = comps["onpolicy"]["rows"]
        return dict(rows), None, 1.0
    old = Conduit.from_checkpoint(where, storage_device="cpu")
    try:
        old.start()
        buf = old.buffer
        assert buf is not None
        slots, rows = buf.oldest_first()
        if edp.config.sampler is SamplerKind.PRIORITIZED and slots.size:
            leaf, mp = buf.priorities_at(slots)
            return rows, np.asarray(leaf, dtype=np.float64), float(mp)
        return rows, None, 1.0
    finally:
        old.close()
