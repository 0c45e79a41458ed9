"""The timeline: a short traced loop writes a valid Chrome/Perfetto trace whose overlapped spans overlap.

The loop uses the sleep cost kind (the update releases the CPU, as a GPU
learner would) and an overlapped delivery schedule: while the learner's update
runs on the main thread, the delivery worker prepares the next batch, so their
spans must intersect in time. No timing thresholds are asserted.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks.loop import loop_callables, runtime_factory
from benchmarks.loop_results import LoopConfig
from conduit.core import Mode, Policy, Schedule
from conduit.scheduling.workload import CostKind, SyntheticWorkload, run_loop
from conduit.storage import FixedStorage
from conduit.trace import Tracer


def _workload() -> SyntheticWorkload:
    return SyntheticWorkload(
        policy=Policy.OFF_POLICY,
        dim=1024,
        unit_size=128,
        batch_size=256,
        capacity=2048,
        rollout_ms=1.0,
        update_ms=4.0,
        cost=CostKind.SLEEP,
    )


@pytest.fixture(scope="module")
def trace_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    w = _workload()
    tracer = Tracer(enabled=True)
    schedule = Schedule(Mode(True, 1), Mode(True, 1))
    config = LoopConfig("overlap g=1", "overlap", "cpu", schedule)
    rollout, update = loop_callables(w, tracer)
    run_loop(
        w,
        schedule,
        iterations=8,
        warmup=1,
        rollout=rollout,
        update=update,
        runtime_factory=runtime_factory(config, FixedStorage("cpu"), tracer),
        pool=w.units(2),
    )
    path = tracer.save(tmp_path_factory.mktemp("trace") / "loop.json")
    return json.loads(path.read_text())


def _complete(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def test_trace_has_the_trace_event_schema_essentials(trace_doc: dict[str, Any]) -> None:
    assert isinstance(trace_doc["traceEvents"], list)
    events = _complete(trace_doc)
    assert events
    for e in events:
        assert isinstance(e["name"], str) and e["name"]
        for key in ("ts", "dur"):
            assert isinstance(e[key], (int, float)) and e[key] >= 0, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    meta = [e for e in trace_doc["traceEvents"] if e["ph"] == "M"]
    named = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert {e["tid"] for e in events} <= set(named), "every thread with spans needs a thread_name"
    assert "conduit-delivery" in named.values()


def test_trace_records_rollout_update_and_operators(trace_doc: dict[str, Any]) -> None:
    names = {(e["cat"], e["name"]) for e in _complete(trace_doc)}
    for expected in (("loop", "rollout"), ("loop", "update"), ("conduit", "ingestion"), ("conduit", "delivery")):
        assert expected in names
    assert ("processing", "select_gather") in names and ("transfer", "buffer_write") in names


def test_delivery_on_the_worker_overlaps_the_update(trace_doc: dict[str, Any]) -> None:
    events = _complete(trace_doc)
    updates = [e for e in events if e["cat"] == "loop" and e["name"] == "update"]
    deliveries = [e for e in events if e["cat"] == "conduit" and e["name"] == "delivery"]
    assert updates and deliveries
    assert {e["tid"] for e in updates}.isdisjoint({e["tid"] for e in deliveries})

    def overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return a["ts"] < b["ts"] + b["dur"] and b["ts"] < a["ts"] + a["dur"]

    assert any(overlaps(u, d) for u in updates for d in deliveries)
