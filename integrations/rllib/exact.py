"""The exact mode: RLlib's own replay buffer, run as the framework's logic inside Conduit's buffer.

``staleness="exact"`` keeps the buffer class the user's config names
(``EpisodeReplayBuffer`` or ``PrioritizedEpisodeReplayBuffer``, built with the
same constructor arguments) and hands it every call that decides what the
learner gets: ``add``, ``sample``, ``update_priorities``, ``get_state`` /
``set_state`` and ``get_metrics``. The draws, importance weights, n-step returns,
evictions, priority trees and ``replay_buffer/*`` metrics are therefore RLlib's by
construction: there is no second sum-tree and no episode table here.

What Conduit adds around it, none of which changes the data:

- the hand-off to the learner: a sample in RLlib's one-step form also carries the
  learner's columns (:func:`prepared_batch`), so an in-process Conduit learner
  skips RLlib's learner connector (``tests/integrations/test_rllib_buffer.py``
  checks the columns equal the connector's output);
- a guard that each sampled batch gets at most one priority update, of its size;
- snapshots: ``state()`` deep-copies RLlib's state (RLlib's shares its lists with
  the live buffer) and adds the generator's state, so a restored buffer draws next
  what the saved one would have; ``load()`` fills a fresh RLlib buffer (RLlib's
  ``set_state`` keeps the episodes of a non-empty one).

Nothing is drawn ahead in this mode: a priority update or an ``add`` between two
samples changes the next draw, so the next batch exists only once ``sample()`` is
called — which is what makes the mode exact.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.replay_buffers import EpisodeReplayBuffer

from conduit import SemanticsError

from .episodes import PreparedBatch, learner_dtype

__all__ = ["ExactReplay", "prepared_batch"]


class ExactReplay:
    """One RLlib episode replay buffer, the buffer's only store in the exact mode."""

    def __init__(self, rllib_class: type[EpisodeReplayBuffer], *, prioritized: bool, seed: int | None,
                 **kwargs: Any) -> None:
        self.rllib_class = rllib_class
        self.prioritized = prioritized
        self.kwargs = kwargs
        self.buffer = rllib_class(**kwargs)
        if seed is not None:
            self.buffer.rng = np.random.default_rng(seed)
        #: the size of the last sampled batch while it awaits its priorities (prioritized only)
        self.awaiting: int | None = None

    def add(self, episodes: list[SingleAgentEpisode], weight: float | None) -> int:
        """RLlib's ``add``; returns the time steps it counted as added."""
        before = self.buffer.get_added_timesteps()
        if self.prioritized:
            self.buffer.add(episodes, weight=weight)
        else:
            self.buffer.add(episodes)
        return self.buffer.get_added_timesteps() - before

    def sample(self, **kwargs: Any) -> list[SingleAgentEpisode]:
        """RLlib's ``sample``, with the caller's arguments as given."""
        episodes = self.buffer.sample(**kwargs)
        if self.prioritized:
            self.awaiting = len(episodes)
        return episodes

    def update_priorities(self, priorities: Any, module_id: str | None) -> int:
        """RLlib's ``update_priorities`` for the last sampled batch; returns how many it applied."""
        size = len(priorities)
        if self.awaiting is None:
            raise SemanticsError(
                "update_priorities: no sampled batch awaits priorities; call sample() first (each batch takes "
                "one update)"
            )
        if size != self.awaiting:
            raise ValueError(f"update_priorities: {size} priorities for a batch of {self.awaiting} transitions")
        self.buffer.update_priorities(priorities, module_id)
        self.awaiting = None
        return size

    def contents(self) -> dict[str, np.ndarray]:
        """Stored time steps as columns, episode by episode in RLlib's order (tests, inspection)."""
        parts: dict[str, list[np.ndarray]] = {k: [] for k in ("obs", "next_obs", "actions", "rewards", "t")}
        ids: list[str] = []
        for eps in self.buffer.episodes:
            obs = np.asarray(eps.get_observations())
            n = len(eps)
            parts["obs"].append(obs[:n])
            parts["next_obs"].append(obs[1 : n + 1])
            parts["actions"].append(np.asarray(eps.get_actions()))
            parts["rewards"].append(np.asarray(eps.get_rewards(), dtype=np.float64).reshape(-1))
            parts["t"].append(eps.t_started + np.arange(n))
            ids += [eps.id_] * n
        if not ids:
            return {}
        out = {k: np.concatenate(v) for k, v in parts.items()}
        out["episode"] = np.asarray(ids)
        return out

    def state(self) -> dict[str, Any]:
        return {
            "rllib": copy.deepcopy(self.buffer.get_state()),
            "rng": self.buffer.rng.bit_generator.state,
            "awaiting": self.awaiting,
        }

    def load(self, state: dict[str, Any]) -> None:
        fresh = self.rllib_class(**self.kwargs)
        fresh.set_state(copy.deepcopy(state["rllib"]))
        bit_generator = getattr(np.random, state["rng"]["bit_generator"])()
        bit_generator.state = state["rng"]
        fresh.rng = np.random.Generator(bit_generator)
        self.buffer = fresh
        self.awaiting = state["awaiting"]


def prepared_batch(episodes: list[SingleAgentEpisode], device: torch.device) -> PreparedBatch:
    """The columns RLlib's DQN/SAC learner connector builds from one-step episodes, plus their float64 extras."""

    def stack(values: list[Any]) -> torch.Tensor:
        t = torch.from_numpy(np.stack([np.asarray(v) for v in values]))
        return t.to(device=device, dtype=learner_dtype(t.dtype))

    returns = np.array([e.get_rewards(0) for e in episodes], dtype=np.float64)
    weights = np.array([e.get_extra_model_outputs("weights", 0) for e in episodes], dtype=np.float64)
    n_step = np.array([e.get_extra_model_outputs("n_step", 0) for e in episodes], dtype=np.int64)
    terminated = np.array([e.is_terminated for e in episodes], dtype=bool)
    truncated = np.array([e.is_truncated for e in episodes], dtype=bool)
    columns = {
        "obs": stack([e.get_observations(0) for e in episodes]),
        "new_obs": stack([e.get_observations(-1) for e in episodes]),
        "actions": stack([e.get_actions(0) for e in episodes]),
        "rewards": torch.from_numpy(returns).to(device=device, dtype=torch.float32),
        "terminateds": torch.from_numpy(terminated).to(device),
        "truncateds": torch.from_numpy(truncated).to(device),
        "weights": torch.from_numpy(weights).to(device=device, dtype=torch.float32),
        "n_step": torch.from_numpy(n_step).to(device),
    }
    extras = {
        "returns": returns, "weights": weights, "n_step": n_step, "terminated": terminated, "truncated": truncated,
        "t_started": np.array([e.t_started for e in episodes], dtype=np.int64),
    }
    return PreparedBatch(columns, extras)
