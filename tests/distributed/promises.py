"""What each rank runs to check that the sharded buffer keeps the core's promises (issue #47): a bad push
raises ``SpecError`` at the push and changes nothing, under every routing; the group holds one spec; a
refused restore changes nothing on any rank; a stalled rank is named within the documented bound.

The scenarios run inside the session's spawned groups (:func:`tests.distributed.workers.scenarios`, and
:func:`stalled_save` in a small group of its own). Every scenario catches what it raises and returns it as
data, so an unexpected error on one rank never leaves the others waiting in a collective.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import conduit
import conduit.distributed as cd
from conduit.checkpoint import COMPLETE, MANIFEST
from conduit.distributed import launch
from conduit.ext import stored_in_order
from conduit.spec import ExperienceSpec, FieldSpec

#: the test rows' layout (``workers.unit``): obs float32 [n, 3], tid int64 [n]; obs declared finite
SPEC = ExperienceSpec({"obs": FieldSpec("obs", (3,), torch.float32, finite=True),
                       "tid": FieldSpec("tid", (), torch.int64)})
ROUTINGS = ("local", "round_robin", "proportional")


def good(rank: int, k: int, n: int = 4, cols: int = 3) -> dict[str, torch.Tensor]:
    tid = torch.arange(n, dtype=torch.int64) + rank * 1000 + k * n
    return {"obs": tid.to(torch.float32).unsqueeze(1).repeat(1, cols), "tid": tid}


def bad_units(declared: bool) -> dict[str, Any]:
    """Writes the core refuses at the push (NaN only where ``finite`` is declared)."""
    tid = torch.arange(4, dtype=torch.int64)
    obs = torch.zeros(4, 3)
    out: dict[str, Any] = {
        "complex": {"obs": torch.zeros(4, 3, dtype=torch.complex64), "tid": tid},
        "missing_field": {"obs": obs},
        "leading_dims": {"obs": torch.zeros(5, 3), "tid": tid},
        "list": [{"obs": obs, "tid": tid}],
        "empty": {},
    }
    if declared:
        nan = obs.clone()
        nan[1, 2] = float("nan")
        out["nan_finite"] = {"obs": nan, "tid": tid}
    return out


def _outcome(fn: Any) -> str:
    try:
        fn()
    except Exception as e:  # the name is what the test checks
        return type(e).__name__
    return "accepted"


def _scenario(out: dict[str, Any], key: str, edp: cd.Conduit, rank: int, world: int,
              body: Callable[[], dict[str, Any]]) -> None:
    """``out[key]``: every rank's result of ``body`` (or the error it raised), ``edp`` closed after it."""
    try:
        mine = body()
    except Exception as e:
        mine = {"error": f"{type(e).__name__}: {e}"}
    edp.close()
    out[key] = edp_gather(rank, world, mine)


def _priorities(edp: cd.Conduit, new_from: int = 0, max_digits: int = 6) -> dict[str, Any]:
    """The distinct priority leaves of the shard's rows (those whose ``tid % 1000`` is at least ``new_from``) and
    its max priority, rounded."""
    buf = edp.shard.buffer
    slots, rows = stored_in_order(buf.state_dict())[:2]
    leaves, top = buf.priorities_at(slots)
    leaves = leaves[rows["tid"].numpy() % 1000 >= new_from]
    return {"leaves": sorted({round(float(v), 6) for v in leaves}), "max": round(top, max_digits)}


def _tids(edp: cd.Conduit) -> list[int]:
    rows = stored_in_order(edp.shard.buffer.state_dict())[1] if edp.shard.buffer is not None else {}
    return rows["tid"].tolist() if rows else []


def push_checks(rank: int, world: int) -> dict[str, Any]:
    """Per routing, declared spec or inferred: a good unit, every bad one, another good unit; then the group's
    counters and where each row landed."""
    out: dict[str, Any] = {}
    for routing in ROUTINGS:
        for declared in (True, False):
            edp = cd.Conduit(policy="off_policy", train_batch_size=8, capacity=200 * world, seed=5, timeout_s=30,
                             routing=routing, spec=SPEC if declared else None)
            res: dict[str, Any] = {}
            try:
                edp.push(good(rank, 0))
                before = edp.counters()
                res["bad"] = {name: _outcome(lambda u=u, e=edp: e.push(u)) for name, u in bad_units(declared).items()}
                res["counters_unchanged"] = edp.counters() == before
                edp.push(good(rank, 1))
                st = edp.stats()
                res.update(pushed=list(st.pushed_rows), ingested=list(st.ingested_rows),
                           refused=list(st.refused_rows), in_flight=list(st.in_flight_rows),
                           shard_rows=list(st.shard_rows), exactly_once=st.exactly_once)
                res["shards"] = edp.group.gather_object(_tids(edp), "test: shard contents")
            except Exception as e:  # reported, never left to hang the others
                res["error"] = f"{type(e).__name__}: {e}"
            edp.close()
            every = edp_gather(rank, world, res)
            out[f"{routing}/{'declared' if declared else 'inferred'}"] = every
    return out


def hooked_and_on_policy(rank: int, world: int) -> dict[str, Any]:
    """Round-robin with an ingestion hook (the unit checked is the hook's input; it runs where the unit lands),
    and on-policy (the hook-less unit checked against the group's spec): bad pushes raise at the push."""
    out: dict[str, Any] = {}
    for case in ("hooked_round_robin", "on_policy"):
        if case == "on_policy":
            edp = cd.Conduit(policy="on_policy", train_batch_size=8 * world, num_minibatches=2, num_epochs=1,
                             num_learners=world, seed=7, timeout_s=30)
        else:
            edp = cd.Conduit(policy="off_policy", train_batch_size=8, capacity=200 * world, seed=5, timeout_s=30,
                             routing="round_robin")

            @edp.register_ingestion()
            def doubled(actor_in: Any, exp_out: Any) -> None:
                unit = actor_in.read()
                exp_out.write({**unit, "twice": unit["tid"] * 2})

        res: dict[str, Any] = {}
        try:
            edp.push(good(rank, 0))
            before = edp.on_policy.pushed_rows if edp.on_policy is not None else edp.counters()
            res["bad"] = {name: _outcome(lambda u=u, e=edp: e.push(u)) for name, u in bad_units(False).items()}
            after = edp.on_policy.pushed_rows if edp.on_policy is not None else edp.counters()
            res["counters_unchanged"] = after == before
            edp.push(good(rank, 1))
            if edp.on_policy is not None:
                res["rows"] = sorted(t for b in edp.minibatches() for t in b["tid"].tolist())
            else:
                st = edp.stats()
                res.update(pushed=sum(st.pushed_rows), ingested=sum(st.ingested_rows), refused=sum(st.refused_rows))
        except Exception as e:
            res["error"] = f"{type(e).__name__}: {e}"
        edp.close()
        out[case] = edp_gather(rank, world, res)
    edp = cd.Conduit(policy="on_policy", train_batch_size=8 * world, num_minibatches=2, num_epochs=1,
                     num_learners=world, seed=7, timeout_s=30)

    @edp.register_ingestion()
    def attaching(actor_in: Any, exp_out: Any) -> None:  # only a delivery hook may attach: refused as one process
        exp_out.write(actor_in.read(), attach="rows")

    try:
        out["on_policy_attach"] = _outcome(lambda: edp.push(good(rank, 0)))
    finally:
        edp.close()
    return out


def delivery_hooks(rank: int, world: int) -> dict[str, Any]:
    """A delivery hook under the sharded runtime runs as one process's does: it reads its batch's facts
    (``exp_in.info``: global weights, slots, ids; on-policy the mini-batch's rows), a hook that drops a row is
    refused by name, a failing one raises ``HookFailed`` naming it -- on every rank, at the same pull."""
    out: dict[str, Any] = {}
    edp = cd.Conduit(policy="off_policy", train_batch_size=4, capacity=100 * world, seed=3, timeout_s=30,
                     sampling="local", tuning={"batch_pool": 2}, pinned={"delivery_granularity": 4})
    res: dict[str, Any] = {}
    try:  # four batches an exchange, a ring of two asked for: each batch still holds the rows its info names
        pushed = torch.cat([good(rank, k)["tid"] for k in range(4)])
        for k in range(4):
            edp.push(good(rank, k))
        batches = [edp.pull() for _ in range(8)]
        res["rows_match"] = all(b["tid"].tolist() == pushed[torch.as_tensor(b.info.ids)].tolist() for b in batches)
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}"
    edp.close()
    out["pool_local"] = edp_gather(rank, world, res)
    for case in ("facts", "facts_local", "facts_on_policy", "drops", "fails", "fails_overlapped"):
        runs: list[int] = []
        if case == "facts_local":  # local sampling: the shard's own delivery path runs the hook
            edp = cd.Conduit(policy="off_policy", train_batch_size=8, capacity=100 * world, sampler="prioritized",
                             seed=11, timeout_s=30, sampling="local")
        elif case == "facts_on_policy":
            edp = cd.Conduit(policy="on_policy", train_batch_size=8 * world, num_minibatches=2, num_epochs=1,
                             num_learners=world, seed=7, timeout_s=30)
        else:
            edp = cd.Conduit(policy="off_policy", train_batch_size=8, capacity=100 * world, sampler="prioritized",
                             seed=11, timeout_s=30, sampling="global",
                             pinned={"delivery_overlap": case == "fails_overlapped"})

        @edp.register_delivery()
        def hook(exp_in: Any, learn_out: Any, case: str = case, runs: list[int] = runs) -> None:
            runs.append(1)
            data, info = exp_in.read(), exp_in.info
            if case.startswith("fails"):
                raise ValueError("the learner's hook failed")
            if case == "drops":
                learn_out.write({k: v[1:] for k, v in data.items()})
                return
            ids = info["ids"][0] if case == "facts_on_policy" else info["ids"]
            extra = {"seen_ids": torch.as_tensor(np.asarray(ids, dtype=np.int64))}
            if case != "facts_on_policy":
                extra["seen_w"] = torch.as_tensor(np.asarray(info["weights"], dtype=np.float64))
            if case == "facts":  # the global draw: the rank holding each row too
                extra["seen_owners"] = torch.as_tensor(np.asarray(info["owners"], dtype=np.int64))
            learn_out.write({**data, **extra})

        res: dict[str, Any] = {}
        try:
            edp.push(good(rank, 0))
            edp.push(good(rank, 1))
            batch = next(iter(edp.minibatches())) if case == "facts_on_policy" else edp.pull()
            res["ids_seen"] = batch["seen_ids"].tolist() == batch.info.ids.tolist()
            if case in ("facts", "facts_local"):
                res["weights_seen"] = bool(np.array_equal(batch["seen_w"].numpy(), batch.info.weights))
            if case == "facts":
                res["owners_seen"] = bool(np.array_equal(batch["seen_owners"].numpy(), batch.owners))
        except Exception as e:
            res["error"] = f"{type(e).__name__}: {e}"
        if case in ("drops", "fails", "fails_overlapped"):  # latched, as one process latches it: raised again
            res["again"] = _outcome(edp.pull)              # by the next call, the hook not run again
            res["runs"] = len(runs)
        edp.close()
        out[case] = edp_gather(rank, world, res)
    return out


def learner_side(rank: int, world: int) -> dict[str, Any]:
    """What a learner loop does around the shards, as one process does it: a bad priority update (for rows other
    ranks hold too) raises at the call and the group goes on; a local pull waits for its shard's rows (an actor
    thread pushing later); a push that times out changes nothing, and the group's counts still add up."""
    out: dict[str, Any] = {}
    edp = cd.Conduit(policy="off_policy", train_batch_size=8, capacity=64 * world, seed=4, timeout_s=30,
                     sampler="prioritized")
    res: dict[str, Any] = {}
    try:
        edp.push(good(rank, 0, n=16))
        b = edp.pull()
        bad = np.ones(len(b.owners))
        bad[int(np.flatnonzero(b.owners != rank)[0]) if (b.owners != rank).any() else 0] = float("nan")
        res["nan_update"] = _outcome(lambda: edp.update_priorities(b, bad))
        res["then"] = _outcome(lambda: [edp.update_priorities(b, np.ones(len(b.owners))), edp.pull()])
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}"
    edp.close()
    out["bad_priorities"] = edp_gather(rank, world, res)

    edp = cd.Conduit(policy="off_policy", train_batch_size=8, capacity=64 * world, seed=4, timeout_s=30,
                     sampler="prioritized")
    try:  # rank 0 feeds back 100 for the rows it holds, then every rank pushes: one buffer's new rows enter at 100
        edp.push(good(rank, 0))
        b = edp.pull()
        if rank == 0:
            edp.update_priorities(b, np.where(b.owners == 0, 100.0, 1.0))
        edp.sync()
        edp.push(good(rank, 1))
        edp.pull()  # its sync lifts the new rows before it draws
        mine = _priorities(edp, new_from=4, max_digits=3)
    except Exception as e:
        mine = {"error": f"{type(e).__name__}: {e}"}
    edp.close()
    out["new_rows"] = edp_gather(rank, world, mine)

    edp = cd.Conduit(policy="off_policy", train_batch_size=8, capacity=16 * world, seed=3, timeout_s=30,
                     sampler="prioritized")

    def stale_update() -> dict[str, Any]:  # rank 0 feeds back 50 for rows every shard has overwritten since the
        edp.push(good(rank, 0, n=16))  # draw: each shard drops the update (as one process drops it), so the
        b = edp.pull()                 # group's max stays 1 and so do new rows
        edp.push(good(rank, 1, n=16))
        if rank == 0:
            edp.update_priorities(b, np.full(len(b.owners), 50.0))
        edp.sync()
        edp.push(good(rank, 2, n=1))
        edp.pull()
        return _priorities(edp)

    _scenario(out, "stale_update", edp, rank, world, stale_update)

    closing = cd.Conduit(policy="off_policy", train_batch_size=4, capacity=64 * world, seed=4, timeout_s=30,
                         sampler="prioritized", routing="round_robin")

    def after_close() -> dict[str, Any]:  # every push and priority update raises, routed or not, counting nothing
        closing.push(good(rank, 0))
        closing.push(good(rank, 1))
        b = closing.pull()
        before = closing.counters()
        closing.close()
        return {"push": [_outcome(lambda k=k: closing.push(good(rank, k))) for k in (2, 3)],
                "update": _outcome(lambda: closing.update_priorities(b, np.ones(len(b.owners)))),
                "counts_kept": before == closing.counters()}

    _scenario(out, "after_close", closing, rank, world, after_close)

    hooked = cd.Conduit(policy="off_policy", train_batch_size=2, capacity=64 * world, seed=1, timeout_s=5,
                        routing="round_robin")

    @hooked.register_ingestion()
    def picky(actor_in: Any, exp_out: Any) -> None:  # refuses every unit rank 1 pushed that was routed elsewhere
        data = actor_in.read()
        if int(data["tid"][0]) // 1000 == 1 and rank != 1:
            raise ValueError("picky refuses rank 1's units")
        exp_out.write(data)

    def routed_hook_fails() -> dict[str, Any]:  # the hook fails where a routed unit lands: every rank raises
        mine = {"pushes": _outcome(lambda: [hooked.push(good(rank, k)) for k in range(4)])}  # HookFailed at the
        try:                                                                                 # sync, naming it,
            hooked.pull()                                                                    # latched
            mine["pull"] = "accepted"
        except Exception as e:
            mine["pull"] = type(e).__name__
            mine["named"] = "picky refuses rank 1's units" in str(e) and "routed" in str(e)
        mine["again"] = _outcome(hooked.pull)
        return mine

    _scenario(out, "routed_hook_fails", hooked, rank, world, routed_hook_fails)

    edp = cd.Conduit(policy="off_policy", train_batch_size=4, capacity=64 * world, seed=4, timeout_s=30,
                     sampling="local")
    late = threading.Timer(0.3, lambda: edp.push(good(rank, 0)))
    late.start()
    out["local_waits"] = _outcome(lambda: edp.pull(timeout=20))
    late.join()
    edp.close()

    edp = cd.Conduit(policy="off_policy", train_batch_size=4, capacity=64 * world, seed=4, timeout_s=30)
    entered, release = threading.Event(), threading.Event()

    @edp.register_ingestion()
    def held_once(actor_in: Any, exp_out: Any) -> None:  # the first unit's invocation holds the path till released
        if not entered.is_set():
            entered.set()
            release.wait(20)
        exp_out.write(actor_in.read())

    first = threading.Thread(target=lambda: edp.push(good(rank, 0)))
    first.start()
    entered.wait(20)
    out["timed_out"] = _outcome(lambda: edp.push(good(rank, 1), timeout=0.2))
    release.set()
    first.join(20)
    edp.flush()
    st = edp.stats()
    out["counts"] = {"exactly_once": st.exactly_once, "pushed": list(st.pushed_rows), "rows": sum(st.shard_rows)}
    edp.close()
    return out

def restore_ahead(rank: int, world: int, ck: str) -> dict[str, Any]:
    """Prioritized, two batches per exchange: saved with a batch drawn ahead and priorities fed back, restored
    onto the same ranks, the run continues draw for draw (rows, weights): the batch drawn ahead comes back first
    and the restored rows keep their priorities (they are not new rows to lift to the max)."""
    kw = dict(policy="off_policy", train_batch_size=4, capacity=64 * world, seed=11, timeout_s=30,
              sampler="prioritized", pinned={"delivery_overlap": False, "delivery_granularity": 2})

    def draws(edp: cd.Conduit) -> list[Any]:
        return [(b["tid"].tolist(), np.round(b.info.weights, 6).tolist()) for b in (edp.pull() for _ in range(3))]

    edp = cd.Conduit(**kw)
    try:
        for k in range(4):
            edp.push(good(rank, k))
        for _ in range(3):  # g = 2: the third pull leaves one batch drawn ahead
            b = edp.pull()
            edp.update_priorities(b, (b["tid"].numpy() % 7 + 1).astype(np.float64))
        edp.save(ck)
        after = draws(edp)
    finally:
        edp.close()
    again = cd.Conduit(**kw)
    try:
        again.start()  # started first: its delivery path exists when the checkpoint comes in
        again.restore(ck)
        restored = draws(again)
    finally:
        again.close()
    return {"same": restored == after, "after": after, "restored": restored}

def edp_gather(rank: int, world: int, obj: Any) -> list[Any]:
    """Gather over the default group (a runtime whose collectives failed cannot gather)."""
    got: list[Any] = [None] * world
    torch.distributed.all_gather_object(got, obj)
    return got


def first_units_diverge(rank: int, world: int) -> dict[str, Any]:
    """No declared spec; rank 0's first unit has 5 columns where the others' have 3.

    ``ordered``: the others push first, then rank 0 (round-robin routing). ``concurrent``: everyone at once
    (local routing): whichever layout the group took first, a rank whose unit differs is refused at its push
    and pushes the group's layout instead. Then every rank pulls a few batches."""
    out: dict[str, Any] = {}
    for case, routing in (("ordered", "round_robin"), ("concurrent", "local")):
        edp = cd.Conduit(policy="off_policy", train_batch_size=4, capacity=200 * world, seed=9, timeout_s=30,
                         routing=routing, min_size_to_sample=4)
        cols = 5 if rank == 0 else 3
        res: dict[str, Any] = {"first": None, "pulls": []}
        try:
            if case == "ordered":
                if rank != 0:
                    edp.push(good(rank, 0, cols=cols))
                edp_gather(rank, world, None)  # the others' units are pushed before rank 0's
                res["first"] = _outcome(lambda e=edp, c=cols: e.push(good(rank, 0, cols=c)) if rank == 0 else None)
            else:
                res["first"] = _outcome(lambda e=edp, c=cols: e.push(good(rank, 0, cols=c)))
            if res["first"] != "accepted":  # the group holds the other layout
                edp.push(good(rank, 1, cols=3 if cols == 5 else 5))
            for _ in range(3):
                res["pulls"].append(_outcome(edp.pull))
            res["spec"] = list(edp.spec["obs"].shape) if edp.spec is not None else None
        except Exception as e:
            res["error"] = f"{type(e).__name__}: {e}"
        edp.close()
        out[case] = edp_gather(rank, world, res)
    return out


# -- checkpoints ---------------------------------------------------------------------------------
def _runtime() -> cd.Conduit:
    """The config of ``workers.save_shards``, so its checkpoint restores here."""
    return cd.Conduit(policy="off_policy", train_batch_size=16, capacity=200 * 4, sampler="prioritized", seed=23,
                      timeout_s=30, prioritized=conduit.PrioritizedReplay(alpha=0.6, beta=0.4, eps=1e-6))


def _reseal(path: Path, doc: dict[str, Any]) -> None:
    import hashlib

    (path / MANIFEST).write_text(json.dumps(doc, indent=1))
    (path / COMPLETE).write_text(hashlib.sha256((path / MANIFEST).read_bytes()).hexdigest())


def damaged(ck: str) -> dict[str, str]:
    """The copies :func:`damage` makes of ``ck``."""
    return {"damaged": f"{ck}-damaged", "escape": f"{ck}-escape"}


def damage(ck: str) -> dict[str, str]:
    """Next to the checkpoint ``ck``: a copy whose shard 1 is damaged, and a copy whose manifest points shard 1
    outside its directory (at an intact shard there, resealed)."""
    src = Path(ck)
    bad = src.with_name(src.name + "-damaged")
    shutil.copytree(src, bad)
    pt = sorted((bad / "shard-00001").glob("*.pt"))[0]
    raw = bytearray(pt.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    pt.write_bytes(bytes(raw))
    escape = src.with_name(src.name + "-escape")
    elsewhere = src.with_name(src.name + "-elsewhere")
    shutil.copytree(src, escape)
    elsewhere.mkdir()
    shutil.copytree(src / "shard-00001", elsewhere / "shard-00001")
    doc = json.loads((escape / MANIFEST).read_text())
    doc["shards"][1] = f"../{elsewhere.name}/shard-00001"
    _reseal(escape, doc)
    return damaged(ck)


def _state(edp: cd.Conduit) -> dict[str, Any]:
    return {"rows": edp.shard.buffer.rows if edp.shard.buffer is not None else 0, "counters": edp.counters(),
            "rng": edp.shared_rng.bit_generator.state["state"]["state"]}


def restore_refusals(rank: int, world: int, ck: str, paths: dict[str, str]) -> dict[str, Any]:
    """Restores that must be refused on every rank and change nothing, then the intact checkpoint, into the same
    runtime: it must load."""
    edp = _runtime()
    res: dict[str, Any] = {"before": _state(edp), "refused": {}}
    for name in ("damaged", "escape"):
        try:
            edp.restore(paths[name])
            res["refused"][name] = {"raised": None}
        except Exception as e:
            res["refused"][name] = {"raised": type(e).__name__, "message": str(e)[:400]}
        res["refused"][name]["after"] = _state(edp)
    try:
        edp.restore(ck)
        st = edp.stats()  # (starts the shard: a restore into one not started yet loads when it starts)
        res["good"] = {"raised": None, "rows": edp.shard.buffer.rows, "tids": sorted(_tids(edp)),
                       "pushed": sum(st.pushed_rows), "exactly_once": st.exactly_once}
    except Exception as e:
        res["good"] = {"raised": type(e).__name__, "message": str(e)[:400]}
    edp.close()
    return {"ranks": edp_gather(rank, world, res)}


def leftovers(ck: str) -> list[str]:
    """Temporaries of distributed saves beside the checkpoint ``ck``."""
    p = Path(ck)
    return sorted(x.name for x in p.parent.glob(f".{p.name}.dtmp*"))


# -- a rank stalled in the middle of a save ----------------------------------------------------------------
STALL_TIMEOUT = 3.0


def stalled_save(rank: int, world: int, port: int, out: str, ck: str) -> None:
    """Rank 0 (which hosts the group's store and owns the save's temporary) stops itself (SIGSTOP) once its shard
    is written; the others' save must raise ``RankFailed`` naming it within the documented bound. The parent then
    kills rank 0: a save killed on one rank."""
    launch.init_process_group(rank, world, port, timeout_s=60)
    edp = cd.Conduit(policy="off_policy", train_batch_size=8, capacity=1000, seed=1, timeout_s=STALL_TIMEOUT)
    edp.push(good(rank, 0, n=16))
    edp.sync()
    if rank == 0:
        save = edp.shard.save

        def save_then_stop(where: Any, **kw: Any) -> Any:
            done = save(where, **kw)
            os.kill(os.getpid(), signal.SIGSTOP)
            return done

        edp.shard.save = save_then_stop
    report: dict[str, Any] = {"rank": rank, "bound": getattr(edp.group, "failure_bound_s", None)}
    t0 = time.monotonic()
    try:
        edp.save(ck)
        report["raised"] = None
    except cd.RankFailed as e:
        report.update(raised="RankFailed", ranks=list(e.ranks), message=str(e).splitlines()[0])
    except Exception as e:  # pragma: no cover - reported to the parent
        report.update(raised=type(e).__name__, message=str(e)[:500])
    report["seconds"] = time.monotonic() - t0
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    wait_for_reports(out, list(range(1, world)))  # no survivor ends while the other diagnoses
    os._exit(0)  # the group is broken: skip torch.distributed's teardown


def wait_for_reports(out: str, ranks: list[int], seconds: float = 30.0) -> None:
    """Until every rank of ``ranks`` wrote its report (bounded): a survivor that ended (closing rank 0's store,
    or exiting) while another still diagnoses would be named by it, rightly, as gone."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(Path(out, f"rank{r}.json").exists() for r in ranks):
        time.sleep(0.05)


def run_stalled_save(root: Path) -> dict[str, Any]:
    """Spawn :func:`stalled_save` on 3 ranks; returns the survivors' reports and the temporaries left."""
    import torch.multiprocessing as mp

    ck = str(root / "ck")
    out = root / "stalled"
    out.mkdir()
    world = 3
    ctx = mp.start_processes(stalled_save, args=(world, launch.free_port(), str(out), ck), nprocs=world,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + 90
    for p in ctx.processes[1:]:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in ctx.processes:
        if p.is_alive():  # the stopped rank 0: killed now, in the middle of its save
            p.kill()
            p.join(10)
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(1, world)
               if (out / f"rank{r}.json").exists()]
    return {"reports": reports, "left": leftovers(ck), "ck": ck, "world": world, "timeout": STALL_TIMEOUT}


def on_policy_promises(rank: int, world: int, ck: str) -> dict[str, Any]:
    """On-policy across ranks, as one process: ``ready()`` says whether rows wait; an iteration too small for its
    mini-batches is refused on every rank with its rows kept; ``minibatches()`` seals at the call; each batch names
    its learner; the counters count; a checkpoint is refused mid-iteration and restores the iteration number; a
    failed ingestion hook is latched; ``actor_channel`` takes ``on_actor_lost``."""
    kw = dict(policy="on_policy", train_batch_size=8 * world, num_minibatches=2, num_epochs=1, num_learners=world,
              seed=5, timeout_s=20)
    out: dict[str, Any] = {}
    edp = cd.Conduit(**kw)

    def iterate() -> dict[str, Any]:
        mine: dict[str, Any] = {"ready_before": edp.ready()}
        edp.push(good(rank, 0, n=1))  # 1 row a rank: fewer than 2 mini-batches x world learners
        mine["ready_after"] = edp.ready()
        mine["too_few"] = _outcome(edp.minibatches)
        edp.push(good(rank, 1, n=3))
        parts = edp.minibatches()  # sealed here: what is pushed next belongs to the next iteration
        edp.push(good(rank, 2, n=4))
        first = next(parts)
        mine["save_mid"] = _outcome(lambda: edp.save(f"{ck}-onpolicy"))
        batches = [first, *parts]
        tids = sorted(t for b in edp.group.gather_object([b["tid"].tolist() for b in batches], "t") for p in b
                      for t in p)
        mine["iteration0"] = tids == sorted(r * 1000 + i for r in range(world) for i in (0, 3, 4, 5))
        mine["info"] = sorted({(b.info.iteration, b.info.learner) for b in batches})
        mine["pushed"] = list(edp.stats().pushed_rows)
        edp.save(f"{ck}-onpolicy")
        edp.actor_channel(on_actor_lost=lambda loss: None).close()
        return mine

    _scenario(out, "iterate", edp, rank, world, iterate)
    again = cd.Conduit(**kw)

    def restored() -> dict[str, Any]:
        again.restore(f"{ck}-onpolicy")
        batches = list(again.minibatches())  # the rows pushed after the last seal: iteration 1
        return {"iterations": sorted({b.info.iteration for b in batches}),
                "rows": sum(len(b["tid"]) for b in batches)}

    _scenario(out, "restored", again, rank, world, restored)
    hooked = cd.Conduit(**kw)

    @hooked.register_ingestion()
    def fails_once(actor_in: Any, exp_out: Any) -> None:
        data = actor_in.read()
        if int(data["tid"][0]) % 1000 == 4:
            raise ValueError("the hook refuses unit 1")
        exp_out.write(data)

    def latched() -> dict[str, Any]:
        return {"pushes": [_outcome(lambda k=k: hooked.push(good(rank, k))) for k in range(3)]}

    _scenario(out, "hook_latched", hooked, rank, world, latched)
    return out


def save_under_pushes(rank: int, world: int, ck: str) -> dict[str, Any]:
    """A checkpoint taken while an actor thread on every rank pushes (round-robin: units in flight between ranks):
    restored, its counts still add up (what was in flight when it was taken is not in it, nor counted)."""
    kw = dict(policy="off_policy", train_batch_size=4, capacity=4096 * world, seed=2, timeout_s=20,
              routing="round_robin")
    edp = cd.Conduit(**kw)
    stop = threading.Event()

    def actor() -> None:
        deadline = time.monotonic() + 10
        for k in range(20_000):
            if stop.is_set() or time.monotonic() > deadline:
                return
            edp.push(good(rank, k % 200))

    pusher = threading.Thread(target=actor, daemon=True)
    pusher.start()
    time.sleep(0.2)
    edp.save(ck)
    stop.set()
    pusher.join(20)
    edp.close()
    again = cd.Conduit(**kw)
    again.restore(ck)
    st = again.stats()
    again.close()
    mine = {"exactly_once": st.exactly_once, "in_flight": sum(st.in_flight_rows), "rows": sum(st.shard_rows) > 0}
    return edp_gather(rank, world, mine)
