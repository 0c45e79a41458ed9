"""Promise: ``close(timeout=t)`` returns within ``t`` behind any hung hook and names the thread it left.

A hook that never returns holds an invocation: inline, in the caller's thread
(a push or pull), or on the path's worker. ``close`` bounds every wait by one
deadline, leaves such a thread behind and says which it is and what it is
inside; when the hook finally returns, its invocation ends with
``RuntimeClosed`` in its own thread and fails nothing.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from conduit import Conduit, ConduitTimeout, Mode, RuntimeClosed, Schedule
from tests.helpers import transitions
from tests.reliability.conftest import until

MARGIN = 0.2  # the Done-means bound: close(timeout=t) returns within t + 0.2 s


def _hung(edp: Conduit, path: str, gate: threading.Event) -> None:
    register = edp.register_ingestion if path == "ingestion" else edp.register_delivery

    @register()
    def hangs(src, dst):
        gate.wait(20)
        dst.write(src.read())


@pytest.mark.parametrize("path", ["ingestion", "delivery"])
@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlapped"])
def test_close_is_bounded_behind_a_hung_hook_and_names_the_thread(path, overlap, caplog):
    mode = Mode(overlap, 1)
    schedule = Schedule(mode, Mode(False, 1)) if path == "ingestion" else Schedule(Mode(False, 1), mode)
    edp = Conduit(policy="off_policy", train_batch_size=4, capacity=64, timeout_s=30.0, pinned=schedule)
    gate = threading.Event()
    _hung(edp, path, gate)
    outcome: dict = {}

    def caller() -> None:
        try:
            if path == "ingestion":
                edp.push(transitions(4))
                edp.flush()
            else:
                edp.push(transitions(8))
                edp.pull()
        except Exception as exc:  # what the caller sees once the hook returns after close
            outcome["exc"] = exc

    edp.start()
    t = threading.Thread(target=caller, name="user-caller", daemon=True)
    t.start()
    deadline = time.monotonic() + 5
    target = edp.ingestion if path == "ingestion" else edp.delivery

    def in_hook() -> bool:  # (an invocation runs its gather first: close reports the operator it is inside now)
        return any("hangs" in r.describe() for r in list(target.graph.running.values()))

    while not in_hook() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert in_hook(), "the hook never started"
    inside = next(iter(target.graph.running.values())).thread
    with caplog.at_level(logging.WARNING, logger="conduit"):
        t0 = time.monotonic()
        behind = edp.close(timeout=0.5)
        took = time.monotonic() - t0
    assert took < 0.5 + MARGIN, f"close(timeout=0.5) took {took:.2f}s"
    assert len(behind) == 1 and inside in behind[0] and "hangs" in behind[0], behind
    assert inside in caplog.text
    gate.set()
    t.join(5)
    if overlap:
        worker = target.worker or next(th for th in threading.enumerate() if th.name == inside)
        deadline = time.monotonic() + 5
        while any(th.name == inside and th.is_alive() for th in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker is not None
    elif path == "ingestion":
        assert isinstance(outcome.get("exc"), RuntimeClosed)
    assert edp.failure.error is None  # the late invocation failed nothing


def test_close_with_a_timeout_of_zero_still_returns_and_releases():
    edp = Conduit(policy="off_policy", train_batch_size=4, capacity=64, pinned=Schedule(Mode(True, 1), Mode(True, 1)))
    with edp:
        edp.push(transitions(16))
    t0 = time.monotonic()
    edp.close(timeout=0.0)
    assert time.monotonic() - t0 < MARGIN
    assert edp.closed


def _inline_hang(edp: Conduit) -> tuple[threading.Event, threading.Thread]:
    """A push whose inline ingestion hook hangs, in its own thread, started and inside the hook."""
    gate = threading.Event()
    _hung(edp, "ingestion", gate)
    edp.start()
    t = threading.Thread(target=lambda: edp.push(transitions(4)), name="stuck-actor", daemon=True)
    t.start()
    until(lambda: edp.ingestion.graph.running)
    return gate, t


def test_a_save_behind_a_hung_inline_hook_times_out_naming_it(tmp_path):
    edp = Conduit(policy="off_policy", train_batch_size=4, capacity=64, timeout_s=30.0,
                  pinned=Schedule(Mode(False, 1), Mode(False, 1)))
    gate, t = _inline_hang(edp)
    with pytest.raises(ConduitTimeout, match=r"stuck-actor.*hangs"):
        edp.save(tmp_path / "ck", timeout=0.3)
    gate.set()
    t.join(5)
    edp.save(tmp_path / "ck")  # and works once the hook returned
    edp.close()


def test_a_reschedule_behind_a_hung_inline_hook_times_out_and_changes_nothing():
    inline = Schedule(Mode(False, 1), Mode(False, 1))
    edp = Conduit(policy="off_policy", train_batch_size=4, capacity=64, timeout_s=30.0, pinned=inline)
    gate, t = _inline_hang(edp)
    with pytest.raises(ConduitTimeout, match="hangs"):
        edp.reschedule(Schedule(Mode(True, 2), Mode(False, 1)), timeout=0.3)
    assert edp.ingestion.mode == inline.ingestion and edp.ingestion.worker is None
    gate.set()
    t.join(5)
    edp.reschedule(Schedule(Mode(True, 2), Mode(False, 1)))
    edp.close()


def test_a_second_push_behind_a_hung_inline_hook_times_out_and_its_unit_is_not_kept():
    edp = Conduit(policy="off_policy", train_batch_size=4, capacity=64, timeout_s=30.0,
                  pinned=Schedule(Mode(False, 1), Mode(False, 1)))
    gate, t = _inline_hang(edp)
    unit = transitions(4, start=100)
    with pytest.raises(ConduitTimeout, match=r"stuck-actor.*hangs"):
        edp.push(unit, timeout=0.3)
    assert edp.stats().pushed_units == 1 and not edp.ingestion.queue
    gate.set()
    t.join(5)
    edp.flush()
    assert sorted(edp.buffer.contents()["tid"].tolist()) == [0, 1, 2, 3]
    edp.close()


def test_close_is_bounded_when_its_own_drain_would_run_a_hung_hook():
    """Inline g = 2 with one unit pending: draining it runs the hook in the closing thread, so close drains on a
    thread of its own and gives up on it after the timeout."""
    edp = Conduit(policy="off_policy", train_batch_size=4, capacity=64, timeout_s=30.0,
                  pinned=Schedule(Mode(False, 2), Mode(False, 1)))
    gate = threading.Event()
    _hung(edp, "ingestion", gate)
    edp.push(transitions(4))  # pending: g = 2 waits for a second unit
    t0 = time.monotonic()
    edp.close(timeout=0.5)
    assert time.monotonic() - t0 < 0.5 + MARGIN
    gate.set()


def test_a_reschedule_whose_delivery_switch_times_out_leaves_one_schedule():
    inline = Schedule(Mode(False, 1), Mode(False, 1))
    edp = Conduit(policy="off_policy", train_batch_size=4, capacity=64, timeout_s=30.0, pinned=inline)
    gate = threading.Event()
    _hung(edp, "delivery", gate)
    edp.start()
    edp.push(transitions(16))
    t = threading.Thread(target=edp.pull, name="stuck-learner", daemon=True)
    t.start()
    until(lambda: edp.delivery.graph.running)
    with pytest.raises(ConduitTimeout, match="stuck-learner"):
        edp.reschedule(Schedule(Mode(True, 2), Mode(True, 1)), timeout=0.3)
    assert edp.ingestion.mode == inline.ingestion and edp.delivery.mode == inline.delivery
    assert edp.schedule == inline
    gate.set()
    t.join(5)
    edp.close()
