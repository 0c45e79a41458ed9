"""Group-aware admission (conduit.grouping, pure logic): property tests over random finish orders.

The rules are verl's replay buffer's (its sampler is the first user); tests/integrations/test_verl_admission_oracle.py
compares them with verl's own buffer.
"""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.ext import AdmissionConfig, AdmissionController, GroupInfo


@st.composite
def scenarios(draw):
    n = draw(st.sampled_from([1, 2, 4, 5, 8]))
    dp = draw(st.sampled_from([1, 2, 4]))
    mini = draw(st.integers(1, 4))
    from math import lcm

    unit = lcm(dp, mini * n) // n
    units = draw(st.integers(1, 4))
    sources = draw(st.sampled_from([None, ["a", "b"], ["a", "b", "c"]]))
    staleness = draw(st.sampled_from([None, 1, 2]))
    seed = draw(st.integers(0, 2**31))
    return n, dp, mini, unit * units, sources, staleness, seed


def split(total: int, k: int, rng: random.Random) -> list[int]:
    cuts = sorted(rng.randint(0, total) for _ in range(k - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, total])]


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_admission_keeps_groups_divisibility_staleness_and_never_starves(sc) -> None:
    n, dp, mini, batch_groups, sources, staleness, seed = sc
    rng = random.Random(seed)
    quotas = dict(zip(sources, split(batch_groups, len(sources), rng))) if sources else None
    cfg = AdmissionConfig(n, mini, dp, batch_groups, max_staleness=staleness, quotas=quotas)
    ctl = AdmissionController(cfg)
    version = 0
    serial = 0

    def launch(source: str | None) -> tuple[GroupInfo, float]:
        nonlocal serial
        serial += 1
        src = source if source is not None else rng.choice(sources or ["*"])
        return GroupInfo(f"g{serial}", version, src), rng.expovariate(1.0)

    # generation: every quota's groups plus a few extra; each finishes at a random time (random finish order)
    inflight = [launch(s) for s, q in (quotas or {None: batch_groups}).items() for _ in range(q)]
    inflight += [launch(None) for _ in range(rng.randint(0, 3))]
    finished: list[GroupInfo] = []
    admitted: list[GroupInfo] = []
    clock = 0.0
    for _ in range(10_000):  # bounded
        if ctl.complete:
            break
        inflight.sort(key=lambda x: x[1])
        if inflight:
            g, clock = inflight.pop(0)
            finished.append(g)
        counts: dict[str, int] = {}
        for g, _ in inflight:
            key = g.source if quotas else "*"
            counts[key] = counts.get(key, 0) + 1
        d = ctl.offer(finished, counts, version, max_units=rng.randint(1, 2))
        unit = cfg.unit_groups
        assert len(d.admitted) % unit == 0
        assert (len(d.admitted) * n) % dp == 0 and (len(d.admitted) * n) % (mini * n) == 0
        assert len({g.uid for g in d.admitted}) == len(d.admitted)  # whole groups, each once
        for g in d.admitted:
            assert staleness is None or version - g.version <= staleness
        gone = {g.uid for g in d.admitted} | {g.uid for g in d.stale}
        finished = [g for g in finished if g.uid not in gone]
        admitted += d.admitted
        if d.admitted:
            version += len(d.admitted) // unit  # one update per admitted mini-batch: the policy moves on
        for s, k in list(d.deficit.items()) + [(g.source if quotas else None, 1) for g in d.stale]:
            for _ in range(k):  # refill (verl's refill_fn): fresh prompts at the current version
                inflight.append((launch(s if s != "*" else None)[0], clock + rng.expovariate(1.0)))
    assert ctl.complete, "the last mini-batch starved"
    assert len(admitted) == batch_groups
    if quotas:
        for s, q in quotas.items():
            assert sum(g.source == s for g in admitted) == q


def test_a_batch_that_cannot_be_cut_into_units_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="multiple"):
        AdmissionConfig(group_size=4, mini_batch_groups=2, dp_size=4, batch_groups=3)


def test_first_unit_is_admitted_before_the_batch_finishes() -> None:
    ctl = AdmissionController(AdmissionConfig(group_size=4, mini_batch_groups=2, dp_size=2, batch_groups=8))
    d = ctl.offer([GroupInfo("a", 0), GroupInfo("b", 0)], {"*": 6}, version=0)
    assert [g.uid for g in d.admitted] == ["a", "b"] and not ctl.complete


# -- verl's rules, at the boundaries (each of these failed before the controller kept them) -------------------------


def ctl_for(**kw) -> AdmissionController:
    base = dict(group_size=4, mini_batch_groups=1, dp_size=1, batch_groups=4)
    return AdmissionController(AdmissionConfig(**{**base, **kw}))


def test_a_uid_is_admitted_once_and_a_repeat_is_refused_not_dropped() -> None:
    ctl = ctl_for(batch_groups=8)
    d = ctl.offer([GroupInfo("a", 0), GroupInfo("b", 0)], {"*": 6}, version=0, max_units=2)
    assert [g.uid for g in d.admitted] == ["a", "b"]
    with pytest.raises(ValueError, match="already admitted"):  # offered again after it was admitted
        ctl.offer([GroupInfo("a", 0), GroupInfo("c", 0)], {"*": 5}, version=0)
    with pytest.raises(ValueError, match="twice in one offer"):  # repeated within one offer
        ctl.offer([GroupInfo("d", 0), GroupInfo("d", 0)], {"*": 5}, version=0)
    ctl.next_batch()  # a new step: what was decided stays decided
    with pytest.raises(ValueError, match="already admitted"):
        ctl.offer([GroupInfo("b", 0)], {"*": 7}, version=1)
    assert ctl.total == 0 and [g.uid for g in ctl.offer([GroupInfo("c", 0)], {"*": 7}, version=1).admitted] == ["c"]


def test_an_evicted_uid_is_decided_too() -> None:
    ctl = ctl_for(max_staleness=1)
    assert [g.uid for g in ctl.offer([GroupInfo("old", 0)], {"*": 4}, version=1).stale] == ["old"]
    with pytest.raises(ValueError, match="already admitted or evicted"):
        ctl.offer([GroupInfo("old", 0)], {"*": 4}, version=1)


@pytest.mark.parametrize("bound", [1, 2, 3])
def test_staleness_is_verls_span_at_the_boundary(bound: int) -> None:
    """verl (ReplayBufferAsync._stale_terminal_keys): stale iff ``step - submitted + 1 > threshold``."""
    step = 5
    ctl = ctl_for(max_staleness=bound)
    for submitted in range(0, step + 1):
        span = step - submitted + 1
        assert ctl.stale(GroupInfo(f"g{submitted}", submitted), step) == (span > bound), (submitted, span)
    # the last fresh step is admitted, one step older is evicted
    last_fresh, first_stale = step - bound + 1, step - bound
    d = ctl.offer([GroupInfo("fresh", last_fresh), GroupInfo("stale", first_stale)], {"*": 3}, version=step)
    assert [g.uid for g in d.stale] == ["stale"] and not d.admitted  # evictions first, as verl
    assert [g.uid for g in ctl.offer([GroupInfo("fresh", last_fresh)], {"*": 3}, step).admitted] == ["fresh"]


def test_wait_strategy_evicts_nothing_and_blocks_while_an_inflight_group_reached_the_bound() -> None:
    """verl's dropless ``wait``: no staleness eviction; no sampling while an in-flight span >= threshold."""
    ctl = ctl_for(max_staleness=2, strategy="wait")
    old = GroupInfo("old", 1)  # span 5 at step 5: far past the bound, kept for training
    d = ctl.offer([old], {"*": 3}, version=5, oldest_inflight=4)  # in-flight span 2 >= 2: blocked
    assert d.blocked and not d.stale and not d.admitted
    d = ctl.offer([old], {"*": 3}, version=5, oldest_inflight=5)  # span 1 < 2: sampling goes on
    assert not d.blocked and [g.uid for g in d.admitted] == ["old"]
    with pytest.raises(ValueError, match="strategy"):
        ctl_for(strategy="evict")
    with pytest.raises(ValueError, match="max_staleness"):
        ctl_for(max_staleness=0)


def test_only_whole_groups_of_group_size_are_admitted() -> None:
    ctl = ctl_for(dp_size=2, mini_batch_groups=2, batch_groups=4)  # unit: 2 groups of 4 = 8 rows
    short, failed = GroupInfo("short", 0, size=3), GroupInfo("failed", 0, size=4, failed=True)
    d = ctl.offer([short, failed, GroupInfo("a", 0, size=4)], {"*": 2}, version=0)
    assert {g.uid for g in d.misfit} == {"short", "failed"} and not d.admitted
    assert d.deficit == {}  # "a", the 2 in flight and the 2 replacements of the evicted cover the batch's 4
    d = ctl.offer([GroupInfo("a", 0, size=4), GroupInfo("b", 0, size=4)], {"*": 2}, version=0)
    assert sum(g.size for g in d.admitted) == 8 and sum(g.size for g in d.admitted) % 2 == 0
    with pytest.raises(ValueError, match="more than group_size"):
        ctl.offer([GroupInfo("big", 0, size=5)], {}, version=0)


def test_want_is_all_or_nothing_in_whole_units() -> None:
    ctl = ctl_for(dp_size=2, mini_batch_groups=2, batch_groups=8)  # unit 2 groups
    three = [GroupInfo(u, 0) for u in "abc"]
    assert not ctl.offer(three, {"*": 5}, version=0, want=4).admitted and ctl.total == 0
    d = ctl.offer([*three, GroupInfo("d", 0)], {"*": 4}, version=0, want=4)
    assert [g.uid for g in d.admitted] == ["a", "b", "c", "d"] and ctl.total == 4
    with pytest.raises(ValueError, match="whole number of admission units"):
        ctl.offer([], {"*": 4}, version=0, want=3)
    with pytest.raises(ValueError, match="whole number of admission units"):
        ctl.offer([], {"*": 4}, version=0, want=6)  # more than is left of the batch


def test_on_policy_hands_over_the_whole_step_as_verls_sync_sampler() -> None:
    """Sync (verl's ReplayBuffer): no staleness, no eviction, the oldest ``want`` terminal groups or none."""
    ctl = ctl_for(max_staleness=1, dp_size=2, mini_batch_groups=1, on_policy=True)
    groups = [GroupInfo("a", 3), GroupInfo("b", 1, size=2, failed=True), GroupInfo("c", 3)]
    d = ctl.offer(groups, {"*": 1}, version=3, want=4)  # 3 of the step's 4: nothing yet, no early mini-batch
    assert not d.admitted and not d.stale and not d.misfit and not d.deficit
    d = ctl.offer([*groups, GroupInfo("d", 3)], {}, version=3, want=4)
    assert [g.uid for g in d.admitted] == ["b", "a", "c", "d"]  # verl delivers a failed group in sync (pads it)
    with pytest.raises(ValueError, match="quotas"):
        ctl_for(on_policy=True, quotas={"x": 4})


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([None, 1, 2, 3]), st.sampled_from(["drop", "wait"]))
def test_every_uid_is_decided_at_most_once_over_steps(seed: int, bound, strategy: str) -> None:
    """Random steps of async sampling (mini-batch calls per step, refills, failures): each uid once, whole, fresh."""
    rng = random.Random(seed)
    n, dp, mini, batch = 2, 2, 1, 4
    ctl = AdmissionController(AdmissionConfig(n, mini, dp, batch, max_staleness=bound, strategy=strategy))
    serial, inflight, finished, seen = 0, [], [], set()

    def launch(step: int) -> None:
        nonlocal serial
        serial += 1
        inflight.append(GroupInfo(f"g{serial}", step, size=n if rng.random() > 0.1 else 1, failed=rng.random() < 0.1))

    for step in range(1, 7):
        for _ in range(batch):
            launch(step)
        for _call in range(2):  # parameter_sync_step = 2: two samples of 2 groups
            for _ in range(200):
                if inflight and rng.random() < 0.7:
                    finished.append(inflight.pop(rng.randrange(len(inflight))))
                oldest = min((g.version for g in inflight), default=None)
                d = ctl.offer(finished, {"*": len(inflight)}, step, want=2, oldest_inflight=oldest)
                for g in d.admitted:
                    assert g.uid not in seen and g.size == n and not g.failed
                    assert strategy == "wait" or bound is None or step - g.version + 1 <= bound
                seen |= {g.uid for g in (*d.admitted, *d.stale, *d.misfit)}
                finished = [g for g in finished if g.uid not in seen]
                for _ in range(len(d.stale) + len(d.misfit) + sum(d.deficit.values())):
                    launch(step)
                if d.admitted:
                    assert len(d.admitted) == 2
                    break
            else:
                raise AssertionError("starved")
        assert ctl.total == batch
        if step < 6:
            ctl.next_batch()


def test_poll_evicts_refills_and_admits_from_fresh_snapshots_and_gives_up_in_time() -> None:
    """The sampler's loop as the core runs it: a failed group is evicted (its uid cleared) and refilled one for one,
    the next snapshot is taken at once, and the admission comes when a unit of whole groups has finished."""
    ctl = ctl_for(group_size=2, mini_batch_groups=2, batch_groups=2)
    polls: list[int] = []
    cleared: list[set[str]] = []
    refills: list[int] = []
    states = [
        ([GroupInfo("a", 0, size=2), GroupInfo("bad", 0, size=2, failed=True)], {"*": 1}),
        ([GroupInfo("a", 0, size=2)], {"*": 2}),  # the replacement runs: one poll waits
        ([GroupInfo("a", 0, size=2), GroupInfo("c", 0, size=2)], {}),
    ]

    def snapshot():
        polls.append(len(polls))
        finished, inflight = states[min(len(polls) - 1, len(states) - 1)]
        return finished, inflight, 0 if inflight else None

    out = ctl.poll(snapshot, 0, 2, evict=cleared.append, refill=refills.append, timeout_s=5.0, interval_s=0.001)
    assert [g.uid for g in out.admitted] == ["a", "c"] and len(polls) == 3
    assert cleared == [{"bad"}] and refills == [1] and (out.misfit, out.refilled, out.stale) == (1, 1, 0)
    with pytest.raises(TimeoutError, match="no 2 admissible whole groups"):
        ctl_for(group_size=2, mini_batch_groups=2, batch_groups=2).poll(
            lambda: ([], {"*": 2}, 0), 0, 2, evict=cleared.append, refill=None, timeout_s=0.05, interval_s=0.01
        )


def test_poll_never_sleeps_past_its_timeout() -> None:
    """A poll interval longer than the timeout is cut short: the TimeoutError comes at the timeout."""
    ctl = ctl_for(group_size=2, mini_batch_groups=2, batch_groups=2)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        ctl.poll(lambda: ([], {"*": 2}, 0), 0, 2, evict=lambda uids: None, refill=None, timeout_s=0.2, interval_s=30)
    assert time.monotonic() - t0 < 10  # not the 30 s interval (a busy host may add seconds, never 30)


def test_groups_in_flight_of_no_named_source_count_against_the_quotas_deficit() -> None:
    """verl's in-flight prompts name no source: they may still fill any quota, so the deficit (what is refilled)
    is only what they cannot cover -- not every missing group again at every poll while they run."""
    ctl = AdmissionController(AdmissionConfig(group_size=2, mini_batch_groups=2, dp_size=1, batch_groups=2,
                                              quotas={"a": 1, "b": 1}, max_staleness=1))
    assert ctl.offer([], {"*": 2}, 0).deficit == {}
    assert sum(ctl.offer([], {"*": 1}, 0).deficit.values()) == 1
    assert ctl.offer([], {}, 0).deficit == {"a": 1, "b": 1}
    assert ctl.offer([GroupInfo("g", 0, "a", size=2)], {"*": 1}, 0).deficit == {}
    refills: list[int] = []
    with pytest.raises(TimeoutError):  # the two groups in flight never finish here: no refill is asked for
        ctl.poll(lambda: ([], {"*": 2}, 0), 0, None, evict=lambda uids: None, refill=refills.append, timeout_s=0.2,
                 interval_s=0.01)
    assert refills == []
