"""Stage graphs: the wave planner (conduit.scheduling.stages) and the runner (conduit.stages), no framework.

The planner's invariants on random graphs (producers in earlier waves, one stage
per worker group per wave, overlap only where the cost model says it pays), and
the runner's: waves in order, a wave's stages at once on the core's lanes, a
stage's error re-raised after its partners ended, timings into the profile,
threads that end at ``close()``.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.ext import Plan, Stage, StageProfile, StageRunner
from conduit.scheduling.stages import overlap_pays, plan, serial_plan


def noop() -> None:
    return None


def graph(*spec: tuple[str, str, tuple[str, ...]]) -> list[Stage]:
    return [Stage(name, group, needs, noop) for name, group, needs in spec]


def check_waves(stages: list[Stage], the_plan: Plan) -> None:
    by_name = {s.name: s for s in stages}
    done: set[str] = set()
    for wave in the_plan.waves:
        assert len({by_name[n].group for n in wave}) == len(wave), the_plan.describe()
        for n in wave:
            assert set(by_name[n].needs) <= done, (n, the_plan.describe())
        done |= set(wave)
    assert done == set(by_name) and sum(len(w) for w in the_plan.waves) == len(stages)


# -- the planner -------------------------------------------------------------------------------------------------


@st.composite
def dags(draw):
    k = draw(st.integers(1, 8))
    groups = draw(st.lists(st.sampled_from("abc"), min_size=k, max_size=k))
    seed = draw(st.integers(0, 2**31))
    rng = random.Random(seed)
    stages = [Stage(f"s{i}", groups[i], tuple(f"s{j}" for j in range(i) if rng.random() < 0.3), noop) for i in range(k)]
    rng.shuffle(stages)  # the planner must not rely on the order given
    costs = {s.name: rng.choice([0.1, 0.5, 1.0, 3.0]) for s in stages}
    sync = draw(st.sampled_from([0.0, 0.05, 10.0]))
    return stages, costs, sync


@settings(max_examples=80, deadline=None)
@given(dags())
def test_plan_keeps_producers_first_one_stage_per_group_and_overlaps_only_where_it_pays(case) -> None:
    stages, costs, sync = case
    profile = StageProfile(sync_s=sync)
    for n, c in costs.items():
        profile.record(n, c)
    the_plan = plan(stages, profile)
    check_waves(stages, the_plan)
    if sync >= 10.0:  # overlapping costs more than any stage: the model never overlaps
        assert not the_plan.overlapped
    assert the_plan.predicted_s <= the_plan.serial_s + 1e-9


def test_equal_priors_and_free_overlap_overlap_every_group_and_a_costly_sync_keeps_them_apart() -> None:
    stages = graph(("reward", "rm", ()), ("old", "actor", ()), ("ref", "ref", ()), ("adv", "driver", ("reward", "old")))
    first = plan(stages, StageProfile())
    assert first.waves[0] == ("reward", "old", "ref") and first.waves[1] == ("adv",)
    assert first.overlapped and first.describe() == "(reward || old || ref) -> adv"
    apart = plan(stages, StageProfile(sync_s=5.0))
    assert not apart.overlapped and apart.predicted_s == apart.serial_s == 4.0


def test_one_group_never_shares_a_wave() -> None:
    stages = graph(("a", "actor", ()), ("b", "actor", ()), ("c", "actor", ()))
    assert all(len(w) == 1 for w in plan(stages, StageProfile()).waves)


def test_a_groups_stages_keep_the_order_given_whatever_they_cost() -> None:
    stages = graph(("old", "actor", ()), ("ref", "actor", ()), ("adv", "driver", ("old", "ref")))
    profile = StageProfile()
    profile.record("ref", 5.0)  # the second one costlier: still second, as the framework orders them
    profile.record("old", 1.0)
    assert plan(stages, profile).waves == (("old",), ("ref",), ("adv",))


def test_overlap_pays_is_the_cost_models_decision() -> None:
    assert overlap_pays(2.0, 1.0, 0.0) == (True, 2.0)  # hidden entirely beside the longer wave
    pays, t = overlap_pays(2.0, 1.0, 0.25)
    assert pays and t == pytest.approx(2.25)
    assert overlap_pays(2.0, 1.0, 5.0) == (False, 3.0)  # overlapping would cost more than it hides


def test_bad_graphs_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        plan(graph(("a", "x", ()), ("a", "y", ())), StageProfile())
    with pytest.raises(ValueError, match="no stage produces"):
        plan(graph(("a", "x", ("ghost",))), StageProfile())
    with pytest.raises(ValueError, match="cycle"):
        plan(graph(("a", "x", ("b",)), ("b", "y", ("a",))), StageProfile())
    with pytest.raises(ValueError, match="before one of its producers"):
        serial_plan(graph(("b", "y", ("a",)), ("a", "x", ())))


def test_serial_plan_is_the_order_given() -> None:
    stages = graph(("a", "x", ()), ("b", "y", ()), ("c", "x", ("a", "b")))
    p = serial_plan(stages)
    assert p.waves == (("a",), ("b",), ("c",)) and not p.overlapped and p.predicted_s == p.serial_s == 3.0


def test_profile_keeps_the_median_of_recent_costs_and_the_measured_sync() -> None:
    profile = StageProfile(history=3)
    for s in (5.0, 1.0, 2.0, 3.0):
        profile.record("a", s)
    assert profile.cost("a") == 2.0 and profile.cost("never") == profile.prior_s
    profile.record_wave(("a", "b"), 3.5, {"a": 3.0, "b": 1.0})
    profile.record_wave(("a",), 9.0, {"a": 9.0})  # one stage alone: no overlap, no sync sample
    assert profile.sync_s == pytest.approx(0.5) and profile.to_json() == {"cost_s/a": 2.0, "sync_s": 0.5}


# -- the runner --------------------------------------------------------------------------------------------------


class Log:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, str, float, str]] = []

    def stage(self, name: str, delay: float = 0.0, barrier: threading.Barrier | None = None, out: object = None):
        def fn() -> object:
            with self.lock:
                self.events.append((name, "start", time.monotonic(), threading.current_thread().name))
            if barrier is not None:
                barrier.wait(timeout=10)  # every partner of the wave is running at once, or this raises
            time.sleep(delay)
            with self.lock:
                self.events.append((name, "end", time.monotonic(), threading.current_thread().name))
            return out if out is not None else name.upper()

        return fn

    def at(self, name: str, what: str) -> float:
        return next(t for n, w, t, _ in self.events if n == name and w == what)


def test_a_wave_runs_at_once_on_its_groups_lanes_and_a_consumer_starts_after_its_producers() -> None:
    log, barrier = Log(), threading.Barrier(3)
    stages = [
        Stage("reward", "rm", (), log.stage("reward", 0.02, barrier)),
        Stage("old", "actor", (), log.stage("old", 0.05, barrier)),
        Stage("ref", "ref", (), log.stage("ref", 0.01, barrier)),
        Stage("adv", "driver", ("reward", "old", "ref"), log.stage("adv")),
    ]
    profile, runner = StageProfile(), StageRunner(prefix="work")
    try:
        the_plan = plan(stages, profile)
        assert the_plan.waves == (("reward", "old", "ref"), ("adv",))
        outputs, timings = runner.run(stages, the_plan, profile)
        assert outputs == {"reward": "REWARD", "old": "OLD", "ref": "REF", "adv": "ADV"}
        assert log.at("adv", "start") >= max(log.at(n, "end") for n in ("reward", "old", "ref"))
        threads = {n: th for n, w, _, th in log.events if w == "start"}
        for name, group in (("reward", "rm"), ("old", "actor"), ("ref", "ref")):
            assert threads[name] == f"conduit-work-{group}"  # each stage of the wave on its group's lane
        assert threads["adv"] == threading.current_thread().name  # alone in its wave: inline
        assert [t.names for t in timings] == list(the_plan.waves)
        assert timings[0].wall_s >= max(timings[0].stage_s.values())
        assert timings[0].stage_s["old"] >= 0.05
        assert set(profile.samples) == {"reward", "old", "ref", "adv"} and len(profile.sync_samples) == 1
        assert sorted(runner.graphs) == ["adv", "old", "ref", "reward"] and runner.graphs["old"].name == "work.old"
        assert not [t for t in threading.enumerate() if t.name.startswith("conduit-work-")]  # none outlives a run
        runner.run(stages, the_plan, profile)  # graphs are kept across iterations, lanes made again
        assert runner.graphs["old"].invocations == 2 and len(profile.samples["old"]) == 2
    finally:
        assert runner.close(timeout=5.0)
    assert not [t for t in threading.enumerate() if t.name.startswith("conduit-work-")]
    with pytest.raises(RuntimeError, match="closed"):
        runner.run(stages, the_plan, profile)


def test_a_stage_on_a_lane_runs_with_its_callers_openmp_team_and_reduces_to_the_callers_bits() -> None:
    """A stage is the framework's own code: on a lane it keeps the caller's intra-op team, so a driver-side
    reduction (verl's entropy metric, a mean over a large batch) gives the bits it gives run serially."""
    import torch

    x = torch.randn(512, 4096, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        serial = x.mean().item(), torch.get_num_threads()
        stages = [Stage(n, n, (), lambda: (x.mean().item(), torch.get_num_threads())) for n in ("old", "ref")]
        runner = StageRunner()
        try:
            outputs, _ = runner.run(stages, Plan((("old", "ref"),), 0.0, 0.0), StageProfile())
        finally:
            runner.close()
    finally:
        torch.set_num_threads(before)
    assert outputs == {"old": serial, "ref": serial}


def test_two_stages_of_one_group_in_one_wave_are_refused() -> None:
    stages = graph(("a", "actor", ()), ("b", "actor", ()))
    runner = StageRunner()
    try:
        with pytest.raises(ValueError, match="one worker group"):
            runner.run(stages, Plan((("a", "b"),), 1.0, 2.0))
    finally:
        runner.close()


@pytest.mark.parametrize("failing", ["first", "partner"])
def test_a_stages_error_is_re_raised_after_its_partners_ended_and_no_later_wave_starts(failing: str) -> None:
    log = Log()

    def boom() -> None:
        raise KeyError("stage failed")

    slow = log.stage("slow", 0.1)
    stages = [
        Stage("first", "a", (), boom if failing == "first" else slow),
        Stage("partner", "b", (), boom if failing == "partner" else slow),
        Stage("after", "c", ("first", "partner"), log.stage("after")),
    ]
    runner = StageRunner()
    profile = StageProfile()
    try:
        with pytest.raises(KeyError, match="stage failed"):
            runner.run(stages, Plan((("first", "partner"), ("after",)), 1.0, 3.0), profile)
        assert [(n, w) for n, w, _, _ in log.events] == [("slow", "start"), ("slow", "end")]  # partner ended first
        assert not profile.samples  # a failed wave records nothing
    finally:
        assert runner.close()


def test_close_is_bounded_when_a_stage_hangs() -> None:
    release = threading.Event()
    stages = [Stage("quick", "a", (), noop), Stage("hung", "b", (), lambda: release.wait(10))]
    runner = StageRunner()
    caller = threading.Thread(target=runner.run, args=(stages, Plan((("quick", "hung"),), 1.0, 2.0)), daemon=True)
    caller.start()
    deadline = time.monotonic() + 5
    while "b" not in runner.lanes and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    assert runner.close(timeout=0.2) is False  # the hung stage's lane is reported, not waited for
    assert time.monotonic() - t0 < 2.0
    release.set()
    caller.join(5)
    assert not caller.is_alive()
