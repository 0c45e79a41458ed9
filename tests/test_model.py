"""The cost model and optimizer (Eq. 2) as pure functions: property tests against brute force."""

from __future__ import annotations

import itertools
from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conduit.core import INLINE, Mode, Policy, Schedule, feasible_schedules, is_feasible_mode
from conduit.scheduling.fit import fit_sync, probe_schedules, settle, shortlist
from conduit.scheduling.model import Costs, coarseness, gamma, optimize, predict, rank

ms = st.floats(min_value=0.0, max_value=50e-3, allow_nan=False)


@st.composite
def workloads(draw: st.DrawFn, policy: Policy | None = None) -> tuple[Costs, int, int]:
    """Random costs over a random feasible space: (costs, g_ing_max, g_del_max)."""
    policy = policy or draw(st.sampled_from(Policy))
    m = draw(st.integers(1, 8)) if policy is Policy.ON_POLICY else 1
    gi_max, gd_max = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    ing = {Fraction(g) for g in range(1, gi_max + 1)} | {Fraction(k, m) for k in range(1, m + 1)}
    dlv = {Fraction(g) for g in range(1, gd_max + 1)} | {Fraction(1, m)}
    costs = Costs(
        policy=policy,
        t_rollout=draw(ms),
        t_update=draw(ms),
        t_ing={g: draw(ms) for g in sorted(ing)},
        t_del={g: draw(ms) for g in sorted(dlv)},
        t_sync_ing=draw(st.floats(-1e-3, 5e-3)),
        t_sync_del=draw(st.floats(-1e-3, 5e-3)),
        t_other=draw(ms),
        units_per_iteration=draw(st.integers(1, 8)),
        num_minibatches=m,
        num_epochs=draw(st.integers(1, 4)),
    )
    return costs, gi_max, gd_max


def brute_force(costs: Costs, g_ing_max: int, g_del_max: int) -> float:
    """The minimum of the model over every (timing, granularity) pair, filtered by feasibility only."""
    m = costs.num_minibatches
    space_i = tuple(sorted(g for g in costs.t_ing if g <= g_ing_max))
    space_d = tuple(sorted(g for g in costs.t_del if g <= g_del_max))
    if costs.policy is Policy.ON_POLICY:
        space_i = tuple(sorted({Fraction(k, m) for k in range(1, m + 1)}))
        space_d = tuple(sorted({Fraction(1, m), Fraction(1)}))
    best = float("inf")
    for oi, gi, od, gd in itertools.product((False, True), space_i, (False, True), space_d):
        ing, dlv = Mode(oi, gi), Mode(od, gd)
        if is_feasible_mode(costs.policy, ing, space_i) and is_feasible_mode(costs.policy, dlv, space_d):
            best = min(best, predict(costs, Schedule(ing, dlv)).t_iter)
    return best


@settings(max_examples=300, deadline=None)
@given(workloads())
def test_optimize_returns_the_true_minimum_of_the_model(w: tuple[Costs, int, int]) -> None:
    costs, gi, gd = w
    space = feasible_schedules(costs.policy, costs.num_minibatches, gi, gd)
    chosen = optimize(costs, space)
    assert chosen.t_iter == pytest.approx(brute_force(costs, gi, gd), abs=1e-15)
    assert chosen.schedule in space
    assert [p.t_iter for p in rank(costs, space)] == sorted(p.t_iter for p in rank(costs, space))


@settings(max_examples=200, deadline=None)
@given(workloads(Policy.ON_POLICY))
def test_on_policy_never_chooses_a_mode_outside_fig_10(w: tuple[Costs, int, int]) -> None:
    costs, gi, gd = w
    chosen = optimize(costs, feasible_schedules(Policy.ON_POLICY, costs.num_minibatches, gi, gd)).schedule
    for mode in (chosen.ingestion, chosen.delivery):
        assert (not mode.overlap and mode.granularity == 1) or (mode.overlap and mode.granularity < 1)


@settings(max_examples=200, deadline=None)
@given(workloads(Policy.OFF_POLICY))
def test_caps_are_respected(w: tuple[Costs, int, int]) -> None:
    costs, gi, gd = w
    chosen = optimize(costs, feasible_schedules(Policy.OFF_POLICY, 1, gi, gd)).schedule
    assert 1 <= chosen.ingestion.granularity <= gi and chosen.ingestion.granularity.denominator == 1
    assert 1 <= chosen.delivery.granularity <= gd and chosen.delivery.granularity.denominator == 1


def test_gamma_hides_everything_at_whole_units_and_less_when_pipelined() -> None:
    assert gamma(Fraction(1)) == gamma(Fraction(3)) == 1.0
    assert gamma(Fraction(1, 4)) == 0.75


def test_overlap_hides_at_most_the_smaller_of_work_and_neighbour() -> None:
    costs = Costs(Policy.OFF_POLICY, 2e-3, 8e-3, {Fraction(1): 1e-3}, {Fraction(1): 12e-3})
    one = Fraction(1)
    inline = predict(costs, Schedule(Mode(False, one), Mode(False, one)))
    both = predict(costs, Schedule(Mode(True, one), Mode(True, one)))
    assert inline.exposed == pytest.approx(13e-3)
    assert both.exposed == pytest.approx(13e-3 - 1e-3 - 8e-3)  # ingestion fully hidden; delivery hides 8 of 12


def test_sync_is_paid_per_invocation() -> None:
    t = {Fraction(g): g * 1e-3 for g in (1, 2, 4)}
    costs = Costs(Policy.OFF_POLICY, 5e-3, 5e-3, t, t, t_sync_ing=0.0, t_sync_del=2e-3)
    g1 = predict(costs, Schedule(Mode(False, 1), Mode(True, 1)))
    g4 = predict(costs, Schedule(Mode(False, 1), Mode(True, 4)))
    assert g1.exposed - g4.exposed == pytest.approx(2e-3 * (1 - 1 / 4))


sync = st.floats(0, 5e-3)


def _physical(costs: Costs) -> bool:
    """Whether every overlap cost of ``costs`` lies within its cap (the fit never returns one beyond it)."""
    line_ing = {g: costs.t_sync0_ing + costs.t_sync_ing * costs.ingestion_invocations(g) for g in costs.t_ing}
    line_del = {g: costs.t_sync0_del + costs.t_sync_del * costs.delivery_invocations(g) for g in costs.t_del}
    return all(
        {**line_ing, **costs.s_ing}[g] <= costs.overlap_cap("ingestion", g) for g in costs.t_ing
    ) and all({**line_del, **costs.s_del}[g] <= costs.overlap_cap("delivery", g) for g in costs.t_del) and all(
        costs.s_both <= min(costs.overlap_cap("ingestion", gi), costs.overlap_cap("delivery", gd))
        for gi in costs.t_ing for gd in costs.t_del
    )


@settings(max_examples=300, deadline=None)
@given(workloads(), st.floats(0, 5e-3), sync, sync, sync, sync)
def test_fit_sync_recovers_the_costs_that_produced_the_measurements(w, t_other, s_ing, s_del, s0_ing, s0_del) -> None:
    costs, gi, gd = w
    g_max = min(gi, gd)
    truth = Costs(
        **{
            **costs.__dict__, "t_other": t_other, "t_sync_ing": s_ing, "t_sync_del": s_del,
            "t_sync0_ing": s0_ing, "t_sync0_del": s0_del,
        }
    )
    probes = probe_schedules(costs.policy, costs.num_minibatches, g_max)
    assume(_physical(truth))  # an overlap costs at most the work it overlaps (Costs.overlap_cap)
    measured = {name: predict(truth, s).t_iter for name, s in probes.items()}
    fitted = fit_sync(truth, measured, probes)  # refitting fitted costs must not double-count anything
    assert fitted.t_other == pytest.approx(t_other, abs=1e-12)
    for name, s in probes.items():
        assert predict(fitted, s).t_iter == pytest.approx(measured[name], abs=1e-12)
    if "delivery_coarse" in probes:  # two points per path: both parts are identified
        assert (fitted.t_sync_del, fitted.t_sync0_del) == pytest.approx((s_del, s0_del), abs=1e-9)
    if "ingestion_coarse" in probes:
        assert (fitted.t_sync_ing, fitted.t_sync0_ing) == pytest.approx((s_ing, s0_ing), abs=1e-9)
    if costs.policy is Policy.OFF_POLICY and g_max > 1:  # and so every overlapped schedule is predicted exactly
        for s in feasible_schedules(Policy.OFF_POLICY, 1, g_max, g_max):
            assert predict(fitted, s).t_iter == pytest.approx(predict(truth, s).t_iter, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.floats(-10e-3, 10e-3), st.floats(-10e-3, 10e-3), st.sampled_from([2, 3, 4]))
def test_fit_sync_never_returns_a_negative_part_from_two_noisy_probes(e_fine, e_coarse, g_max):
    t = {Fraction(g): 1e-3 * g for g in range(1, g_max + 1)}
    costs = Costs(Policy.OFF_POLICY, 2e-3, 8e-3, t, t)
    probes = probe_schedules(Policy.OFF_POLICY, 1, g_max)
    bare = {name: predict(costs, s).t_iter for name, s in probes.items()}
    measured = {**bare, "delivery": bare["delivery"] + e_fine, "delivery_coarse": bare["delivery_coarse"] + e_coarse}
    fitted = fit_sync(costs, measured, probes)
    assert fitted.t_sync_del >= 0  # never a per-invocation gain
    assert fitted.t_sync0_del >= 0  # nor a per-iteration one: a negative cost is a probe's noise
    assert all(0 <= fitted.sync_del(Fraction(g)) <= costs.overlap_cap("delivery", Fraction(g)) for g in t)


@settings(max_examples=200, deadline=None)
@given(workloads(), st.floats(0, 5e-3), st.data())
def test_probing_every_granularity_predicts_every_schedule_of_a_nonlinear_overlap_cost(w, t_other, data) -> None:
    """Overlap costs arbitrary per granularity (not a line in n(g)): with a probe at every overlapped
    granularity, the fit reproduces the truth at every feasible schedule."""
    costs, gi, gd = w
    g_max = min(gi, gd)
    s_ing = {g: data.draw(sync) for g in costs.t_ing}
    s_del = {g: data.draw(sync) for g in costs.t_del}
    s_both = data.draw(st.floats(0, 5e-3))  # two overlapped paths may cost more than the sum (never less: see below)
    truth = Costs(**{**costs.__dict__, "t_other": t_other, "s_ing": s_ing, "s_del": s_del, "s_both": s_both})
    assume(_physical(truth))
    probes = probe_schedules(costs.policy, costs.num_minibatches, g_max, every=True)
    feasible = feasible_schedules(costs.policy, costs.num_minibatches, g_max, g_max)
    if "both" in probes:  # a run at the bound (exposed 0) cannot tell how far below it S_both would go
        unbounded = predict(replace(truth, s_both=0.0), probes["both"]).t_iter + s_both
        assume(unbounded > costs.t_rollout + costs.t_update + t_other)
    assert set(probes.values()) <= set(feasible)
    one = Mode(False, Fraction(1))
    for s in feasible:  # every overlapped mode of one path (the other inline g=1) is probed
        if s.ingestion.overlap != s.delivery.overlap and one in (s.ingestion, s.delivery):
            assert s in probes.values()
    measured = {name: predict(truth, s).t_iter for name, s in probes.items()}
    fitted = fit_sync(costs, measured, probes)
    for s in feasible:
        assert predict(fitted, s).t_iter == pytest.approx(predict(truth, s).t_iter, abs=1e-9)


def test_the_cost_of_overlapping_both_paths_is_paid_only_by_schedules_that_overlap_both() -> None:
    t = {Fraction(g): 1e-3 for g in (1, 2)}
    plain = Costs(Policy.OFF_POLICY, 2e-3, 8e-3, t, t)
    costs = Costs(Policy.OFF_POLICY, 2e-3, 8e-3, t, t, s_both=3e-3)
    for i in (Mode(False, 1), Mode(True, 1), Mode(True, 2)):
        for d in (Mode(False, 1), Mode(True, 1), Mode(True, 2)):
            s = Schedule(i, d)
            extra = 3e-3 if i.overlap and d.overlap else 0.0
            assert predict(costs, s).t_iter == pytest.approx(predict(plain, s).t_iter + extra)
    probes = probe_schedules(Policy.OFF_POLICY, 1, 2)
    assert probes["both"] == Schedule(Mode(True, 1), Mode(True, 1))
    measured = {name: predict(costs, s).t_iter for name, s in probes.items()}
    assert fit_sync(plain, measured, probes).s_both == pytest.approx(3e-3)


def test_a_probed_granularity_overrides_the_line() -> None:
    t = {Fraction(g): 1e-3 for g in (1, 2, 3)}
    costs = Costs(Policy.OFF_POLICY, 2e-3, 8e-3, t, t, t_sync_del=3e-3, s_del={Fraction(2): 7e-3})
    assert costs.sync_del(Fraction(2)) == 7e-3  # measured there
    assert costs.sync_del(Fraction(3)) == pytest.approx(1e-3)  # the line elsewhere


def test_coarseness_counts_what_a_schedule_groups_per_path() -> None:
    def s(oi: bool, gi: Fraction | int, od: bool, gd: Fraction | int) -> Schedule:
        return Schedule(Mode(oi, gi), Mode(od, gd))

    assert coarseness(s(False, 1, False, 1)) == 0
    assert coarseness(s(True, 1, True, 1)) == 0  # overlap groups nothing
    assert coarseness(s(False, 3, True, 2)) == 2 + 1  # two units wait for the third; one batch drawn ahead
    assert coarseness(s(True, Fraction(1, 4), True, Fraction(1, 4))) == 0  # on-policy never mixes iterations
    assert coarseness(s(False, 1, True, Fraction(1, 4))) == 0


def test_settle_takes_the_finest_tie_then_inline_then_the_models_pick() -> None:
    t = {Fraction(g): 1e-3 for g in (1, 2)}
    costs = Costs(Policy.OFF_POLICY, 2e-3, 8e-3, t, t)
    ranked = rank(costs, feasible_schedules(Policy.OFF_POLICY, 1, 2, 2))
    fine = Schedule(Mode(True, 1), Mode(True, 1))
    coarse = Schedule(Mode(True, 2), Mode(True, 2))
    assert settle(ranked, {}) == ranked[0]  # nothing measured: the model decides
    assert settle(ranked, {coarse: 10.0, fine: 10.2}).schedule == fine  # 2% apart: noise; the finer plan
    assert settle(ranked, {coarse: 10.0, fine: 11.0}).schedule == coarse  # 10% apart: measurement wins
    assert settle(ranked, {coarse: 10.0, fine: 10.2}, margin=0.0).schedule == coarse
    # equally fine ties that overlap: the model's pick, whichever way it ranks them
    half = Schedule(Mode(False, 1), Mode(True, 1))
    for order in (ranked, list(reversed(ranked))):
        first = next(p.schedule for p in order if p.schedule in (fine, half))
        assert settle(order, {fine: 10.0, half: 10.2}).schedule == first
    # a tie never takes a schedule measured outside the margin, however fine
    assert settle(ranked, {coarse: 10.0, fine: 10.5, INLINE: 10.4}).schedule == coarse
    # bracketed times can reach zero or below (tiny costs, a noisy host): the fastest still ties itself
    assert settle(ranked, {coarse: -0.2, fine: 0.3}).schedule == coarse
    assert settle(ranked, {coarse: -10.0, fine: -10.2}).schedule == fine  # 2% apart below zero: still noise
    assert settle(ranked, {coarse: 0.0, fine: 0.0}).schedule == fine


def test_settle_keeps_the_inline_baseline_unless_a_plan_beats_it_by_more_than_the_margin() -> None:
    t = {Fraction(g): 1e-3 for g in (1, 2)}
    ranked = rank(Costs(Policy.OFF_POLICY, 2e-3, 8e-3, t, t), feasible_schedules(Policy.OFF_POLICY, 1, 2, 2))
    own = ranked[0].schedule
    assert own != INLINE  # the model prefers something else here
    assert settle(ranked, {own: 10.0, INLINE: 10.2}).schedule == INLINE  # 2%: buys nothing measurable
    assert settle(ranked, {own: 10.0, INLINE: 11.0}).schedule == own  # 10%: the plan


def test_settle_and_the_group_planner_decide_by_one_rule() -> None:
    """A finer schedule that does not beat inline never hides a coarser one that does (the sharded group's planner
    decides the same way); the runs' own spread widens a tie, so a finer schedule whose runs reach the fastest's
    is the plan."""
    from conduit.scheduling.noise import Spread

    t = {Fraction(g): 1e-3 for g in (1, 2)}
    ranked = rank(Costs(Policy.OFF_POLICY, 2e-3, 8e-3, t, t), feasible_schedules(Policy.OFF_POLICY, 1, 2, 2))
    fine = Schedule(Mode(False, 1), Mode(True, 1))
    coarse = Schedule(Mode(False, 1), Mode(True, 2))
    # fine is within 5% of coarse, but only coarse beats inline by more than 5%: coarse
    assert settle(ranked, {INLINE: 1.00, fine: 0.96, coarse: 0.93}, margin=0.05).schedule == coarse
    # fine's runs reach coarse's time: a tie, and the finer plan, which beats inline too
    runs = {fine: Spread(0.88, 0.78, 0.98), INLINE: Spread(1.0, 1.0, 1.0), coarse: Spread(0.80, 0.80, 0.80)}
    measured = {s: v.median for s, v in runs.items()}
    assert settle(ranked, measured, margin=0.03, spreads=runs).schedule == fine
    assert settle(ranked, measured, margin=0.03).schedule == coarse  # without the runs: 10% apart, coarse


def test_the_shortlist_holds_each_overlap_familys_best_and_finest() -> None:
    t = {Fraction(g): 1e-3 for g in (1, 2, 3)}
    # overlap costs that fall with g: the model ranks coarse overlapped schedules first
    costs = Costs(Policy.OFF_POLICY, 2e-3, 8e-3, t, t, s_ing={Fraction(1): 3e-3}, s_del={Fraction(1): 3e-3})
    ranked = rank(costs, feasible_schedules(Policy.OFF_POLICY, 1, 3, 3))
    top = shortlist(ranked, 3)
    assert top[:3] == [p.schedule for p in ranked[:3]]
    assert len(top) == len(set(top))
    for oi in (False, True):
        for od in (False, True):
            family = [p.schedule for p in ranked if (p.schedule.ingestion.overlap, p.schedule.delivery.overlap) == (oi, od)]
            assert family[0] in top  # the model's best of the family
            assert Schedule(Mode(oi, 1), Mode(od, 1)) in top  # and its finest, g = 1 on both paths
    assert Schedule(Mode(True, 1), Mode(True, 1)) not in [p.schedule for p in ranked[:3]]  # the case that matters
    assert INLINE in top  # the inline family's finest is inline g=1 itself
    assert shortlist(ranked, 3, families=False) == [p.schedule for p in ranked[:3]]
    assert shortlist(ranked, 0) == []


def _spreads(times: dict) -> dict:
    from conduit.scheduling.noise import Spread

    return {s: Spread(t, t, t) for s, t in times.items()}


def _medians(spreads: dict) -> dict:
    return {s: v.median for s, v in spreads.items()}


def test_a_schedule_that_would_overrule_the_model_meets_its_minimum_again_in_fresh_rounds(monkeypatch) -> None:
    from conduit.scheduling import profiler

    t = {Fraction(g): 1e-3 for g in (1, 2)}
    ranked = rank(Costs(Policy.OFF_POLICY, 2e-3, 8e-3, t, t), feasible_schedules(Policy.OFF_POLICY, 1, 2, 2))
    own, other, third = (p.schedule for p in ranked[:3])
    matches: list[list[Schedule]] = []
    fresh = {own: 10.0, other: 10.6, third: 10.4}  # the lucky first rounds do not repeat

    def rounds(source, schedules, *args, **kwargs):
        matches.append(list(schedules))
        return _spreads({s: fresh[s] for s in schedules})

    monkeypatch.setattr(profiler, "interleaved", rounds)
    source = None
    # agreement: no rematch
    assert _medians(profiler.rematch(source, ranked, _spreads({own: 10.0, other: 10.1}))) == {own: 10.0, other: 10.1}
    assert matches == []
    # 'other' would overrule the model; fresh rounds put it 6% behind; then 'third' would, and is rematched too
    out = profiler.rematch(source, ranked, _spreads({own: 11.0, other: 9.0, third: 9.5}))
    assert matches == [[own, other], [own, third]]
    assert _medians(out) == {own: 10.0, other: 10.6, third: 10.4}
    assert settle(ranked, _medians(out)).schedule == own


def test_even_the_models_minimum_meets_the_inline_baseline_again_before_it_is_kept(monkeypatch) -> None:
    from conduit.scheduling import profiler

    t = {Fraction(g): 1e-3 for g in (1, 2)}
    ranked = rank(Costs(Policy.OFF_POLICY, 2e-3, 8e-3, t, t), feasible_schedules(Policy.OFF_POLICY, 1, 2, 2))
    own = ranked[0].schedule
    assert own != INLINE
    matches: list[list[Schedule]] = []

    def rounds(fresh):
        def run(source, schedules, *args, **kwargs):
            matches.append(list(schedules))
            return _spreads({s: fresh[s] for s in schedules})

        return run

    source = None
    # two lucky rounds put the model's minimum 8% ahead of inline; fresh rounds find them level: inline stays
    monkeypatch.setattr(profiler, "interleaved", rounds({own: 10.0, INLINE: 10.1}))
    out = _medians(profiler.rematch(source, ranked, _spreads({own: 10.0, INLINE: 10.8}), baseline=INLINE))
    assert matches == [[INLINE, own]]
    assert settle(ranked, out).schedule == INLINE
    # a real lead survives the fresh rounds, and is measured once
    matches.clear()
    monkeypatch.setattr(profiler, "interleaved", rounds({own: 10.0, INLINE: 11.0}))
    out = _medians(profiler.rematch(source, ranked, _spreads({own: 10.0, INLINE: 10.8}), baseline=INLINE))
    assert matches == [[INLINE, own]]
    assert settle(ranked, out).schedule == own
    # inline as the plan: nothing to rematch
    matches.clear()
    kept = profiler.rematch(source, ranked, _spreads({own: 10.0, INLINE: 10.1}), baseline=INLINE)
    assert _medians(kept) == {own: 10.0, INLINE: 10.1}
    assert matches == []


def test_calibration_times_rollout_and_update_alone_beside_its_rounds():
    """t_other is what the loop costs beyond rollout and update: both are re-timed after every calibration round
    and their medians replace the ones measured before, so the host's drift in between is not fitted as t_other."""
    from conduit.scheduling.profiler import ProfileSettings, calibrate
    from conduit.scheduling.workload import SyntheticWorkload
    from tests.profiling_fakes import FakeSource

    # every probe: 2 + 8 ms alone, plus 2.5 ms; the host now runs the 4 + 16 ms measured earlier in half the time
    source = FakeSource(lambda s: 0.0125, lambda: (2e-3, 8e-3))
    w = SyntheticWorkload(dim=8, unit_size=16, batch_size=16, capacity=256)
    stale = Costs(Policy.OFF_POLICY, 4e-3, 16e-3, {Fraction(1): 1e-3}, {Fraction(1): 1e-3})
    fitted, calib = calibrate(source, w, stale, ProfileSettings(calibration_rounds=3, bracket_repeats=0), g_max=1)
    calls = ["alone" if c == "alone" else "loop" for c in source.calls]
    assert calls.count("alone") == 3 and calls[-1] == "alone"  # after each round
    assert (fitted.t_rollout, fitted.t_update) == (2e-3, 8e-3)  # medians of the stale one and three fresh ones
    assert calib["t_other"] > 0  # stale costs (20 ms against a 12.5 ms loop) would have fitted a negative one
