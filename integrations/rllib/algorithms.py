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

RLlib's replay-buffer metrics: in the exact mode they are RLlib's buffer's own
(its ``get_metrics()``, aggregated by RLlib's ``training_step`` as stock). In the
bounded mode the Conduit buffer records them per call for a few integer additions
(:mod:`.buffer_report`); the expensive part — turning them
into RLlib's stats and aggregating them into ``REPLAY_BUFFER_RESULTS`` — runs in
:class:`ConduitAlgorithm`: at the end of a ``training_step`` at most every
``METRICS_INTERVAL_S`` seconds, and always when the algorithm reduces its
metrics (``Algorithm._run_one_training_iteration`` compiles them once, at the
iteration's end), so every value equals stock RLlib's at every iteration's end.
A buffer swapped in by :func:`install_conduit_buffer` under another algorithm
class reports on each ``get_metrics()`` instead (exact too, at stock RLlib's cost).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from ray.rllib.algorithms.dqn import DQN
from ray.rllib.algorithms.sac import SAC
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from conduit import ConfigError

from ._compat import log
from .buffer import ConduitEpisodeReplayBuffer, ConduitPrioritizedEpisodeReplayBuffer, _ConduitReplay
from .learners import ConduitOffPolicyLearner
from .options import Staleness
from .sharded import ShardedReplay, wants_shards
from .sharded import training_step as sharded_training_step

__all__ = ["BUFFER_COMPONENT", "ConduitAlgorithm", "ConduitDQN", "ConduitSAC", "IterationMetricsLogger",
           "install_conduit_buffer", "make_conduit_buffer"]

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
    if wants_shards(algorithm.config):
        return  # the learners hold the buffer (:mod:`.sharded`)
    algorithm.local_replay_buffer = make_conduit_buffer(algorithm.config)
    log.info("conduit: swapped in %s for %s", type(algorithm.local_replay_buffer).__name__, type(algorithm).__name__)


class IterationMetricsLogger(MetricsLogger):
    """The algorithm's root ``MetricsLogger``, running ``before_reduce`` first on every ``reduce()``
    (``compile()`` reduces too), so metrics held back for speed land in the iteration they belong to."""

    def __init__(self, *, before_reduce: Callable[[], object] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.before_reduce = before_reduce

    def reduce(self, compile: bool = False) -> dict:
        if self.before_reduce is not None:
            self.before_reduce()
        return super().reduce(compile=compile)


class ConduitAlgorithm:
    """Mixin (before the RLlib algorithm class): a Conduit buffer that survives checkpoints and
    reports RLlib's replay-buffer metrics exactly at every iteration's end."""

    #: seconds between two flushes of the buffer's metrics within an iteration (the iteration's
    #: end always flushes)
    METRICS_INTERVAL_S: ClassVar[float] = 0.5

    def setup(self, config: Any) -> None:
        # `Algorithm.__init__` has just built `self.metrics`; nothing holds it yet
        self.metrics = IterationMetricsLogger(
            root=True, stats_cls_lookup=self.metrics.stats_cls_lookup, before_reduce=self.flush_buffer_metrics
        )
        self._metrics_flushed_at = time.monotonic()
        super().setup(config)  # type: ignore[misc]
        buffer = getattr(self, "local_replay_buffer", None)
        if isinstance(buffer, _ConduitReplay) and buffer.staleness is Staleness.BOUNDED:
            buffer.defer_metrics = True  # the exact mode's metrics are RLlib's buffer's own, reduced by it
        #: several learners: the buffer sharded over the learner actors (:mod:`.sharded`), else None
        self.conduit_shards = ShardedReplay(self) if wants_shards(self.config) else None

    def training_step(self) -> None:
        if self.conduit_shards is not None:
            sharded_training_step(self, self.conduit_shards)
            return
        super().training_step()  # type: ignore[misc]
        if time.monotonic() - self._metrics_flushed_at >= self.METRICS_INTERVAL_S:
            self.flush_buffer_metrics()

    def flush_buffer_metrics(self) -> int:
        """Aggregate the Conduit buffer's pending RLlib metrics into ``self.metrics`` now; returns
        how many of RLlib's reduce cycles were flushed."""
        self._metrics_flushed_at = time.monotonic()
        shards = getattr(self, "conduit_shards", None)
        if shards is not None:
            shards.log_metrics(self.metrics)
            return 1
        buffer = getattr(self, "local_replay_buffer", None)
        if isinstance(buffer, _ConduitReplay) and buffer.defer_metrics:
            return buffer.flush_metrics(self.metrics)
        return 0

    def _create_local_replay_buffer_if_necessary(self, config: Any) -> Any:
        if wants_shards(config):
            return None  # the learners hold the buffer
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
        shards = getattr(self, "conduit_shards", None)
        if shards is not None and self._check_component(  # type: ignore[attr-defined]
            BUFFER_COMPONENT, components, not_components
        ):
            state[BUFFER_COMPONENT] = {"sharded": shards.state()}
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        saved = state.get(BUFFER_COMPONENT)
        sharded = getattr(self, "conduit_shards", None) is not None
        if isinstance(saved, dict) and ("sharded" in saved) != sharded:  # before anything is loaded
            where = {True: "sharded over the learners (num_learners >= 2)",
                     False: "in the driver (num_learners 0 or 1, or the exact mode)"}
            raise ConfigError(
                f"this checkpoint's replay buffer was kept {where['sharded' in saved]}, this algorithm keeps it "
                f"{where[sharded]}: the two do not load into each other; restore with the learner count it was "
                "saved with (any count of two or more loads a sharded one)"
            )
        super().set_state(state)  # type: ignore[misc]
        buffer = getattr(self, "local_replay_buffer", None)
        if BUFFER_COMPONENT in state and isinstance(buffer, _ConduitReplay):
            buffer.set_state(state[BUFFER_COMPONENT])
        shards = getattr(self, "conduit_shards", None)
        if shards is not None and "sharded" in state.get(BUFFER_COMPONENT, {}):
            shards.load(state[BUFFER_COMPONENT]["sharded"])

    def save_to_path(self, path: Any = None, **kwargs: Any) -> str:
        """RLlib's checkpoint, plus every learner's shard (collective) in its ``conduit_shards`` directory."""
        saved = super().save_to_path(path, **kwargs)  # type: ignore[misc]
        shards = getattr(self, "conduit_shards", None)
        if shards is not None:
            shards.save(saved)
        return saved

    def restore_from_path(self, path: Any, *args: Any, **kwargs: Any) -> None:
        """RLlib's restore, then the shards (re-sharded where the checkpoint had another learner count)."""
        super().restore_from_path(path, *args, **kwargs)  # type: ignore[misc]
        shards = getattr(self, "conduit_shards", None)
        if shards is not None and not kwargs.get("component"):
            shards.restore(path)

    def cleanup(self) -> None:
        shards = getattr(self, "conduit_shards", None)
        if shards is not None:
            shards.close()
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
