"""Tiny RLlib configs for the real-RLlib tests (imported only after ``importorskip``)."""

from __future__ import annotations


def tiny_dqn(seed: int = 0, learning_starts: int = 64):
    """DQN on CartPole with tiny networks: ~100 training steps per iteration."""
    from ray.rllib.algorithms.dqn import DQNConfig

    return (
        DQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(
            lr=5e-4, train_batch_size_per_learner=16, num_steps_sampled_before_learning_starts=learning_starts,
            target_network_update_freq=100, replay_buffer_config={"capacity": 2000},
        )
        .rl_module(model_config={"fcnet_hiddens": [16], "head_fcnet_hiddens": [16]})
        .reporting(min_sample_timesteps_per_iteration=100, min_time_s_per_iteration=None)
        .debugging(seed=seed)
    )


def tiny_sac(seed: int = 0):
    from ray.rllib.algorithms.sac import SACConfig

    return (
        SACConfig()
        .environment("Pendulum-v1")
        .env_runners(num_env_runners=0)
        .training(
            actor_lr=3e-4, critic_lr=3e-4, alpha_lr=3e-4, train_batch_size_per_learner=16,
            num_steps_sampled_before_learning_starts=64, replay_buffer_config={"capacity": 2000},
        )
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .reporting(min_sample_timesteps_per_iteration=64, min_time_s_per_iteration=None)
        .debugging(seed=seed)
    )


def tiny_ppo(seed: int = 0):
    from ray.rllib.algorithms.ppo import PPOConfig

    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(train_batch_size_per_learner=256, minibatch_size=64, num_epochs=3)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=seed)
    )
