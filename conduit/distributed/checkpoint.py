"""Collective checkpoints of a sharded buffer: every rank its shard, one manifest, atomic; restore onto any
number of ranks.

Layout (a directory on a file system every rank sees)::

    MANIFEST.json       format conduit-distributed-checkpoint, world size, policy, global config, spec,
                        per-shard capacities and row counts, the shared generator, the group's counters
    shard-00000/ ...    each rank's shard: a single-process Conduit checkpoint (conduit.checkpoint), itself
                        verified by checksum and read with weights_only
    delivery-00000/ ... global sampling: each rank's batches drawn ahead, not yet handed out (same format)
    COMPLETE            written last: the sha256 of MANIFEST.json

Atomic as the core's: every rank writes into one temporary sibling directory
(``.<name>.dtmp-<pid>-<host>-<id>``, named by rank 0), rank 0 writes the manifest and its
marker once every rank reported success, then renames the directory into place (the
previous checkpoint set aside first, removed after). A crash at any point leaves the
previous checkpoint whole; a failed rank makes every rank's ``save`` raise, and rank 0
removes the temporary (a rank that died or stalled included). Where rank 0 itself was
killed, the next save removes what it left: temporaries whose rank 0 is no longer alive on
this host (another host's are left alone: its pids say nothing here), as the core's save does.

**Restore is all or nothing, on every rank.** Each rank first reads and verifies
everything it will load (its shards, checksums and safe loads included) and checks
that it is fresh, changing nothing; the ranks compare outcomes, and only where every
rank succeeded does any rank load its rows, counters and generators. A restore
refused on one rank (a damaged shard) raises ``CheckpointError`` on every rank and
leaves every rank as it was, ready for another restore. Nothing is read from outside
the checkpoint: a manifest whose shard paths (or a shard whose files) lead out of
its directory is refused.

**Restore onto the same ranks** loads each shard into its rank exactly (sampler and
generators included), the shared generator and each rank's batches drawn ahead (handed out
first): the run continues draw for draw.
**Onto a different number of ranks** the rows are re-dealt: the checkpoint's live
rows, shard after shard, each shard's oldest first, are split over the new ranks in
proportion to their capacities; a rank reads only the old shards its range
overlaps, writes their rows into its fresh shard (no ingestion hook: they were
ingested once) and restores their priorities. Every row survives exactly once; the
samplers' generators start afresh (another world draws differently anyway).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from conduit import checkpoint as core_checkpoint
from conduit.core import SamplerKind
from conduit.distributed.options import Sampling
from conduit.errors import CheckpointError, SemanticsError
from conduit.executor import process_alive
from conduit.placement.records import largest_remainder
from conduit.snapshot import stored_in_order
from conduit.spec import ExperienceSpec

#: the rank's :class:`~conduit.distributed.runtime.DistributedConduit` (not imported: it imports this module)
DistributedConduit = Any

__all__ = ["FORMAT", "restore", "save"]

FORMAT = "conduit-distributed-checkpoint"
VERSION = 1
MANIFEST, COMPLETE = core_checkpoint.MANIFEST, core_checkpoint.COMPLETE  # sealed as the core seals its own


#: this host in temporaries' names (no dash: the name's fields are split on it)
_HOST = socket.gethostname().replace("-", "_") or "host"


def _shard_dir(rank: int) -> str:
    return f"shard-{rank:05d}"


def _delivery_dir(rank: int) -> str:
    return f"delivery-{rank:05d}"


def _remove_dead_temporaries(target: Path) -> None:
    """What saves killed on rank 0 left beside ``target``: temporaries whose rank 0 ran on this host and is no
    longer alive, or is this process (saves are collective: none of its own is under way), and unnamed ones
    (only an earlier version wrote those)."""
    for tmp in target.parent.glob(f".{target.name}.dtmp-*"):
        parts = tmp.name.rsplit(".dtmp-", 1)[1].split("-")
        if len(parts) == 1:
            shutil.rmtree(tmp, ignore_errors=True)
        elif len(parts) == 3 and parts[1] == _HOST and parts[0].isdigit():
            pid = int(parts[0])
            if pid == os.getpid() or not process_alive(pid):  # (this process's: an earlier save, failed)
                shutil.rmtree(tmp, ignore_errors=True)


def save(edp: DistributedConduit, path: str | Path) -> Path:
    """Collective: see the module docstring. Returns ``path`` on every rank."""
    if edp.on_policy is not None and edp.on_policy.delivering():  # alike on every rank: they iterate in step
        raise SemanticsError("an on-policy runtime is checkpointed between iterations; this one's mini-batches "
                             "are still being handed out")
    edp.sync()  # routed units and priority updates land first: nothing is in flight in a checkpoint
    target = Path(path).resolve()
    name = f".{target.name}.dtmp-{os.getpid()}-{_HOST}-{uuid.uuid4().hex[:10]}"
    tmp = target.parent / edp.group.gather_object(name, "save (temporary name)")[0]
    committed = False
    try:
        _save(edp, target, tmp)
        committed = True
    finally:
        if edp.rank == 0 and not committed:  # failed anywhere, a rank that died or stalled included
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _save(edp: DistributedConduit, target: Path, tmp: Path) -> None:
    report: dict[str, Any] = {"ok": True}
    try:
        if edp.rank == 0:
            target.parent.mkdir(parents=True, exist_ok=True)
            _remove_dead_temporaries(target)
            tmp.mkdir()
        edp.group.barrier("save (temporary directory)")
        where = tmp / _shard_dir(edp.rank)
        # Pushes go on while a rank saves. What the checkpoint counts is read before its shard is: the rows a
        # shard took by then (it holds at least those), and the units refused; a unit still in flight (a local
        # push under way, a routed one not yet moved) is not in the checkpoint, so it is not counted pushed there
        counts = edp.counters()
        report["counts"] = {**counts, "pushed": counts["ingested"] + counts["refused"]}
        report["rate_pushed"] = counts["ingested"] if edp.rate is not None else 0  # the rows inserted
        if edp.shard is not None:
            report["rows"] = edp.shard.buffer.rows if edp.shard.buffer is not None else 0
            edp.shard.save(where)
        else:
            assert edp.on_policy is not None
            state = edp.on_policy.state_dict()
            core_checkpoint.save(where, {"policy": "on_policy"}, {"onpolicy": state})
            rows = state["rows"]
            report["rows"] = int(next(iter(rows.values())).shape[0]) if rows else 0
            report["iteration"] = int(state["iteration"])
        report["ahead"] = len(edp.delivery.staged[0]) if edp.delivery is not None else 0
        if edp.delivery is not None:  # global sampling: the batches drawn ahead, for a restore onto these ranks
            name = _delivery_dir(edp.rank)
            core_checkpoint.save(tmp / name, {"policy": "group_delivery"}, {"delivery": edp.delivery.state_dict()})
            report["delivery"] = name
    except Exception as e:  # every rank must still reach the gather below, or the others time out
        report = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    reports = edp.group.gather_object(report, "save (shards written)")
    failed = {r: rep["error"] for r, rep in enumerate(reports) if not rep["ok"]}
    if failed:
        if edp.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        edp.group.barrier("save (abandoned)")
        raise CheckpointError(f"{target}: ranks failed to save their shards: {failed}")
    error = None
    if edp.rank == 0:
        try:
            _commit(edp, target, tmp, reports)
        except Exception as e:  # said to every rank, which would otherwise wait for rank 0 until the timeout
            error = f"{type(e).__name__}: {e}"
    committed = edp.group.gather_object(error, "save (committed)")[0]
    if committed is not None:
        raise CheckpointError(f"{target}: rank 0 failed to commit the checkpoint: {committed}")


def _commit(edp: DistributedConduit, target: Path, tmp: Path, reports: list[dict[str, Any]]) -> None:
    totals = {k: sum(int(r["counts"][k]) for r in reports) for k in reports[0]["counts"]}
    spec = edp.spec
    doc = {
        "format": FORMAT, "version": VERSION, "world": edp.world, "policy": edp.config.policy.value,
        "config": edp.config.model_dump(mode="json"), "spec": spec.to_json() if spec else None,
        "capacities": list(edp.capacities), "rows": [int(r["rows"]) for r in reports],
        "shards": [_shard_dir(r) for r in range(edp.world)], "counts": totals,
        "shared_rng": edp.shared_rng.bit_generator.state,
        "rate": _rate_counts(edp, reports), "deliveries": [r.get("delivery") for r in reports],
        "iteration": reports[0].get("iteration", 0),  # on-policy: the next iteration's number
    }
    core_checkpoint.commit(tmp, target, doc)


def _rate_counts(edp: DistributedConduit, reports: list[dict[str, Any]]) -> dict[str, int] | None:
    """The group's rate-limit counts as saved: its admitted rows, and its samples less those of the batches
    drawn ahead and not yet handed out (the checkpoint does not hold them: they were never delivered)."""
    if edp.rate is None:
        return None
    ahead = sum(int(r["ahead"]) for r in reports) * edp.config.train_batch_size  # rows drawn, not handed out
    return {"inserts": sum(int(r["rate_pushed"]) for r in reports), "samples": edp.rate.limiter.samples - ahead,
            "ahead": ahead}  # (counted again where a restore onto the same ranks hands those batches out)


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The verified manifest of the distributed checkpoint at ``path`` (shards are verified when loaded); its
    shard paths are checked to stay inside ``path``."""
    p = Path(path)
    if not (p / MANIFEST).exists():
        raise CheckpointError(f"{p}: not a distributed Conduit checkpoint (no {MANIFEST})")
    if not core_checkpoint.sealed(p):
        raise CheckpointError(f"{p}: incomplete or corrupt ({COMPLETE} missing or not matching {MANIFEST})")
    doc = json.loads((p / MANIFEST).read_text())
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise CheckpointError(f"{p}: expected {FORMAT} version {VERSION}, found {doc.get('format')!r} "
                              f"version {doc.get('version')!r}")
    world = doc.get("world")
    if not (isinstance(world, int) and world > 0 and len(doc.get("shards", ())) == world
            and len(doc.get("rows", ())) == world):
        raise CheckpointError(f"{p}: the manifest's shards and row counts do not match its world size {world!r}")
    for name in doc["shards"]:
        _inside(p, name, "shard")
    deliveries = doc.get("deliveries") or [None] * world
    if not isinstance(deliveries, list) or len(deliveries) != world:
        raise CheckpointError(f"{p}: the manifest's deliveries do not match its world size {world!r}")
    for name in deliveries:
        if name is not None:
            _inside(p, name, "delivery")
    return doc


def _inside(p: Path, name: Any, what: str) -> Path:
    """``p / name`` where ``name`` is an entry of the directory ``p`` itself, else ``CheckpointError``: nothing is
    read from outside a checkpoint (no separators, no ``..``, no link leading out)."""
    if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name or "\\" in name:
        raise CheckpointError(f"{p}: {what} path {name!r} leads outside the checkpoint's directory (refused)")
    where = p / name
    if where.resolve().parent != p.resolve():
        raise CheckpointError(f"{p}: {what} path {name!r} leads outside the checkpoint's directory (refused)")
    return where


def _contained(where: Path) -> Path:
    """A shard's own checkpoint, its files checked to stay inside it before the core reads them."""
    try:
        doc = json.loads((where / MANIFEST).read_text())
    except (OSError, ValueError):
        return where  # missing or unreadable: the core's load says so
    names = list(doc.get("files", {}) or {}) + [f"{c}.pt" for c in doc.get("components", []) or []]
    for name in names:
        _inside(where, name, "file")
    return where


def restore(edp: DistributedConduit, path: str | Path) -> dict[str, Any]:
    """Collective: load the checkpoint at ``path`` into this fresh group (see the module docstring): every rank
    reads and checks what it needs first; only if all of them could does any load."""
    p = Path(path)
    doc, staged, error = None, None, None
    try:
        doc = read_manifest(p)
        staged = _stage(edp, p, doc)
    except Exception as e:  # every rank must still reach the gather below, or the others time out
        error = f"{type(e).__name__}: {e}"
    errors = edp.group.gather_object(error, "restore (shards read and checked)")
    failed = {r: e for r, e in enumerate(errors) if e is not None}
    if failed:
        raise CheckpointError(f"{p}: restore refused, nothing loaded on any rank: ranks failed to read or check "
                              f"their shards: {failed}")
    assert doc is not None and staged is not None
    error = None
    try:
        _apply(edp, p, doc, staged)
    except Exception as e:  # (everything that could fail was checked above)
        error = f"{type(e).__name__}: {e}"
    errors = edp.group.gather_object(error, "restore (shards loaded)")
    failed = {r: e for r, e in enumerate(errors) if e is not None}
    if failed:
        raise CheckpointError(f"{p}: ranks failed to load their checked shards, the others loaded: {failed}")
    return doc


def _stage(edp: DistributedConduit, p: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Everything this rank will load, read and verified, and the checks it must pass; changes nothing."""
    if doc["policy"] != edp.config.policy.value:
        raise CheckpointError(f"{p}: checkpoint is {doc['policy']}, the runtime is {edp.config.policy.value}")
    spec = ExperienceSpec.from_json(doc["spec"]) if doc.get("spec") else None
    if spec is not None and edp.spec is not None and spec != edp.spec:
        raise CheckpointError(f"{p}: the checkpoint's experience spec differs from the group's")
    counts = edp.counters()
    if any(counts.values()) or edp.restored:
        raise CheckpointError("restore into a fresh runtime (this rank pushed, or restored, already)")
    if (edp.shard is not None and edp.shard.buffer is not None and edp.shard.buffer.inserted) or (
            edp.on_policy is not None and edp.on_policy.pushed_rows):
        raise CheckpointError("restore into a fresh runtime (this rank's shard already holds data)")
    same = doc["world"] == edp.world and list(doc["capacities"]) == list(edp.capacities)
    if same and edp.shard is not None:
        where = _contained(_inside(p, doc["shards"][edp.rank], "shard"))
        manifest, state = core_checkpoint.load(where)
        if manifest.get("policy") != edp.config.policy.value:
            raise CheckpointError(f"{where}: shard is {manifest.get('policy')}, the runtime is "
                                  f"{edp.config.policy.value}")
        ahead = (doc.get("deliveries") or [None] * edp.world)[edp.rank]
        if ahead is not None and edp.sampling is Sampling.GLOBAL:  # the batches this rank had drawn ahead
            ahead = core_checkpoint.load(_contained(_inside(p, ahead, "delivery")))[1]["delivery"]
        else:
            ahead = None
        return {"where": where, "state": state, "spec": spec, "ahead": ahead}
    return {"rows": _gather_rows(edp, p, doc), "spec": spec}


def _apply(edp: DistributedConduit, p: Path, doc: dict[str, Any], staged: dict[str, Any]) -> None:
    """Load what :func:`_stage` read into this rank: rows, counters, generators."""
    if "where" in staged:
        assert edp.shard is not None
        if edp.shard.buffer is not None:  # started: the state read already goes in now
            edp.shard.load_state_dict(staged["state"])
        else:  # loaded when the shard starts (hooks registered meanwhile see its pending units)
            edp.shard.restore(staged["where"])
    else:
        _load_rows(edp, staged["rows"])
    if edp.on_policy is not None:
        edp.on_policy.iteration = int(doc.get("iteration", 0))
    edp.restored = True
    ahead = staged.get("ahead")
    if edp.delivery is not None:  # made at start: the rows loaded are not new, its batches drawn ahead come back
        edp.delivery.restored(ahead)
    else:
        edp.restored_delivery = ahead  # loaded into the group's delivery path when it is made
    edp.agreement.learn(staged["spec"])
    if edp.rank == 0:
        edp.add_counts(doc["counts"])
    edp.shared_rng.bit_generator.state = doc["shared_rng"]
    if edp.rate is not None and doc.get("rate") is not None:  # the ratio continues (saved without one: anew)
        inserts, samples = int(doc["rate"]["inserts"]), int(doc["rate"]["samples"])
        if ahead is not None:  # the batches drawn ahead are handed out after all
            samples += int(doc["rate"].get("ahead", 0))
        edp.rate.restored(inserts, inserts if edp.rank == 0 else 0, samples)


def _gather_rows(edp: DistributedConduit, p: Path, doc: dict[str, Any]) -> dict[str, Any] | None:
    """Re-sharding: this rank's part of the checkpoint's live rows (and their priorities), read from the old
    shards its range overlaps."""
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
            rows, leaf, mp = _read_shard(edp, _contained(_inside(p, doc["shards"][k], "shard")))
            parts.append({f: t[a - start : b - start] for f, t in rows.items()})
            if leaf is not None:
                leaves.append(leaf[a - start : b - start])
                max_priority = max(max_priority, mp)
        start += n
    if not parts:
        return None
    merged = {f: torch.cat([part[f] for part in parts]) for f in parts[0]}
    return {"merged": merged, "leaves": np.concatenate(leaves) if leaves else None, "max_priority": max_priority}


def _load_rows(edp: DistributedConduit, rows: dict[str, Any] | None) -> None:
    if rows is None:
        return
    if edp.on_policy is not None:
        edp.on_policy.load_rows(rows["merged"])
        return
    assert edp.shard is not None
    prioritized = rows["leaves"] is not None and edp.config.sampler is SamplerKind.PRIORITIZED
    edp.shard.load_rows(rows["merged"], leaves=rows["leaves"] if prioritized else None,
                        max_priority=rows["max_priority"])


def _read_shard(edp: DistributedConduit, where: Path) -> tuple[dict[str, torch.Tensor], np.ndarray | None, float]:
    """An old shard's live rows (oldest first) and their priorities (``p^alpha``), read from its checkpoint's
    state (a pure function of it: no runtime)."""
    _, comps = core_checkpoint.load(where)
    if edp.on_policy is not None:
        return dict(comps["onpolicy"]["rows"]), None, 1.0
    stored = stored_in_order(comps["buffer"])
    if edp.config.sampler is SamplerKind.PRIORITIZED and stored.leaves is not None and stored.leaves.size:
        return stored.rows, stored.leaves, stored.max_priority
    return stored.rows, None, 1.0
