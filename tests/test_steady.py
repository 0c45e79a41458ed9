"""A schedule's time per iteration: whole periods of its bursts, robust to one hiccup."""

from __future__ import annotations

import statistics
import time
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conduit.core import Mode, Policy, Schedule
from conduit.scheduling.steady import period, steady_time
from conduit.scheduling.workload import CostKind, SyntheticWorkload, run_loop


def _s(g_ing: int | Fraction, g_del: int | Fraction, overlap: bool = False) -> Schedule:
    return Schedule(Mode(overlap, Fraction(g_ing)), Mode(overlap, Fraction(g_del)))


@pytest.mark.parametrize(
    ("g_ing", "g_del", "expected"), [(1, 1, 1), (3, 1, 3), (1, 3, 3), (2, 3, 6), (2, 4, 4), (3, 3, 3)]
)
def test_off_policy_period_is_the_lcm_of_the_granularities(g_ing: int, g_del: int, expected: int) -> None:
    assert period(_s(g_ing, g_del), Policy.OFF_POLICY) == expected
    assert period(_s(g_ing, g_del, overlap=True), Policy.OFF_POLICY) == expected


def test_on_policy_iterations_are_all_alike() -> None:
    assert period(Schedule(Mode(True, Fraction(1, 4)), Mode(True, Fraction(1, 4))), Policy.ON_POLICY) == 1
    assert period(_s(1, 1), Policy.ON_POLICY) == 1


def test_a_burst_every_third_iteration_counts_once_per_period() -> None:
    # measured shape of inline ingestion at g = 3 (ms): the median iteration drops the burst entirely
    times = [14.5, 19.6, 14.3] * 4
    assert statistics.median(times) == pytest.approx(14.5)
    assert steady_time(times, 3) == pytest.approx(statistics.fmean(times))


def test_one_hiccup_moves_one_window_not_the_estimate() -> None:
    times = [10.0, 10.0, 16.0] * 5
    times[4] = 500.0  # a neighbour's job stalls one iteration
    assert steady_time(times, 3) == pytest.approx(12.0)


def test_partial_windows_are_left_out_and_short_runs_fall_back_to_the_mean() -> None:
    assert steady_time([10.0, 10.0, 16.0, 10.0, 10.0, 16.0, 10.0], 3) == pytest.approx(12.0)
    assert steady_time([10.0, 16.0], 3) == pytest.approx(13.0)
    assert steady_time([3.0, 1.0, 2.0], 1) == 2.0
    with pytest.raises(ValueError, match="no iteration times"):
        steady_time([], 2)


@given(
    pattern=st.lists(st.floats(0.001, 1.0), min_size=1, max_size=6),
    repeats=st.integers(1, 5),
    phase=st.integers(0, 5),
)
def test_any_phase_of_a_periodic_series_gives_the_pattern_mean(pattern: list[float], repeats: int, phase: int) -> None:
    p = len(pattern)
    series = (pattern * (repeats + 1))[phase % p :][: p * repeats]
    assert steady_time(series, p) == pytest.approx(statistics.fmean(pattern))


def test_run_loop_times_whole_periods_of_its_schedule() -> None:
    w = SyntheticWorkload(
        policy=Policy.OFF_POLICY, dim=16, unit_size=16, batch_size=32, capacity=512,
        rollout_ms=0.2, update_ms=0.2, cost=CostKind.SLEEP,
    )
    res = run_loop(w, _s(2, 3), iterations=7, warmup=1, pool=w.units(2))
    assert res.period == 6 and len(res.t_iter) == 12  # rounded up to two whole periods
    assert res.steady == pytest.approx(statistics.median([statistics.fmean(res.t_iter[:6]), statistics.fmean(res.t_iter[6:])]))


@pytest.mark.parametrize("policy", [Policy.OFF_POLICY, Policy.ON_POLICY])
def test_run_loop_leaves_the_benchmarks_own_stamping_out_of_each_iteration(
    policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # making units unique is neither rollout nor experience path: charged to neither T_iter nor exposed latency
    import conduit.scheduling.workload as synthetic

    stamp = synthetic._stamped

    def slow_stamp(pool: list, k: int) -> dict:
        time.sleep(0.05)
        return stamp(pool, k)

    monkeypatch.setattr(synthetic, "_stamped", slow_stamp)
    w = SyntheticWorkload(
        policy=policy, dim=16, unit_size=16, batch_size=32, capacity=512, units_per_iteration=2,
        num_minibatches=2, rollout_ms=0.0, update_ms=0.0, cost=CostKind.SLEEP,
    )
    res = run_loop(w, _s(1, 1), iterations=4, warmup=1, pool=w.units(2))
    units = 1 if policy is Policy.OFF_POLICY else 2
    assert res.stamping_s >= 4 * units * 0.05
    assert statistics.median(res.t_iter) < 0.05  # 50 ms of sleep per unit, none of it in an iteration
