"""On-policy delivery: an iteration's rows, shuffled per epoch into ``M`` mini-batches.

Pure index math. Every row appears exactly once per epoch; mini-batch sizes
differ by at most one (``numpy.array_split``); with several data-parallel
learners each mini-batch is split again into one shard per learner.
"""

from __future__ import annotations

import numpy as np

__all__ = ["minibatch_plan", "split"]


def minibatch_plan(
    rows: int,
    num_minibatches: int,
    num_epochs: int,
    rng: np.random.Generator,
    num_learners: int = 1,
    shuffle: bool = True,
) -> list[list[list[np.ndarray]]]:
    """``plan[epoch][minibatch][learner]`` -> row indices (int64) into the iteration."""
    if rows < num_minibatches * num_learners:
        raise ValueError(
            f"an iteration of {rows} rows cannot fill {num_minibatches} mini-batches "
            f"for {num_learners} learner(s)"
        )
    plan = []
    for _ in range(num_epochs):
        order = rng.permutation(rows).astype(np.int64) if shuffle else np.arange(rows, dtype=np.int64)
        plan.append([split(mb, num_learners) for mb in split(order, num_minibatches)])
    return plan


def split(a: np.ndarray, k: int) -> list[np.ndarray]:
    """``numpy.array_split(a, k)`` as views of ``a`` (the first ``len(a) % k`` parts one row longer).

    A plan is drawn on the on-policy critical path (sealing the iteration whose
    first mini-batch the learner waits for), and ``array_split``, called 1 + M
    times, does general-purpose work per call (any axis, any sections) that
    plain slices skip.
    """
    q, r = divmod(len(a), k)
    out, start = [], 0
    for i in range(k):
        end = start + q + (i < r)
        out.append(a[start:end])
        start = end
    return out
