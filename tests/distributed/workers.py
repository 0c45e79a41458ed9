"""What each rank runs in the distributed tests (spawned processes import this module).

Every scenario returns plain data (lists, dicts) that rank 0 writes for the test
to check in the parent; no assertion runs inside a rank except where it has to.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import conduit
import conduit.distributed as cd
from conduit.distributed import launch
from conduit.distributed.checkpoint import read_manifest
from conduit.ext import stored_in_order
from conduit.scheduling.planner import group_planner
from tests.distributed import promises

ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
BATCH = 64


def unit(tids: np.ndarray | list[int]) -> dict[str, torch.Tensor]:
    tid = torch.as_tensor(np.asarray(tids, dtype=np.int64))
    return {"obs": tid.to(torch.float32).unsqueeze(1).repeat(1, 3), "tid": tid}


def prio(tid: np.ndarray) -> np.ndarray:
    """The priority every test row gets (|td| before alpha)."""
    return 1.0 + (np.asarray(tid) % 5).astype(np.float64)


def fill(edp: cd.Conduit, rank: int, rows: int, base: int = 0) -> np.ndarray:
    tids = np.arange(base + rank * 10_000, base + rank * 10_000 + rows)
    for chunk in np.array_split(tids, max(1, rows // 16)):
        edp.push(unit(chunk))
    return tids


def set_local_priorities(edp: cd.Conduit) -> None:
    buf = edp.shard.buffer
    slots, rows = stored_in_order(buf.state_dict())[:2]
    buf.update_priorities(slots, buf.ids[slots].copy(), prio(rows["tid"].numpy()))


def shard_leaves(edp: cd.Conduit) -> dict[int, float]:
    """This rank's rows: transition id -> priority leaf (``p^alpha``)."""
    buf = edp.shard.buffer
    slots, rows = stored_in_order(buf.state_dict())[:2]
    leaf, _ = buf.priorities_at(slots)
    return dict(zip(rows["tid"].tolist(), leaf.tolist(), strict=True))


def shard_tids(edp: cd.Conduit) -> list[int]:
    _, rows = stored_in_order(edp.shard.buffer.state_dict())[:2]
    return rows["tid"].tolist() if rows else []


# -- scenarios -----------------------------------------------------------------------------
def exactly_once(rank: int, world: int, routing: str, shares: list[float] | None) -> dict[str, Any]:
    edp = cd.Conduit(policy="off_policy", train_batch_size=8, capacity=4000 * world, seed=3, timeout_s=30,
                     routing=routing, shares=shares)
    threads_n, units, rows = 3, 15, 7
    errors: list[BaseException] = []

    def actor(t: int) -> None:
        try:
            for i in range(units):
                base = ((rank * threads_n + t) * units + i) * rows
                edp.push(unit(np.arange(base, base + rows)))
        except BaseException as e:  # pragma: no cover - reported to the parent
            errors.append(e)

    th = [threading.Thread(target=actor, args=(t,)) for t in range(threads_n)]
    for t in th:
        t.start()
    for t in th:
        t.join(60)
    stats = edp.stats()
    tids = edp.group.gather_object(shard_tids(edp), "test: shard contents")
    edp.close()
    return {"errors": [repr(e) for e in errors], "exactly_once": stats.exactly_once,
            "pushed": sum(stats.pushed_rows), "ingested": sum(stats.ingested_rows),
            "in_flight": sum(stats.in_flight_rows), "shard_rows": list(stats.shard_rows),
            "tids": [t for per in tids for t in per], "expected": world * threads_n * units * rows,
            "capacity": list(stats.shard_capacity)}


def distribution(rank: int, world: int, sampler: str, sampling: str, pulls: int, overlap: bool = False,
                 g: int = 1) -> dict[str, Any]:
    """Draws over unequal shards. Overlapped, a collective (``stats``) runs every few pulls, while an
    exchange is in flight on the delivery worker: the order of collectives must hold on every rank."""
    edp = cd.Conduit(policy="off_policy", train_batch_size=BATCH, capacity=2000 * world, sampler=sampler,
                     seed=11, timeout_s=30, sampling=sampling,
                     prioritized=conduit.PrioritizedReplay(alpha=ALPHA, beta=BETA, eps=EPS),
                     pinned={"delivery_overlap": overlap, "delivery_granularity": g})
    tids = fill(edp, rank, 40 * (rank + 1))  # unequal shards: local sampling is not one buffer's distribution
    if sampler == "prioritized":
        set_local_priorities(edp)
        b = edp.pull()  # the same priorities again, through the cross-rank path
        edp.update_priorities(b, prio(b["tid"].numpy()))
    seen: list[int] = []
    weights: dict[int, float] = {}
    modes = set()
    exactly_once = True
    for k in range(pulls):
        b = edp.pull()
        modes.add((b.info.mode.overlap, int(b.info.mode.granularity)))
        if overlap and k % 7 == 3:
            exactly_once &= edp.stats().exactly_once
        seen += b["tid"].tolist()
        if b.info.weights is not None:
            for t, w in zip(b["tid"].tolist(), b.info.weights.tolist(), strict=True):
                weights[t] = w
    everything = edp.group.gather_object({"tids": tids.tolist(), "seen": seen, "weights": weights}, "test: gather")
    out: dict[str, Any] = {"ranks": everything, "modes": sorted(modes), "exactly_once": exactly_once}
    if sampler == "prioritized" and sampling == "global":
        out["cross_rank"] = _cross_rank_priorities(edp, rank, world)
        if rank == 0:
            out["reference"] = _single_buffer_weights([t for e in everything for t in e["tids"]])
    edp.close()
    return out


def _cross_rank_priorities(edp: cd.Conduit, rank: int, world: int) -> dict[str, Any]:
    """Priorities a learner sets for rows other ranks hold land on those ranks at the next collective."""
    b = edp.pull()
    new = np.where(b.owners != rank, 50.0 + rank, prio(b["tid"].numpy()))
    edp.update_priorities(b, new)
    sent = {int(t): float(p) for t, p, o in zip(b["tid"].tolist(), new, b.owners, strict=True) if o != rank}
    edp.pull()  # the next collective delivers them
    buf = edp.shard.buffer
    slots, rows = stored_in_order(buf.state_dict())[:2]
    leaf, _ = buf.priorities_at(slots)
    mine = dict(zip(rows["tid"].tolist(), leaf.tolist(), strict=True))
    all_sent = edp.group.gather_object(sent, "test: sent priorities")
    landed = {}
    for per in all_sent:
        for t, p in per.items():
            if t in mine:
                landed[t] = (mine[t], p)
    return {"landed": landed}


def _single_buffer_weights(tids: list[int]) -> dict[int, float]:
    """The importance weights one single-process prioritized buffer gives the same rows and priorities."""
    ref = conduit.Conduit(policy="off_policy", train_batch_size=BATCH, capacity=len(tids) + 1,
                          sampler="prioritized", seed=5,
                          prioritized=conduit.PrioritizedReplay(alpha=ALPHA, beta=BETA, eps=EPS))
    with ref:
        ref.push(unit(tids))
        buf = ref.buffer
        slots, rows = stored_in_order(buf.state_dict())[:2]
        buf.update_priorities(slots, buf.ids[slots].copy(), prio(rows["tid"].numpy()))
        out: dict[int, float] = {}
        for _ in range(30):
            s = buf.sample(BATCH)
            out.update(zip(s.data["tid"].tolist(), s.weights.tolist(), strict=True))
    return out


def auto_plan(rank: int, world: int) -> dict[str, Any]:
    """``plan="auto"``: the probe runs every candidate, and every rank keeps the same plan at the same pull."""
    edp = cd.Conduit(policy="off_policy", train_batch_size=16, capacity=1000 * world, seed=5, timeout_s=30,
                     plan="auto", g_max=2)
    fill(edp, rank, 200)
    probe = edp.planner.probe_units
    modes = []
    for _ in range(probe + 6):
        b = edp.pull()
        modes.append([int(b.info.mode.overlap), int(b.info.mode.granularity)])
    chosen = edp.delivery_mode
    every = edp.group.gather_object({"chosen": [chosen.overlap, chosen.g], "plan": edp.delivery_plan(),
                                     "tail": modes[probe + 2:]}, "test: gather")
    edp.close()
    return {"ranks": every, "probe_pulls": probe}


def group_timeout(rank: int, world: int) -> dict[str, Any]:
    """Overlapped, nothing pushed anywhere: the exchange the pull queued gives up on every rank alike, and the
    pull raises ``GroupTimeout`` (the group is still in step, nothing latched); rows pushed, the next pulls and a
    collective of the learner's own go on."""
    edp = cd.Conduit(policy="off_policy", train_batch_size=8, capacity=1000 * world, seed=4, timeout_s=30,
                     pinned={"delivery_overlap": True})
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    try:
        edp.pull(timeout=0.5)
        out["first"] = "served"
    except Exception as e:
        out["first"] = type(e).__name__
    out["waited_s"] = time.monotonic() - t0
    fill(edp, rank, 64)
    try:
        batches = [edp.pull() for _ in range(3)]
        out["then"] = [bool(b.info.mode.overlap) for b in batches]
        out["stats_rows"] = sum(edp.stats().shard_rows)
    except Exception as e:
        out["then"] = f"{type(e).__name__}: {e}"
    edp.close()
    return promises.edp_gather(rank, world, out)


def auto_replan(rank: int, world: int) -> dict[str, Any]:
    """``plan="auto"`` watched: once the plan is kept, the learner's compute grows to 50 ms a pull (some 25x what
    the probe measured); every rank must probe again from inline, at the same pull."""
    edp = cd.Conduit(policy="off_policy", train_batch_size=16, capacity=1000 * world, seed=6, timeout_s=30,
                     plan="auto", g_max=2)
    planner = edp.planner = group_planner(edp.planner.keys, windows=2, window=4)
    fill(edp, rank, 200)
    for _ in range(planner.probe_units + 1):
        edp.pull()
    decided = planner.chosen is not None
    replanned_at, mode_after = None, None
    for i in range(40):  # the first check comes 12 pulls after the decision
        edp.pull()
        time.sleep(0.05)
        if planner.replans:
            replanned_at, mode_after = i, [edp.delivery_mode.overlap, edp.delivery_mode.g]
            break
    every = edp.group.gather_object({"decided": decided, "replanned_at": replanned_at, "mode_after": mode_after,
                                     "replans": list(planner.replans), "plan": edp.delivery_plan()}, "test: gather")
    edp.close()
    return {"ranks": every}


RATE = {"samples_per_insert": 1.0, "min_size": 32, "batch": 8}


def rate_limited(rank: int, world: int, ck: str) -> dict[str, Any]:
    """The group's samples-per-insert ratio: an actor thread pushes as fast as the ratio admits while the learner
    pulls (blocking, overlapped), and a checkpoint carries the counts on; then, non-blocking, pushes until refused
    and pulls until refused."""
    tol = 2 * world * RATE["batch"]
    kw = dict(policy="off_policy", train_batch_size=RATE["batch"], capacity=1000 * world, seed=11, timeout_s=30,
              min_size_to_sample=RATE["min_size"])
    edp = cd.Conduit(rate_limit={"samples_per_insert": RATE["samples_per_insert"], "tolerance": tol},
                     pinned={"delivery_overlap": True}, **kw)  # exchanges drawn ahead wait for inserts on the worker
    stop = threading.Event()

    def actor() -> None:
        for k in range(2000):
            if stop.is_set():
                return
            try:
                edp.push(unit(np.arange(4) + rank * 100_000 + 4 * k), timeout=20)
            except conduit.RuntimeClosed:
                return

    t = threading.Thread(target=actor, name="test-actor")
    t.start()
    seen = []  # the group's counts as each exchange drew (on the delivery worker, at the same point on every rank)
    drew = edp.rate.drew

    def recording(rows: int) -> None:
        drew(rows)
        seen.append([edp.rate.limiter.inserts, edp.rate.limiter.samples])

    edp.rate.drew = recording
    for _ in range(30):
        edp.pull()
    seen = seen[:30]  # the exchanges the 30 pulls delivered (the worker may be drawing the next one now)
    stop.set()
    stats = edp.stats()
    final = [sum(stats.pushed_rows), edp.rate.limiter.samples]
    edp.save(ck)
    edp.close()
    t.join(30)
    edp = cd.Conduit(rate_limit={"samples_per_insert": RATE["samples_per_insert"], "tolerance": tol}, **kw)
    edp.restore(ck)
    edp.sync()
    saved = read_manifest(ck)["rate"]["inserts"]
    carried = [edp.rate.limiter.inserts, edp.rate.limiter.samples, saved]
    edp.close()
    edp = cd.Conduit(rate_limit={"samples_per_insert": RATE["samples_per_insert"], "tolerance": tol, "block": False},
                     **kw)
    pushed = 0
    try:
        for k in range(1000):
            edp.push(unit(np.arange(4) + rank * 100_000 + 4 * k))
            pushed += 4
    except conduit.RateLimited:
        pass
    pulls, refused, ready = 0, None, []
    try:
        for _ in range(1000):
            ready.append(edp.ready())
            edp.pull()
            pulls += 1
    except conduit.RateLimited as e:
        refused = str(e)
    every = edp.group.gather_object({"seen": seen, "final": final, "carried": carried, "pushed": pushed,
                                     "pulls": pulls, "refused": refused, "ready": ready}, "test: gather")
    edp.close()
    return {"ranks": every, "tolerance": tol}


def on_policy(rank: int, world: int) -> dict[str, Any]:
    rows_here = [13 * (rank + 1) + 3, 7 * (rank + 2)]
    totals = [sum(13 * (r + 1) + 3 for r in range(world)), sum(7 * (r + 2) for r in range(world))]
    edp = cd.Conduit(policy="on_policy", train_batch_size=totals[0], num_minibatches=4, num_epochs=2,
                     num_learners=world, seed=7, timeout_s=30)
    got = []
    for it, n in enumerate(rows_here):
        tids = np.arange(n) + rank * 10_000 + it * 100_000
        for chunk in np.array_split(tids, 3):
            edp.push(unit(chunk))
        for b in edp.minibatches():
            got.append({"iteration": b.info.iteration, "epoch": b.info.epoch, "minibatch": b.info.minibatch,
                        "last": b.info.last, "tids": b["tid"].tolist()})
    every = edp.group.gather_object({"got": got}, "test: gather")
    edp.close()
    return {"learners": [e["got"] for e in every], "totals": totals}


def save_shards(rank: int, world: int, path: str) -> dict[str, Any]:
    edp = cd.Conduit(policy="off_policy", train_batch_size=16, capacity=200 * 4, sampler="prioritized",
                     seed=13, timeout_s=30, prioritized=conduit.PrioritizedReplay(alpha=ALPHA, beta=BETA, eps=EPS))
    fill(edp, rank, 30 + 10 * rank)
    set_local_priorities(edp)
    edp.pull()
    edp.save(path)
    every = edp.group.gather_object(shard_leaves(edp), "test: gather")
    stats = edp.stats()
    edp.close()
    return {"leaves": {k: v for e in every for k, v in e.items()}, "pushed": sum(stats.pushed_rows)}


def restore_shards(rank: int, world: int, path: str) -> dict[str, Any]:
    edp = cd.Conduit(policy="off_policy", train_batch_size=16, capacity=200 * 4, sampler="prioritized",
                     seed=17, timeout_s=30, prioritized=conduit.PrioritizedReplay(alpha=ALPHA, beta=BETA, eps=EPS))
    edp.restore(path)
    restored = edp.group.gather_object(shard_leaves(edp), "test: gather")
    stats = edp.stats()
    fill(edp, rank, 8, base=500_000)  # continues: new rows, new draws
    seen, weights = [], []
    for _ in range(20):
        b = edp.pull()
        seen += b["tid"].tolist()
        weights += b.info.weights.tolist()
    after = edp.stats()
    edp.close()
    return {"restored": [list(m.items()) for m in restored], "exactly_once": stats.exactly_once,
            "pushed": sum(stats.pushed_rows), "after_exactly_once": after.exactly_once,
            "seen": seen, "max_weight": max(weights), "shard_rows": list(after.shard_rows)}


def scenarios(rank: int, world: int, port: int, out: str, ck: str, mode: str) -> None:
    """Every check of one world size, in one group (a group costs seconds to start on two cores)."""
    launch.init_process_group(rank, world, port, timeout_s=60)
    res: dict[str, Any] = {}
    res["round_robin"] = exactly_once(rank, world, "round_robin", None)
    res["proportional"] = exactly_once(rank, world, "proportional", [float(r + 1) for r in range(world)])
    res["uniform"] = distribution(rank, world, "uniform", "global", 40)
    res["uniform_local"] = distribution(rank, world, "uniform", "local", 40)
    res["prioritized"] = distribution(rank, world, "prioritized", "global", 40)
    res["uniform_overlapped"] = distribution(rank, world, "uniform", "global", 40, overlap=True, g=2)
    res["prioritized_overlapped"] = distribution(rank, world, "prioritized", "global", 40, overlap=True)
    res["auto_plan"] = auto_plan(rank, world)
    res["auto_replan"] = auto_replan(rank, world)
    res["group_timeout"] = group_timeout(rank, world)
    res["rate_limited"] = rate_limited(rank, world, f"{ck}-rate{world}")
    res["on_policy"] = on_policy(rank, world)
    res["push_checks"] = promises.push_checks(rank, world)
    res["diverge"] = promises.first_units_diverge(rank, world)
    res["push_checks_more"] = promises.hooked_and_on_policy(rank, world)
    res["delivery_hooks"] = promises.delivery_hooks(rank, world)
    res["learner_side"] = promises.learner_side(rank, world)
    res["restore_ahead"] = promises.restore_ahead(rank, world, f"{ck}-ahead{world}")
    res["on_policy_promises"] = promises.on_policy_promises(rank, world, f"{ck}-onpolicy{world}")
    res["save_under_pushes"] = promises.save_under_pushes(rank, world, f"{ck}-busy{world}")
    if mode == "save":
        res["leftovers_before"] = promises.leftovers(ck)  # a save killed before this run left its temporary
        res["save"] = save_shards(rank, world, ck)
        res["leftovers_after"] = promises.leftovers(ck)
        if rank == 0:
            promises.damage(ck)
        promises.edp_gather(rank, world, None)
    elif mode == "restore":
        res["restore"] = restore_shards(rank, world, ck)
    res["restore_refusals"] = promises.restore_refusals(rank, world, ck, promises.damaged(ck))
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def killed(rank: int, world: int, port: int, out: str, victim: int, how: str = "kill") -> None:
    """``victim`` kills itself with SIGKILL (``how="kill"``), or stops itself with SIGSTOP (``"stop"``: alive
    but silent; its exchanges overlapped on the delivery worker); the others pull until they raise, and say what and when."""
    launch.init_process_group(rank, world, port, timeout_s=60)
    edp = cd.Conduit(policy="off_policy", train_batch_size=8, capacity=1000, seed=1, timeout_s=4,
                     pinned={"delivery_overlap": how == "stop"})
    fill(edp, rank, 32)
    edp.pull()
    if rank == victim:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    t0 = time.monotonic()
    report: dict[str, Any] = {"rank": rank}
    try:
        for _ in range(100_000):
            edp.pull()
            if time.monotonic() - t0 > 60:
                break
        report["raised"] = None
    except cd.RankFailed as e:
        report.update(raised="RankFailed", ranks=list(e.ranks), message=str(e).splitlines()[0],
                      seconds=time.monotonic() - t0)
        try:  # the failure is latched: the next call raises it again, at once
            t1 = time.monotonic()
            edp.push(unit([1]))
            report["second"] = None
        except cd.RankFailed:
            report["second"] = time.monotonic() - t1
    except Exception as e:  # pragma: no cover - reported to the parent
        report.update(raised=type(e).__name__, message=str(e)[:500], seconds=time.monotonic() - t0)
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    promises.wait_for_reports(out, [r for r in range(world) if r != victim])  # no survivor ends while others diagnose
    edp.close()
    os._exit(0)  # the group is broken: skip torch.distributed's teardown


def ray_rank(rank: int, world: int, port: int) -> dict[str, Any]:
    """A rank inside a Ray actor: the same checks, returned to the driver."""
    launch.init_process_group(rank, world, port, timeout_s=60)
    try:
        return {"round_robin": exactly_once(rank, world, "round_robin", None),
                "prioritized": distribution(rank, world, "prioritized", "global", 25)}
    finally:
        dist.destroy_process_group()
