"""Checkpoint and restore: atomic, verified, portable, and exact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conduit import Conduit, Mode, RateLimited, Schedule, SemanticsError
from conduit.checkpoint import CheckpointError, load, pack, read_manifest, unpacked
from conduit.storage import ShardedStorage
from tests.helpers import transitions

INLINE = Schedule(Mode(False, 1), Mode(False, 1))
BATCHED = Schedule(Mode(False, 2), Mode(False, 3))  # leaves staged batches and pending units around


def make(sampler="uniform", pinned=INLINE, **kw) -> Conduit:
    cfg = dict(policy="off_policy", train_batch_size=4, capacity=48, seed=7, sampler=sampler, timeout_s=5.0)
    cfg.update(kw)
    return Conduit(pinned=pinned, **cfg)


def drive(edp: Conduit, steps: range, record: list) -> None:
    for i in steps:
        edp.push(transitions(8, start=8 * i))
        if edp.ready():
            b = edp.pull()
            record.append(b["tid"].tolist())
            if edp.config.sampler.value == "prioritized":
                edp.update_priorities(b, (b["tid"] % 5 + 1).float())


@pytest.mark.parametrize("sampler", ["uniform", "prioritized", "fifo"])
@pytest.mark.parametrize("schedule", [INLINE, BATCHED], ids=["inline", "batched"])
def test_restore_and_continue_matches_an_uninterrupted_run_sample_for_sample(tmp_path, sampler, schedule):
    extra = {"max_times_sampled": 3} if sampler == "fifo" else {}
    uninterrupted: list = []
    with make(sampler, schedule, **extra) as a:
        drive(a, range(20), uninterrupted)
    first: list = []
    with make(sampler, schedule, **extra) as b:
        drive(b, range(9), first)
        b.save(tmp_path / "ckpt")
    resumed: list = []
    with Conduit.from_checkpoint(tmp_path / "ckpt") as c:
        drive(c, range(9, 20), resumed)
    assert first + resumed == uninterrupted


def test_staged_batches_of_another_batch_size_go_back_at_restore(tmp_path):
    """A restore that changes ``train_batch_size`` hands out batches of the new size only: the queue's rows
    staged in batches of the old size are drawable again, none lost, none twice."""
    queue = dict(sampler="fifo", max_times_sampled=1, capacity=64, pinned=Schedule(Mode(False, 1), Mode(True, 2)))
    got: list[int] = []
    with make(**queue) as a:
        a.push(transitions(32))
        got += a.pull()["tid"].tolist()
        deadline = time.monotonic() + 10
        while not a.state_dict()["delivery"]["staged"][0] and time.monotonic() < deadline:
            time.sleep(0.01)  # the worker stages the next batches of four
        a.save(tmp_path / "ckpt")
    b = make(**{**queue, "train_batch_size": 7, "pinned": INLINE})
    b.restore(tmp_path / "ckpt")
    with b:
        sizes = []
        for _ in range(4):  # 28 rows left: four batches of seven
            batch = b.pull(timeout=5)
            sizes.append(len(batch["tid"]))
            got += batch["tid"].tolist()
    assert sizes == [7] * 4 and sorted(got) == list(range(32))


def test_an_annealed_beta_is_part_of_the_checkpoint(tmp_path):
    """``set_beta`` (a framework's annealed importance-sampling exponent) goes on after a restore: the restored
    run draws the uninterrupted run's rows with its weights, not the configured beta's."""
    with make("prioritized") as a:
        drive(a, range(4), [])
        a.set_beta(1.0)
        a.save(tmp_path / "ckpt")
        expected = a.pull()
    with Conduit.from_checkpoint(tmp_path / "ckpt") as c:
        got = c.pull()
    assert got["tid"].tolist() == expected["tid"].tolist()
    np.testing.assert_array_equal(np.asarray(got.weights), np.asarray(expected.weights))


@pytest.mark.parametrize("learners", [1, 3])
def test_a_queues_staged_batches_reach_a_restore_into_another_number_of_learners(tmp_path, learners):
    """Staged batches of a queue (each row delivered once) are in the checkpoint: restored into fewer learners,
    those of the learners gone go to the learners left; into more, the new ones pull from pull 0."""
    queue = dict(sampler="fifo", max_times_sampled=1, capacity=64, pinned=Schedule(Mode(False, 1), Mode(True, 2)))
    got: list[int] = []
    with make(num_learners=2, **queue) as a:
        a.push(transitions(32))
        got += a.pull(0)["tid"].tolist() + a.pull(1)["tid"].tolist()
        deadline = time.monotonic() + 10
        while min(len(q) for q in a.state_dict()["delivery"]["staged"]) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the worker stages each learner's next batch
        a.save(tmp_path / "ckpt")
    b = make(num_learners=learners, **{**queue, "pinned": INLINE})  # (overlapped, the others' staged batches
    b.restore(tmp_path / "ckpt")                                     # may hold every row a new learner could get)
    with b:
        for k in range(6):  # 24 rows left: six batches of four, whichever learners pull them
            got += b.pull(k % learners, timeout=5)["tid"].tolist()
        assert b.stats().buffer_rows == 0
    assert sorted(got) == list(range(32))


def test_a_rate_limit_added_at_restore_counts_the_rows_stored_without_one(tmp_path):
    """A runtime without a ratio counts samples but no inserts; restored into one with a ratio, its stored rows
    count as inserted (the limiter said 0 inserted, 24 sampled, and refused the learner)."""
    with make() as a:
        drive(a, range(6), [])  # 48 rows stored
        sampled = a.buffer.limiter.samples
        a.save(tmp_path / "ckpt")
    b = make(rate_limit=dict(samples_per_insert=1.0, tolerance=8, block=False))
    b.restore(tmp_path / "ckpt")
    with b:
        assert (b.buffer.limiter.inserts, b.buffer.limiter.samples) == (48, sampled)
        b.pull()  # the actors are ahead of the ratio: the learner may sample, and a push waits its turn
        with pytest.raises(RateLimited):
            b.push(transitions(8, start=48))


def test_restore_into_another_placement_keeps_every_row(tmp_path):
    with make("prioritized") as a:
        drive(a, range(10), [])
        a.save(tmp_path / "ckpt")
        before = a.buffer.contents()
        expected = [a.pull()["tid"].tolist() for _ in range(5)]

    class TwoShards:  # CPU shards stand in for another device set
        def create(self, spec, rows):
            return ShardedStorage(spec, rows, [("cpu", rows // 2), ("cpu", rows - rows // 2)])

        def migrate(self, old, spec, valid):  # pragma: no cover - not exercised here
            raise AssertionError

    restored = Conduit.from_checkpoint(tmp_path / "ckpt", storage=TwoShards())
    with restored:
        assert isinstance(restored.buffer.storage, ShardedStorage)
        after = restored.buffer.contents()
        assert all(torch.equal(before[k], after[k]) for k in before)
        assert [restored.pull()["tid"].tolist() for _ in range(5)] == expected


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128, torch.bfloat16, torch.bool, torch.int8])
def test_every_dtype_a_push_accepts_comes_back_from_a_checkpoint(tmp_path, dtype):
    data = transitions(8)
    data["extra"] = (torch.randn(8, 3, dtype=dtype if dtype.is_complex else torch.float64) * 4).to(dtype)
    with make() as a:
        a.push(data)
        a.flush()
        a.save(tmp_path / "ckpt")
        before = a.buffer.contents()
    with Conduit.from_checkpoint(tmp_path / "ckpt") as b:
        after = b.buffer.contents()
        assert after["extra"].dtype == dtype
        assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_failure_mid_save_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    with make() as a:
        drive(a, range(6), [])
        a.save(tmp_path / "ckpt")
        good = read_manifest(tmp_path / "ckpt")[1]["buffer"]["inserted"]
        drive(a, range(6, 12), [])
        real_save = torch.save

        def crash(obj, f, *args, **kwargs):
            if str(f).endswith("delivery.pt"):
                raise OSError("disk full")
            return real_save(obj, f, *args, **kwargs)

        monkeypatch.setattr(torch, "save", crash)
        with pytest.raises(OSError, match="disk full"):
            a.save(tmp_path / "ckpt")
    assert read_manifest(tmp_path / "ckpt")[1]["buffer"]["inserted"] == good
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary left behind


def test_a_crash_between_the_renames_falls_back_to_the_aside_copy(tmp_path, monkeypatch):
    with make() as a:
        drive(a, range(6), [])
        a.save(tmp_path / "ckpt")
        good = read_manifest(tmp_path / "ckpt")[1]["buffer"]["inserted"]
        drive(a, range(6, 12), [])
        calls = {"n": 0}
        real = os.replace

        def replace(src, dst):
            calls["n"] += 1
            if calls["n"] == 2:  # the old one is aside, the new one not yet in place: "crash"
                raise KeyboardInterrupt
            return real(src, dst)

        monkeypatch.setattr(os, "replace", replace)
        with pytest.raises(KeyboardInterrupt):
            a.save(tmp_path / "ckpt")
    monkeypatch.undo()
    assert not (tmp_path / "ckpt").exists()
    where, manifest = read_manifest(tmp_path / "ckpt")
    assert where.name.startswith(".ckpt.old-") and manifest["buffer"]["inserted"] == good
    with Conduit.from_checkpoint(tmp_path / "ckpt") as c:
        assert c.buffer.inserted == good


def test_killing_the_saving_process_leaves_the_previous_checkpoint_loadable(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys, time, torch
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        import conduit.checkpoint as ck
        from tests.helpers import transitions
        from conduit import Conduit
        edp = Conduit(policy="off_policy", train_batch_size=4, capacity=4096, seed=0)
        edp.push(transitions(64))
        edp.save({str(tmp_path / "ckpt")!r})
        print("saved", flush=True)
        edp.push(transitions(1024, start=64))
        real = torch.save
        def slow(obj, f, *a, **k):
            real(obj, f, *a, **k)
            print("writing", flush=True)
            time.sleep(30)
        torch.save = slow
        edp.save({str(tmp_path / "ckpt")!r})
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "saved"
        assert proc.stdout.readline().strip() == "writing"  # mid-way through the second save
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    where, manifest = read_manifest(tmp_path / "ckpt")
    assert where == tmp_path / "ckpt" and manifest["buffer"]["inserted"] == 64
    with Conduit.from_checkpoint(tmp_path / "ckpt") as c:
        assert sorted(c.buffer.contents()["tid"].tolist()) == list(range(64))


def test_corrupt_and_foreign_checkpoints_fail_clearly(tmp_path):
    with make() as a:
        drive(a, range(5), [])
        a.save(tmp_path / "ckpt")
    ck = tmp_path / "ckpt"
    rows = ck / "buffer.pt"
    data = bytearray(rows.read_bytes())
    data[-10] ^= 0xFF
    rows.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"buffer\.pt does not match its recorded checksum"):
        read_manifest(ck)
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        read_manifest(tmp_path / "nowhere")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "MANIFEST.json").write_text(json.dumps({"format": "reverb", "version": 1}))
    with pytest.raises(CheckpointError, match="incomplete checkpoint"):
        read_manifest(foreign)
    import hashlib

    (foreign / "COMPLETE").write_text(hashlib.sha256((foreign / "MANIFEST.json").read_bytes()).hexdigest())
    with pytest.raises(CheckpointError, match="expected format 'conduit-checkpoint', found 'reverb'"):
        read_manifest(foreign)


def test_restoring_into_a_mismatched_runtime_is_refused(tmp_path):
    with make() as a:
        drive(a, range(5), [])
        a.save(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="capacity"):
        make(capacity=64).restore(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="sampler"):
        make("prioritized").restore(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="checkpoint is off_policy"):
        Conduit(policy="on_policy", train_batch_size=8).restore(tmp_path / "ckpt")
    with make("prioritized") as a:  # the priorities are saved as p ** alpha: another alpha would misread them
        drive(a, range(5), [])
        a.save(tmp_path / "per")
    with pytest.raises(CheckpointError, match=r"restore with alpha=0\.6"):
        make("prioritized", prioritized=dict(alpha=0.9)).restore(tmp_path / "per")
    with make("prioritized") as b:
        b.restore(tmp_path / "per")
        assert b.pull()["tid"].numel() == 4


def test_on_policy_checkpoints_between_iterations_only(tmp_path):
    with Conduit(policy="on_policy", train_batch_size=16, num_minibatches=2, seed=3) as a:
        a.push(transitions(16))
        list(a.minibatches())
        a.save(tmp_path / "ckpt")
        a.push(transitions(16, start=16))
        expected = [b["tid"].tolist() for b in a.minibatches()]
        a.push(transitions(8, start=32))
        with pytest.raises(SemanticsError, match="between iterations"):
            a.save(tmp_path / "mid")
    with Conduit.from_checkpoint(tmp_path / "ckpt") as b:
        b.push(transitions(16, start=16))
        got = [x["tid"].tolist() for x in b.minibatches()]
        assert got == expected and b.stats().buffer_version == 32


def test_save_under_load_is_a_consistent_point(tmp_path):
    import threading

    edp = make(pinned=Schedule(Mode(True, 2), Mode(True, 2)), capacity=4096)
    stop = threading.Event()
    with edp:
        def actor():
            i = 0
            while not stop.is_set():
                edp.push(transitions(8, start=8 * i))
                i += 1

        t = threading.Thread(target=actor)
        t.start()
        time.sleep(0.05)
        for _ in range(3):
            edp.save(tmp_path / "ckpt")
            _, m = read_manifest(tmp_path / "ckpt")
            ids = np.asarray(load(tmp_path / "ckpt")[1]["buffer"]["table"]["ids"])
            assert int((ids >= 0).sum()) == min(m["buffer"]["inserted"], 4096)
        stop.set()
        t.join()


def test_a_save_inside_quiesced_captures_the_point_the_caller_holds(tmp_path):
    """A framework reads its own bookkeeping inside ``quiesced()`` and saves there: the pause is re-entrant for
    its thread (no deadlock), no invocation runs until the block ends, and pulls of staged batches still work."""
    edp = make(pinned=Schedule(Mode(True, 1), Mode(True, 1)), timeout_s=2.0)
    with edp:
        edp.push(transitions(16))
        edp.flush()
        edp.pull()
        deadline = time.monotonic() + 2.0
        while not edp.delivery.staged[0] and time.monotonic() < deadline:  # the worker stages the next batch
            time.sleep(0.005)
        with edp.quiesced():
            invocations = edp.stats().delivery_invocations
            edp.save(tmp_path / "ckpt")
            edp.state_dict()
            edp.pull()  # the batch the worker staged before the pause
            time.sleep(0.05)
            assert edp.stats().delivery_invocations == invocations  # the worker stays still
        edp.pull()  # and resumes after the block
    assert read_manifest(tmp_path / "ckpt")[1]["policy"] == "off_policy"


def test_a_push_while_the_queue_is_saved_lands_after_the_checkpoint(tmp_path, monkeypatch):
    """Pushes go on queueing while a save holds ingestion still, so the save copies the queue at one point:
    it once iterated the live queue and failed with "deque mutated during iteration" under a pushing actor."""
    from conduit.paths import ingestion

    edp = make(pinned=Schedule(Mode(True, 2), Mode(True, 2)), capacity=4096)
    pushed_during_save = []
    real_adopt = ingestion.adopt

    def adopt_then_push(data, producers):  # an actor's push lands while the save walks the queue
        real_adopt(data, producers)
        if not pushed_during_save:
            pushed_during_save.append(True)
            edp.push(transitions(8, start=800))

    with edp:
        edp.push(transitions(8))  # one unit of a group of two: it waits in the queue
        monkeypatch.setattr(ingestion, "adopt", adopt_then_push)
        edp.save(tmp_path / "ckpt")
        monkeypatch.setattr(ingestion, "adopt", real_adopt)
        assert pushed_during_save
        edp.flush()
        assert edp.stats().ingested_rows == 16  # the runtime itself lost nothing
    saved = load(tmp_path / "ckpt")[1]["ingestion"]
    assert saved["pending_units"] == 1 and sum(p["rows"] for p in saved["pieces"]) == 8
    with Conduit.from_checkpoint(tmp_path / "ckpt") as b:  # the checkpoint is the point before that push
        b.flush()
        assert b.stats().ingested_rows == 8


@pytest.mark.parametrize("delivery", [Mode(True, 2), Mode(False, 1)], ids=["staged", "direct"])
def test_a_pull_being_counted_when_the_save_starts_is_wholly_in_the_checkpoint(tmp_path, monkeypatch, delivery):
    """A pull takes its batch and then counts its rows as sampled (the rate limiter, ``max_times_sampled``).
    A save that read the counts between the two once kept the pull's index but not its rows: restored,
    the limiter let the learners take one batch more than the ratio allows."""
    import threading

    edp = make(
        pinned=Schedule(Mode(False, 1), delivery), capacity=4096, max_times_sampled=50,
        rate_limit={"samples_per_insert": 1.0, "tolerance": 1000.0},
    )
    with edp:
        edp.push(transitions(64))
        edp.pull()
        inside, go = threading.Event(), threading.Event()
        real = edp.delivery._counted

        def slow_count(*args, **kwargs):  # the second pull stops between taking its batch and counting it
            inside.set()
            assert go.wait(5.0)
            return real(*args, **kwargs)

        monkeypatch.setattr(edp.delivery, "_counted", slow_count)
        puller = threading.Thread(target=edp.pull)
        puller.start()
        assert inside.wait(5.0)
        saver = threading.Thread(target=edp.save, args=(tmp_path / "ckpt",))
        saver.start()
        saver.join(0.3)
        assert saver.is_alive(), "the save read the counts while a pull was between taking and counting its batch"
        go.set()
        puller.join(5.0)
        saver.join(5.0)
        assert not saver.is_alive() and not puller.is_alive()
    _, m = read_manifest(tmp_path / "ckpt")
    pulled_rows = 4 * sum(m["delivery"]["pulls"])
    assert pulled_rows == 8
    saved = load(tmp_path / "ckpt")[1]["buffer"]
    assert saved["limiter"]["samples"] == pulled_rows
    assert int(np.asarray(saved["table"]["times_sampled"]).sum()) == pulled_rows


class _Exploit:
    """A pickle that runs code when loaded: it creates ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_checkpoint_that_would_run_code_when_loaded_is_refused_and_runs_nothing(tmp_path):
    import hashlib

    def sha(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    with make() as a:
        drive(a, range(5), [])
        a.save(tmp_path / "ckpt")
    ck, marker = tmp_path / "ckpt", tmp_path / "ran"
    for name in ("delivery.pt", "buffer.pt"):  # a tampered file, its checksums rewritten: they are not signatures
        tampered = ck / name
        torch.save({"pulls": [0], "staged": [_Exploit(marker)]}, tampered)
        manifest = json.loads((ck / "MANIFEST.json").read_text())
        manifest["files"][name] = {"sha256": sha(tampered), "bytes": tampered.stat().st_size}
        (ck / "MANIFEST.json").write_text(json.dumps(manifest))
        (ck / "COMPLETE").write_text(sha(ck / "MANIFEST.json"))
        with pytest.raises(CheckpointError, match=rf"{name.replace('.', '[.]')} cannot be loaded safely"):
            Conduit.from_checkpoint(ck)
        with pytest.raises(CheckpointError, match="cannot be loaded safely"):
            load(ck)
        assert not marker.exists()
    torch.load(ck / "buffer.pt", weights_only=False)  # the exploit is real: an unsafe load runs it
    assert marker.exists()


def test_what_the_buffer_admitted_and_the_queue_are_read_at_one_point(tmp_path):
    """A push goes on admitting and queueing while a save holds ingestion still: the rate limiter's inserts and
    the queued units must be read in one hold, else a unit lands in the saved queue without its insert (or, on-
    policy, without its iteration's count, and that iteration never seals after a restore)."""
    import threading

    edp = make(pinned=Schedule(Mode(True, 2), Mode(False, 1)), capacity=4096,
               rate_limit={"samples_per_insert": 1.0, "tolerance": 4096.0})
    with edp:
        edp.push(transitions(8))  # one unit of a group of two: it waits in the queue
        buffer, pushers = edp.buffer, []
        real_state = buffer.state_dict

        def state_then_push(**kw):  # an actor's push arrives while the save reads the buffer
            state = real_state(**kw)
            if not pushers:
                t = threading.Thread(target=edp.push, args=(transitions(8, start=800),))
                t.start()
                t.join(0.2)
                pushers.append(t)
            return state

        buffer.state_dict = state_then_push
        edp.save(tmp_path / "ckpt")
        buffer.state_dict = real_state
        pushers[0].join(5.0)
        edp.flush()
    saved = load(tmp_path / "ckpt")[1]
    queued = sum(int(p["rows"]) for p in saved["ingestion"]["pieces"])
    assert saved["buffer"]["limiter"]["inserts"] == saved["buffer"]["inserted"] + queued == 8


def test_a_checkpoint_packed_as_bytes_restores_exactly_and_names_no_file_outside_itself(tmp_path):
    """``pack``/``unpacked``: a checkpoint as one picklable value (SRL pickles its buffer object), restored with
    every check a checkpoint on disk gets; a file named outside the directory is refused before it is written."""
    a, a_rec = make(sampler="prioritized"), []
    drive(a, range(4), a_rec)
    files = pack(lambda path: a.save(path))
    assert "MANIFEST.json" in files and all(isinstance(v, bytes) for v in files.values())
    b = make(sampler="prioritized")
    with unpacked(files) as root:
        b.restore(root)
    a_next, b_next = [], []
    drive(a, range(4, 7), a_next)
    drive(b, range(4, 7), b_next)
    assert a_next == b_next and a_next
    a.close()
    b.close()
    with pytest.raises(CheckpointError, match="outside its directory"):
        with unpacked({**files, "../escaped.pt": b"x"}):
            pass
    damaged = {**files, "MANIFEST.json": files["MANIFEST.json"][:-3]}
    with pytest.raises(CheckpointError), unpacked(damaged) as root:
        make().restore(root)
