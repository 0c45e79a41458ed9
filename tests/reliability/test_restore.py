"""Promise: a restored run continues the interrupted one — hooks included — and a damaged checkpoint is
never silently swapped for an older one."""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import conduit
from conduit import CheckpointError, Conduit, Mode, Schedule
from conduit.checkpoint import read_manifest
from tests.helpers import transitions
from tests.reliability.conftest import until

G2 = Schedule(Mode(False, 2), Mode(False, 1))  # units wait for a second one: a checkpoint holds them pending


def _runtime(**kw) -> Conduit:
    return Conduit(policy="off_policy", train_batch_size=4, capacity=256, seed=0, pinned=G2, **kw)


def _tenfold(edp: Conduit) -> None:
    @edp.register_ingestion()
    def tenfold(actor_in, exp_out):
        d = actor_in.read()
        exp_out.write({**d, "reward": d["reward"] * 10})


def test_units_pending_in_a_checkpoint_go_through_hooks_registered_after_from_checkpoint(tmp_path):
    whole = _runtime()
    _tenfold(whole)
    with whole:
        for i in range(3):
            whole.push(transitions(4, start=4 * i))
        whole.flush()
        expected = whole.buffer.contents()["reward"].sum().item()
    a = _runtime()
    _tenfold(a)
    with a:
        for i in range(3):
            a.push(transitions(4, start=4 * i))
        a.save(tmp_path / "ck")  # the third unit is pending (g = 2)
    b = Conduit.from_checkpoint(tmp_path / "ck")
    assert not b.closed and b.buffer is None  # not started: hooks can still be registered
    _tenfold(b)
    with b:
        b.flush()
        assert b.buffer.contents()["reward"].sum().item() == expected == 120.0


def test_a_damaged_checkpoint_is_an_error_even_with_an_older_copy_beside_it(tmp_path, caplog):
    with _runtime() as a:
        a.push(transitions(8))
        a.flush()
        a.save(tmp_path / "ck")
        older = tmp_path / ".ck.old-deadbeef"  # what a save killed between its renames leaves
        os.replace(tmp_path / "ck", older)
        a.push(transitions(8, start=8))
        a.flush()
        a.save(tmp_path / "ck")
    assert not older.exists()  # a completed save removes copies earlier interrupted saves left
    # an aside copy again, then the newest damaged
    with _runtime() as a:
        a.push(transitions(8))
        a.flush()
        a.save(older)
    (tmp_path / "ck" / "buffer.pt").write_bytes(b"damaged")
    with pytest.raises(CheckpointError, match="fallback=True"):
        Conduit.from_checkpoint(tmp_path / "ck")
    with caplog.at_level(logging.WARNING, logger="conduit"):
        b = Conduit.from_checkpoint(tmp_path / "ck", fallback=True)
    assert "falling back" in caplog.text
    with b:
        assert b.buffer.inserted == 8


def test_a_missing_checkpoint_after_a_crash_between_renames_loads_the_aside_copy_loudly(tmp_path, caplog):
    with _runtime() as a:
        a.push(transitions(8))
        a.flush()
        a.save(tmp_path / "ck")
    os.replace(tmp_path / "ck", tmp_path / ".ck.old-0badc0de")
    with caplog.at_level(logging.WARNING, logger="conduit"):
        where, _ = read_manifest(tmp_path / "ck")
    assert where.name == ".ck.old-0badc0de" and "set aside" in caplog.text


def test_a_save_removes_what_killed_saves_left_behind(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys, time, torch
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from conduit import Conduit
        from tests.helpers import transitions
        edp = Conduit(policy="off_policy", train_batch_size=4, capacity=4096, seed=0)
        edp.push(transitions(2048))
        real = torch.save
        def slow(obj, f, *a, **k):
            real(obj, f, *a, **k)
            print("writing", flush=True)
            time.sleep(30)
        torch.save = slow
        edp.save({str(tmp_path / "ck")!r})
        """
    )
    for _ in range(2):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            assert ready and proc.stdout.readline().strip() == "writing"
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
    # each killed save left its temporary; the second save removed the first's (its process was gone)
    assert len(list(tmp_path.glob(".ck.tmp-*"))) == 1
    with _runtime() as a:
        a.push(transitions(8))
        a.save(tmp_path / "ck")
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_checkpoint_error_is_part_of_the_public_api():
    assert conduit.CheckpointError is CheckpointError and "CheckpointError" in conduit.__all__
    assert issubclass(CheckpointError, ValueError)
    assert torch  # the checkpoint tests' own import


def test_a_prioritized_queue_saved_with_batches_in_flight_samples_after_restore(tmp_path):
    """Rows held by staged batches have their priorities kept aside; a checkpoint keeps them too."""
    edp = Conduit(policy="off_policy", train_batch_size=8, capacity=64, sampler="prioritized", max_times_sampled=1,
                  min_size_to_sample=8, seed=0, pinned=Schedule(Mode(False, 1), Mode(True, 2)))
    with edp:
        edp.push(transitions(32))
        edp.pull()
        until(lambda: edp.delivery.staged[0])
        assert edp.buffer.table.held_count > 0
        edp.save(tmp_path / "ck")
    with Conduit.from_checkpoint(tmp_path / "ck") as b:
        seen = [t for _ in range(3) for t in b.pull()["tid"].tolist()]
        assert len(seen) == len(set(seen)) == 24


def test_a_restore_that_fails_at_start_fails_every_call():
    edp = _runtime()
    with _runtime() as a:
        a.push(transitions(8))
        a.flush()
        state = a.state_dict()
    state["delivery"]["pulls"] = "not a list of counts"
    edp._restoring = state  # what restore() leaves for start(): here, a state no component accepts
    with pytest.raises(ValueError):  # the first call sees why: the delivery's state could not be read
        edp.push(transitions(4))
    with pytest.raises(conduit.RuntimeFailed, match="restoring the checkpoint"):
        edp.push(transitions(4))
    edp.close()
