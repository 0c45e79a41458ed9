"""Contract tests of the SRL adapter against SRL's documented buffer protocol (no SRL source needed).

Written from SRL's documented buffer protocol (docs/srl.md), not from SRL's code:
entry fields, axis-1 (time-major ``[T, B, ...]``) batching, the reuse queue's order
(``reuses``, ``reuses_left``, drops), PER feedback through the ``isinstance`` gate,
the staleness filter, two threads (``consume_to`` on one, ``empty``/``get`` on the
other) with exactly-once accounting, ``make_buffer`` registration under fork and
spawn, and pickling (``save_buffer_on_exit``). Every test runs against the
SRL-protocol stub (:mod:`.srl_stub`) posing as SRL's buffer module, and against
SRL's own buffer module where a checkout is given (``CONDUIT_SRL_SRC``).
"""

from __future__ import annotations

import bisect
import multiprocessing as mp
import pickle
import queue
import subprocess
import sys
import threading
import time
from typing import ClassVar

import numpy as np
import pytest
import torch
from conduit.integrations import srl
from conduit.integrations.srl.install import ORIGINAL
from conduit.integrations.srl.locate import types_of

import conduit
from conduit.ext import flatten_record as flatten

from . import srl_stub as stub
from .srl_stub import StepLog, ids_of, sample, trainer_step

SOURCES = ["stub", "srl"]


@pytest.fixture(params=SOURCES)
def module(request):
    """The SRL buffer module the buffers take their types from: the stub, or SRL's own (skipped without a checkout)."""
    return stub if request.param == "stub" else request.getfixturevalue("srl_module")


@pytest.fixture
def made(module):
    """``make(name, **args)`` with this source's types; every buffer is closed after the test."""
    built = []

    def build(name, **args):
        buf = srl.make(name, module, **args)
        built.append(buf)
        return buf

    yield build
    for buf in built:
        close = getattr(buf, "close", None)
        if close is not None:
            close()


def _types(module):
    """The types a buffer of ``module`` hands out."""
    t = types_of(module)
    return t.replay_entry, t.named_array, t.prioritized_base


# -- entries and batching -----------------------------------------------------------------------------------------
def test_queue_entries_are_srl_entries_with_time_major_samples(made, module):
    entry_t, named_t, _ = _types(module)
    buf = made("conduit_queue", max_size=8, reuses=1, batch_size=3)
    assert [buf.put(sample(i, t=5)) for i in range(3)] == [False, False, True]
    entry = buf.get()
    assert type(entry) is entry_t and type(entry.sample) is named_t
    assert (entry.reuses_left, entry.reuses, entry.sampling_indices) == (0, 1, None)
    assert entry.receive_time <= time.time()
    s = entry.sample
    assert s.obs.shape == (5, 3, 3) and s.reward.shape == (5, 3, 1) and s.length(0) == 5 and s.length(1) == 3
    assert ids_of(s).tolist() == [0, 1, 2]
    for b in range(3):  # column b is sample b, time along axis 0
        np.testing.assert_array_equal(s.obs[:, b], sample(b, t=5).obs)
    assert s.analyzed_result.value is None and s.policy_name is None


def test_queue_without_batch_size_keeps_samples_whole(made):
    buf = made("conduit_queue", max_size=4, reuses=1, batch_size=0)
    assert buf.put(sample(7)) is False
    assert buf.get().sample.obs.shape == (4, 3)


@pytest.mark.parametrize("name", ["conduit_replay", "conduit_prioritized"])
def test_replay_entries_are_time_major_batches_of_stored_samples(made, module, name):
    entry_t, named_t, per_t = _types(module)
    args = dict(max_size=32, batch_size=4, warmup_transitions=24, sample_length=6)
    buf = made(name, **args)
    assert buf.empty() and buf.qsize() == 0
    for i in range(3):
        buf.put(sample(i, t=6))
        assert buf.empty()  # fewer than warmup_transitions (24 = 4 samples of 6)
    for i in range(3, 8):
        buf.put(sample(i, t=6))
    assert not buf.empty() and buf.qsize() == 48
    entry = buf.get()
    assert type(entry) is entry_t and type(entry.sample) is named_t
    assert (entry.reuses_left, entry.receive_time, entry.reuses) == (-1, -1, 0.0)
    s = entry.sample
    assert s.obs.shape == (6, 4, 3) and s.obs.flags["C_CONTIGUOUS"]
    for b, i in enumerate(ids_of(s)):
        np.testing.assert_array_equal(s.obs[:, b], sample(int(i), t=6).obs)
    assert s.min_of("policy_version_steps") == 0.0
    assert isinstance(buf, per_t) == (name == "conduit_prioritized")
    if name == "conduit_prioritized":
        assert entry.sampling_indices.shape == (4,) and s.metadata["sampling_weight"].dtype == np.float32
    else:
        assert entry.sampling_indices is None


def test_replay_counts_reuses_at_get_as_srl_does(made):
    buf = made("conduit_replay", max_size=4, batch_size=4, warmup_transitions=0, seed=1)
    for i in range(4):
        buf.put(sample(i))
    reuses = [buf.get().reuses for _ in range(6)]
    assert reuses[0] == 0.0 and min(reuses[1:]) > 0  # the mean count of the drawn samples before this draw


def test_replay_refuses_what_it_does_not_do(made):
    with pytest.raises(conduit.ConfigError, match="batch_length"):
        made("conduit_replay", max_size=8, batch_size=2, warmup_transitions=0, sample_length=4, batch_length=2)
    with pytest.raises(conduit.ConfigError, match="priority_interpolation_eta"):
        made("conduit_prioritized", max_size=8, sample_length=4, batch_size=2, warmup_transitions=0,
             priority_interpolation_eta=0.9)
    buf = made("conduit_replay", max_size=8, batch_size=2, warmup_transitions=0, sample_length=4)
    with pytest.raises(queue.Empty):
        buf.get()
    with pytest.raises(RuntimeError, match="length 3"):
        buf.put(sample(0, t=3))
    buf.put(sample(0))
    with pytest.raises(RuntimeError, match="length 5"):
        buf.put(sample(1, t=5))


# -- the reuse queue's order, against a reference model of the documented semantics ------------------------------
class Reference:
    """§1.3: sorted by (reuses_left, arrival); get pops the max and re-inserts while reuses are left; over
    max_size drop the min."""

    def __init__(self, max_size, reuses):
        self.items, self.max_size, self.reuses, self.clock = [], max_size, reuses, 0

    def put(self, sid):
        self.clock += 1
        self._insert([self.reuses, self.clock, sid, 0])

    def _insert(self, item):
        bisect.insort(self.items, item)
        while len(self.items) > self.max_size:
            self.items.pop(0)

    def get(self):
        item = self.items.pop()
        item[0] -= 1
        item[3] += 1
        if item[0] > 0 and len(self.items) < self.max_size:
            self.clock += 1  # a re-insert goes after equal keys
            self._insert([item[0], item[1], item[2], item[3]])
        return item[2], item[0], item[3]


@pytest.mark.parametrize("seed", range(6))
def test_reuse_queue_matches_the_documented_order(made, seed):
    rng = np.random.default_rng(seed)
    max_size, reuses = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    buf = made("conduit_queue", max_size=max_size, reuses=reuses, batch_size=1)
    ref = Reference(max_size, reuses)
    for i in range(60):
        if rng.random() < 0.5 or buf.empty():
            buf.put(sample(i))
            ref.put(i)
            time.sleep(1e-6)  # distinct receive times, as arrivals have
        else:
            e = buf.get()
            assert (int(ids_of(e.sample)[0]), e.reuses_left, e.reuses) == ref.get()
        assert buf.qsize() == len(ref.items)


def test_reuse_queue_hands_back_the_same_entry_and_drops_on_overflow(made):
    buf = made("conduit_queue", max_size=2, reuses=3, batch_size=1)
    for i in range(3):
        buf.put(sample(i))
    assert buf.dropped == 1 and buf.qsize() == 2  # all had 3 reuses left: the oldest (0) went
    newest = buf.get()
    assert int(ids_of(newest.sample)[0]) == 2 and (newest.reuses_left, newest.reuses) == (2, 1)
    more_left = buf.get()
    assert int(ids_of(more_left.sample)[0]) == 1  # 3 reuses left beat 2
    again = buf.get()  # both have 2 left: the newer arrival, the very entry handed out first
    assert again is newest and (again.reuses_left, again.reuses) == (1, 2)


# -- priority feedback through the isinstance gate ----------------------------------------------------------------
def test_per_feedback_reaches_conduit_through_the_isinstance_gate(made, module):
    _, _, per_t = _types(module)
    buf = made("conduit_prioritized", max_size=16, sample_length=4, batch_size=8, warmup_transitions=0, seed=3,
               alpha=1.0, beta=0.5)
    for i in range(16):
        buf.put(sample(i))
    log = StepLog()
    assert isinstance(buf, per_t)

    def favour_zero(entry):  # sample 0 gets all the mass
        return np.where(ids_of(entry.sample) == 0, 1e6, 1e-6)

    for _ in range(3):
        trainer_step(buf, log, priorities=favour_zero, gate=per_t)
    assert log.priority_updates == 3 and len(log.trained) == 3
    for _ in range(5):
        e = buf.get()
    assert (ids_of(e.sample) == 0).mean() > 0.9
    w = e.sample.metadata["sampling_weight"]
    assert np.all((w > 0) & (w <= 1.0 + 1e-6))
    assert e.reuses >= 1  # replay counts rise with feedback (SRL counts them at update_priorities)


def test_per_feedback_for_overwritten_samples_is_dropped(made):
    buf = made("conduit_prioritized", max_size=4, sample_length=4, batch_size=4, warmup_transitions=0, seed=0)
    for i in range(4):
        buf.put(sample(i))
    entry = buf.get()
    for i in range(4, 8):  # every slot overwritten since the draw
        buf.put(sample(i))
    assert buf.update_priorities(entry.sampling_indices, np.ones(4)) == 0
    with pytest.raises(ValueError, match="> 0"):
        buf.update_priorities(buf.get().sampling_indices, np.zeros(4))
    with pytest.raises(conduit.SemanticsError, match="match no batch"):
        buf.update_priorities(np.array([9, 9, 9, 9]), np.ones(4))


def test_per_takes_an_entrys_feedback_again_as_srls_trainer_sends_it_when_stopping(made):
    """SRL's GPU thread re-runs the last entry's step until its safe stop step, sending the same sampling_indices
    each time; SRL's PrioritizedReplayBuffer takes every call: so does the drop-in (the replay counts once)."""
    buf = made("conduit_prioritized", max_size=8, sample_length=4, batch_size=4, warmup_transitions=0, seed=1)
    for i in range(8):
        buf.put(sample(i))
    entry = buf.get()
    assert buf.update_priorities(entry.sampling_indices, np.full(4, 2.0)) == 4
    assert buf.update_priorities(entry.sampling_indices, np.full(4, 3.0)) == 4
    assert buf.update_priorities(entry.sampling_indices, np.full(4, 4.0)) == 4 and buf.training_steps == 3
    drawn = set(ids_of(entry.sample).tolist())
    e = buf.get()  # a sample that entry drew counts one replay, not three
    assert e.reuses == pytest.approx(np.mean([float(i in drawn) for i in ids_of(e.sample).tolist()]))


def test_per_beta_follows_the_scheduler_at_each_update(made):
    class Linear:
        init_value = 0.4

        def get(self, step):
            return min(1.0, 0.4 + 0.1 * step)

    buf = made("conduit_prioritized", max_size=8, sample_length=4, batch_size=2, warmup_transitions=0,
               beta=0.4, beta_scheduler=Linear())
    for i in range(8):
        buf.put(sample(i))
    for _ in range(3):
        e = buf.get()
        buf.update_priorities(e.sampling_indices, np.array([1.0, 2.0]))
    assert buf.beta == pytest.approx(0.7) and buf.training_steps == 3


# -- the staleness filter reads policy_version_steps exactly as put ------------------------------------------------
@pytest.mark.parametrize("name", ["conduit_queue", "conduit_replay"])
def test_staleness_filter_sees_the_versions_that_were_put(module, made, name):
    args = dict(max_size=8, batch_size=2) | ({"reuses": 1} if name == "conduit_queue" else {"warmup_transitions": 0})
    buf = made(name, **args)
    buf.put(sample(0, version=-1))
    buf.put(sample(1, version=-1))
    log = StepLog()
    trainer_step(buf, log)
    assert log.skipped == 1
    buf.put(sample(2, version=3))
    buf.put(sample(3, version=3))
    fresh = StepLog()
    for _ in range(10):
        trainer_step(buf, fresh, version=10, preemption_steps=5)
        if fresh.skipped + len(fresh.trained) >= 2:
            break
    # the queue hands the fresh batch (trained); replay may draw the stale rows too (skipped)
    assert fresh.trained or fresh.skipped
    for e in fresh.trained:
        assert e.sample.min_of("policy_version_steps") == 3 and e.sample.policy_name is None


# -- two threads: the stream thread's consume_to, the trainer thread's empty/get -------------------------------------
@pytest.mark.parametrize("name", ["conduit_queue", "conduit_replay"])
def test_two_threads_exactly_once(made, name, module):
    n, b = 240, 4
    args = dict(max_size=n, batch_size=b) | ({"reuses": 1} if name == "conduit_queue" else {"warmup_transitions": 0})
    buf = made(name, **args)
    stream = stub.DequeSampleConsumer()
    consumer = srl.consumer_class(stub if module is stub else None)(stream)
    for i in range(n):
        stream.post(sample(i, t=2))
    seen, errors, stop = [], [], threading.Event()

    def trainer():
        deadline = time.monotonic() + 20
        try:
            while not stop.is_set() and time.monotonic() < deadline and len(seen) < n // b:
                if buf.empty():
                    time.sleep(0.0005)
                    continue
                seen.append(ids_of(buf.get().sample))
        except BaseException as e:  # reported, not swallowed
            errors.append(e)

    t = threading.Thread(target=trainer)
    t.start()
    for _ in range(400):  # bounded: each consume_to takes at most 7 samples
        if consumer.consume_to(buf, max_iter=7) == 0 and not stream.samples:
            break
    if name == "conduit_replay":
        stop.set()
    t.join(30)
    assert not t.is_alive() and errors == []
    assert consumer.consumed == n and consumer.groups == -(-n // 7)
    if name == "conduit_queue":
        assert sorted(np.concatenate(seen).tolist()) == list(range(n))  # each sample exactly once
    else:
        stats = buf.stats()
        assert stats.ingested_rows == n and stats.pushed_units == consumer.groups  # one push per consume_to
        assert stats.buffer_rows == n


def test_make_consumer_passes_the_conduit_consumer_through_and_can_wrap_every_consumer():
    cls = srl.consumer_class(stub)
    inner = stub.DequeSampleConsumer()
    wrapped = cls(inner)
    assert isinstance(wrapped, stub.SampleConsumer) and stub.make_consumer(wrapped) is wrapped
    original = stub.make_consumer
    try:
        assert srl.install_consumers(stub) is cls
        made = stub.make_consumer("deque")
        assert isinstance(made, srl.ConduitSampleConsumer) and isinstance(made.inner, stub.DequeSampleConsumer)
        assert stub.make_consumer(wrapped) is wrapped
        again = pickle.loads(pickle.dumps(wrapped))
        assert type(again) is cls
    finally:
        stub.make_consumer = original


# -- registration by wrapping make_buffer: in this process, forked and spawned children -------------------------------
@pytest.fixture
def installed():
    original = stub.make_buffer
    installation = srl.install(stub)
    yield installation
    srl.uninstall(stub)
    assert stub.make_buffer is original


def test_make_buffer_builds_conduit_buffers_and_falls_through(installed):
    assert srl.installed(stub) and installed.modules == (stub.__name__,)
    srl.install(stub)  # idempotent: one wrapper
    assert not hasattr(getattr(stub.make_buffer, ORIGINAL), ORIGINAL)
    assert type(stub.make_buffer("priority_queue", max_size=2)) is stub.PriorityQueueBuffer
    per = stub.make_buffer("conduit_prioritized", max_size=8, sample_length=4, batch_size=2, warmup_transitions=0)
    assert isinstance(per, stub.PrioritizedReplayBuffer) and per.types.module is stub
    per.put(sample(0))
    per.put(sample(1))
    assert type(per.get()) is stub.ReplayEntry
    per.close()
    with pytest.raises(NotImplementedError):
        stub.make_buffer("no_such_buffer")


def _child_builds(result, installation=None):
    """In a child process: build a buffer through the module attribute, as SRL's trainer worker does."""
    try:
        from tests.integrations import srl_stub as child_stub

        buf = child_stub.make_buffer("conduit_queue", max_size=4, reuses=1, batch_size=1)
        buf.put(child_stub.sample(5))
        result.put((type(buf).__name__, type(buf.get()).__module__))
    except BaseException as e:
        result.put(("error", repr(e)))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_registration_reaches_worker_processes(installed, method):
    ctx = mp.get_context(method)
    result = ctx.Queue()
    # fork inherits the patched module; spawn re-imports it, and the Installation re-installs when unpickled
    p = ctx.Process(target=_child_builds, args=(result, installed if method == "spawn" else None))
    p.start()
    try:
        got = result.get(timeout=60)
    finally:
        p.join(30)
    assert got == ("ConduitQueueBuffer", stub.__name__)


# -- pickling (SRL's save_buffer_on_exit / load_buffer_on_restart) ------------------------------------------------------
def test_queue_pickles_with_its_order_and_reuse_counts(made):
    buf = made("conduit_queue", max_size=4, reuses=2, batch_size=2)
    for i in range(5):
        buf.put(sample(i))
    first = buf.get()
    back = pickle.loads(pickle.dumps(buf))
    assert back.qsize() == buf.qsize() == 2 and back.types == buf.types
    a, b = back.get(), buf.get()
    assert ids_of(a.sample).tolist() == ids_of(b.sample).tolist() and (a.reuses, a.reuses_left) == (b.reuses, b.reuses_left)
    assert first.reuses == 1
    back.put(sample(5))  # the pending sample 4 travelled too
    assert ids_of(back.get().sample).tolist() == [4, 5]


@pytest.mark.parametrize("name", ["conduit_replay", "conduit_prioritized"])
def test_replay_pickles_through_conduits_checkpoint(made, module, name):
    args = dict(max_size=8, batch_size=2, warmup_transitions=0, sample_length=4, seed=5)
    buf = made(name, **args)
    assert pickle.loads(pickle.dumps(buf)).empty()  # nothing put yet: a fresh buffer
    for i in range(6):
        buf.put(sample(i))
    e = buf.get()
    if name == "conduit_prioritized":
        buf.update_priorities(e.sampling_indices, np.array([5.0, 0.5]))
    blob = pickle.dumps(buf)
    back = pickle.loads(blob)
    try:
        assert type(back) is type(buf) and back.qsize() == buf.qsize() == 24
        expected, got = buf.get(), back.get()  # same generator state, same rows: the same draw
        assert ids_of(got.sample).tolist() == ids_of(expected.sample).tolist()
        assert got.reuses == expected.reuses
        if name == "conduit_prioritized":
            np.testing.assert_allclose(got.sample.metadata["sampling_weight"],
                                       expected.sample.metadata["sampling_weight"])
        back.put(sample(99))
        assert back.stats().buffer_version == 7
    finally:
        back.close()


def test_a_tampered_pickle_fails_with_a_checkpoint_error(made):
    buf = made("conduit_replay", max_size=4, batch_size=2, warmup_transitions=0)
    for i in range(3):
        buf.put(sample(i))
    rebuild, (name, kwargs, (files, state), module) = buf.__reduce__()
    victim = next(k for k in files if k.endswith(".pt"))
    tampered = {**files, victim: files[victim][:-8] + b"tampered"}
    with pytest.raises(conduit.CheckpointError):
        rebuild(name, kwargs, (tampered, state), module)
    with pytest.raises(conduit.CheckpointError, match="outside"):
        rebuild(name, kwargs, ({"../escape.pt": b"x"}, state), module)


# -- staging memory and imports ---------------------------------------------------------------------------------------------
def test_staging_is_pinned_where_cuda_is_and_pageable_elsewhere():
    import torch

    cuda = torch.cuda.is_available()
    staging = srl.Staging()
    assert staging.pinned is cuda
    block = staging.take({"obs": ((4, 2, 3), torch.float32)})["obs"]
    assert block.shape == (4, 2, 3) and block.is_pinned() is cuda
    if not cuda:  # pinning needs CUDA in torch: asked for without it, a clear refusal
        with pytest.raises(conduit.ConfigError, match="CUDA"):
            srl.Staging(pinned=True)
    guard = srl.HandoffGuard()
    guard.handed([block])
    assert len(guard) == (1 if cuda else 0)  # only pinned memory handed to an async copy needs keeping alive


def test_importing_the_adapter_imports_no_srl_and_changes_nothing():
    code = (
        "import sys, conduit.integrations.srl as s; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('srl', 'rlsrl', 'base', 'distributed', 'wandb')]; "
        "print(bad, s.loaded()); sys.exit(1 if bad or s.loaded() is not None else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_find_reports_what_it_tried():
    if srl.loaded() is not None or "rlsrl" in sys.modules:
        pytest.skip("an SRL checkout is importable in this session (CONDUIT_SRL_SRC)")
    with pytest.raises(ImportError, match=r"rlsrl\.base\.buffer.*base\.buffer.*not on PyPI"):
        srl.find()
    with pytest.raises(ImportError, match="not SRL's buffer module"):
        srl.find("json")


# -- samples as SRL's actors post them: nested records, None leaves, the policy fields -----------------------------
def _named_type(module):
    return _types(module)[1]


def _leaf_shapes(x):
    """A record's structure: each leaf's shape (``None`` for a ``None`` leaf), nested records as dicts."""
    return {k: _leaf_shapes(v) if hasattr(v, "keys") and not isinstance(v, np.ndarray) else
            (None if v is None else tuple(v.shape)) for k, v in x.items()}


def _as_record(module, x):
    """``x`` (a stub record) rebuilt in this source's record type, so every test posts the source's own kind."""
    named = _named_type(module)
    return named(**{k: _as_record(module, v) if isinstance(v, stub.NamedArray) else v for k, v in x.items()})


def _assert_nested_batch(s, named_t, t, b):
    assert type(s) is named_t and type(s.obs) is named_t and type(s.analyzed_result) is named_t
    assert s.obs.obs.shape == (t, b, 3) and s.obs.mask.shape == (t, b, 2) and s.action.x.shape == (t, b, 1)
    assert s.analyzed_result.ret is None and s.policy_state is None
    assert s.analyzed_result.value.shape == (t, b, 1) and s.length(0) == t and s.length(1) == b
    assert isinstance(s.shape, dict)  # a record with a shape, as SRL's is


def test_flatten_reads_every_kind_of_record_in_its_own_order(module):
    """flatten reads a NamedArray's fields directly (its ``_fields``): the same pairs as its own ``items()``, nested
    records by dotted name; a mapping, or a record whose ``_fields`` is no tuple, through ``items()``."""

    def by_items(x, prefix=""):
        out = []
        for k, v in x.items():
            nested = v is not None and not isinstance(v, np.ndarray) and callable(getattr(v, "items", None))
            out += by_items(v, f"{prefix}{k}.") if nested else [(prefix + k, v)]
        return out

    record = _as_record(module, stub.actor_sample(3))
    assert [(k, id(v)) for k, v in flatten(record)] == [(k, id(v)) for k, v in by_items(record)]
    assert [k for k, _ in flatten(record)][:2] == ["action.x", "analyzed_result.log_probs"]  # SRL sorts its fields
    mapping = {"b": np.zeros(2), "a": {"y": None, "x": np.ones(1)}}
    assert [k for k, _ in flatten(mapping)] == ["b", "a.y", "a.x"]

    class Listed(dict):
        _fields: ClassVar[list[str]] = ["not", "a", "tuple"]

    assert [k for k, _ in flatten(Listed(z=np.zeros(1)))] == ["z"]


def test_queue_takes_nested_actor_samples_and_returns_the_nested_record(made, module):
    named_t = _named_type(module)
    buf = made("conduit_queue", max_size=8, reuses=1, batch_size=3)
    for i in range(3):
        buf.put(_as_record(module, stub.actor_sample(i)))
    s = buf.get().sample
    _assert_nested_batch(s, named_t, 4, 3)
    np.testing.assert_array_equal(s.obs.obs[0, :, 0], [0, 1, 2])
    assert s.policy_name.shape == (4, 3, 1) and s.policy_name[0, 0, 0] == "default"  # the queue keeps strings
    assert s.min_of("policy_version_steps") == 0
    ref = stub.PriorityQueueBuffer(max_size=8, reuses=1, batch_size=3)  # the documented stacking, field for field
    for i in range(3):
        ref.put(stub.actor_sample(i))
    assert _leaf_shapes(s) == _leaf_shapes(ref.get().sample)


@pytest.mark.parametrize("name", ["conduit_replay", "conduit_prioritized"])
def test_a_dropped_replay_buffer_is_freed_with_its_runtime(module, name):
    """SRL never closes a buffer, it drops it (a worker reconfigured, a buffer rebuilt from its pickle): the
    buffer is collected and its runtime closed -- no worker thread or storage left behind for the process's life."""
    import gc
    import pickle
    import weakref

    buf = srl.make(name, module, max_size=8, batch_size=2, warmup_transitions=0, sample_length=4, seed=0)
    for i in range(8):
        buf.put(sample(i))
    buf.get()
    again = pickle.loads(pickle.dumps(buf))
    again.get()
    runtimes, refs = [buf.edp, again.edp], [weakref.ref(buf), weakref.ref(again)]
    del buf, again
    gc.collect()
    assert [r() for r in refs] == [None, None]
    assert all(edp.closed for edp in runtimes)


@pytest.mark.parametrize("dtypes", [(np.int32, np.int64), (np.float32, np.float64), (np.int64, np.float32)], ids=str)
def test_queue_promotes_a_batchs_dtypes_as_srls_own_stacking(made, module, dtypes):
    """Samples of one entry whose leaf differs in dtype: stacked into the promoted dtype, values intact, as SRL's
    PriorityQueueBuffer (``np.stack``) does -- never narrowed into the first sample's dtype, never a TypeError."""
    named = _named_type(module)
    values = [np.full((3, 1), 1, dtypes[0]), np.full((3, 1), 2**40 if dtypes[1] is np.int64 else 0.5, dtypes[1])]
    ref = module.PriorityQueueBuffer(max_size=4, reuses=1, batch_size=2)
    buf = made("conduit_queue", max_size=4, reuses=1, batch_size=2)
    for v in values:
        ref.put(named(v=v))
        buf.put(named(v=v))
    want, got = ref.get().sample.v, buf.get().sample.v
    assert got.dtype == want.dtype == np.result_type(*dtypes)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["conduit_replay", "conduit_prioritized"])
def test_replay_takes_nested_actor_samples_and_returns_the_nested_record(made, module, name):
    named_t = _named_type(module)
    buf = made(name, max_size=8, batch_size=4, warmup_transitions=0, sample_length=4, seed=2)
    for i in range(8):
        buf.put(_as_record(module, stub.actor_sample(i, version=i)))
    s = buf.get().sample
    _assert_nested_batch(s, named_t, 4, 4)
    ids = ids_of(s)
    np.testing.assert_array_equal(s.obs.obs[0, :, 0], ids)  # every field of column b is sample b's
    np.testing.assert_array_equal(s.info.episode_return[0, :, 0], ids)
    np.testing.assert_array_equal(s.policy_version_steps[0, :, 0], ids)
    assert s.policy_name is None  # SRL's replay buffers clear this string field at put


def test_a_record_left_none_in_some_samples_is_zero_filled(made, module):
    """An actor leaves ``info`` None at steps without one: the queue fills zeros (SRL's aggregation), a replay
    buffer stores zeros in the record's slots."""
    q = made("conduit_queue", max_size=8, reuses=1, batch_size=2)
    q.put(_as_record(module, stub.actor_sample(1, info=False)))
    q.put(_as_record(module, stub.actor_sample(2)))
    s = q.get().sample
    np.testing.assert_array_equal(s.info.episode_return[0, :, 0], [0, 2])
    r = made("conduit_replay", max_size=4, batch_size=4, warmup_transitions=0, sample_length=4, seed=0)
    r.put(_as_record(module, stub.actor_sample(1)))
    for i in (2, 3, 4):
        r.put(_as_record(module, stub.actor_sample(i, info=False)))
    s = r.get().sample
    for b, i in enumerate(ids_of(s)):
        assert s.info.episode_return[0, b, 0] == (1 if i == 1 else 0)


def test_a_none_leaf_in_a_nested_field_stays_none_and_an_array_there_later_is_dropped(made, module):
    named = _named_type(module)

    def with_ret(i, ret):
        x = _as_record(module, stub.actor_sample(i))
        x.analyzed_result = named(log_probs=x.analyzed_result.log_probs, value=x.analyzed_result.value, ret=ret)
        return x

    r = made("conduit_replay", max_size=4, batch_size=2, warmup_transitions=0, sample_length=4)
    r.put(with_ret(0, None))
    r.put(with_ret(1, np.ones((4, 1), np.float32)))  # the storage has no slot for it (laid out from the first)
    assert r.get().sample.analyzed_result.ret is None


# -- what SRL's storage and stacking take: laid out from the first sample ------------------------------------------
@pytest.mark.parametrize("name", ["conduit_replay", "conduit_prioritized"])
def test_replay_drops_a_record_the_first_sample_left_none(made, module, name):
    """SRL's ``SampleBatch`` leaves ``info`` None until an episode ends: the storage, laid out from the first
    sample, has no slot for it, so a later sample's ``info`` record is dropped (it was refused with SpecError)."""
    buf = made(name, max_size=4, batch_size=2, warmup_transitions=0, sample_length=4)
    buf.put(_as_record(module, stub.actor_sample(0, info=False)))
    buf.put(_as_record(module, stub.actor_sample(1)))
    assert buf.get().sample.info is None


@pytest.mark.parametrize("name", ["conduit_replay", "conduit_prioritized"])
def test_replay_writes_later_samples_as_numpys_assignment_into_the_first_ones_layout(made, module, name):
    """Another dtype is cast and a shape that broadcasts is broadcast, as SRL's storage writes a sample (a numpy
    assignment); ``put_many`` casts each sample so before stacking its group (int64 with uint64 stacked to float64
    and was refused)."""
    named = _named_type(module)

    def s(i, obs, done):
        return named(obs=obs, done=done, policy_version_steps=np.full((4, 1), i, np.int64))

    buf = made(name, max_size=4, batch_size=4, warmup_transitions=0, sample_length=4, seed=0)
    buf.put(s(0, np.zeros((4, 3), np.float32), np.zeros((4, 1), bool)))
    buf.put(s(1, np.full((1, 1), 1.0), np.ones((4, 1), np.int64)))  # (1, 1) broadcasts over time too
    buf.put_many([s(2, np.full((4, 3), 2, np.int64), np.ones((4, 1), np.uint64)),
                  s(3, np.full((4, 3), 3, np.float32), np.ones((4, 1), np.int64))])
    with pytest.raises(RuntimeError, match="length 1 on axis 0"):  # a sample's length is never stretched (SRL's
        buf.put(named(obs=np.zeros((1, 3), np.float32), done=np.zeros((1, 1), bool),  # length(0) refuses it too)
                      policy_version_steps=np.zeros((1, 1), np.int64)))
    got = buf.get().sample
    assert got.obs.dtype == np.float32 and got.done.dtype == np.bool_ and got.obs.shape == (4, 4, 3)
    for b, i in enumerate(got.policy_version_steps[0, :, 0]):
        assert (got.obs[:, b] == i).all() and bool(got.done[:, b].all()) == (i > 0)


def _stacked_alike(module, made, xs):
    """What SRL's queue (``module``'s) and ``conduit_queue`` hand back for one entry of ``xs``: (fields, values)."""
    ref = module.PriorityQueueBuffer(max_size=4, reuses=1, batch_size=len(xs))
    buf = made("conduit_queue", max_size=np.int64(4), reuses=np.int64(1), batch_size=np.int64(len(xs)))
    for x in xs:
        ref.put(x)
        buf.put(x)
    return [[(k, None if v is None else (np.asarray(v).dtype.newbyteorder("="), np.asarray(v).tolist()))
             for k, v in sorted(flatten(b.get().sample))] for b in (ref, buf)]


@pytest.mark.parametrize("name", ["conduit_replay", "conduit_prioritized"])
def test_a_replay_that_could_never_be_ready_is_refused_when_made(made, name):
    """More warm-up transitions than the buffer holds: refused at ``make_buffer`` (it raised at the stream thread's
    first put), naming the sizes."""
    with pytest.raises(conduit.ConfigError, match="never be ready"):
        made(name, max_size=4, batch_size=2, warmup_transitions=100, sample_length=4)


def test_chunks_shorter_than_the_samples_are_refused_when_the_length_is_learned(made, module):
    """``batch_length`` without ``sample_length``: the first sample's length is checked against it (whole samples of
    8 were handed out where chunks of 4 were asked for). (SRL's PER takes no batch_length.)"""
    buf = made("conduit_replay", max_size=8, batch_size=2, warmup_transitions=0, batch_length=4)
    with pytest.raises(conduit.ConfigError, match="batch_length=4"):
        buf.put(_as_record(module, stub.actor_sample(0, t=8)))


def test_queue_takes_what_srls_stacking_takes(made, module):
    """A field only a later sample has is left out (SRL's aggregation takes the first sample's fields); numpy
    arrays and tensors promote as ``np.stack`` promotes them; arrays of another byte order stack; numpy integers
    configure the queue (each was refused)."""
    named = _named_type(module)
    first = named(v=np.zeros((3, 1), np.float32), info=named(a=np.zeros((3, 1), np.float32)))
    later = named(v=np.ones((3, 1), np.float32), info=named(a=np.ones((3, 1), np.float32), b=np.ones((3, 1))))
    want, got = _stacked_alike(module, made, [first, later])
    assert got == want and [k for k, _ in got] == ["info.a", "v"]
    want, got = _stacked_alike(module, made, [named(v=np.full((3, 1), 7, np.int64)),
                                              named(v=torch.full((3, 1), 0.5, dtype=torch.float32))])
    assert got == want and got[0][1][0] == np.float64
    swapped = [named(v=np.full((3, 2), i, np.dtype(">f4"))) for i in range(2)]
    want, got = _stacked_alike(module, made, swapped)
    assert got == want


# -- PER: max_priority, duplicate draws ------------------------------------------------------------------------------
def test_per_with_a_max_priority_other_than_one_puts_and_starts_new_samples_there(made):
    buf = made("conduit_prioritized", max_size=4, sample_length=4, batch_size=2, warmup_transitions=0,
               alpha=0.5, max_priority=4.0)
    for i in range(4):
        buf.put(sample(i))
    buf.edp.flush()
    leaves, top = buf.edp.buffer.priorities_at(np.arange(4))
    assert top == 4.0 and np.allclose(leaves, 4.0**0.5)
    assert buf.get().sample.obs.shape == (4, 2, 3)


def test_per_counts_a_slot_drawn_twice_in_one_batch_once(made):
    """SRL counts replays with a fancy-index ``+= 1`` at ``update_priorities``: once per slot per batch."""
    buf = made("conduit_prioritized", max_size=4, sample_length=4, batch_size=4, warmup_transitions=0, seed=5,
               alpha=1.0, conduit_config={"pinned": conduit.SchedulePin(delivery_overlap=False)})  # draws after feedback
    for i in range(4):
        buf.put(sample(i))
    e = buf.get()
    buf.update_priorities(e.sampling_indices, np.where(ids_of(e.sample) == 0, 1e9, 1e-9))  # every slot once: 1
    e = buf.get()
    assert ids_of(e.sample).tolist() == [0, 0, 0, 0] and e.reuses == 1.0  # one slot, four times
    buf.update_priorities(e.sampling_indices, np.full(4, 1e9))
    assert buf.get().reuses == 2.0  # counted once for the batch that drew it four times


def test_uniform_replay_counts_a_slot_drawn_twice_in_one_batch_once(made):
    buf = made("conduit_replay", max_size=4, batch_size=4, warmup_transitions=0, seed=7)
    for i in range(4):
        buf.put(sample(i))
    counts = np.zeros(4)
    saw_duplicate = False
    for _ in range(12):
        e = buf.get()
        ids = ids_of(e.sample)
        assert e.reuses == pytest.approx(counts[ids].mean())
        saw_duplicate |= len(set(ids.tolist())) < len(ids)
        counts[np.unique(ids)] += 1
    assert saw_duplicate  # Conduit's uniform draw is with replacement: the case occurred


def test_uniform_replay_counts_match_after_a_pickle_taken_while_the_next_batch_is_staged(made):
    """The delivery hook counts each draw as it stages it: a pickle carries the staged batch and counts at one
    point, so the copy hands out the same batches with the same ``reuses`` as the original."""
    buf = made("conduit_replay", max_size=6, batch_size=3, warmup_transitions=0, seed=3)
    for i in range(6):
        buf.put(sample(i))
    for _ in range(6):
        buf.get()  # the worker stages the next batch meanwhile
        back = pickle.loads(pickle.dumps(buf))
        try:
            for _ in range(3):
                a, b = buf.get(), back.get()
                assert ids_of(b.sample).tolist() == ids_of(a.sample).tolist()
                assert b.reuses == a.reuses
        finally:
            back.close()


def test_uniform_replay_gathers_the_next_batch_beside_the_update_and_per_on_a_cpu_after_feedback(made):
    """Delivery overlaps the trainer's update for ``conduit_replay`` on any machine; ``conduit_prioritized`` on a
    CPU draws each batch after the previous batch's priorities, as SRL's trainer thread does."""
    uniform = made("conduit_replay", max_size=8, batch_size=2, warmup_transitions=0)
    per = made("conduit_prioritized", max_size=8, sample_length=4, batch_size=2, warmup_transitions=0)
    for buf in (uniform, per):
        buf.put(sample(0))
    assert "delivery[overlap" in str(uniform.edp.schedule)
    if not uniform.staging.pinned:
        assert "delivery[inline" in str(per.edp.schedule)


def test_replay_batches_and_samples_are_laid_out_without_torch_view_ops(made):
    """The trainer thread frees each batch right after the delivery worker was woken for the next: freeing a
    torch view op's result (``transpose``) releases the GIL, which the worker then takes in the middle of the
    trainer's step. So the delivery hook lays ``[T, B, ...]`` out on the numpy side: the batch the trainer's
    ``get`` pulls holds no autograd view, and the sample's arrays are the same memory, time-major."""
    buf = made("conduit_replay", max_size=8, batch_size=4, warmup_transitions=0, seed=1)
    for i in range(8):
        buf.put(sample(i))
    buf.get()  # the delivery hook has staged the next batch meanwhile
    batch = buf.edp.pull()
    assert not [k for k, t in batch.items() if t._is_view()]
    sample_, _ = batch.info.attachment
    obs = next(v for k, v in flatten(sample_) if k == "obs")
    assert obs.flags.c_contiguous and obs.shape[:2] == (4, 4)  # [T, B, ...]
    assert np.shares_memory(obs, batch["obs"].numpy())
