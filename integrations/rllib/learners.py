"""Learner subclasses that consume Conduit-delivered batches (DQN, SAC, PPO; torch).

Off-policy (DQN, SAC): with ``num_learners=0`` the learner lives in the
algorithm's process, so the episodes ``sample()`` returned reach
``Learner._make_batch_if_necessary`` as the very list object. When that list
carries a Conduit-prepared batch (``SampledEpisodes.conduit_batch``), the learner
takes its tensors — the same columns, dtypes and values RLlib's learner
connector would build from those episodes — and neither the episodes nor the
connector run. Anything else (a plain episode list, a batch) goes the stock way.

PPO: ``_create_iterator_if_necessary``'s iterator is wrapped in
:class:`~.pipeline.PipelinedMinibatches`, so mini-batch k+1 is prepared while k
trains; this works with remote learners too, since it runs inside the learner.

Settings come from ``config.learner_config_dict["conduit"]`` (``enable_conduit``
writes them), so nothing unpicklable travels with the config.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.algorithms.sac.torch.sac_torch_learner import SACTorchLearner
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from .pipeline import PipelinedMinibatches, PipelineStats

__all__ = [
    "ConduitDQNTorchLearner",
    "ConduitOffPolicyLearner",
    "ConduitPPOTorchLearner",
    "ConduitSACTorchLearner",
    "learner_settings",
]


def learner_settings(learner: Any) -> dict[str, Any]:
    """``config.learner_config_dict["conduit"]`` of a learner (empty when unset)."""
    cfg = getattr(learner, "config", None)
    d = getattr(cfg, "learner_config_dict", None) or {}
    return dict(d.get("conduit", {}))


class ConduitOffPolicyLearner:
    """Mixin (before the RLlib learner class): train on the replay buffer's prepared tensors."""

    @property
    def conduit_stats(self) -> dict[str, int]:
        stats = self.__dict__.get("_conduit_stats")
        if stats is None:
            stats = self.__dict__["_conduit_stats"] = {"prepared_batches": 0, "connector_batches": 0}
        return stats

    def _make_batch_if_necessary(self, training_data: Any) -> Any:
        episodes = training_data.episodes
        prepared = getattr(episodes, "conduit_batch", None) if episodes is not None else None
        module = self.module  # type: ignore[attr-defined]
        if prepared is None or training_data.batch is not None or len(module) != 1:
            self.conduit_stats["connector_batches"] += 1
            return super()._make_batch_if_necessary(training_data)  # type: ignore[misc]
        device = self._device  # type: ignore[attr-defined]
        columns = {
            k: v if v.device == device else v.to(device, non_blocking=True) for k, v in prepared.columns.items()
        }
        prepared.consumed = True
        self.conduit_stats["prepared_batches"] += 1
        module_id = next(iter(module.keys()))
        return MultiAgentBatch({module_id: SampleBatch(columns)}, env_steps=prepared.size)


class ConduitDQNTorchLearner(ConduitOffPolicyLearner, DQNTorchLearner):
    """DQN's torch learner, fed by a Conduit replay buffer."""


class ConduitSACTorchLearner(ConduitOffPolicyLearner, SACTorchLearner):
    """SAC's torch learner, fed by a Conduit replay buffer."""


class ConduitPPOTorchLearner(PPOTorchLearner):
    """PPO's torch learner with pipelined mini-batches (the same mini-batches, prepared one ahead)."""

    @property
    def conduit_stats(self) -> PipelineStats:
        stats = self.__dict__.get("_conduit_stats")
        if stats is None:
            stats = self.__dict__["_conduit_stats"] = PipelineStats()
        return stats

    def _create_iterator_if_necessary(self, **kwargs: Any) -> Any:
        it = super()._create_iterator_if_necessary(**kwargs)
        settings = learner_settings(self)
        if isinstance(it, dict) or not settings.get("pipeline_minibatches", True):
            return it  # `{}`: nothing to train on this update
        return PipelinedMinibatches(
            it,
            device=self._device,
            depth=int(settings.get("prefetch_depth", 1)),
            timeout_s=float(settings.get("timeout_s", 60.0)),
            stats=self.conduit_stats,
            batch=getattr(it, "_batch", None),
        )
