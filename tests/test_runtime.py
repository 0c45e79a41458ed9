"""Integration tests of the runtime with real worker threads."""

from __future__ import annotations

import threading
import time
from fractions import Fraction

import pytest
import torch

import conduit
from conduit import Conduit, ConduitTimeout, Mode, RuntimeClosed, RuntimeFailed, Schedule, SpecError
from tests.helpers import transitions

OFF_MODES = [Mode(o, g) for o in (False, True) for g in (1, 2, 3)]


def off_runtime(ing: Mode, dlv: Mode, **kw) -> Conduit:
    cfg = dict(policy="off_policy", train_batch_size=8, capacity=256, seed=0, timeout_s=5.0)
    cfg.update(kw)
    return Conduit(pinned=Schedule(ing, dlv), **cfg)


@pytest.mark.parametrize("dlv", [Mode(False, 1), Mode(False, 3), Mode(True, 2)], ids=str)
def test_a_batchs_ids_read_after_its_slots_were_overwritten_still_name_its_rows(dlv):
    """Pulled batches' provenance is made when first read (a ring's ids from its position at the draw): read
    only after the ring wrapped several times over their slots, every batch's ids are still its rows' tids."""
    with off_runtime(Mode(False, 1), dlv, capacity=32) as edp:
        batches = []
        for u in range(12):
            edp.push(transitions(16, start=16 * u))
            if edp.ready():
                batches.append(edp.pull())
        edp.flush()
        assert edp.buffer.inserted == 192 and len(batches) >= 10  # the 32-slot ring wrapped five times over
        for b in batches:
            assert b.info.ids.tolist() == b["tid"].tolist()
            assert (b.info.indices >= 0).all() and (b.info.indices < 32).all()


@pytest.mark.parametrize("ing", OFF_MODES, ids=str)
@pytest.mark.parametrize("dlv", OFF_MODES, ids=str)
def test_off_policy_every_mode_ingests_everything_once_and_delivers_valid_rows(ing, dlv):
    with off_runtime(ing, dlv) as edp:
        for u in range(10):
            edp.push(transitions(16, start=16 * u))
            if edp.ready():
                b = edp.pull()
                assert b.size == 8
                assert torch.equal(b["tid"], torch.from_numpy(b.info.ids))
                assert b.info.staleness <= int(dlv.granularity)
                assert b.info.mode == dlv
        edp.flush()
        tids = sorted(edp.buffer.contents()["tid"].tolist())
        assert tids == list(range(160))
        s = edp.stats()
        assert s.pushed_rows == s.ingested_rows == 160
        assert s.ingestion_invocations == -(-10 // int(ing.granularity))


def test_batched_ingestion_lags_by_at_most_g_units():
    with off_runtime(Mode(False, 3), Mode(False, 1), min_size_to_sample=1) as edp:
        for u in range(7):
            edp.push(transitions(4, start=4 * u))
            pending = edp.stats().pushed_units - edp.stats().ingested_rows // 4
            assert pending < 3
        assert edp.stats().ingested_rows == 24  # 6 of 7 units; the 7th waits for its group
        edp.flush()
        assert edp.stats().ingested_rows == 28


@pytest.mark.parametrize("ing", [Mode(True, 2), Mode(False, 1)], ids=str)  # inline g=1: the direct write path
def test_concurrent_actor_threads_lose_and_duplicate_nothing(ing):
    with off_runtime(ing, Mode(True, 1), capacity=10_000) as edp:
        def actor(k):
            for u in range(25):
                edp.push(transitions(8, start=10_000 * k + 8 * u))

        threads = [threading.Thread(target=actor, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        edp.flush()
        tids = edp.buffer.contents()["tid"].tolist()
        expected = [10_000 * k + i for k in range(4) for i in range(200)]
        assert sorted(tids) == sorted(expected)
        assert len(set(edp.buffer.ids[: edp.buffer.size].tolist())) == 800


def test_data_parallel_learners_each_pull_their_own_batches():
    with off_runtime(Mode(True, 1), Mode(True, 2), num_learners=3) as edp:
        edp.push(transitions(64))
        edp.flush()
        results = {}

        def learner(rank):
            results[rank] = [edp.pull(rank) for _ in range(5)]

        threads = [threading.Thread(target=learner, args=(r,)) for r in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for rank, batches in results.items():
            assert [b.info.pull_index for b in batches] == list(range(5))
            assert all(b.info.learner == rank and b.size == 8 for b in batches)
        assert edp.stats().pulls == 15


def test_prioritized_replay_end_to_end_with_prefetch():
    with off_runtime(Mode(True, 1), Mode(True, 2), sampler="prioritized", capacity=32) as edp:
        edp.push(transitions(32))
        edp.flush()
        b = edp.pull()
        assert b.weights is not None and b.weights.shape == (8,)
        edp.push(transitions(32, start=32))  # overwrites every slot
        edp.flush()
        assert edp.update_priorities(b, torch.ones(8)) == 0  # all stale: dropped
        b2 = edp.pull(timeout=2)
        b3 = edp.pull(timeout=2)
        fresh = [x for x in (b2, b3) if x.info.buffer_version == 64]
        assert fresh and edp.update_priorities(fresh[0], torch.ones(8)) == 8


@pytest.mark.parametrize("ing", [Mode(False, 1), Mode(True, Fraction(1, 4)), Mode(True, Fraction(1, 2))], ids=str)
@pytest.mark.parametrize("dlv", [Mode(False, 1), Mode(True, Fraction(1, 4))], ids=str)
def test_on_policy_modes_deliver_each_iteration_exactly(ing, dlv):
    cfg = dict(policy="on_policy", train_batch_size=32, num_minibatches=4, num_epochs=2, rollout_unit_size=16, seed=1)
    with Conduit(pinned=Schedule(ing, dlv), **cfg) as edp:
        for it in range(3):
            edp.push(transitions(16, start=32 * it))
            edp.push(transitions(16, start=32 * it + 16))
            mbs = list(edp.minibatches())
            assert len(mbs) == 8
            assert {b.info.iteration for b in mbs} == {it}
            for epoch in (0, 1):
                rows = torch.cat([b["tid"] for b in mbs if b.info.epoch == epoch]).tolist()
                assert sorted(rows) == list(range(32 * it, 32 * it + 32))
            assert mbs[-1].info.last and not any(b.info.last for b in mbs[:-1])


def test_on_policy_seal_closes_a_short_iteration():
    with Conduit(policy="on_policy", train_batch_size=100, num_minibatches=2) as edp:
        edp.push(transitions(10))
        assert edp.seal() == 0
        mbs = list(edp.minibatches())
        assert sorted(torch.cat([b["tid"] for b in mbs]).tolist()) == list(range(10))


def test_on_policy_seal_refuses_an_iteration_too_small_for_its_minibatches():
    with Conduit(policy="on_policy", train_batch_size=100, num_minibatches=4) as edp:
        edp.push(transitions(3))
        with pytest.raises(conduit.SemanticsError, match="fewer than num_minibatches"):
            edp.seal()
        edp.push(transitions(1, start=3))
        edp.seal()
        assert len(list(edp.minibatches())) == 4


def test_on_policy_data_parallel_learners_split_each_minibatch():
    cfg = dict(policy="on_policy", train_batch_size=24, num_minibatches=2, num_learners=2, seed=0)
    with Conduit(**cfg) as edp:
        edp.push(transitions(24))
        out = {}

        def learner(r):
            out[r] = list(edp.minibatches(r))

        ts = [threading.Thread(target=learner, args=(r,)) for r in (0, 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for mb in range(2):
            shards = [out[r][mb]["tid"] for r in (0, 1)]
            assert not set(shards[0].tolist()) & set(shards[1].tolist())
        everything = torch.cat([b["tid"] for r in (0, 1) for b in out[r]]).tolist()
        assert sorted(everything) == list(range(24))


def test_on_policy_back_pressure_waits_for_the_learner_then_times_out():
    with Conduit(policy="on_policy", train_batch_size=8, timeout_s=0.3) as edp:
        edp.push(transitions(8))  # iteration 0
        edp.push(transitions(8))  # iteration 1
        t0 = time.monotonic()
        with pytest.raises(ConduitTimeout, match="is a learner pulling"):
            edp.push(transitions(8))  # iteration 2: two already in flight
        assert time.monotonic() - t0 < 2
        list(edp.minibatches())  # consume iteration 0 -> room again
        edp.push(transitions(8), timeout=1)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_failing_ingestion_hook_surfaces_from_the_next_call_within_a_second(overlap):
    edp = off_runtime(Mode(overlap, 1), Mode(overlap, 1))

    @edp.register_ingestion(input="Actor", output="ExperienceBuffer")
    def broken(actor_in, exp_out):
        raise ZeroDivisionError("boom in the framework's ingestion")

    with edp:
        t0 = time.monotonic()
        with pytest.raises(RuntimeFailed) as e:
            for _ in range(100):
                edp.push(transitions(4))
                time.sleep(0.01)
        assert time.monotonic() - t0 < 1.0
        assert isinstance(e.value.__cause__, ZeroDivisionError)
        assert "boom in the framework's ingestion" in str(e.value)
        assert "in broken" in e.value.original_traceback  # the original frame is kept
        with pytest.raises(RuntimeFailed):
            edp.pull(timeout=0.2)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_failing_delivery_hook_surfaces_from_pull_within_a_second(overlap):
    edp = off_runtime(Mode(True, 1), Mode(overlap, 1))

    @edp.register_delivery(input="ExperienceBuffer", output="Learner")
    def broken(exp_in, learn_out):
        raise KeyError("missing column")

    with edp:
        t0 = time.monotonic()
        with pytest.raises(RuntimeFailed, match="missing column"):
            # the overlapped worker may fail before pull: then flush (the next call) reports it
            edp.push(transitions(16))
            edp.flush()
            edp.pull(timeout=10)
        assert time.monotonic() - t0 < 1.0


def test_bad_input_raises_at_the_offending_push_and_the_runtime_keeps_working():
    with off_runtime(Mode(True, 1), Mode(True, 1)) as edp:
        edp.push(transitions(8))
        bad = transitions(8)
        bad["obs"] = torch.zeros(8, 7)
        with pytest.raises(SpecError, match="field 'obs'"):
            edp.push(bad)
        edp.push(transitions(8, start=8))
        edp.flush()
        assert sorted(edp.buffer.contents()["tid"].tolist()) == list(range(16))


def test_pull_before_enough_data_times_out_with_an_explanation():
    with off_runtime(Mode(False, 2), Mode(False, 1), timeout_s=0.2) as edp:
        edp.push(transitions(4))  # pending: its group of 2 is incomplete
        with pytest.raises(ConduitTimeout, match="min_size_to_sample"):
            edp.pull()


def test_close_is_idempotent_joins_threads_and_refuses_further_calls():
    edp = off_runtime(Mode(True, 1), Mode(True, 1))
    edp.push(transitions(16))
    edp.close()
    edp.close()
    assert not edp.ingestion.worker.alive and not edp.delivery.worker.alive
    with pytest.raises(RuntimeClosed):
        edp.push(transitions(1))
    with pytest.raises(RuntimeClosed):
        edp.pull()


def test_close_completes_while_a_learner_is_blocked_in_pull():
    edp = off_runtime(Mode(True, 1), Mode(True, 1), timeout_s=30)
    errors = []

    def learner():
        try:
            edp.pull()
        except Exception as e:
            errors.append(e)

    t = threading.Thread(target=learner)
    t.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    edp.close()
    t.join(2)
    assert not t.is_alive() and time.monotonic() - t0 < 2
    assert isinstance(errors[0], RuntimeClosed)


def test_conflicting_config_arguments():
    with pytest.raises(conduit.ConfigError):
        Conduit(conduit.ConduitConfig(policy="off_policy", train_batch_size=1, capacity=2), capacity=3)
    with pytest.raises(ValueError, match="breaks on_policy semantics"):  # a pinned schedule is the config's
        Conduit(policy="on_policy", train_batch_size=8, pinned=Schedule(Mode(True, 1), Mode(False, 1)))
    edp = Conduit(policy="on_policy", train_batch_size=8)
    with pytest.raises(conduit.ConfigError, match="not feasible"):  # a schedule given to a runtime is checked there
        edp.reschedule(Schedule(Mode(True, 1), Mode(False, 1)))
    with pytest.raises(TypeError, match=r"expected a conduit\.Schedule"):
        edp.reschedule({"delivery_overlap": True})


def test_close_drains_pending_units_like_a_writer_flush_and_releases_storage():
    edp = off_runtime(Mode(False, 3), Mode(False, 1))
    edp.push(transitions(4))
    edp.push(transitions(4, start=4))  # both pending: their group of 3 is incomplete
    assert edp.stats().ingested_rows == 0 and edp.buffer.storage is None
    edp.close()
    assert edp.stats().ingested_rows == 8
    assert edp.buffer.storage.tensors == {}  # memory is released at close, not at some later GC


def test_close_without_drain_drops_pending_units():
    edp = off_runtime(Mode(False, 3), Mode(False, 1))
    edp.push(transitions(4))
    edp.close(drain=False)
    assert edp.stats().ingested_rows == 0


@pytest.mark.parametrize("dlv", [Mode(False, 1), Mode(False, 2), Mode(True, 1), Mode(True, 3)], ids=str)
def test_batch_pool_recycles_memory_yet_each_batch_holds_its_rows_until_reused(dlv):
    with off_runtime(Mode(False, 1), dlv, tuning={"batch_pool": 2}) as edp:
        edp.push(transitions(200))
        prev, ptrs = None, set()
        for _ in range(12):
            cur = edp.pull()
            assert torch.equal(cur["tid"], torch.from_numpy(cur.info.ids))
            if prev is not None:  # still valid one pull later (batch_pool - 1 = 1)
                assert torch.equal(prev["tid"], torch.from_numpy(prev.info.ids))
            ptrs.add(cur["obs"].untyped_storage().data_ptr())
            prev = cur
        assert len(ptrs) < 12  # memory was recycled


def test_batch_pool_is_validated():
    with pytest.raises(ValueError, match="batch_pool=1"):
        conduit.ConduitConfig(policy="off_policy", train_batch_size=2, capacity=8, tuning={"batch_pool": 1})


def test_workers_run_torch_ops_on_an_openmp_team_of_their_own_without_touching_the_learners():
    """A worker (and any hook on it) runs its ops on one intra-op thread so it never oversubscribes the cores
    next to the learner's team, and sets that for itself only: the learner and threads started later keep theirs."""
    from conduit import executor

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    seen = []
    try:
        edp = off_runtime(Mode(True, 1), Mode(True, 1))

        @edp.register_delivery(input="ExperienceBuffer", output="Learner")
        def probe(exp_in, learn_out):
            seen.append((torch.get_num_threads(), executor.serial_kernels()))
            learn_out.write(exp_in.read())

        with edp:
            edp.push(transitions(64))
            edp.flush()
            edp.pull(timeout=10)
        later = []
        t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        t.start()
        t.join()
        assert seen and all(s == (1, False) for s in seen)  # one thread, and no chunked kernels needed
        assert torch.get_num_threads() == 2
        assert later == [2]
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("traced", [False, True], ids=["direct", "graph"])
def test_inline_pushes_keep_the_same_accounts_whether_written_directly_or_through_the_graph(traced):
    """Untraced inline g=1 pushes skip the queue (ingestion._push_direct); the profiler and stats must not notice."""
    from conduit.trace import Tracer

    with off_runtime(Mode(False, 1), Mode(False, 1), tracer=Tracer(enabled=traced)) as edp:
        for u in range(5):
            edp.push(transitions(16, start=16 * u))
        stats, graph = edp.ingestion.stats, edp.ingestion.graph
        assert (stats.pushed_units, stats.pushed_rows, stats.ingested_rows, stats.invocations) == (5, 80, 80, 5)
        assert graph.invocations == 5 and len(graph.timings) == 5
        assert edp.ingestion.pending_units == 0
        assert edp.buffer.contents()["tid"].tolist() == list(range(80))


@pytest.mark.parametrize("dim", [4, 70_000], ids=["views", "recycled"])  # 8 rows of 70,000 floats: 2.2 MB a field
def test_inline_batched_pulls_deliver_the_same_batches_directly_or_through_the_graph(dim):
    """Untraced inline g>1 pulls call the operators directly, not the graph: same rows, provenance and accounts.

    Small transitions come as views of one gather; large ones each in their own recycled memory.
    """
    from conduit.trace import Tracer

    def run(traced: bool) -> tuple[list, list, tuple]:
        with off_runtime(Mode(False, 1), Mode(False, 4), tracer=Tracer(enabled=traced)) as edp:
            for u in range(4):
                edp.push(transitions(16, dim=dim, start=16 * u))
            batches, infos = [], []
            for k in range(8):
                b = edp.pull()
                assert torch.equal(b["tid"], torch.from_numpy(b.info.ids))
                assert torch.equal(b["obs"][:, -1], b["tid"].to(torch.float32))
                infos.append((b.info.staleness, b.info.iteration, b.info.sampled_at_pull, b.info.pull_index))
                batches.append(b["tid"].clone())
                reserved = edp.delivery.limiter.reserved
                assert reserved == 8 * (3 - k % 4)  # the invocation's batches still staged keep their rows reserved
            limiter = edp.delivery.limiter
            accounts = (limiter.samples, limiter.reserved, edp.stats().pulls, edp.delivery.graph.invocations)
        return batches, infos, accounts

    direct, graph = run(False), run(True)
    assert [t.tolist() for t in direct[0]] == [t.tolist() for t in graph[0]]  # one draw of 4 batches, same seed
    assert direct[1] == graph[1] == [(k % 4, k // 4, 4 * (k // 4), k) for k in range(8)]
    assert direct[2] == graph[2] == (64, 0, 8, 2)


def test_a_seal_racing_a_push_waits_for_the_push_to_be_admitted():
    """On-policy, a push checks room for the iteration being pushed, then is admitted to it. A ``seal()`` from
    another thread in between once advanced the iteration, so the push joined one beyond the in-flight bound
    and the write killed the runtime. The seal now waits until the push is admitted."""
    edp = Conduit(policy="on_policy", train_batch_size=8, num_minibatches=2, seed=0, timeout_s=5.0)
    with edp:
        edp.push(transitions(8))  # iteration 0: sealed, not delivered (in flight)
        edp.push(transitions(4, start=8))  # iteration 1, open
        buffer, sealed = edp.buffer, []
        real_room = buffer.room

        def room_then_seal(rows):  # the pushing thread holds the ingestion's condition here
            ok = real_room(rows)
            if not sealed:
                t = threading.Thread(target=lambda: sealed.append(edp.seal()))
                t.start()
                t.join(0.2)  # with the seal waiting for the condition, the thread is still blocked
                sealed.append(t)
            return ok

        buffer.room = room_then_seal
        edp.push(transitions(2, start=12))  # joins iteration 1 (room checked for it), whatever the seal does
        buffer.room = real_room
        sealed[0].join(5.0)
        assert sealed[1] == 1  # the seal ended iteration 1, with the racing push's rows in it
        first = [b.info.iteration for b in edp.minibatches()]
        second = list(edp.minibatches())
        assert first == [0, 0] and [b.info.iteration for b in second] == [1, 1]
        assert sorted(torch.cat([b["tid"] for b in second]).tolist()) == list(range(8, 14))


def test_a_worker_hands_the_interpreter_over_before_each_turn(monkeypatch):
    """A learner that lets the interpreter go for a moment (freeing a batch's tensors) must get it back before the
    worker woken by its pull runs a turn of Python: the worker yields (``time.sleep(0)``) before every turn."""
    import types

    from conduit import executor

    events: list[str] = []

    def sleep(seconds: float) -> None:
        if threading.current_thread().name == "conduit-probe" and seconds == 0:
            events.append("yield")
        time.sleep(seconds)

    monkeypatch.setattr(executor, "time", types.SimpleNamespace(
        **{**{n: getattr(time, n) for n in dir(time) if not n.startswith("_")}, "sleep": sleep}))
    done = threading.Event()

    def step() -> None:
        events.append("turn")
        if events.count("turn") == 3:
            done.set()
            worker.stopping.set()

    worker = executor.Worker("probe", step, executor.FailureBox(), threading.Condition())
    worker.start()
    assert done.wait(10) and worker.stop(5)
    assert events == ["yield", "turn"] * 3
