"""A sharded buffer's sync, the collective every other one starts with: routed units and priority updates move to
their shards, then every rank learns every shard's state (rows, priority mass, spec, rate-limit counts).

Prioritized replay keeps one buffer's max priority here: each rank reports its shard's max priority and the
smallest priority of its shard's rows new since the last sync, read after the priority updates that moved were
applied (an update its shard drops, for a row overwritten since the draw, raises no max, as in one buffer); where
some shard's new rows entered below the group's max, they rise to it before the state is gathered again
(:func:`conduit.distributed.replay.lifts`), so a row enters at the group's max priority as it would in one buffer.

An ingestion hook runs on the rank whose shard takes the unit. Where it fails on a unit routed there, the sync
still ends alike on every rank: each learns it from the state gathered next, and every rank raises the same
``HookFailed``, naming the hook, the rank it ran on and the failure, and latches it, as one process latches a
hook's failure (the pushing rank's push had returned).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from conduit.distributed.exchange import dumps, loads
from conduit.distributed.replay import FAILED, HEAD, MAXP, PUSHED, SINCE, SPEC, WANT, lifts
from conduit.errors import HookFailed, SpecError
from conduit.spec import rows_of

#: the rank's :class:`~conduit.distributed.runtime.DistributedConduit` (not imported: it imports this module)
DistributedConduit = Any

__all__ = ["sync"]

log = logging.getLogger("conduit")


def sync(edp: DistributedConduit, give_up: bool) -> np.ndarray:
    """Collective: move routed units and queued priority updates to their shards, then exchange every shard's
    state; returns the ``[world, fields]`` matrix of it (:data:`conduit.distributed.replay.HEAD` columns)."""
    edp.start()
    if edp.delivery is not None:
        edp.delivery.quiesce()  # an overlapped exchange queued or running goes first (a no-op on the worker)
    with edp._lock:
        outbox, edp._outbox = edp._outbox, [{"units": [], "priorities": []} for _ in range(edp.world)]
        moving = edp._outbox_rows
    payload = [dumps(o) if o["units"] or o["priorities"] else torch.empty(0, dtype=torch.uint8) for o in outbox]
    sizes = [int(p.numel()) for p in payload]
    try:
        state = edp.group.gather(state_vector(edp, give_up, sizes), "sync (state and outbox sizes)")
        pending = state[:, HEAD:].to(torch.int64)
        moved = int(pending.sum())  # alike on every rank
        if moved:
            recv = edp.group.exchange(torch.cat(payload), sizes, pending[:, edp.rank].tolist(),
                                      "sync (routed units and priority updates)", rows=False)
        with edp._lock:
            edp._outbox_rows -= moving  # handed over: the receiving shards count them in
        failed: HookFailed | None = None
        if moved:  # the state again, with what moved applied (the max priorities among it)
            try:
                receive(edp, recv, pending[:, edp.rank].tolist())
            except HookFailed as e:  # the ingestion hook, on a unit routed here: the group learns it next
                failed = e
            state = edp.group.gather(state_vector(edp, give_up, [0] * edp.world, failed is not None), "sync (state)")
        if state[:, FAILED].any():
            raise routed_hook_failed(edp, failed)
        lift = lifts(state, edp.config.prioritized.alpha)
        if edp.delivery is not None:  # new rows enter at the group's max priority, as in one buffer
            edp.delivery.synced(float(state[:, MAXP].max()))
        if lift:
            state = edp.group.gather(state_vector(edp, give_up, [0] * edp.world), "sync (state)")
        if edp.rate is not None:
            edp.rate.synced(state[:, PUSHED].numpy(), state[:, WANT].numpy(), state[:, SINCE].numpy())
    finally:
        if edp.rate is not None:
            edp.rate.end_sync()  # pushes wait while a sync is under way, and not a moment longer
    edp.agree_on_spec(state[:, SPEC].numpy())
    return state[:, :HEAD].numpy()


def routed_hook_failed(edp: DistributedConduit, failed: HookFailed | None) -> HookFailed:
    """Collective, where some rank's ingestion hook failed on a unit routed to it: the one ``HookFailed`` every
    rank raises, naming the ranks and their failures, latched on the group."""
    mine = str(failed).strip().splitlines()[0] if failed is not None else None
    reasons = edp.group.gather_object(mine, "sync (a routed unit's ingestion failed)")
    said = "; ".join(f"on rank {r}: {why}" for r, why in enumerate(reasons) if why)
    cause = failed if failed is not None else RuntimeError(said)
    err = HookFailed(f"the ingestion hook, on a unit routed to another rank ({said})", cause)
    return edp.group.failure.set("sync", err)


def state_vector(edp: DistributedConduit, give_up: bool, sizes: list[int], failed: bool = False) -> torch.Tensor:
    """This rank's row of the sync's state (the columns :mod:`conduit.distributed.replay` names), then its outbox
    sizes; ``failed``: the ingestion hook failed on a unit routed to this rank."""
    buf = edp.shard.buffer if edp.shard is not None else None
    rows = float(buf.rows) if buf is not None else 0.0
    inf = float("inf")
    mass, low, top, new_low = edp.delivery.shard_priorities() if edp.delivery is not None else (0.0, inf, 0.0, inf)
    rate = edp.rate.snapshot() if edp.rate is not None else (0, 0, 0)
    head = [rows, mass, low, edp.spec_key(), float(buf.inserted if buf else 0), float(give_up), *map(float, rate),
            top, new_low, float(failed)]
    return torch.tensor(head + [float(s) for s in sizes], dtype=torch.float64)


def receive(edp: DistributedConduit, recv: torch.Tensor, sizes: list[int]) -> None:
    """Apply what the other ranks sent this shard: priority updates for its rows, then routed units (a unit its
    push refuses is counted refused and logged: the sender's push had returned)."""
    assert edp.shard is not None and edp.shard.buffer is not None
    at = 0
    for src, n in enumerate(sizes):
        if not n:
            continue
        got = loads(recv[at : at + n])
        at += n
        for slots, ids, pr in got["priorities"]:
            edp.shard.buffer.update_priorities(slots.numpy(), ids.numpy(), pr.numpy())
        for unit in got["units"]:
            rows = rows_of(unit)
            try:
                edp.shard.push(unit, copy=False)
            except SpecError as e:
                log.error("conduit.distributed: a unit routed from rank %d was refused here: %s", src, e)
                with edp._lock:
                    edp._counts["refused"] += rows
                continue
            with edp._lock:
                edp._counts["ingested"] += rows
    edp.shard.flush()
