"""The automatic planner on a live loop: it observes, profiles, probes, plans, and re-plans."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from conduit import Conduit, ExperienceSpec, FieldSpec
from conduit.core import INLINE, Mode, Schedule, feasible_schedules, is_feasible_mode
from conduit.scheduling.auto import AutoPlanner, Phase
from conduit.scheduling.fit import settle, shortlist
from conduit.scheduling.model import rank
from conduit.scheduling.noise import Spread, beats
from conduit.scheduling.planner import spreads_of
from conduit.scheduling.workload import Burner, CostKind
from tests.helpers import transitions


def _loop(edp, iterations, start=0, dim=4, rollout_ms=0.5, update_ms=1.0):
    burner = Burner(CostKind.SLEEP)
    pushed = start
    for _ in range(iterations):
        with edp.phase("rollout"):
            burner.burn(rollout_ms)
        edp.push(transitions(16, dim=dim, start=pushed))
        pushed += 16
        b = edp.pull()
        assert torch.equal(b["tid"], torch.from_numpy(b.info.ids))
        with edp.phase("update"):
            burner.burn(update_ms)
    return pushed


def _until_planned(edp, planner, limit):
    """Iterations until the planner runs its plan: probes last whole periods of their schedules, so it varies."""
    pushed = 0
    for _ in range(limit):
        pushed = _loop(edp, 1, start=pushed)
        if planner.phase is Phase.RUN:
            return pushed
    raise AssertionError(f"no plan after {limit} iterations (phase {planner.phase})")


def test_planner_profiles_probes_and_settles_on_a_feasible_minimum():
    edp = Conduit(policy="off_policy", train_batch_size=8, capacity=4096, min_size_to_sample=8, g_max=3, seed=0)
    planner = AutoPlanner(edp, observe=4, probe=4, window=1000)
    with edp:
        # the clock's first pull, observe 4, six probes of 4-5, then up to six verified schedules of up to 2 + 6
        # iterations (g = 2 and 3: period 6); bounded, with room
        pushed = _until_planned(edp, planner, 2 * (1 + 4 + 6 * 5 + 6 * 8))
        event = planner.history[-1]
        assert event.reason == "planned" and edp.schedule == event.schedule
        costs = planner.costs
        assert costs.t_rollout > 0 and costs.t_update > 0
        assert set(costs.t_ing) == set(edp.config.ingestion_space) and set(costs.t_del) == set(edp.config.delivery_space)
        schedules = feasible_schedules(edp.config.policy, 1, 3, 3)
        ranked = rank(costs, schedules)  # ties broken as the planner breaks them
        assert set(planner.verified) == set(shortlist(ranked, 3))  # the model's shortlist, each measured live
        families = {(s.ingestion.overlap, s.delivery.overlap) for s in planner.verified}
        assert len(families) == 4  # off-policy: every overlap family has a verified representative
        # the finest within 3% of the fastest, then inline; kept over inline (the all-inline probe) only when it
        # beats it by more than the two measurements' spread
        assert INLINE in planner.judged and set(planner.verified) <= set(planner.spreads)
        assert event.prediction == settle(ranked, planner.judged, spreads=planner.spreads)
        plan = event.prediction.schedule
        assert plan == INLINE or beats(planner.spreads[plan], planner.spreads[INLINE], 0.03)
        edp.flush()
        assert sorted(edp.buffer.contents()["tid"].tolist()) == list(range(pushed))


def test_planner_replans_when_the_buffer_migrates():
    spec = ExperienceSpec.of(
        obs=FieldSpec("obs", (4,), torch.float32, growable=True), action=((), "int64"), reward=((), "float32"),
        done=((), "bool"), tid=((), "int64"),
    )
    edp = Conduit(policy="off_policy", train_batch_size=8, capacity=4096, min_size_to_sample=8, g_max=2, seed=0, spec=spec)
    planner = AutoPlanner(edp, observe=3, probe=3, window=1000)
    with edp:
        pushed = _until_planned(edp, planner, 2 * (1 + 3 + 6 * 4 + 6 * 4))
        _loop(edp, 3, start=pushed, dim=6)  # obs grows: the buffer re-lays out (migrates)
        assert any("migration" in e.reason for e in planner.history)
        assert planner.phase in (Phase.OBSERVE, Phase.PROBE, Phase.RUN)


def test_on_policy_planner_only_ever_runs_feasible_modes():
    edp = Conduit(policy="on_policy", train_batch_size=32, num_minibatches=4, seed=0)
    planner = AutoPlanner(edp, observe=3, probe=3, window=1000)
    burner = Burner(CostKind.SLEEP)
    seen = set()
    with edp:
        for it in range(30):
            with edp.phase("rollout"):
                burner.burn(0.5)
            edp.push(transitions(32, start=32 * it))
            seen.add(edp.schedule)
            rows = []
            for mb in edp.minibatches():
                rows += mb["tid"].tolist()
                with edp.phase("update"):
                    burner.burn(0.2)
            assert sorted(rows) == list(range(32 * it, 32 * it + 32))
        assert planner.phase is Phase.RUN
    space_i, space_d = edp.config.ingestion_space, edp.config.delivery_space
    for s in seen:
        assert is_feasible_mode(edp.config.policy, s.ingestion, space_i)
        assert is_feasible_mode(edp.config.policy, s.delivery, space_d)


def test_a_probe_lasts_whole_periods_of_the_probed_schedule():
    edp = Conduit(policy="off_policy", train_batch_size=8, capacity=4096, min_size_to_sample=8, g_max=3, seed=0)
    planner = AutoPlanner(edp, observe=4, probe=4, window=1000)
    bursty = Schedule(Mode(False, Fraction(2)), Mode(False, Fraction(3)))  # bursts repeat every 6 iterations
    live = planner.prober([bursty, INLINE])
    assert live.length(bursty) == 6 and live.length(INLINE) == 1
    assert live.skip(bursty) + live.windows_of(bursty) * live.length(bursty) == 8  # 2 skipped + one period of 6
    # two skipped iterations, then a burst every third; then inline for 2 skipped + 2 measured (probe=4)
    times = [0.5, 0.5, 0.010, 0.010, 0.016, 0.010, 0.010, 0.016, 0.5, 0.5, 0.002, 0.004]
    now, ran = 0.0, []
    for t in times:
        ran.append(live.tick(now))
        now += t
    assert ran == [bursty] * 8 + [INLINE] * 4
    live.tick(now)
    assert live.deciding
    bursty_s, inline_s = spreads_of(live.times[None])
    assert bursty_s.median == pytest.approx(0.012)  # the mean over the period, not the median 0.010
    assert (inline_s.median, inline_s.low, inline_s.high, inline_s.runs) == pytest.approx((0.003, 0.002, 0.004, 2))
    edp.close()


def test_on_drift_the_planner_falls_back_to_inline_until_a_new_plan_beats_it():
    """The measured iteration time leaves the prediction: the gain planned for may be gone, so the runtime runs
    inline while the planner observes again, and the next plan must beat inline again."""
    edp = Conduit(policy="off_policy", train_batch_size=8, capacity=4096, min_size_to_sample=8, g_max=2, seed=0)
    planner = AutoPlanner(edp, observe=3, probe=3, window=4, drift=0.25)
    with edp:
        pushed = _until_planned(edp, planner, 2 * (1 + 3 + 6 * 4 + 6 * 4))
        overlapped = Schedule(Mode(True, 1), Mode(True, 1))
        edp.reschedule(overlapped)  # as if the plan had been an overlapped one
        planner.live.planned = Spread.of([planner.live.planned.median * 1e-3])  # as if it had measured that fast
        for _ in range(12):  # a window of 4, then the drift is seen at once
            pushed = _loop(edp, 1, start=pushed)
            if planner.phase is Phase.OBSERVE:
                break
        assert planner.history[-1].reason.startswith("measured T_iter"), planner.history[-1]
        assert planner.history[-1].schedule == overlapped  # what ran when the drift was seen
        assert edp.schedule == INLINE  # and what runs while the planner observes again
