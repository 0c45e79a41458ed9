"""On-policy delivery: an iteration's rows, shuffled per epoch into ``M`` mini-batches.

Pure index math. Every row appears exactly once per epoch; mini-batch sizes
differ by at most one (``numpy.array_split``); with several data-parallel
learners each mini-batch is split again into one shard per learner.
"""

from __future__ import annotations

import numpy as np

__all__ = ["minibatch_plan"]


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
        epoch = []
        for mb in np.array_split(order, num_minibatches):
            epoch.append(list(np.array_split(mb, num_learners)))
        plan.append(epoch)
    return plan
