"""The group's samples-per-insert ratio (pure parts): ranks' shares of the room never add up to more than it."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conduit.config import RateLimit
from conduit.distributed.ratelimit import GroupRateLimit
from conduit.errors import ConduitTimeout, ConfigError, RateLimited, RuntimeClosed
from conduit.ratelimit import RateLimiter

SPI, TOL, MIN = 2.0, 48.0, 16


def group(world: int, block: bool = False) -> list[GroupRateLimit]:
    return [GroupRateLimit(RateLimit(samples_per_insert=SPI, tolerance=TOL, block=block), MIN, world)
            for _ in range(world)]


def snapshot(ranks: list[GroupRateLimit]) -> int:
    return sum(r.snapshot() for r in ranks)


def synced(ranks: list[GroupRateLimit], inserts: int) -> None:
    for r in ranks:
        r.synced(inserts)


@given(st.integers(1, 1000), st.integers(1, 1000))
def test_insert_room_is_exactly_what_can_insert_admits(inserts: int, samples: int) -> None:
    rl = RateLimiter(MIN, SPI, TOL)
    rl.inserts, rl.samples = inserts, samples
    room = rl.insert_room()
    if room >= 1:
        assert rl.can_insert(int(room))
    assert not rl.can_insert(max(int(room), 0) + 1)


@given(st.integers(1, 4), st.lists(st.tuples(st.sampled_from(["push", "snapshot", "sync", "draw"]),
                                             st.integers(0, 3), st.integers(1, 12)), max_size=120))
def test_the_ranks_pushes_together_never_break_the_ratio(world: int, steps: list[tuple[str, int, int]]) -> None:
    ranks = group(world)
    truth = RateLimiter(MIN, SPI, TOL)  # one buffer's limiter over the group's true counts
    pending: int | None = None  # the group's inserts as the snapshots saw them, until the sync ends
    for what, who, rows in steps:
        if what == "push":
            try:
                ranks[who % world].admit(rows, timeout=0)
            except RateLimited:
                continue
            assert truth.can_insert(rows), "a rank admitted rows one buffer's limiter would refuse"
            truth.insert(rows)
        elif what == "snapshot" and pending is None:
            pending = snapshot(ranks)
        elif what == "sync" and pending is not None:
            synced(ranks, pending)
            pending = None
        elif what == "draw" and pending is None:
            n = world * 8
            if ranks[0].can_draw(n, truth.inserts):
                assert truth.can_sample(n, truth.inserts), "the group drew what one buffer's limiter would refuse"
                for r in ranks:
                    r.drew(n)
                truth.sampled(n)


def test_a_blocked_push_is_admitted_when_a_sync_shares_out_new_room() -> None:
    a, b = group(2, block=True)
    a.admit(a._part, timeout=0)  # its whole part of the first room
    done = threading.Event()
    t = threading.Thread(target=lambda: (a.admit(4, timeout=10), done.set()))
    t.start()
    assert not done.wait(0.05)
    inserts = a.snapshot() + b.snapshot()
    for r in (a, b):
        r.drew(32)  # the learners sampled: more room
        r.synced(inserts)
    t.join(10)
    assert done.is_set()


def test_a_push_that_waits_past_its_timeout_or_a_close_says_why() -> None:
    (a,) = group(1, block=True)
    a.admit(a._part, timeout=0)
    with pytest.raises(ConduitTimeout, match=r"waited .* for learners to sample"):
        a.admit(1, timeout=0.01)
    threading.Timer(0.05, a.close).start()
    with pytest.raises(RuntimeClosed):
        a.admit(1, timeout=10)


def test_a_unit_no_part_of_the_room_can_ever_hold_is_refused_at_once() -> None:
    (a, _) = group(2, block=True)
    with pytest.raises(ConfigError, match="can never be admitted"):
        a.admit(a.most_per_rank + 1, timeout=10)


def test_pushes_between_the_snapshots_and_the_sync_use_only_what_was_left() -> None:
    """The sync counts pushes up to the snapshots; one after them spends the old part and is charged to the new."""
    (a,) = group(1)
    part = a._part
    a.admit(part - 4, timeout=0)
    inserts = a.snapshot()
    a.admit(4, timeout=0)  # what was left of the part
    with pytest.raises(RateLimited):
        a.admit(1, timeout=0)  # not the whole part again
    a.drew(8)
    a.synced(inserts)  # 8 samples made room for 4 rows: the sync sees 8 (from 36 inserts), less the 4 since
    a.admit(4, timeout=0)
    with pytest.raises(RateLimited):
        a.admit(1, timeout=0)
