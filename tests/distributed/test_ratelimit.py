"""The group's samples-per-insert ratio (pure parts): the ranks' parts never add up to more than one buffer's
limiter admits, and a waiting unit is served in time."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from conduit.config import ConduitConfig, RateLimit
from conduit.distributed.options import Sampling, validate_rate
from conduit.distributed.ratelimit import GroupRateLimit, allocate
from conduit.errors import ConduitTimeout, ConfigError, RateLimited, RuntimeClosed, SemanticsError
from conduit.ratelimit import RateLimiter

SPI, TOL, MIN = 2.0, 48.0, 16
SPIS = [0.1, 1 / 3, 1.1, 2.0, 32.0]  # ratios not exact in binary too: the band's edge must round safely


def group(world: int, block: bool = False, spi: float = SPI, tol: float = TOL, min_size: int = MIN
          ) -> list[GroupRateLimit]:
    return [GroupRateLimit(RateLimit(samples_per_insert=spi, tolerance=tol, block=block), min_size, r, world)
            for r in range(world)]


def sync(ranks: list[GroupRateLimit]) -> None:
    """One sync: every rank's snapshot gathered, then every rank's parts from the same matrix."""
    state = np.array([r.snapshot() for r in ranks], dtype=np.float64)
    for r in ranks:
        r.synced(state[:, 0], state[:, 1], state[:, 2])


def use_part(rank: GroupRateLimit) -> None:
    """Admit the rank's whole part, in units it may push."""
    while rank._part - (rank.pushed - rank._base) > 0:
        rank.admit(min(rank.most_rows, rank._part - (rank.pushed - rank._base)), timeout=0)


def push(rank: GroupRateLimit, rows: int) -> bool:
    try:
        rank.admit(rows, timeout=0)
    except (RateLimited, ConduitTimeout):
        return False
    return True


@given(st.integers(0, 1000), st.integers(0, 4000), st.sampled_from(SPIS))
def test_insert_room_is_exactly_what_can_insert_admits(inserts: int, samples: int, spi: float) -> None:
    rl = RateLimiter(MIN, spi, TOL)
    rl.inserts, rl.samples = inserts, samples
    room = rl.insert_room()
    assert room >= 0 and (room == 0 or rl.can_insert(room))
    assert not rl.can_insert(room + 1)


def test_allocation_serves_the_longest_waiting_whole_and_keeps_the_room_for_one_that_does_not_fit() -> None:
    assert allocate(100, [0, 0, 0, 0], [0] * 4) == [25, 25, 25, 25]
    assert allocate(100, [0, 40, 30, 0], [0, 5, 3, 0]) == [7, 47, 37, 7]  # rank 2 waited longer: served first
    assert allocate(100, [0, 90, 30, 0], [0, 2, 3, 0]) == [0, 90, 0, 0]  # rank 1 first; rank 2's 30 do not fit
    assert allocate(20, [0, 90, 10, 0], [0, 2, 3, 0]) == [0, 0, 0, 0]  # the room waits for rank 1's unit
    assert allocate(7, [0, 0, 0], [0] * 3) == [2, 2, 2]


@given(st.integers(1, 4), st.sampled_from(SPIS),
       st.lists(st.tuples(st.sampled_from(["push", "snapshot", "synced", "draw"]), st.integers(0, 3),
                          st.integers(1, 12)), max_size=150))
@example(2, SPI, [("push", 1, 10), ("push", 1, 10), ("snapshot", 0, 1), ("push", 0, 10), ("push", 0, 10),
                  ("synced", 0, 1), ("push", 1, 10)])  # pushes during a sync would be counted by no rank
def test_the_ranks_pushes_together_never_break_the_ratio(world: int, spi: float,
                                                         steps: list[tuple[str, int, int]]) -> None:
    tol = 48.0 * spi / 2  # room for 24 rows whatever the ratio
    ranks = group(world, spi=spi, tol=tol)
    truth = RateLimiter(MIN, spi, tol)  # one buffer's limiter over the group's true counts
    state: np.ndarray | None = None  # the snapshots, until the sync ends
    for what, who, rows in steps:
        if what == "push":
            if push(ranks[who % world], rows):
                assert state is None, "a push was admitted while a sync was under way"
                assert truth.can_insert(rows), "a rank admitted rows one buffer's limiter would refuse"
                truth.insert(rows)
        elif what == "snapshot" and state is None:
            state = np.array([r.snapshot() for r in ranks], dtype=np.float64)
        elif what == "synced" and state is not None:
            for r in ranks:
                r.synced(state[:, 0], state[:, 1], state[:, 2])
            state = None
        elif what == "draw" and state is None:
            n = world * 2
            if ranks[0].can_draw(n, truth.inserts):
                assert truth.can_sample(n, truth.inserts), "the group drew what one buffer's limiter would refuse"
                for r in ranks:
                    r.drew(n)
                truth.sampled(n)


@given(st.integers(1, 8), st.integers(1, 64), st.sampled_from(SPIS), st.integers(0, 7))
def test_every_unit_that_may_fit_is_admitted_while_learners_sample(world: int, unit: int, spi: float,
                                                                   lead: int) -> None:
    """Liveness: ranks that push units of up to ``tolerance / spi`` rows (refused ones retried after the next
    sync) all get room, however evenly split room would fragment it, as long as learners keep pulling."""
    batch = 4
    tol = float(max(world * batch, 64))
    ranks = group(world, spi=spi, tol=tol, min_size=200)
    unit = min(unit, ranks[0].most_rows)
    admitted = [0] * world
    for step in range(2000):
        for i, r in enumerate(ranks):
            if (i + step + lead) % 3 and push(r, unit):
                admitted[i] += 1
        sync(ranks)
        n = world * batch
        if ranks[0].can_draw(n, ranks[0].limiter.inserts):
            for r in ranks:
                r.drew(n)
        if min(admitted) >= 5:
            return
    pytest.fail(f"units of {unit} rows starved: admitted per rank {admitted} ({ranks[0].limiter.describe()})")


def test_a_blocked_push_is_admitted_when_a_sync_shares_out_new_room() -> None:
    ranks = group(2, block=True)
    a = ranks[0]
    use_part(a)  # its whole part of the first room
    done = threading.Event()
    t = threading.Thread(target=lambda: (a.admit(4, timeout=10), done.set()))
    t.start()
    assert not done.wait(0.05)
    for r in ranks:
        r.drew(64)  # the learners sampled: more room
    sync(ranks)
    t.join(10)
    assert done.is_set()


def test_a_push_waits_out_a_sync_under_way_even_without_blocking() -> None:
    (a,) = group(1, block=False)
    a.snapshot()
    threading.Timer(0.05, a.end_sync).start()  # a failed sync ends too
    a.admit(1, timeout=10)
    assert a.pushed == 1


def test_a_push_that_waits_past_its_timeout_a_close_or_a_failed_group_says_why() -> None:
    (a,) = group(1, block=True)
    use_part(a)
    with pytest.raises(ConduitTimeout, match=r"waited .* for learners to sample"):
        a.admit(1, timeout=0.01)
    threading.Timer(0.05, a.close).start()
    with pytest.raises(RuntimeClosed):
        a.admit(1, timeout=10)

    def failed() -> None:
        raise RuntimeError("rank 1 died")

    b = GroupRateLimit(RateLimit(samples_per_insert=SPI, tolerance=TOL), MIN, 0, 1, check=failed)
    use_part(b)
    with pytest.raises(RuntimeError, match="rank 1 died"):
        b.admit(1, timeout=10)


def test_a_refused_push_is_kept_room_for_until_it_is_retried() -> None:
    ranks = group(4, block=False)
    a = ranks[0]
    unit = a._part + 1  # more than an even part
    with pytest.raises(RateLimited, match="keep room for a retry"):
        a.admit(unit, timeout=0)
    sync(ranks)
    sync(ranks)  # a retry after several syncs keeps its place
    others = a._part - unit
    assert not push(a, others + 1)  # the room kept for the retry is not anyone else's on the rank
    a.admit(unit, timeout=0)


def test_a_refused_push_never_retried_stops_holding_room() -> None:
    """A rank whose unit was refused and dropped must not hold the group's room for ever."""
    ranks = [GroupRateLimit(RateLimit(samples_per_insert=1.0, tolerance=32.0, block=False), 32, r, 2,
                            patience_s=0.0) for r in range(2)]
    a, b = ranks
    a.admit(32, timeout=0)
    with pytest.raises(RateLimited):
        a.admit(32, timeout=0)  # refused, and the actor drops it
    sync(ranks)  # past its patience: not asked for, so the room left (32 rows) is split again
    assert a._part == b._part == 16 and push(b, 16)


def test_a_push_waiting_for_room_keeps_it_from_the_rank_s_other_pushes() -> None:
    ranks = group(2, block=True)
    a = ranks[0]
    use_part(a)
    got = threading.Event()
    t = threading.Thread(target=lambda: (a.admit(a.most_rows, timeout=10), got.set()))
    t.start()
    while not a._waiting:
        threading.Event().wait(0.01)
    for r in ranks:
        r.drew(200)  # room for the big unit and more
    sync(ranks)
    t.join(10)
    assert got.is_set()


def test_a_unit_that_may_never_fit_is_refused_at_once() -> None:
    (a, _) = group(2, block=True)
    with pytest.raises(SemanticsError, match="may never fit"):
        a.admit(a.most_rows + 1, timeout=10)


def test_a_restore_shares_out_the_room_the_checkpoint_left() -> None:
    ranks = group(2)
    full = RateLimiter(MIN, SPI, TOL)
    full.inserts = full.insert_room()  # saved at the band's top: no room left
    for r in ranks:
        r.restored(full.inserts, full.inserts if r.rank == 0 else 0, 0)
    assert not any(push(r, 1) for r in ranks)
    sync(ranks)
    assert ranks[0].limiter.inserts == full.inserts


@pytest.mark.parametrize(("extra", "sampling", "message"), [
    ({}, Sampling.LOCAL, "needs sampling='global'"),
    ({"rate_limit": {"samples_per_insert": 1.0, "tolerance": 16.0}}, Sampling.GLOBAL, "smaller than one exchange"),
    ({"pinned": {"delivery_granularity": "2"}}, Sampling.GLOBAL, "granularity 2"),
    ({"rate_limit": {"samples_per_insert": 1.0, "tolerance": 64.0, "block": False},
      "pinned": {"delivery_overlap": True}}, Sampling.GLOBAL, "block=False with delivery_overlap"),
])
def test_a_ratio_the_group_could_never_keep_is_refused_before_it_forms(extra: dict, sampling: Sampling,
                                                                       message: str) -> None:
    fields = {"policy": "off_policy", "train_batch_size": 8, "capacity": 1000,
              "rate_limit": {"samples_per_insert": 1.0, "tolerance": 32.0}, **extra}
    with pytest.raises(ConfigError, match=message):
        validate_rate(ConduitConfig(**fields), sampling, world=4)
    validate_rate(ConduitConfig(**{**fields, "rate_limit": None}), sampling, world=4)  # no ratio: nothing to keep


def test_local_sampling_from_a_shard_smaller_than_a_batch_is_refused_before_the_group_forms() -> None:
    """Each learner pulls whole batches from its own shard: the smallest shard must hold one (the same
    capacities on every rank, so every rank refuses alike)."""
    from conduit.distributed.options import validate_local

    cfg = ConduitConfig(policy="off_policy", train_batch_size=64, capacity=200)  # 50 rows a shard at 4 ranks
    with pytest.raises(ConfigError, match=r"sampling='local': rank \d's shard holds 50 rows"):
        validate_local(cfg, Sampling.LOCAL, 4, None)
    with pytest.raises(ConfigError, match=r"rank 0's shard holds 40 rows"):  # unequal shares: the smallest
        validate_local(cfg, Sampling.LOCAL, 2, [1.0, 4.0])
    validate_local(cfg, Sampling.GLOBAL, 4, None)  # a global draw takes rows from every shard
    validate_local(cfg, Sampling.LOCAL, 2, None)
