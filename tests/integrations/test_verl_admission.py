"""Constraint-preserving admission (pure logic): property test over random finish orders. No verl, no Ray."""

from __future__ import annotations

import random

import pytest
from conduit.integrations.verl.admission import AdmissionConfig, AdmissionController, GroupInfo
from hypothesis import given, settings
from hypothesis import strategies as st


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
