"""Algorithm-side wiring: build the Conduit buffer, persist it in checkpoints, close it on stop.

RLlib's new API stack builds ``algorithm.local_replay_buffer`` in ``setup`` from
``replay_buffer_config`` and leaves it out of checkpoints. Two mechanisms put a
Conduit buffer there:

- :class:`ConduitAlgorithm` (mixed into :class:`ConduitDQN` / :class:`ConduitSAC`,
  which ``enable_conduit`` installs as ``config.algo_class``) builds it directly
  (no throw-away stock buffer: SAC's default one allocates two 2M-leaf trees),
  adds it to ``get_state`` / ``set_state`` under ``"conduit_replay_buffer"`` (so
  ``save_to_path`` / ``restore_from_path`` / ``from_checkpoint`` carry it), and
  closes it in ``cleanup``.
- :func:`install_conduit_buffer`, an ``on_algorithm_init`` callback, swaps the
  buffer in for any other algorithm class (SAC's config validation accepts only
  the four stock buffer type names, so the type cannot name Conduit's class).

Both read the buffer's options from ``replay_buffer_config["conduit"]`` and
refresh batch size, ``n_step``, ``gamma``, seed and learner device from the
algorithm's final config.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.algorithms.dqn import DQN
from ray.rllib.algorithms.sac import SAC

from ._compat import log
from .buffer import ConduitEpisodeReplayBuffer, ConduitPrioritizedEpisodeReplayBuffer, _ConduitReplay
from .learners import ConduitOffPolicyLearner

__all__ = ["BUFFER_COMPONENT", "ConduitAlgorithm", "ConduitDQN", "ConduitSAC", "install_conduit_buffer",
           "make_conduit_buffer"]

#: The key of the replay buffer's state in ``Algorithm.get_state()``.
BUFFER_COMPONENT = "conduit_replay_buffer"


def _learner_device(config: Any) -> str:
    if config.num_learners == 0 and (config.num_gpus_per_learner or 0) > 0 and torch.cuda.is_available():
        return "cuda:0"
    return "cpu"


def make_conduit_buffer(config: Any) -> _ConduitReplay:
    """The Conduit replay buffer an algorithm with this (Conduit-enabled) config uses."""
    rb = dict(config.replay_buffer_config)
    opts = dict(rb.get("conduit") or {})
    learner_cls = config.learner_class
    local_conduit_learner = config.num_learners == 0 and isinstance(learner_cls, type) and issubclass(
        learner_cls, ConduitOffPolicyLearner
    )
    opts.update(
        train_batch_size=config.total_train_batch_size,
        n_step=config.n_step,
        gamma=config.gamma,
        learner_device=_learner_device(config),
        prepared_batches=bool(opts.get("prepared_batches", True)) and local_conduit_learner
        and config._learner_connector is None,
    )
    if opts.get("seed") is None:
        opts["seed"] = config.seed
    prioritized = "Prioritized" in str(rb.get("type", ""))
    cls = ConduitPrioritizedEpisodeReplayBuffer if prioritized else ConduitEpisodeReplayBuffer
    return cls(
        capacity=int(rb.get("capacity", 50_000)),
        alpha=float(rb.get("alpha", 1.0)),
        beta=float(rb.get("beta") if rb.get("beta") is not None else 0.4),
        metrics_num_episodes_for_smoothing=config.metrics_num_episodes_for_smoothing,
        conduit=opts,
    )


def _wants_conduit(config: Any) -> bool:
    rb = config.replay_buffer_config if hasattr(config, "replay_buffer_config") else None
    return bool(rb) and "conduit" in rb


def install_conduit_buffer(*, algorithm: Any, metrics_logger: Any = None, **kwargs: Any) -> None:
    """``on_algorithm_init`` callback: make sure ``algorithm.local_replay_buffer`` is Conduit's."""
    if not _wants_conduit(algorithm.config) or isinstance(algorithm.local_replay_buffer, _ConduitReplay):
        return
    algorithm.local_replay_buffer = make_conduit_buffer(algorithm.config)
    log.info("conduit: swapped in %s for %s", type(algorithm.local_replay_buffer).__name__, type(algorithm).__name__)


class ConduitAlgorithm:
    """Mixin (before the RLlib algorithm class): a Conduit buffer that survives checkpoints."""

    def _create_local_replay_buffer_if_necessary(self, config: Any) -> Any:
        if _wants_conduit(config) and not config.replay_buffer_config.get("no_local_replay_buffer"):
            return make_conduit_buffer(config)
        return super()._create_local_replay_buffer_if_necessary(config)  # type: ignore[misc]

    def get_state(self, components: Any = None, *, not_components: Any = None, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(components, not_components=not_components, **kwargs)  # type: ignore[misc]
        buffer = getattr(self, "local_replay_buffer", None)
        if isinstance(buffer, _ConduitReplay) and self._check_component(  # type: ignore[attr-defined]
            BUFFER_COMPONENT, components, not_components
        ):
            state[BUFFER_COMPONENT] = buffer.get_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)  # type: ignore[misc]
        buffer = getattr(self, "local_replay_buffer", None)
        if BUFFER_COMPONENT in state and isinstance(buffer, _ConduitReplay):
            buffer.set_state(state[BUFFER_COMPONENT])

    def cleanup(self) -> None:
        try:
            super().cleanup()  # type: ignore[misc]
        finally:
            buffer = getattr(self, "local_replay_buffer", None)
            if isinstance(buffer, _ConduitReplay):
                buffer.close()


class ConduitDQN(ConduitAlgorithm, DQN):
    """DQN whose replay buffer is Conduit's and is saved with its checkpoints."""


class ConduitSAC(ConduitAlgorithm, SAC):
    """SAC whose replay buffer is Conduit's and is saved with its checkpoints."""
