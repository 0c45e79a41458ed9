"""Rates by row size and the runtime's fixed cost per call: the tables, the topology's reads, the model's sums."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conduit.errors import PlacementError
from conduit.placement import Node, PlacementRequest, Topology, evaluate_candidates
from conduit.placement.rates import effective_rate, rate_at

GB = 1e9
TABLE = ((64, 5 * GB), (4096, 40 * GB), (131072, 20 * GB))


def cpu_node(**extra: object) -> Node:
    return Node(host_memory_bytes=16 << 30, host_memcpy=20 * GB, host_gather=15 * GB, **extra)


def test_rate_at_interpolates_in_log_space_and_holds_the_ends() -> None:
    assert rate_at(TABLE, 64) == rate_at(TABLE, 1) == 5 * GB
    assert rate_at(TABLE, 131072) == rate_at(TABLE, 1 << 30) == 20 * GB
    assert rate_at(TABLE, 4096) == 40 * GB  # a measured row size reads its rate exactly
    assert rate_at(TABLE, 512) == pytest.approx(math.sqrt(5 * 40) * GB)  # halfway in log(row) between 64 and 4 KiB


@given(st.integers(1, 1 << 22))
def test_rate_at_stays_between_its_neighbours(row: int) -> None:
    rate = rate_at(TABLE, row)
    rows = [r for r, _ in TABLE]
    i = min(max(sum(r <= row for r in rows), 1), len(rows) - 1)
    (_, v0), (_, v1) = TABLE[i - 1], TABLE[i]
    assert min(v0, v1) <= rate <= max(v0, v1)  # exactly: a ulp beyond the bracket is a bug


@pytest.mark.parametrize("row", [r for r, _ in TABLE])
def test_rate_at_reads_a_measured_row_exactly(row: int) -> None:
    assert rate_at(TABLE, row) == dict(TABLE)[row]


def test_effective_rate_adds_the_columns_times() -> None:
    rows = [4096, 4096, 64]
    seconds = 4096 / (40 * GB) * 2 + 64 / (5 * GB)
    assert effective_rate(TABLE, rows) == pytest.approx(sum(rows) / seconds)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ((), "at least one"),
        (((4096, 1e9), (64, 2e9)), "strictly ascending"),
        (((64, 1e9), (64, 2e9)), "strictly ascending"),
        (((64, 0.0),), "rates > 0"),
    ],
)
def test_a_bad_rate_table_is_refused_naming_the_field(table: tuple, message: str) -> None:
    with pytest.raises(PlacementError, match=f"host_gather_by_row.*{message}"):
        cpu_node(host_gather_by_row=table)


def test_call_seconds_count_the_columns_beyond_the_first() -> None:
    node = cpu_node(push_call_s=10e-6, push_column_s=2e-6, pull_call_s=15e-6, pull_column_s=3e-6)
    assert node.call_seconds(1) == pytest.approx((10e-6, 15e-6))
    assert node.call_seconds(6) == pytest.approx((20e-6, 30e-6))
    assert cpu_node().call_seconds(6) == (0.0, 0.0)  # topologies from files: no fixed cost, as before
    with pytest.raises(PlacementError, match="push_call_s"):
        cpu_node(push_call_s=-1e-6)


def test_host_legs_read_the_tables_at_the_samples_rows_and_fall_back_without_them() -> None:
    topo = Topology(name="t", nodes=(cpu_node(host_write_by_row=TABLE, host_gather_by_row=TABLE),))
    rows = [4096, 4096, 64]
    assert topo.ingest_bandwidth("cpu", "cpu", rows) == pytest.approx(effective_rate(TABLE, rows))
    assert topo.deliver_bandwidth("cpu", "cpu", rows) == pytest.approx(effective_rate(TABLE, rows))
    assert topo.ingest_bandwidth("cpu", "cpu") == 20 * GB  # no rows: host_memcpy
    assert topo.deliver_bandwidth("cpu", "cpu") == 15 * GB  # no rows: host_gather
    plain = Topology(name="t", nodes=(cpu_node(),))
    assert plain.ingest_bandwidth("cpu", "cpu", rows) == 20 * GB
    assert plain.deliver_bandwidth("cpu", "cpu", rows) == 15 * GB


def test_an_iteration_is_the_legs_per_sample_plus_the_fixed_cost_per_call() -> None:
    node = cpu_node(host_write_by_row=TABLE, host_gather_by_row=TABLE, push_call_s=10e-6, push_column_s=2e-6,
                    pull_call_s=15e-6, pull_column_s=3e-6)
    topo = Topology(name="t", nodes=(node,))
    request = PlacementRequest(actors="cpu", learners="cpu", capacity=1000)
    rows = [4096, 4096, 64]
    (e,) = evaluate_candidates(topo, request, sum(rows), row_bytes=rows)
    rate = effective_rate(TABLE, rows)
    assert e.ingest_seconds == pytest.approx(sum(rows) / rate)
    assert e.deliver_seconds == pytest.approx(sum(rows) / rate)
    assert (e.push_call_seconds, e.pull_call_seconds) == pytest.approx((14e-6, 21e-6))
    assert e.iteration_seconds(256, 512) == pytest.approx((256 + 512) * sum(rows) / rate + 35e-6)
    (one,) = evaluate_candidates(topo, request, sum(rows))  # no columns given: the rates that need none
    assert one.ingest_seconds == pytest.approx(sum(rows) / 20e9)  # host_memcpy
    assert one.deliver_seconds == pytest.approx(sum(rows) / 15e9)  # host_gather
    assert (one.push_call_seconds, one.pull_call_seconds) == pytest.approx((10e-6, 15e-6))


@pytest.mark.parametrize("rows", [[100, 100], [0, 8256], [8256.0], []])
def test_row_bytes_must_be_the_samples_columns(rows: list) -> None:
    topo = Topology(name="t", nodes=(cpu_node(),))
    request = PlacementRequest(actors="cpu", learners="cpu", capacity=1000)
    with pytest.raises(PlacementError, match=r"row_bytes: expected the sample's column sizes.*8256"):
        evaluate_candidates(topo, request, 8256, row_bytes=rows)
