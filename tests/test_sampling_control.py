"""Reverb's useful sampling controls: selectors, removers, max_times_sampled, rate limiting."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from conduit import Conduit, ConduitConfig, Mode, Schedule
from conduit.errors import ConduitTimeout, ConfigError, RateLimited
from conduit.ratelimit import RateLimiter
from conduit.slots import FifoRemover, LifoRemover, SlotTable, UniformRemover
from tests.helpers import transitions

INLINE = Schedule(Mode(False, 1), Mode(False, 1))


def runtime(**kw) -> Conduit:
    cfg = dict(policy="off_policy", train_batch_size=4, capacity=16, seed=0, timeout_s=2.0, pinned=INLINE)
    cfg.update(kw)
    return Conduit(**cfg)


def test_fifo_selector_with_max_times_sampled_one_is_a_queue():
    with runtime(sampler="fifo", max_times_sampled=1, min_size_to_sample=4) as edp:
        edp.push(transitions(12))
        got = [edp.pull()["tid"].tolist() for _ in range(3)]
        assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
        assert edp.buffer.size == 0 and edp.buffer.evicted_by_sampling == 12


def test_lifo_selector_returns_the_newest_first():
    with runtime(sampler="lifo") as edp:
        edp.push(transitions(10))
        assert edp.pull()["tid"].tolist() == [9, 8, 7, 6]


def test_max_times_sampled_evicts_rows_after_n_deliveries_and_frees_their_slots():
    with runtime(capacity=8, train_batch_size=8, sampler="fifo", max_times_sampled=2, min_size_to_sample=1) as edp:
        edp.push(transitions(8))
        edp.pull()
        assert edp.buffer.size == 8
        edp.pull()
        assert edp.buffer.size == 0
        edp.push(transitions(3, start=100))  # freed slots are reused, nothing else evicted
        assert sorted(edp.buffer.contents()["tid"].tolist()) == [100, 101, 102]


def test_inline_pulls_count_their_rows_as_sampled_at_once_with_nothing_reserved():
    with runtime(rate_limit={"samples_per_insert": 1.0, "tolerance": 64.0}) as edp:
        edp.push(transitions(16))
        limiter = edp.delivery.limiter
        reserved = []
        limiter.reserve = reserved.append  # the direct inline pull samples and delivers in one step
        for _ in range(3):
            edp.pull()
        assert limiter.samples == 12 and limiter.reserved == 0 and reserved == []


def test_a_prefetched_batch_never_delivered_is_not_counted_as_sampled():
    edp = runtime(capacity=64, max_times_sampled=1, min_size_to_sample=4, pinned=Schedule(Mode(False, 1), Mode(True, 2)))
    with edp:
        edp.push(transitions(64))
        b = edp.pull()
        time.sleep(0.05)  # let the worker stage the rest of its invocation (and maybe the next)
        delivered = set(b.info.ids.tolist())
        assert int(edp.buffer.table.times_sampled.sum()) == len(b.info.ids) - (len(b.info.ids) - len(delivered))
        assert edp.buffer.evicted_by_sampling == len(delivered)
        limiter = edp.delivery.limiter
        assert limiter.samples == 4 and limiter.reserved >= 0
    assert limiter.reserved == 0 and limiter.samples == 4  # close released the staged reservations


@pytest.mark.parametrize(
    "remover, evicted",
    [(FifoRemover(), [0, 1]), (LifoRemover(), [3, 4])],
    ids=["fifo", "lifo"],
)
def test_removers_choose_their_victims(remover, evicted):
    t = SlotTable(5)
    t.occupy(np.arange(5), 0)  # slot i holds transition i
    victims = remover.choose(2, t.valid_slots(), t.ids, None, np.random.default_rng(0))
    assert sorted(t.ids[victims].tolist()) == evicted


def test_uniform_remover_chooses_distinct_live_slots():
    t = SlotTable(10)
    t.occupy(np.arange(10), 0)
    victims = UniformRemover().choose(4, t.valid_slots(), t.ids, None, np.random.default_rng(0))
    assert len(set(victims.tolist())) == 4 and all(t.valid[victims])


def test_lifo_remover_keeps_the_oldest_rows_in_a_full_buffer():
    with runtime(capacity=8, remover="lifo", min_size_to_sample=1) as edp:
        edp.push(transitions(8))
        edp.push(transitions(2, start=8))
        assert sorted(edp.buffer.contents()["tid"].tolist()) == [0, 1, 2, 3, 4, 5, 8, 9]


def test_uniform_remover_keeps_capacity_and_every_new_row():
    with runtime(capacity=8, remover="uniform", min_size_to_sample=1) as edp:
        edp.push(transitions(8))
        edp.push(transitions(3, start=8))
        tids = edp.buffer.contents()["tid"].tolist()
        assert len(tids) == 8 and {8, 9, 10} <= set(tids)


def test_prioritized_remover_evicts_the_lowest_priorities():
    with runtime(capacity=4, sampler="prioritized", remover="prioritized", min_size_to_sample=1) as edp:
        edp.push(transitions(4))
        b = edp.pull()
        edp.update_priorities(b, np.where(b["tid"].numpy() == b["tid"].numpy().min(), 1e-3, 10.0))
        low = int(b["tid"].min())
        edp.push(transitions(1, start=50))
        assert low not in edp.buffer.contents()["tid"].tolist()


def test_rate_limiter_band_arithmetic():
    rl = RateLimiter(min_size=4, samples_per_insert=2.0, tolerance=8)
    assert rl.can_insert(4)  # below min_size always
    rl.insert(4)
    assert rl.can_sample(4, 4) and not rl.can_sample(4, 3)
    rl.insert(4)  # diff = 16 = centre(8) + 8: at the upper edge
    assert not rl.can_insert(1)
    rl.reserve(8)
    assert rl.can_insert(4)  # reservations count against the ratio
    rl.release(8)
    assert not rl.can_insert(1)
    rl.reserve(8)
    rl.commit(8)
    assert rl.samples == 8 and rl.reserved == 0


def test_blocking_rate_limit_holds_actors_until_learners_sample():
    edp = runtime(capacity=1000, min_size_to_sample=4, rate_limit=dict(samples_per_insert=1.0, tolerance=8))
    with edp:
        edp.push(transitions(4))
        edp.push(transitions(8, start=4))  # diff hits the band's top
        done = threading.Event()

        def actor():
            edp.push(transitions(4, start=12))
            done.set()

        t = threading.Thread(target=actor)
        t.start()
        assert not done.wait(0.2)  # blocked: learners must sample first
        edp.pull()
        assert done.wait(2.0)
        t.join()


def test_non_blocking_rate_limit_raises_at_once():
    edp = runtime(capacity=1000, min_size_to_sample=4, rate_limit=dict(samples_per_insert=1.0, tolerance=4, block=False))
    with edp:
        edp.push(transitions(8))
        with pytest.raises(RateLimited):
            edp.push(transitions(4, start=8))
        edp.pull()
        edp.pull()  # diff = 8 - 8 = 0: the band's bottom (centre 4 - tolerance 4)
        with pytest.raises(RateLimited, match="sample/insert ratio"):
            edp.pull()  # learners would get ahead of the ratio


def test_blocking_pull_times_out_when_actors_stop():
    edp = runtime(capacity=1000, min_size_to_sample=4, timeout_s=0.3, rate_limit=dict(samples_per_insert=1.0, tolerance=4))
    with edp:
        edp.push(transitions(8))
        edp.pull()
        edp.pull()
        with pytest.raises(ConduitTimeout, match="rate limiter"):
            edp.pull()


def test_sampling_controls_are_validated():
    with pytest.raises(ConfigError, match="needs sampler='prioritized'"):
        ConduitConfig(policy="off_policy", train_batch_size=4, capacity=8, remover="prioritized")
    with pytest.raises(ConfigError, match="smaller than one batch"):
        ConduitConfig(policy="off_policy", train_batch_size=4, capacity=8, rate_limit=dict(samples_per_insert=1, tolerance=2))
    with pytest.raises(ConfigError, match="max_times_sampled"):
        ConduitConfig(policy="on_policy", train_batch_size=8, max_times_sampled=1)


# -- pull(rows=n): a batch of another size than train_batch_size ------------------------------------------------------
def test_a_pull_of_other_rows_takes_the_next_pull_index_and_staged_batches_keep_their_turn():
    seen = []
    edp = runtime(capacity=64, pinned=Schedule(Mode(False, 1), Mode(True, 1)))

    @edp.register_delivery(input="ExperienceBuffer", output="Learner")
    def hook(exp_in, learn_out):  # the delivery hook runs on it as on any batch
        data = exp_in.read()
        seen.append(int(data["tid"].shape[0]))
        learn_out.write(data)

    with edp:
        edp.push(transitions(32))
        first = edp.pull()
        deadline = time.monotonic() + 2.0
        while not edp.delivery.staged[0] and time.monotonic() < deadline:  # the worker stages the next batch
            time.sleep(0.005)
        odd = edp.pull(rows=7)
        after = edp.pull()
        assert [b["tid"].shape[0] for b in (first, odd, after)] == [4, 7, 4]
        assert [b.info.pull_index for b in (first, odd, after)] == [0, 1, 2]
        assert odd.info.mode == Mode(False, "7/4") and len(odd.info.ids) == 7
        assert after.info.sampled_at_pull == 1 and after.info.mode.overlap  # drawn before the odd pull, kept
        assert 7 in seen and edp.stats().delivered_rows == 15
        assert edp.pull(rows=4).info.mode.overlap  # the configured size is a normal pull


def test_a_pull_of_other_rows_is_gated_and_counted_like_any_pull():
    with runtime(capacity=64, min_size_to_sample=8, timeout_s=0.2, max_times_sampled=1) as edp:
        edp.push(transitions(6))
        with pytest.raises(ConduitTimeout, match="min_size_to_sample"):
            edp.pull(rows=3)  # six rows: sampling starts at eight
        edp.push(transitions(10, start=6))
        got = [set(edp.pull(rows=n)["tid"].tolist()) for n in (5, 3)]  # 16 rows, then 11 left: both served
        assert len(got[0]) == 5 and len(got[1]) == 3 and not got[0] & got[1]  # each row used at most once
        assert edp.buffer.evicted_by_sampling == 8 and edp.delivery.limiter.samples == 8
        with pytest.raises(ValueError, match="at least one row"):
            edp.pull(rows=0)
    with runtime(rate_limit=dict(samples_per_insert=1.0, tolerance=4, block=False), min_size_to_sample=4) as edp:
        edp.push(transitions(8))
        edp.pull(rows=8)  # eight sampled for eight inserted: the band's bottom
        with pytest.raises(RateLimited, match="sample/insert ratio"):
            edp.pull(rows=3)


def test_on_policy_refuses_a_pull_of_other_rows():
    from conduit.errors import SemanticsError

    edp = Conduit(policy="on_policy", train_batch_size=8, rollout_unit_size=8, num_minibatches=2, seed=0)
    with edp, pytest.raises(SemanticsError, match="replay buffer"):
        edp.pull(rows=3)
