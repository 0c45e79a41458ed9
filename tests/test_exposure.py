"""What a loop waits on (conduit.exposure): calls and iterators of live objects timed by part, runs interleaved."""

from __future__ import annotations

from typing import Any

import pytest

from conduit.ext import WaitTimer, measure_interleaved, summary_table


class Buffer:
    def __init__(self) -> None:
        self.calls = 0

    def sample(self, n: int) -> list[int]:
        self.calls += 1
        return list(range(n))

    def batches(self, n: int) -> Any:
        return iter(range(n))

    def state(self) -> dict[str, int]:
        return {"calls": self.calls}


def test_wrapped_calls_and_iterators_are_charged_by_part_and_the_wrappers_come_off() -> None:
    buf, timer = Buffer(), WaitTimer()
    timer.wrap(buf, "sample", "buffer.sample")
    timer.wrap_iterators(buf, "batches", "minibatch_wait")
    timer.wrap_iterators(buf, "state", "state")
    assert buf.sample(3) == [0, 1, 2] and buf.calls == 1  # the call itself, unchanged
    assert list(buf.batches(4)) == [0, 1, 2, 3]
    assert buf.state() == {"calls": 1}  # a mapping is no iterator of the loop's: handed back as it is
    assert set(timer.seconds) == {"buffer.sample", "minibatch_wait"} and timer.total > 0
    assert timer.reset().keys() == {"buffer.sample", "minibatch_wait"} and timer.total == 0
    timer.close()
    assert "sample" not in buf.__dict__ and "batches" not in buf.__dict__
    buf.sample(1)
    assert timer.seconds == {}  # nothing is charged once closed


def test_a_call_that_raises_is_charged_and_the_error_goes_through() -> None:
    class Broken:
        def add(self) -> None:
            raise ValueError("boom")

    obj, timer = Broken(), WaitTimer()
    timer.wrap(obj, "add", "buffer.add")
    with pytest.raises(ValueError, match="boom"):
        obj.add()
    assert "buffer.add" in timer.seconds


def test_runs_are_interleaved_and_each_iteration_reports_its_charged_share() -> None:
    order: list[str] = []
    bufs = {"a": Buffer(), "b": Buffer()}
    timers = {label: WaitTimer() for label in bufs}
    for label, buf in bufs.items():
        timers[label].wrap(buf, "sample", "buffer.sample")

    def step(label: str) -> Any:
        def train() -> dict[str, float]:
            order.append(label)
            bufs[label].sample(2)
            return {"ret": float(len(order))}
        return train

    results = measure_interleaved({"a": step("a"), "b": step("b")}, timers, 3,
                                  describe=lambda r: {"return_mean": r["ret"]}, verbose=False)
    assert order == ["a", "b"] * 3
    assert [r["return_mean"] for r in results["b"]] == [2.0, 4.0, 6.0]
    row = results["a"][0]
    assert row["parts"].keys() == {"buffer.sample"} and 0 < row["experience_s"] <= row["wall_s"]
    assert 0 < row["share"] <= 1
    table = summary_table(results)
    assert table.count("\n") == 3 and "| a | 2 of 3 |" in table  # header, rule, one line per run
