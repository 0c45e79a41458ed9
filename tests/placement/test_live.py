"""Live profiling: bounded, valid on a CPU-only machine; GPU paths when CUDA is there."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit.errors import PlacementError
from conduit.placement import (
    DeviceKind,
    PlacementKind,
    PlacementRequest,
    Topology,
    profile_topology,
    solve_placement,
)
from conduit.placement.live import ROW_SIZES, _Timer, cap_pageable, host_available_bytes
from conduit.placement.solver import TIE_TOLERANCE
from conduit.scheduling.calls import runtime_call_costs

CUDA = torch.cuda.is_available()


def test_profile_is_valid(tmp_path: Path) -> None:
    topo = profile_topology()  # how long it takes is a benchmark's question; its budget is tested below
    assert isinstance(topo, Topology) and len(topo.nodes) == 1
    node = topo.nodes[0]
    assert node.host_memcpy > 1e8  # > 0.1 GB/s on any machine
    assert node.host_gather is not None and node.host_gather > 1e8
    for table in (node.host_write_by_row, node.host_gather_by_row):  # measured at every row size, ascending
        assert table is not None and [r for r, _ in table] == list(ROW_SIZES)
        assert all(0 < v < float("inf") for _, v in table)  # a rate, not a speed bound (loaded hosts vary)
    assert node.push_call_s == node.pull_call_s == 0.0  # not measured unless asked for (``calls=``)
    assert node.host_memory_bytes == pytest.approx(host_available_bytes(), rel=0.5)
    assert any("median of 5" in n for n in topo.notes)
    path = tmp_path / "live.yaml"
    topo.save(path)
    assert Topology.load(path) == topo
    result = solve_placement(topo, PlacementRequest(actors="cpu", learners="cpu", capacity=1000), 64)
    assert result.placement.kind in (PlacementKind.CPU_PAGEABLE, PlacementKind.CPU_PINNED)


def test_the_runtimes_fixed_cost_per_call_is_measured_when_asked() -> None:
    topo = profile_topology(nbytes=1 << 20, repeats=2, calls=lambda: runtime_call_costs(repeats=5))
    node = topo.nodes[0]
    assert node.push_call_s > 0 and node.pull_call_s > 0  # timed on the real runtime
    assert node.push_column_s >= 0 and node.pull_column_s >= 0
    assert any("fixed cost per push and pull" in n for n in topo.notes)


@pytest.mark.skipif(CUDA, reason="checks the CPU-only shape")
def test_cpu_only_machine_has_no_pinned_memory() -> None:
    topo = profile_topology(nbytes=1 << 20, repeats=2)
    assert [d.kind for d in topo.devices] == [DeviceKind.CPU]
    assert topo.nodes[0].pinned_memory_bytes is None
    assert any("no pinned host memory" in n for n in topo.notes)
    with pytest.raises(PlacementError, match="gpus: expected none on a machine without CUDA"):
        profile_topology(gpus=[0])


class _VirtualClock:
    """A clock each measured call advances by ``step`` seconds: the budget's rule, free of the host's speed."""

    def __init__(self, step: float) -> None:
        self.now, self.step, self.calls = 0.0, step, 0

    def __call__(self) -> float:
        return self.now

    def work(self) -> None:
        self.calls += 1
        self.now += self.step


def test_time_budget_bounds_each_measurement_on_a_virtual_clock() -> None:
    clock = _VirtualClock(1.0)
    timer = _Timer(nbytes=1, warmup=3, repeats=50, budget_s=3.5, clock=clock)
    timer.bandwidth(clock.work, lambda: None)
    assert clock.calls == 4 and timer.truncated  # 3 warm-up copies, then one timed past the deadline
    for _ in range(3):  # once the budget is spent, each further measurement is one timed call
        before = clock.calls
        timer.bandwidth(clock.work, lambda: None)
        assert clock.calls - before == 1
        before = clock.calls
        timer.seconds(clock.work, repeats=50)
        assert clock.calls - before == 2  # one untimed, one timed


def test_time_budget_within_reach_runs_every_repeat() -> None:
    clock = _VirtualClock(1.0)
    timer = _Timer(nbytes=1, warmup=1, repeats=5, budget_s=100.0, clock=clock)
    assert timer.bandwidth(clock.work, lambda: None) == pytest.approx(1.0)
    assert clock.calls == 6 and not timer.truncated


def test_a_spent_budget_is_noted_in_the_profile() -> None:
    topo = profile_topology(nbytes=1 << 20, warmup=3, repeats=50, time_budget_s=0.0)
    assert any("time budget" in n for n in topo.notes)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nbytes": 0}, "nbytes: expected a number >= 1, received 0"),
        ({"repeats": 0}, "repeats: expected a number >= 1, received 0"),
        ({"warmup": -1}, "warmup: expected a number >= 0"),
        ({"pinned_fraction": 0.0}, "pinned_fraction: expected 0 < fraction <= 1"),
        ({"time_budget_s": -1}, "time_budget_s: expected a number >= 0"),
    ],
)
def test_arguments_are_validated(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        profile_topology(**kwargs)  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_profile_measures_gpus() -> None:
    topo = profile_topology(nbytes=16 << 20, repeats=3)
    node = topo.nodes[0]
    g = torch.cuda.device_count()
    assert node.gpu_count == g and node.has_pinned
    assert all(m > 0 for m in node.gpu_memory_bytes)
    assert node.pinned_to_gpu is not None and all(b > 0 for b in node.pinned_to_gpu)
    if g > 1:
        assert topo.bandwidth("cuda:0", "cuda:1") > 0
    assert all(b <= node.host_memcpy for b in (*node.host_to_gpu, *node.gpu_to_host))  # pageable: capped
    # rollouts on the learner's GPU (an LLM's generations): the buffer stays on that GPU while it fits
    result = solve_placement(topo, PlacementRequest(actors="cuda:0", learners="cuda:0", capacity=1000), 1024)
    assert result.placement.kind is PlacementKind.SINGLE_GPU
    # rollouts in pageable host memory: Eq. 1 weighs a pageable host->GPU write against a host memcpy plus a
    # gather and a pinned->GPU read, so any of the three may win (on one H200 VM, profiled: pinned first, then
    # pageable host memory once the gather was counted; measured end to end, the GPU was fastest): whichever it
    # is, it is the cheapest feasible candidate
    result = solve_placement(topo, PlacementRequest(actors="cpu", learners="cuda:0", capacity=1000), 1024)
    feasible = [e for e in result.evaluations if e.feasible]
    assert result.chosen.transfer_seconds <= min(e.transfer_seconds for e in feasible) * (1 + TIE_TOLERANCE)


def test_pageable_gpu_copies_are_capped_at_host_memcpy() -> None:
    tables = {"host_to_gpu": [12e9, 30e9], "gpu_to_host": [40e9, 9e9], "pinned_to_gpu": [55e9, 55e9]}
    assert cap_pageable(tables, 25e9) == ["host_to_gpu[1]", "gpu_to_host[0]"]
    assert tables == {"host_to_gpu": [12e9, 25e9], "gpu_to_host": [25e9, 9e9], "pinned_to_gpu": [55e9, 55e9]}
    assert cap_pageable(tables, 25e9) == []
