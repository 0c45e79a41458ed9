"""``stats(algo)``: what Conduit did inside an RLlib algorithm, read through public APIs only.

Off-policy algorithms (DQN, SAC) keep Conduit's replay buffer in the algorithm's
process (``algo.local_replay_buffer``); in bounded mode that buffer runs a
:class:`conduit.Conduit` runtime. The learners (in-process or Ray actors) keep
their own counters: prepared vs connector-built batches off-policy, pipelined
mini-batches for PPO. Learners are reached with RLlib's public
``LearnerGroup.foreach_learner``, which runs on the local learner in-process and
on each remote learner actor, so the same call works for ``num_learners=0`` and
``num_learners>=1``. With the buffer sharded over the learners (``num_learners >= 2``), each
shard's counters come from its learner (:class:`ShardStats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conduit import RuntimeStats
from conduit.distributed import DistributedStats

from .buffer import ConduitBufferStats, _ConduitReplay
from .learners import ConduitOffPolicyLearner, ConduitPPOTorchLearner
from .pipeline import PipelineStats

__all__ = ["ConduitStats", "LearnerStats", "ShardStats", "stats"]


@dataclass(frozen=True)
class LearnerStats:
    """One learner's Conduit counters (``index``: its place in the learner group, 0 for a local one)."""

    index: int
    #: off-policy learners: batches taken as the buffer's prepared tensors / built by RLlib's connector
    prepared_batches: int = 0
    connector_batches: int = 0
    #: PPO learners: the mini-batch pipeline's counters (None for other learners)
    pipeline: PipelineStats | None = None


@dataclass(frozen=True)
class ShardStats:
    """One learner's shard of a sharded buffer (``num_learners >= 2``): its rank, the rows its learner pulled,
    and the group's exactly-once counters per rank as that rank saw them (the same on every rank)."""

    rank: int
    sampled: int
    group: DistributedStats


@dataclass(frozen=True)
class ConduitStats:
    """Conduit's counters in one algorithm, at the time of the call.

    ``buffer``: the replay buffer's counters (DQN/SAC; None without a Conduit buffer, e.g. PPO).
    ``runtime``: the bounded-mode buffer's :class:`conduit.Conduit` runtime counters (None in exact
    mode, or before the first ``sample()`` started the runtime).
    ``learners``: one entry per learner carrying a Conduit learner class, in the learner group's
    order; kept apart rather than summed, since each learner trains on its own shard.
    """

    buffer: ConduitBufferStats | None
    runtime: RuntimeStats | None
    learners: tuple[LearnerStats, ...]
    #: the learners' shards, by rank (empty unless the buffer is sharded over the learners)
    shards: tuple[ShardStats, ...] = ()

    @property
    def pipeline(self) -> PipelineStats | None:
        """The PPO pipelines' counters summed over the learners (None if no learner pipelines)."""
        parts = [learner.pipeline for learner in self.learners if learner.pipeline is not None]
        if not parts:
            return None
        total = PipelineStats()
        for p in parts:
            for name, value in p.as_dict().items():
                setattr(total, name, getattr(total, name) + value)
        return total


def _learner_stats(learner: Any) -> dict[str, Any] | None:
    """Runs on each learner (in-process or in its actor): its Conduit counters, picklable."""
    if isinstance(learner, ConduitPPOTorchLearner):
        return {"pipeline": PipelineStats(**learner.conduit_stats.as_dict())}
    if isinstance(learner, ConduitOffPolicyLearner):
        return dict(learner.conduit_stats)
    return None


def stats(algo: Any) -> ConduitStats:
    """Conduit's counters of ``algo`` (any algorithm ``enable_conduit`` configured): its replay buffer,
    the buffer's runtime, and every learner, local or remote.

    Raises ``TypeError`` if ``algo`` has neither a Conduit buffer nor a Conduit learner.
    """
    buffer = getattr(algo, "local_replay_buffer", None)
    buffer_stats = runtime = None
    if isinstance(buffer, _ConduitReplay):
        buffer_stats = ConduitBufferStats(**buffer.conduit_stats())
        runtime = buffer.runtime_stats()
    learners: list[LearnerStats] = []
    group = getattr(algo, "learner_group", None)
    if group is not None:
        for i, result in enumerate(group.foreach_learner(_learner_stats)):
            found = result.get()
            if found is not None:
                learners.append(LearnerStats(index=i, **found))
    sharded = getattr(algo, "conduit_shards", None)
    shards = tuple(ShardStats(rank=c["rank"], sampled=c["sampled"], group=c["stats"])
                   for c in sharded.shard_counts()) if sharded is not None else ()
    if buffer_stats is None and not learners and not shards:
        raise TypeError(
            f"stats: {type(algo).__name__} has no Conduit replay buffer and no Conduit learner; "
            "build it from a config passed through enable_conduit(config)"
        )
    return ConduitStats(buffer=buffer_stats, runtime=runtime, learners=tuple(learners), shards=shards)
