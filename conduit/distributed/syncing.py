"""A sharded buffer's sync, the collective every other one starts with: routed units and priority updates move to
their shards, then every rank learns every shard's state (rows, priority mass, spec, rate-limit counts).

Prioritized replay keeps one buffer's max priority here: each rank reports the largest priority it knows of (its
shard's, and what it sent other ranks' rows) and the smallest priority of its shard's rows new since the last sync;
where some shard's new rows entered below the group's max, they rise to it before the state is gathered again
(:func:`conduit.distributed.replay.lifts`), so a row enters at the group's max priority as it would in one buffer.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from conduit.distributed.exchange import dumps, loads
from conduit.distributed.replay import HEAD, MAXP, PUSHED, SINCE, SPEC, WANT, lifts
from conduit.errors import SpecError
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
        moving, sent_max, edp._outbox_max = edp._outbox_rows, edp._outbox_max, 0.0
    payload = [dumps(o) if o["units"] or o["priorities"] else torch.empty(0, dtype=torch.uint8) for o in outbox]
    sizes = [int(p.numel()) for p in payload]
    try:
        state = edp.group.gather(state_vector(edp, give_up, sizes, sent_max), "sync (state and outbox sizes)")
        pending = state[:, HEAD:].to(torch.int64)
        moved, lift = int(pending.sum()), lifts(state, edp.config.prioritized.alpha)  # alike on every rank
        if moved:
            recv = edp.group.exchange(torch.cat(payload), sizes, pending[:, edp.rank].tolist(),
                                      "sync (routed units and priority updates)", rows=False)
        with edp._lock:
            edp._outbox_rows -= moving  # handed over: the receiving shards count them in
        if moved:
            receive(edp, recv, pending[:, edp.rank].tolist())
        if edp.delivery is not None:  # new rows enter at the group's max priority, as in one buffer
            edp.delivery.synced(float(state[:, MAXP].max()))
        if moved or lift:
            state = edp.group.gather(state_vector(edp, give_up, [0] * edp.world), "sync (state)")
        if edp.rate is not None:
            edp.rate.synced(state[:, PUSHED].numpy(), state[:, WANT].numpy(), state[:, SINCE].numpy())
    finally:
        if edp.rate is not None:
            edp.rate.end_sync()  # pushes wait while a sync is under way, and not a moment longer
    edp.agree_on_spec(state[:, SPEC].numpy())
    return state[:, :HEAD].numpy()


def state_vector(edp: DistributedConduit, give_up: bool, sizes: list[int], sent_max: float = 0.0) -> torch.Tensor:
    """This rank's row of the sync's state (the columns :mod:`conduit.distributed.replay` names), then its outbox
    sizes; ``sent_max``: the largest priority in the outbox this sync moves (the group's max is at least it)."""
    buf = edp.shard.buffer if edp.shard is not None else None
    rows = float(buf.rows) if buf is not None else 0.0
    inf = float("inf")
    mass, low, top, new_low = edp.delivery.shard_priorities() if edp.delivery is not None else (0.0, inf, 0.0, inf)
    rate = edp.rate.snapshot() if edp.rate is not None else (0, 0, 0)
    head = [rows, mass, low, edp.spec_key(), float(buf.inserted if buf else 0), float(give_up), *map(float, rate),
            max(top, sent_max), new_low]
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
