"""How much of an iteration the experience path costs, measured the same way with and without Conduit.

The exposed experience-path latency (docs/design.md §4) is the time the training
loop waits on experience handling: for DQN/SAC the replay buffer's ``add``,
``sample``, ``get_metrics`` and ``update_priorities`` plus the learner turning
the sample into a train batch (``_make_batch_if_necessary``: RLlib's learner
connector, or taking Conduit's prepared tensors); for PPO the learner connector
(with GAE) plus the time the update loop waits for its next mini-batch.
Work Conduit overlaps with rollout or update on its own threads is hidden and
not counted — only what the loop waits for is.

:class:`ExperiencePathTimer` wraps those methods on the live objects (the
algorithm's buffer and its in-process learner), so stock RLlib and Conduit are
measured by the same code. With learner actors (``num_learners >= 1``) only the
driver's side is timed: the buffer's calls, or with the buffer sharded over the
learners, the driver's ``add`` plus the slowest learner's pull of each update;
a learner actor's connector (stock RLlib) is inside its update and not counted.

The timing itself is the core's (:mod:`conduit.exposure`): this module says which
of RLlib's calls are the experience path.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from conduit.ext import WaitTimer, measure_interleaved, summary_table

__all__ = ["ExperiencePathTimer", "measure_iterations", "summary_table"]

_BUFFER_METHODS = ("add", "sample", "get_metrics", "update_priorities")


class ExperiencePathTimer(WaitTimer):
    """Accumulates exposed experience-path seconds of one algorithm (in-process learner)."""

    def __init__(self, algo: Any) -> None:
        super().__init__()
        buffer = getattr(algo, "local_replay_buffer", None)
        if buffer is not None:
            for name in _BUFFER_METHODS:
                self.wrap(buffer, name, f"buffer.{name}")
        shards = getattr(algo, "conduit_shards", None)
        if shards is not None:
            self.wrap(shards, "add", "shards.add")
            original_train = shards.train

            @functools.wraps(original_train)
            def train(*args: Any, **kwargs: Any) -> Any:
                before = shards.pull_s  # the slowest learner's pulls of each update
                try:
                    return original_train(*args, **kwargs)
                finally:
                    self.charge("shards.pull", shards.pull_s - before)

            self.patch(shards, "train", train)
        learner = getattr(algo.learner_group, "_learner", None) if algo.config.num_learners == 0 else None
        if learner is not None:
            self.wrap(learner, "_make_batch_if_necessary", "learner.make_batch")
            self.wrap_iterators(learner, "_create_iterator_if_necessary", "minibatch_wait")


def measure_iterations(
    algos: Mapping[str, Any], iterations: int, verbose: bool = True
) -> dict[str, list[dict[str, Any]]]:
    """Train each algorithm ``iterations`` times, interleaved (A, B, A, B, ...)
    (:func:`conduit.exposure.measure_interleaved`). Per iteration: wall time, exposed experience-path time and its
    share, mean episode return, env steps."""
    timers = {label: ExperiencePathTimer(algo) for label, algo in algos.items()}
    try:
        return measure_interleaved({label: algo.train for label, algo in algos.items()}, timers, iterations,
                                   describe=_rllib_result, verbose=verbose)
    finally:
        for timer in timers.values():
            timer.close()


def _rllib_result(result: Mapping[str, Any]) -> dict[str, Any]:
    runners = result.get("env_runners", {})
    return {"return_mean": runners.get("episode_return_mean"),
            "env_steps": runners.get("num_env_steps_sampled_lifetime")}
