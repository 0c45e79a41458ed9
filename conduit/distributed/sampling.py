"""The sampling math of a sharded buffer: pure functions over explicit inputs, no collectives, no tensors.

**Global sampling is one buffer's distribution.** Every rank knows every shard's
live rows and priority mass (one ``all_gather``), and every rank holds the same
*shared* generator (seeded alike, advanced alike), so each rank computes the
whole request matrix ``counts[requester, shard]`` itself and no counts need to
be exchanged. Each shard then draws its rows with its own sampler:

* uniform: ``counts[r] ~ Multinomial(n, rows_s / sum rows)``; a shard then draws
  uniformly among its rows. Each of the ``n`` draws is uniform over all rows of all
  shards, independently: exactly one buffer's uniform draw with replacement.
* prioritized: the requester's ``n`` stratified points over the global mass
  (one uniform point per segment ``total / n``, as one sum-tree does) counted per
  shard by the shard's mass interval; the shard draws its count stratified over
  its own mass. A row of priority ``p_i`` is drawn ``n p_i / total`` times in
  expectation, as from one tree, with the same low variance of the shard counts.
* importance weights: ``w_i = (p_i / p_min)^-beta`` with ``p_min`` the *global*
  minimum priority, so the global maximum weight is 1, as one buffer normalises.

**On-policy shares**: the iteration is the union of every rank's rows; one shared
permutation per epoch orders them, the permutation splits into ``M`` mini-batches
and each mini-batch into one disjoint part per learner, so every learner's parts
are disjoint from the others' and their union is the mini-batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from conduit.placement.records import largest_remainder

__all__ = [
    "OnPolicyPart",
    "global_weights",
    "on_policy_plan",
    "prioritized_counts",
    "proportional_route",
    "shard_capacities",
    "uniform_counts",
]


def shard_capacities(capacity: int, world: int, shares: Sequence[float] | None = None) -> tuple[int, ...]:
    """Whole rows per shard (largest remainder): equal unless ``shares`` (e.g. a placement's) are given."""
    weights = [1.0] * world if shares is None else [float(s) for s in shares]
    if len(weights) != world:
        raise ValueError(f"shares: expected one per rank ({world}), got {len(weights)}")
    caps = largest_remainder(weights, capacity)
    if min(caps) < 1:
        raise ValueError(f"capacity={capacity} over {world} ranks with shares {weights} leaves a shard empty: {caps}")
    return caps


def uniform_counts(rng: np.random.Generator, wants: Sequence[int], rows: Sequence[int]) -> np.ndarray:
    """``counts[r, s]``: rows requester ``r`` (wanting ``wants[r]``) takes from shard ``s``, uniform over all rows."""
    r = np.asarray(rows, dtype=np.float64)
    if r.sum() <= 0:
        raise ValueError("cannot sample: every shard is empty")
    p = r / r.sum()
    return np.stack([rng.multinomial(int(n), p) for n in wants]).astype(np.int64)


def prioritized_counts(rng: np.random.Generator, wants: Sequence[int], masses: Sequence[float]) -> np.ndarray:
    """``counts[r, s]`` by stratified points over the global priority mass (see the module docstring)."""
    m = np.asarray(masses, dtype=np.float64)
    total = float(m.sum())
    if total <= 0:
        raise ValueError("cannot sample: every live transition has priority 0")
    edges = np.cumsum(m)
    out = np.zeros((len(wants), m.size), dtype=np.int64)
    for r, n in enumerate(wants):
        n = int(n)
        if n <= 0:
            continue
        points = (np.arange(n) + rng.random(n)) * (total / n)
        np.clip(points, 0.0, np.nextafter(total, 0.0), out=points)
        shard = np.searchsorted(edges, points, side="right")
        np.clip(shard, 0, m.size - 1, out=shard)
        out[r] = np.bincount(shard, minlength=m.size)
    return out


def global_weights(leaf_values: np.ndarray, global_min: float, beta: float) -> np.ndarray:
    """Importance weights ``(p_i / p_min)^-beta`` over the global minimum ``p_min`` (leaf values: ``p^alpha``)."""
    return np.power(np.asarray(leaf_values, dtype=np.float64) / global_min, -beta).astype(np.float32)


def proportional_route(routed: np.ndarray, shares: np.ndarray, rows: int) -> int:
    """The shard a unit of ``rows`` goes to under capacity-proportional routing: the one furthest below its
    share of the rows routed so far (``routed`` is updated in place). Deterministic, smooth."""
    after = routed.sum() + rows
    deficit = shares * after - routed
    s = int(np.argmax(deficit))
    routed[s] += rows
    return s


@dataclass(frozen=True)
class OnPolicyPart:
    """One learner's part of one mini-batch: global row positions, and which rank owns each and where."""

    epoch: int
    minibatch: int
    owners: np.ndarray  # int64: the rank holding each row
    local: np.ndarray  # int64: the row's position in its owner's iteration store


def on_policy_plan(
    rng: np.random.Generator, rows_per_rank: Sequence[int], num_minibatches: int, learners: int, epoch: int
) -> list[list[OnPolicyPart]]:
    """For one epoch: ``plan[learner][m]``, the learner's part of mini-batch ``m`` (shared ``rng``: every rank
    computes the same plan). Mini-batches are ``array_split`` of one permutation, parts ``array_split`` of a
    mini-batch, so parts are disjoint and complete."""
    counts = np.asarray(rows_per_rank, dtype=np.int64)
    total = int(counts.sum())
    if total < num_minibatches * learners:
        raise ValueError(
            f"an iteration of {total} rows cannot give {num_minibatches} mini-batches to {learners} learners "
            "at least one row each"
        )
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    perm = rng.permutation(total)
    owner_of = np.searchsorted(np.cumsum(counts), perm, side="right").astype(np.int64)
    local_of = perm - starts[owner_of]
    plan: list[list[OnPolicyPart]] = [[] for _ in range(learners)]
    for m, mb in enumerate(np.array_split(np.arange(total), num_minibatches)):
        for learner, part in enumerate(np.array_split(mb, learners)):
            plan[learner].append(OnPolicyPart(epoch, m, owner_of[part], local_of[part]))
    return plan
