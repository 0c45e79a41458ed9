"""Configuration is validated at construction with messages naming the field."""

from __future__ import annotations

from fractions import Fraction

import pytest
from pydantic import ValidationError

from conduit import ConduitConfig, ConfigError, Mode, Policy, Schedule, SchedulePin
from conduit.core import delivery_space, feasible_schedules, ingestion_space


def off(**kw):
    base = dict(policy="off_policy", train_batch_size=32, capacity=1000)
    base.update(kw)
    return ConduitConfig(**base)


def on(**kw):
    base = dict(policy="on_policy", train_batch_size=64, num_minibatches=4)
    base.update(kw)
    return ConduitConfig(**base)


@pytest.mark.parametrize(
    "make, kw, fragment",
    [
        (off, dict(capacity=None), "capacity: off-policy replay needs a capacity"),
        (off, dict(capacity=10), "capacity=10 is smaller than train_batch_size=32"),
        (off, dict(train_batch_size=0), "train_batch_size"),
        (off, dict(num_minibatches=4), "num_minibatches=4"),
        (off, dict(min_size_to_sample=5000), "min_size_to_sample=5000 exceeds capacity=1000"),
        (off, dict(learner_device="gpu7"), "learner_device='gpu7' is not a torch device"),
        (off, dict(memory_headroom=1.5), "memory_headroom"),
        (off, dict(unknown_field=1), "unknown_field"),
        (on, dict(capacity=10), "capacity=10: on-policy stores exactly one iteration"),
        (on, dict(sampler="prioritized"), "prioritized sampling is off-policy only"),
        (on, dict(num_minibatches=100), "num_minibatches=100 exceeds train_batch_size=64"),
        (on, dict(num_learners=32), "num_learners=32"),
        (off, dict(num_learners=2, learner_device=["cpu"]), "lists 1 devices but num_learners=2"),
        (off, dict(pinned=SchedulePin(delivery_granularity=9)), "pinned.delivery_granularity=9"),
        (on, dict(pinned=SchedulePin(ingestion_overlap=True, ingestion_granularity=1)), "breaks on_policy semantics"),
        (on, dict(num_minibatches=1, pinned=SchedulePin(delivery_overlap=True)), "breaks on_policy semantics"),
        # accepted once, then failed at start or at a pull with errors that named no field
        (off, dict(seed=-1), "seed: Input should be greater than or equal to 0 (got -1)"),
        (off, dict(timeout_s=float("inf")), "timeout_s: Input should be a finite number"),
        (off, dict(rate_limit=dict(samples_per_insert=float("inf"), tolerance=64)), "samples_per_insert: Input should"),
        (off, dict(prioritized=dict(alpha=float("nan"))), "alpha: Input should be a finite number"),
        (off, dict(rate_limit=dict(samples_per_insert=1.0, tolerance=float("nan"))), "tolerance: Input should be"),
        # a rate band is ± tolerance or Reverb's [min_diff, max_diff], one of them, and wider than a batch
        (off, dict(rate_limit=dict(samples_per_insert=1.0)), "give the band as tolerance, or as min_diff"),
        (off, dict(rate_limit=dict(samples_per_insert=1.0, tolerance=64, min_diff=0, max_diff=64)), "not both"),
        (off, dict(rate_limit=dict(samples_per_insert=1.0, min_diff=0)), "give the band as tolerance"),
        (off, dict(rate_limit=dict(samples_per_insert=1.0, min_diff=8, max_diff=8)), "min_diff=8.0 must be below"),
        (off, dict(rate_limit=dict(samples_per_insert=1.0, min_diff=0, max_diff=16)), "max_diff - min_diff = 16"),
    ],
)
def test_bad_configs_are_rejected_with_the_field_and_value(make, kw, fragment):
    with pytest.raises(ConfigError) as e:
        make(**kw)
    assert fragment in str(e.value)
    assert isinstance(e.value, ValueError) and "errors.pydantic.dev" not in str(e.value)


def test_a_config_error_lists_every_bad_field_as_written_with_what_it_got_and_what_is_allowed():
    with pytest.raises(ConfigError) as e:
        off(sampler="prioritised", capcity=3, rate_limit={"samples_per_insert": -1, "tolrance": 3})
    text = str(e.value)
    assert "sampler: Input should be 'uniform', 'prioritized', 'fifo' or 'lifo' (got 'prioritised')" in text
    assert "capcity: not a setting (got 3); did you mean 'capacity'?" in text
    assert "rate_limit.tolrance" in text or "tolrance: not a setting (got 3); did you mean 'tolerance'?" in text
    assert "samples_per_insert: Input should be greater than 0 (got -1)" in text
    with pytest.raises(ConfigError, match=r"zzz: not a setting \(got 1\); valid: capacity, copy_on_push"):
        off(zzz=1)


def test_an_infinite_rate_tolerance_is_no_band():
    assert off(rate_limit=dict(samples_per_insert=1.0, tolerance=float("inf"))).rate_limit.tolerance == float("inf")


def test_reverbs_queue_limiter_is_a_band_from_zero_to_its_size():
    from conduit import RateLimit

    q = RateLimit.queue(128, block=False)
    assert (q.samples_per_insert, q.min_diff, q.max_diff, q.tolerance, q.block) == (1.0, 0.0, 128.0, None, False)
    assert off(rate_limit=q).rate_limit == q


def test_configs_are_frozen():
    cfg = off()
    with pytest.raises(ValidationError):
        cfg.capacity = 5  # type: ignore[misc]


def test_feasible_spaces_follow_the_rl_configuration():
    assert ingestion_space(Policy.OFF_POLICY, g_max=3) == (1, 2, 3)
    assert ingestion_space(Policy.ON_POLICY, 4) == (Fraction(1, 4), Fraction(1, 2), Fraction(3, 4), 1)
    assert delivery_space(Policy.ON_POLICY, 4) == (Fraction(1, 4), 1)
    assert off(g_max=8, max_staleness=2).delivery_space == (1, 2)
    assert off(g_max=8, max_ingest_lag=3).ingestion_space == (1, 2, 3)


def test_on_policy_admits_only_the_modes_of_fig_10():
    schedules = feasible_schedules(Policy.ON_POLICY, 4)
    for s in schedules:
        for mode in (s.ingestion, s.delivery):
            assert (not mode.overlap and mode.granularity == 1) or (mode.overlap and mode.granularity < 1)
    # 4 ingestion modes (inline 1, overlap 1/4, 1/2, 3/4) x 2 delivery modes
    assert len(schedules) == 8
    assert len(feasible_schedules(Policy.OFF_POLICY, g_ing_max=3, g_del_max=2)) == 4 * 3 * 2


def test_default_schedule_overlaps_for_gpu_learners_and_stays_inline_on_cpu():
    assert off().default_schedule() == Schedule(Mode(False, 1), Mode(False, 1))
    assert on().default_schedule() == Schedule(Mode(False, 1), Mode(False, 1))
    assert off(learner_device="cuda:0").default_schedule() == Schedule(Mode(True, 1), Mode(True, 1))
    assert on(learner_device="cuda:0").default_schedule() == Schedule(Mode(False, 1), Mode(True, Fraction(1, 4)))


def test_schedule_pins():
    pinned = off(pinned=SchedulePin(ingestion_overlap=False, delivery_overlap=True, delivery_granularity=3))
    assert pinned.default_schedule() == Schedule(Mode(False, 1), Mode(True, 3))
    half = on(pinned=SchedulePin(delivery_overlap=False))
    assert half.default_schedule().delivery == Mode(False, 1)
    frac = on(pinned=SchedulePin(ingestion_granularity="1/2"))
    assert frac.default_schedule().ingestion == Mode(True, Fraction(1, 2))
