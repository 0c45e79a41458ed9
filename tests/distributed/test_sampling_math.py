"""The pure sampling math of a sharded buffer (no process group): request matrices, plans, layouts."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from conduit.distributed import sampling as smp
from conduit.distributed.exchange import META_ID, META_SLOT, RowLayout, dumps, loads
from conduit.spec import ExperienceSpec


def test_uniform_counts_are_multinomial_over_shard_rows():
    rng = np.random.default_rng(0)
    counts = smp.uniform_counts(rng, [1000] * 200, [10, 30, 60])
    assert (counts.sum(axis=1) == 1000).all()
    assert np.allclose(counts.mean(axis=0) / 1000, [0.1, 0.3, 0.6], atol=0.01)
    assert (smp.uniform_counts(rng, [50], [0, 5, 0])[0] == [0, 50, 0]).all()  # empty shards get nothing


def test_prioritized_counts_are_stratified_over_the_global_mass():
    rng = np.random.default_rng(1)
    masses = [1.0, 0.0, 3.0, 4.0]
    counts = smp.prioritized_counts(rng, [64] * 100, masses)
    assert (counts.sum(axis=1) == 64).all() and (counts[:, 1] == 0).all()
    expected = 64 * np.array(masses) / sum(masses)
    assert (np.abs(counts - expected) <= 1).all()  # stratification: within one row of the expectation
    assert np.allclose(counts.mean(axis=0), expected, atol=0.2)


def test_global_weights_normalise_by_the_global_minimum():
    w = smp.global_weights(np.array([2.0, 4.0, 8.0]), 2.0, 0.5)
    assert w.tolist() == pytest.approx([1.0, 2**-0.5, 0.5])


def test_shard_capacities_follow_shares_exactly():
    assert smp.shard_capacities(10, 3) == (4, 3, 3)
    assert smp.shard_capacities(100, 2, [1.0, 3.0]) == (25, 75)
    with pytest.raises(ValueError, match="leaves a shard empty"):
        smp.shard_capacities(2, 3)


def test_proportional_routing_tracks_the_shares():
    routed = np.zeros(3)
    shares = np.array([0.5, 0.25, 0.25])
    picks = [smp.proportional_route(routed, shares, 4) for _ in range(40)]
    assert np.bincount(picks, minlength=3).tolist() == [20, 10, 10]


@pytest.mark.parametrize(("rows", "m", "learners"), [((5, 9, 2), 4, 3), ((16,), 4, 1), ((0, 7, 7), 2, 2)])
def test_on_policy_plan_is_disjoint_and_complete(rows, m, learners):
    plan = smp.on_policy_plan(np.random.default_rng(2), rows, m, learners, epoch=0)
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]])
    seen = []
    for mb in range(m):
        parts = [starts[p.owners] + p.local for p in (plan[r][mb] for r in range(learners))]
        assert all(len(p) for p in parts)
        seen += [int(x) for p in parts for x in p]
    assert sorted(seen) == list(range(sum(rows)))
    assert all((p.local < np.asarray(rows)[p.owners]).all() for per in plan for p in per)


def test_row_layout_views_round_trip_every_dtype():
    spec = ExperienceSpec.of(obs=((3,), "float32"), a=((), "int64"), done=((), "bool"), h=((2, 2), "float16"),
                             z=((), "complex128"))  # after fields of 8-byte multiples: needs 16-byte alignment
    layout = RowLayout.of(spec, meta=True)
    buf = torch.zeros(layout.block_bytes(5) + layout.block_bytes(3), dtype=torch.uint8)
    first = layout.views(buf, 0, 5)
    assert all(v.data_ptr() % 16 == 0 for v in first.values())
    first["z"].copy_(torch.arange(5) * (1 + 1j))
    assert layout.views(buf, 0, 5)["z"].tolist() == [k * (1 + 1j) for k in range(5)]
    first["obs"].copy_(torch.arange(15, dtype=torch.float32).view(5, 3))
    first["done"].copy_(torch.tensor([True, False, True, False, True]))
    first[META_SLOT].copy_(torch.arange(5))
    second = layout.views(buf, layout.block_bytes(5), 3)
    second[META_ID].fill_(7)
    again = layout.views(buf, 0, 5)
    assert again["obs"].flatten().tolist() == list(range(15))
    assert again["done"].tolist() == [True, False, True, False, True]
    assert layout.views(buf, layout.block_bytes(5), 3)[META_ID].tolist() == [7, 7, 7]


def test_small_payloads_round_trip_and_refuse_code():
    obj = {"units": [{"x": torch.arange(3)}], "priorities": [[torch.tensor([1]), torch.tensor([2]), torch.ones(1)]]}
    back = loads(dumps(obj))
    assert back["units"][0]["x"].tolist() == [0, 1, 2]

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.warns(UserWarning), pytest.raises(Exception, match=r"[Ww]eights only|Unsupported"):
        loads(torch.frombuffer(bytearray(pickle.dumps(Evil())), dtype=torch.uint8))
