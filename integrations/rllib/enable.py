"""``enable_conduit(config, **options) -> config``: one call that switches Conduit on.

For a ``DQNConfig`` or ``SACConfig`` it sets ``replay_buffer_config`` (type,
capacity, alpha and beta always together: RLlib replaces the whole dict when the
type changes, and DQN's ``training_step`` reads ``beta`` from it; the type is a
dotted string for DQN, because a class object passes validation and then breaks
a substring check in ``Algorithm.setup``, and a stock name for SAC, whose
validation accepts nothing else), the algorithm class that builds and persists
the Conduit buffer, the ``on_algorithm_init`` swap for other algorithm classes,
and the learner class that takes prepared tensors. For a ``PPOConfig`` it sets
the learner class with pipelined mini-batches. Options are validated
(:class:`~.options.ConduitRLlibOptions`); a problem raises
:class:`conduit.ConfigError` naming the option.

**Several learner actors (``num_learners >= 2``) shard the buffer over them** (DQN/SAC, bounded
mode; ``sharded=False`` keeps one buffer in the driver): :mod:`.sharded` replaces the buffer's
calls in ``training_step`` with the learners' shards, each a rank of :mod:`conduit.distributed`.
The exact mode is RLlib's one buffer, bit for bit, and stays in the driver.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.dqn import DQN, DQNConfig
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.algorithms.sac import SAC, SACConfig

from conduit import ConfigError

from ._compat import log
from .algorithms import ConduitAlgorithm, ConduitDQN, ConduitSAC, install_conduit_buffer
from .learners import ConduitDQNTorchLearner, ConduitOffPolicyLearner, ConduitPPOTorchLearner, ConduitSACTorchLearner
from .options import BufferOptions, ConduitRLlibOptions, Staleness, parse_options

__all__ = ["enable_conduit"]

_DQN_TYPES = {
    True: "conduit.integrations.rllib.ConduitPrioritizedEpisodeReplayBuffer",
    False: "conduit.integrations.rllib.ConduitEpisodeReplayBuffer",
}
_SAC_TYPES = {True: "PrioritizedEpisodeReplayBuffer", False: "EpisodeReplayBuffer"}


def enable_conduit(config: Any, **options: Any) -> Any:
    """Switch Conduit on for a DQN, SAC or PPO config (new API stack, torch); returns ``config``."""
    opts = parse_options(ConduitRLlibOptions, options, "enable_conduit")
    if not (config.enable_rl_module_and_learner and config.enable_env_runner_and_connector_v2):
        raise ConfigError("enable_conduit: the RLlib adapter needs the new API stack (RLModule/Learner, EnvRunner v2)")
    if config.framework_str != "torch":
        raise ConfigError(f"enable_conduit: framework={config.framework_str!r}; the adapter supports 'torch'")
    if type(config) not in (DQNConfig, SACConfig, PPOConfig):  # a subclass is another algorithm (CQL is a SAC's)
        raise ConfigError(
            f"enable_conduit: expected a DQNConfig, SACConfig or PPOConfig, got {type(config).__name__} "
            f"({getattr(config.algo_class, '__name__', config.algo_class)}: its learner would be replaced)"
        )
    if isinstance(config, SACConfig):
        _enable_off_policy(config, opts, SAC, ConduitSAC, ConduitSACTorchLearner, _SAC_TYPES)
    elif isinstance(config, DQNConfig):
        _enable_off_policy(config, opts, DQN, ConduitDQN, ConduitDQNTorchLearner, _DQN_TYPES)
    elif isinstance(config, PPOConfig):
        _set_learner(config, ConduitPPOTorchLearner, ConduitPPOTorchLearner)
    else:
        raise ConfigError(
            f"enable_conduit: expected a DQNConfig, SACConfig or PPOConfig, got {type(config).__name__}"
        )
    config.learner_config_dict = {**(config.learner_config_dict or {}), "conduit": opts.model_dump(mode="json")}
    return config


def _set_learner(config: Any, cls: type, accepts: type) -> None:
    """Install learner ``cls`` unless the config already has a learner that is an ``accepts``."""
    current = config.learner_class
    if isinstance(current, type) and issubclass(current, accepts):
        return
    if current is config.get_default_learner_class():
        config.learners(learner_class=cls)
        return
    raise ConfigError(
        f"enable_conduit: config.learner_class is {current!r}; mix {accepts.__name__} into it "
        f"(class MyLearner({accepts.__name__}, ...)) or leave the default"
    )


def _enable_off_policy(config: Any, opts: ConduitRLlibOptions, stock_algo: type, conduit_algo: type,
                       learner: type, types: dict[bool, str]) -> None:
    rb = dict(config.replay_buffer_config or {})
    prioritized = opts.prioritized if opts.prioritized is not None else "Prioritized" in str(rb.get("type", ""))
    if opts.staleness is Staleness.BOUNDED and isinstance(config.n_step, tuple | list):
        raise ConfigError(
            f"enable_conduit: n_step={tuple(config.n_step)} is a random range; the bounded mode folds a fixed "
            "n-step return at ingestion: use staleness='exact' or a fixed n_step"
        )
    buffer_opts = BufferOptions(
        staleness=opts.staleness, prefetch=opts.prefetch, max_staleness=opts.max_staleness,
        storage_device=opts.storage_device, prepared_batches=opts.prepared_batches,
        train_batch_size=config.total_train_batch_size,
        n_step=tuple(config.n_step) if isinstance(config.n_step, list) else config.n_step,
        gamma=config.gamma, seed=opts.seed, timeout_s=opts.timeout_s, sharded=opts.sharded, sampling=opts.sampling,
    )
    if opts.sharded and opts.staleness is Staleness.EXACT:
        raise ConfigError("enable_conduit: sharded=True needs staleness='bounded' (the exact mode is RLlib's one "
                          "buffer, bit for bit)")
    config.replay_buffer_config = {
        "type": types[prioritized],
        "capacity": opts.capacity or int(rb.get("capacity", 50_000)),
        "alpha": opts.alpha if opts.alpha is not None else float(rb.get("alpha", 0.6)),
        "beta": opts.beta if opts.beta is not None else float(rb.get("beta", 0.4)),
        "conduit": buffer_opts.model_dump(mode="json"),
    }
    algo_class = config.algo_class
    if algo_class is stock_algo:
        config.algo_class = conduit_algo
    elif not (isinstance(algo_class, type) and issubclass(algo_class, ConduitAlgorithm)):
        log.warning(
            "enable_conduit: algo_class %s does not mix in ConduitAlgorithm; the buffer is swapped in by the "
            "on_algorithm_init callback but is not saved with checkpoints",
            algo_class,
        )
    callbacks = config.callbacks_on_algorithm_init
    callbacks = [] if callbacks is None else list(callbacks) if isinstance(callbacks, list | tuple) else [callbacks]
    if install_conduit_buffer not in callbacks:
        callbacks.append(install_conduit_buffer)
    config.callbacks_on_algorithm_init = callbacks
    if config.num_learners == 0:
        _set_learner(config, learner, ConduitOffPolicyLearner)
