"""``count_replays``: how many batches drew each row (Reverb's ``times_sampled``, SRL's reuses), per batch.

The oracle is the definition, worked out from the batches themselves: a row's count before a batch is the
number of earlier batches (in draw order) that drew that transition -- each batch once, however often it drew
the row -- or, counted at ``"feedback"``, the earlier batches whose priorities landed on it.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import conduit
from conduit import Conduit, ConfigError, Mode, Schedule
from tests.helpers import transitions


def counting(at: str, delivery: Mode, **kw) -> Conduit:
    cfg = dict(policy="off_policy", train_batch_size=6, capacity=16, seed=3, count_replays=at, timeout_s=10.0)
    cfg.update(kw)
    return Conduit(pinned=Schedule(Mode(False, 1), delivery), **cfg)


@pytest.mark.parametrize("delivery", [Mode(False, 1), Mode(True, 1), Mode(True, 2)], ids=str)
def test_each_batch_reports_how_many_earlier_batches_drew_each_of_its_rows(delivery):
    """Counted at the draw, in draw order (prefetched batches too), once per batch; a slot written again starts
    its new row at 0 -- the ring wraps twice while batches are drawn."""
    seen: Counter[int] = Counter()
    with counting("draw", delivery) as edp:
        edp.push(transitions(16))
        edp.flush()
        for step in range(30):
            b = edp.pull()
            ids = b.info.ids.tolist()
            assert b.info.times_sampled.tolist() == [seen[i] for i in ids]
            seen.update(set(ids))
            if step % 10 == 9:
                edp.push(transitions(8, start=16 + 8 * (step // 10)))
                edp.flush()
        assert max(seen.values()) > 1  # rows were drawn again, and twice in one batch somewhere
    with counting("draw", Mode(False, 1), capacity=8, train_batch_size=8, min_size_to_sample=4) as edp:
        edp.push(transitions(4))  # 8 draws from 4 rows: each batch draws some row twice
        first = edp.pull().info
        assert len(set(first.ids.tolist())) < 8 and first.times_sampled.tolist() == [0] * 8
        second = edp.pull().info
        assert second.times_sampled.tolist() == [int(i in set(first.ids.tolist())) for i in second.ids.tolist()]


def test_counted_at_feedback_only_the_batches_whose_priorities_landed_count_each_once():
    """A batch without feedback is not counted; one updated twice (a second gradient step on it) counts once."""
    fed: Counter[int] = Counter()
    with counting("feedback", Mode(False, 1), sampler="prioritized") as edp:
        edp.push(transitions(16))
        for step in range(12):
            b = edp.pull()
            ids = b.info.ids.tolist()
            assert b.info.times_sampled.tolist() == [fed[i] for i in ids]
            if step % 3:  # every third batch gets no feedback, and is not counted
                edp.update_priorities(b, torch.rand(6) + 0.1)
                if step % 2:  # a second update moves priorities, not the counts
                    edp.update_priorities(b, torch.rand(6) + 0.1)
                fed.update(set(ids))
        assert sum(fed.values()) > 0


def test_counts_survive_a_checkpoint_and_cost_nothing_when_off(tmp_path):
    with counting("draw", Mode(False, 1)) as a:
        a.push(transitions(16))
        for _ in range(5):
            a.pull()
        a.save(tmp_path / "c")
        after = [a.pull().info.times_sampled.tolist() for _ in range(3)]
    with Conduit.from_checkpoint(tmp_path / "c") as b:
        assert [b.pull().info.times_sampled.tolist() for _ in range(3)] == after
    with Conduit(policy="off_policy", train_batch_size=4, capacity=8) as plain:
        plain.push(transitions(8))
        assert plain.pull().info.times_sampled is None


def test_count_replays_is_refused_where_it_means_nothing():
    with pytest.raises(ConfigError, match="needs sampler='prioritized'"):
        conduit.ConduitConfig(policy="off_policy", train_batch_size=4, capacity=8, count_replays="feedback")
    with pytest.raises(ConfigError, match="count_replays"):
        conduit.ConduitConfig(policy="on_policy", train_batch_size=4, count_replays="draw")


def test_count_replays_is_refused_across_ranks_until_the_group_path_counts():
    from conduit.distributed.options import Routing, validate

    cfg = conduit.ConduitConfig(policy="off_policy", train_batch_size=4, capacity=8, count_replays="draw")
    with pytest.raises(ConfigError, match="count_replays: not supported across ranks"):
        validate(cfg, Routing.LOCAL)
