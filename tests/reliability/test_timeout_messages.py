"""Promise: a timeout says what it waited for — a slow hook is named as a slow hook, not as missing data."""

from __future__ import annotations

import threading

import pytest

from conduit import Conduit, ConduitTimeout, Mode, Schedule
from tests.helpers import transitions
from tests.reliability.conftest import until


def test_a_pull_waiting_on_a_delivery_worker_stuck_in_its_hook_names_the_hook_not_the_data():
    edp = Conduit(policy="off_policy", train_batch_size=4, capacity=64, timeout_s=30.0,
                  pinned=Schedule(Mode(False, 1), Mode(True, 1)))
    gate = threading.Event()

    @edp.register_delivery()
    def featurize(exp_in, learn_out):
        gate.wait(10)
        learn_out.write(exp_in.read())

    with edp:
        edp.push(transitions(64))
        until(lambda: edp.delivery.graph.running)
        with pytest.raises(ConduitTimeout) as err:
            edp.pull(timeout=0.3)
        message = str(err.value)
        assert "featurize" in message and "conduit-delivery" in message and "has been inside" in message
        assert "push more rollouts" not in message
        gate.set()


def test_a_push_waiting_on_an_ingestion_worker_stuck_in_its_hook_names_the_hook():
    edp = Conduit(policy="off_policy", train_batch_size=4, capacity=64, timeout_s=30.0,
                  pinned=Schedule(Mode(True, 1), Mode(False, 1)))
    gate = threading.Event()

    @edp.register_ingestion()
    def parse(actor_in, exp_out):
        gate.wait(10)
        exp_out.write(actor_in.read())

    with edp:
        edp.push(transitions(4))
        until(lambda: edp.ingestion.graph.running)
        with pytest.raises(ConduitTimeout, match=r"parse.*for \d"):
            edp.push(transitions(4), timeout=0.3)
        gate.set()


def test_a_pull_waiting_for_data_still_says_push_more():
    with Conduit(policy="off_policy", train_batch_size=4, capacity=64, min_size_to_sample=32) as edp:
        edp.push(transitions(8))
        with pytest.raises(ConduitTimeout, match="push more rollouts"):
            edp.pull(timeout=0.1)


def test_a_pull_waiting_on_a_queue_or_the_ratio_says_which():
    """Enough rows stored is not enough: a queue's rows whose uses are taken, or a ratio that holds the draw
    back, are named (it said "holds 2 rows and sampling starts at 1" either way)."""
    with Conduit(policy="off_policy", train_batch_size=4, capacity=64, sampler="fifo", max_times_sampled=1,
                 min_size_to_sample=1) as edp:
        edp.push(transitions(2))
        with pytest.raises(ConduitTimeout, match=r"2 of them may still be drawn .* a draw takes 4 distinct rows"):
            edp.pull(timeout=0.1)
    with Conduit(policy="off_policy", train_batch_size=4, capacity=64, min_size_to_sample=4,
                 rate_limit={"samples_per_insert": 0.5, "tolerance": 4}) as edp:
        edp.push(transitions(8))
        edp.pull()
        with pytest.raises(ConduitTimeout, match="the sample/insert ratio holds the draw of 4 rows back"):
            edp.pull(timeout=0.1)
    with Conduit(policy="off_policy", train_batch_size=4, capacity=64, min_size_to_sample=32) as edp:
        edp.push(transitions(8))
        with pytest.raises(ConduitTimeout, match="holds 8 rows and sampling starts at 32"):
            edp.pull(timeout=0.1)
