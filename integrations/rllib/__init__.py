"""Conduit for RLlib: DQN, SAC and PPO on RLlib's new API stack, its control flow untouched.

::

    from ray.rllib.algorithms.dqn import DQNConfig
    from conduit.integrations.rllib import enable_conduit

    config = enable_conduit(DQNConfig().environment("CartPole-v1"))
    algo = config.build_algo()

What ``enable_conduit`` switches on:

- DQN / SAC: the replay buffer becomes a :class:`ConduitPrioritizedEpisodeReplayBuffer`
  (or :class:`ConduitEpisodeReplayBuffer`): RLlib's interface outside, Conduit's
  runtime inside (columnar storage, overlapped ingestion, prefetching delivery,
  generation-checked priority updates); ``staleness="exact"`` runs RLlib's own
  buffer inside instead (its draws and metrics are RLlib's). With an in-process
  learner, the learner takes the buffer's prepared tensors instead of rebuilding
  them from episodes.
- PPO: the learner prepares mini-batch k+1 while k trains (same mini-batches).
- Checkpoints include the buffer (RLlib's new stack leaves it out).
- RLlib's replay-buffer metrics are RLlib's buffer's own in the exact mode; the
  bounded mode reports RLlib's keys, its differences listed in :mod:`.buffer`.
- :func:`stats` reads Conduit's counters of an algorithm (buffer, runtime, every learner).

Importing this package imports Ray; ``import conduit`` never does.
"""

from __future__ import annotations

from . import _compat  # noqa: F401  (fails early, with the pip command, when ray is missing)
from ._compat import TESTED_RAY_RANGE
from .algorithms import BUFFER_COMPONENT, ConduitAlgorithm, ConduitDQN, ConduitSAC, install_conduit_buffer
from .buffer import ConduitBufferStats, ConduitEpisodeReplayBuffer, ConduitPrioritizedEpisodeReplayBuffer
from .enable import enable_conduit
from .episodes import PreparedBatch, SampledEpisodes
from .learners import (
    ConduitDQNTorchLearner,
    ConduitOffPolicyLearner,
    ConduitPPOTorchLearner,
    ConduitSACTorchLearner,
)
from .options import ConduitRLlibOptions, Staleness
from .pipeline import PipelinedMinibatches, PipelineStats
from .profiling import ExperiencePathTimer, measure_iterations, summary_table
from .quiet import quiet_ray_startup
from .stats import ConduitStats, LearnerStats, ShardStats, stats

__all__ = [
    "BUFFER_COMPONENT",
    "TESTED_RAY_RANGE",
    "ConduitAlgorithm",
    "ConduitBufferStats",
    "ConduitDQN",
    "ConduitDQNTorchLearner",
    "ConduitEpisodeReplayBuffer",
    "ConduitOffPolicyLearner",
    "ConduitPPOTorchLearner",
    "ConduitPrioritizedEpisodeReplayBuffer",
    "ConduitRLlibOptions",
    "ConduitSAC",
    "ConduitSACTorchLearner",
    "ConduitStats",
    "ExperiencePathTimer",
    "LearnerStats",
    "PipelineStats",
    "PipelinedMinibatches",
    "PreparedBatch",
    "SampledEpisodes",
    "ShardStats",
    "Staleness",
    "enable_conduit",
    "install_conduit_buffer",
    "measure_iterations",
    "quiet_ray_startup",
    "stats",
    "summary_table",
]
