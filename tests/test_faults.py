"""Fault injection: every fault surfaces as a typed error from the next call, nothing hangs."""

from __future__ import annotations

import threading
import time

import pytest

from conduit import (
    Conduit,
    ConduitTimeout,
    DeviceFailed,
    HookFailed,
    Mode,
    RuntimeClosed,
    RuntimeFailed,
    Schedule,
    WorkerDied,
)
from conduit.storage import TensorStorage
from tests.helpers import transitions

BOTH = [False, True]


def runtime(overlap: bool, **kw) -> Conduit:
    cfg = dict(policy="off_policy", train_batch_size=4, capacity=256, seed=0, timeout_s=2.0)
    cfg.update(kw)
    return Conduit(pinned=Schedule(Mode(overlap, 1), Mode(overlap, 1)), **cfg)


def surfaces_within(seconds: float, call, error: type[BaseException]) -> BaseException:
    t0 = time.monotonic()
    with pytest.raises(error) as e:
        for _ in range(200):
            call()
            time.sleep(0.005)
    assert time.monotonic() - t0 < seconds
    return e.value


@pytest.mark.parametrize("overlap", BOTH)
def test_a_raising_hook_is_a_hook_failure_with_its_traceback(overlap):
    edp = runtime(overlap)

    @edp.register_delivery(input="ExperienceBuffer", output="Learner")
    def broken(exp_in, learn_out):
        raise ValueError("the framework's delivery op broke")

    def iteration():  # an overlapped worker may fail before the pull: then the next call reports it
        edp.push(transitions(16))
        edp.flush()
        edp.pull()

    with edp:
        err = surfaces_within(1.0, iteration, HookFailed)
        assert isinstance(err.__cause__, ValueError) and "in broken" in err.original_traceback
        with pytest.raises(HookFailed):  # the runtime stays failed: every later call says so
            edp.push(transitions(4))
    assert edp.delivery.limiter.reserved == 0  # the failed invocation gave back the rows it claimed


@pytest.mark.parametrize("overlap", BOTH)
def test_a_device_error_on_the_transfer_path_is_a_device_failure(overlap, monkeypatch):
    edp = runtime(overlap)

    def cuda_error(self, indices, device=None, out=None):  # where a device fault surfaces: the gather/copy kernels
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(TensorStorage, "gather", cuda_error)
    with edp:
        err = surfaces_within(1.0, lambda: (edp.push(transitions(16)), edp.pull()), DeviceFailed)
        assert "illegal memory access" in str(err)


def test_a_worker_that_dies_outside_any_operator_surfaces_from_the_next_push(monkeypatch):
    edp = runtime(True)
    edp.start()

    def die(flush):
        raise MemoryError("worker lost its memory")

    monkeypatch.setattr(edp.ingestion, "_take_group", die)
    with edp:
        err = surfaces_within(1.0, lambda: edp.push(transitions(4)), WorkerDied)
        assert "ingestion worker" in str(err)


def test_a_delivery_worker_that_dies_fails_a_blocked_learner_at_once(monkeypatch):
    edp = runtime(True)
    edp.start()
    errors = []

    def learner():
        try:
            edp.pull(timeout=30)
        except Exception as e:
            errors.append(e)

    with edp:
        t = threading.Thread(target=learner)
        t.start()
        time.sleep(0.05)
        monkeypatch.setattr(edp.delivery, "_ready", lambda r: (_ for _ in ()).throw(OSError("lost")))
        with pytest.raises(RuntimeFailed):  # the worker may die before or after this push returns
            edp.push(transitions(16))
            edp.push(transitions(16))
            edp.flush()
            time.sleep(0.5)
            edp.push(transitions(16))
        t.join(2.0)
        assert not t.is_alive()
        assert isinstance(errors[0], RuntimeFailed)


def test_a_learner_that_stops_pulling_makes_on_policy_actors_time_out_not_hang():
    with Conduit(policy="on_policy", train_batch_size=8, timeout_s=0.3) as edp:
        edp.push(transitions(8))
        edp.push(transitions(8))
        with pytest.raises(ConduitTimeout):
            edp.push(transitions(8))


@pytest.mark.parametrize("overlap", BOTH)
def test_an_actor_that_stops_pushing_makes_pull_time_out_not_hang(overlap):
    with runtime(overlap, min_size_to_sample=64, timeout_s=0.3) as edp:
        edp.push(transitions(8))
        t0 = time.monotonic()
        with pytest.raises(ConduitTimeout, match="min_size_to_sample"):
            edp.pull()
        assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("fault", ["hook", "worker"])
def test_close_completes_under_every_fault_and_leaves_no_thread(fault, monkeypatch):
    edp = runtime(True)
    if fault == "hook":
        edp.register_ingestion(input="Actor", output="ExperienceBuffer")(lambda a, b: 1 / 0)
    edp.start()
    if fault == "worker":
        monkeypatch.setattr(edp.delivery, "_ready", lambda r: 1 / 0)
    try:
        edp.push(transitions(8))
        edp.flush()
    except RuntimeFailed:
        pass
    t0 = time.monotonic()
    edp.close(timeout=2.0)
    assert time.monotonic() - t0 < 2.5
    assert not any(t.name.startswith("conduit-") and t.is_alive() for t in threading.enumerate())
    with pytest.raises((RuntimeFailed, RuntimeClosed)):
        edp.push(transitions(1))


def test_close_waits_for_a_slow_hook_up_to_its_timeout_and_reports_it():
    edp = runtime(True)
    release = threading.Event()

    @edp.register_ingestion(input="Actor", output="ExperienceBuffer")
    def slow(actor_in, exp_out):
        release.wait(5)
        exp_out.write(actor_in.read())

    edp.push(transitions(4))
    time.sleep(0.05)
    t0 = time.monotonic()
    edp.close(timeout=0.3)  # the worker is stuck in the hook: close gives up after the timeout
    assert time.monotonic() - t0 < 1.5
    release.set()
    edp.ingestion.worker._thread.join(2)
    assert not edp.ingestion.worker.alive
