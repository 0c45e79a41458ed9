"""The live planner across ranks (pure parts): candidates, the decision rule, the probe's windows, the watch."""

from __future__ import annotations

import numpy as np
import pytest

from conduit.config import ConduitConfig
from conduit.errors import RuntimeClosed
from conduit.executor import Lane
from conduit.scheduling.noise import Spread
from conduit.scheduling.planner import DeliveryMode, LivePlanner, candidates, choose, drifted, group_planner

MODES = (DeliveryMode(False, 1), DeliveryMode(True, 1), DeliveryMode(False, 2), DeliveryMode(True, 2))


def config(**kw: object) -> ConduitConfig:
    return ConduitConfig(policy="off_policy", train_batch_size=8, capacity=100, **kw)


def test_candidates_are_powers_of_two_within_the_space_and_the_pins_finest_first() -> None:
    assert candidates(config()) == (*MODES, DeliveryMode(False, 4), DeliveryMode(True, 4))  # g_max 4: 3 left out
    assert candidates(config(max_staleness=2)) == MODES
    assert candidates(config(pinned={"delivery_overlap": False})) == tuple(m for m in candidates(config())
                                                                           if not m.overlap)
    assert candidates(config(pinned={"delivery_granularity": 2})) == (DeliveryMode(False, 2), DeliveryMode(True, 2))


def windows(*per_mode: list[float], ranks: int = 2) -> np.ndarray:
    return np.array([list(per_mode)] * ranks, dtype=np.float64)


def test_a_gain_inside_the_noise_keeps_inline() -> None:
    w = windows([10.0, 11.0, 9.0], [9.6, 10.5, 8.8], [10.0, 10.0, 10.0], [10.2, 10.1, 9.9])
    assert choose(MODES, w, 0.05, DeliveryMode.order)[0] == 0


def test_a_clear_gain_is_kept_and_the_finest_within_the_noise_of_the_fastest_wins() -> None:
    w = windows([10.0, 10.1, 9.9], [6.0, 6.1, 5.9], [5.0, 5.1, 4.9], [5.1, 5.0, 5.2])
    pick, spreads = choose(MODES, w, 0.05, DeliveryMode.order)
    assert MODES[pick] == DeliveryMode(False, 2)  # fastest; overlapped g=2 is within its noise but not finer
    assert spreads[pick].median == pytest.approx(5.0)
    w = windows([10.0, 10.1, 9.9], [5.05, 5.0, 5.1], [5.0, 5.1, 4.9], [4.0, 4.1, 4.2])
    assert MODES[choose(MODES, w, 0.05, DeliveryMode.order)[0]] == DeliveryMode(True, 2)  # 4.1 beats everything else by more


def test_a_finer_mode_that_does_not_beat_inline_never_hides_a_coarser_one_that_does() -> None:
    """Overlapped g=1 is near the fastest but too noisy to beat inline; inline g=2 beats it clearly: g=2."""
    w = windows([10.0, 10.0, 10.0], [9.4, 8.5, 10.3], [8.5, 8.5, 8.5], [9.9, 10.0, 10.1])
    assert MODES[choose(MODES, w, 0.05, DeliveryMode.order)[0]] == DeliveryMode(False, 2)


def test_the_group_decides_on_the_mean_over_ranks_the_same_everywhere() -> None:
    a = np.array([[[10.0] * 3, [5.0] * 3, [9.0] * 3, [9.0] * 3], [[10.0] * 3, [15.0] * 3, [9.0] * 3, [9.0] * 3]])
    pick, spreads = choose(MODES, a, 0.05, DeliveryMode.order)
    assert spreads[1].median == pytest.approx(10.0)  # one rank fast, one slow: no gain for the group
    assert MODES[pick] == DeliveryMode(False, 2)


def test_the_probe_runs_each_candidate_for_whole_windows_then_asks_for_a_decision() -> None:
    planner = group_planner(MODES, windows=2, window=3)
    assert planner.window == 4 and {planner.length(m) for m in MODES} == {4}  # whole exchanges of every g
    assert planner.probe_units == 4 * 3 * 4
    seen, now = [], 0.0
    while True:
        mode = planner.tick(now)
        if planner.deciding:
            break
        seen.append(mode)
        now += {1: 1.0, 2: 0.5}[mode.g] * (0.5 if mode.overlap else 1.0)  # seconds per pull
    assert [seen.count(m) for m in MODES] == [12] * 4 and seen == sorted(seen, key=MODES.index)
    assert planner.times.tolist() == [[1.0, 1.0], [0.5, 0.5], [0.5, 0.5], [0.25, 0.25]]
    assert planner.decide(planner.times[None]) == DeliveryMode(True, 2)
    assert planner.tick(now) == DeliveryMode(True, 2) and not planner.deciding
    assert [r["chosen"] for r in planner.report()] == [False, False, False, True]


def test_a_lane_runs_calls_in_order_and_hands_back_results_and_errors() -> None:
    lane = Lane("test")
    order: list[int] = []
    futures = [lane.submit(order.append, k) for k in range(5)]
    boom = lane.submit(lambda: 1 / 0)
    assert [f.result(5) for f in futures] == [None] * 5 and order == [0, 1, 2, 3, 4]
    assert isinstance(boom.exception(5), ZeroDivisionError)
    assert lane.submit(lambda: lane.current).result(5) and not lane.current
    assert lane.close()  # joined
    with pytest.raises(RuntimeClosed, match="closed"):
        lane.submit(order.append, 5)


def _decided(planner: LivePlanner[DeliveryMode], per_pull: float) -> float:
    """Run ``planner``'s probe at ``per_pull`` seconds for every mode but the last (half that), decide; the clock."""
    now = 0.0
    while True:
        mode = planner.tick(now)
        if planner.deciding:
            planner.decide(planner.times[None])
            return now
        now += per_pull / 2 if mode == planner.keys[-1] else per_pull


def _watch(planner: LivePlanner[DeliveryMode], now: float, per_pull: float) -> tuple[float, int]:
    """Pull the plan at ``per_pull`` until the group is due to check; the clock and the pulls it took."""
    pulls = 0
    while True:
        now += per_pull  # the pull ticked last (the decision's, or the last check's) took per_pull
        pulls += 1
        planner.tick(now)
        if planner.checking:
            return now, pulls


def test_the_plan_is_checked_every_few_windows_and_kept_while_its_time_holds() -> None:
    planner = group_planner(MODES, windows=2, window=4)
    now = _decided(planner, 1.0)
    assert planner.keys[planner.chosen] == MODES[-1]
    for check in range(3):
        now, pulls = _watch(planner, now, 0.5)
        # the first check after one unmeasured window (the decision's pull its first), then every ``windows`` windows
        assert pulls == (3 * 4 if check == 0 else 2 * 4)
        assert planner.watched.tolist() == [0.5, 0.5]
        assert not planner.recheck(planner.watched[None], now)
        assert not planner.checking and planner.chosen is not None
    assert planner.replans == []


def test_a_plan_whose_time_drifts_is_probed_again_from_inline() -> None:
    planner = group_planner(MODES, windows=2, window=4)
    now = _decided(planner, 1.0)
    now, _ = _watch(planner, now, 1.5)  # the learner's compute grew: three times what the probe measured
    group = np.stack([planner.watched, planner.watched])
    assert planner.recheck(group, now)
    assert planner.chosen is None and not planner.checking
    assert len(planner.replans) == 1 and "1500.000 ms per unit" in planner.replans[0]
    assert planner.tick(now) == MODES[0]  # the probe again, inline g = 1 first
    assert np.isnan(planner.times).all() and planner.report() == []  # the old probe's windows are gone


def test_drift_is_a_move_beyond_both_the_threshold_and_the_noise() -> None:
    planned = Spread.of([1.0, 1.0, 1.0])
    assert not drifted(planned, np.array([[1.2, 1.2, 1.2]]), 0.25, 0.05)  # within 25%
    assert drifted(planned, np.array([[1.5, 1.5, 1.5]]), 0.25, 0.05)
    assert drifted(planned, np.array([[0.5, 0.5, 0.5]]), 0.25, 0.05)  # faster counts too: overlap may now pay
    assert not drifted(planned, np.array([[0.4, 1.5, 2.6]]), 0.25, 0.05)  # a move inside its own spread
    assert not drifted(planned, np.array([[1.5, 1.5, 1.5], [0.5, 0.5, 0.5]]), 0.25, 0.05)  # the group's mean held


def test_a_planner_refuses_windows_it_cannot_measure() -> None:
    with pytest.raises(ValueError, match="windows >= 1"):
        group_planner(MODES, windows=0)
    with pytest.raises(ValueError, match="drift > 0"):
        group_planner(MODES, drift=0.0)
    with pytest.raises(ValueError, match="no candidate"):
        LivePlanner([])
