"""Placement records: validation and whole-sample shard sizes."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conduit.errors import PlacementError
from conduit.placement import Placement, PlacementKind, PlacementRequest, Shard, SharePolicy
from conduit.placement.records import largest_remainder


@given(
    weights=st.lists(st.floats(min_value=0.01, max_value=100.0), min_size=1, max_size=16),
    total=st.integers(min_value=0, max_value=10**9),
)
def test_largest_remainder_is_exact_and_fair(weights: list[float], total: int) -> None:
    parts = largest_remainder(weights, total)
    assert sum(parts) == total
    w_sum = sum(weights)
    for part, w in zip(parts, weights, strict=True):
        quota = total * w / w_sum
        assert quota - 1 - 1e-6 < part < quota + 1 + 1e-6


def test_equal_shares_split_capacity() -> None:
    p = Placement.of(PlacementKind.SHARED_GPU, ["cuda:0", "cuda:1", "cuda:2"])
    assert p.shares == pytest.approx((1 / 3,) * 3)
    assert p.sample_counts(10**6) == (333334, 333333, 333333)
    assert str(p) == "shared_gpu(cuda:0, cuda:1, cuda:2)"
    weighted = Placement.of(PlacementKind.SHARED_GPU, ["cuda:0", "cuda:1"], [3, 1])
    assert weighted.sample_counts(8) == (6, 2)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Placement(PlacementKind.SHARED_GPU, ()), "expected at least one shard"),
        (lambda: Placement.of(PlacementKind.SHARED_GPU, ["cuda:0", "cuda:0"]), "expected distinct devices"),
        (lambda: Placement.of(PlacementKind.SINGLE_GPU, ["cuda:0", "cuda:1"]), "expected 1 shard for kind single_gpu"),
        (
            lambda: Placement(PlacementKind.SHARED_GPU, (Shard("a", 0.5), Shard("b", 0.2))),
            "expected shares summing to 1",
        ),
        (lambda: Shard("cuda:0", 0.0), "Shard.share: expected 0 < share <= 1"),
        (lambda: Placement.of(PlacementKind.SHARED_GPU, ["a", "b"], [1.0]), "expected 2 values"),
        (lambda: Placement("single_gpu", (Shard("a", 1.0),)), "expected a PlacementKind"),  # type: ignore[arg-type]
    ],
)
def test_placement_validation(build: object, message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        build()  # type: ignore[operator]


def test_request_normalizes_and_validates() -> None:
    r = PlacementRequest(actors="cpu", learners=["cuda:0", "cuda:1"], capacity=10, share_policy="memory")  # type: ignore[arg-type]
    assert r.actors == ("cpu",) and r.learners == ("cuda:0", "cuda:1")
    assert r.share_policy is SharePolicy.MEMORY
    with pytest.raises(
        PlacementError, match=re.escape("PlacementRequest.capacity: expected an integer >= 1, received 0")
    ):
        PlacementRequest(actors="cpu", learners="cuda:0", capacity=0)
    with pytest.raises(
        PlacementError, match=re.escape("PlacementRequest.headroom: expected 0 <= headroom < 1, received 1.0")
    ):
        PlacementRequest(actors="cpu", learners="cuda:0", capacity=1, headroom=1.0)
    with pytest.raises(PlacementError, match=re.escape("PlacementRequest.learners: expected one or more device ids")):
        PlacementRequest(actors="cpu", learners=[], capacity=1)
    with pytest.raises(PlacementError, match=re.escape("PlacementRequest.kinds: expected kinds among")):
        PlacementRequest(actors="cpu", learners="cpu", capacity=1, kinds=frozenset({"gpu_cluster"}))  # type: ignore[arg-type]
    with pytest.raises(PlacementError, match=re.escape("PlacementRequest.share_policy: expected one of equal, memory")):
        PlacementRequest(actors="cpu", learners="cpu", capacity=1, share_policy="random")  # type: ignore[arg-type]
