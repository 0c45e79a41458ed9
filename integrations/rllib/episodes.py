"""RLlib's data format at the buffer's edge: episode chunks in, one-step episodes out.

- :func:`chunk_from_episode` turns a ``SingleAgentEpisode`` chunk (what DQN's
  ``training_step`` hands to ``buffer.add``) into flat numpy columns, once; the
  buffer never deep-copies or concatenates episode objects.
- :class:`PreparedBatch` is a sampled batch as the learner wants it: the columns
  RLlib's learner connector would have produced for DQN/SAC (same names, dtypes
  and values), plus what is needed to rebuild RLlib's episodes on demand.
- :class:`SampledEpisodes` is what ``sample()`` returns: a ``list`` of one-step
  ``SingleAgentEpisode``\\s, built only when somebody looks at them. A Conduit
  learner in the same process reads ``.conduit_batch`` instead and no episode
  object is ever built; anybody else (a stock learner, a remote learner, a user)
  sees an ordinary list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from conduit import SpecError

__all__ = [
    "LEARNER_COLUMNS",
    "Chunk",
    "PreparedBatch",
    "SampledEpisodes",
    "chunk_from_episode",
    "learner_dtype",
    "materialize",
]

#: The train-batch columns RLlib's DQN/SAC learner connector builds from sampled episodes.
LEARNER_COLUMNS = ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "weights", "n_step")


@dataclass(frozen=True)
class Chunk:
    """One episode chunk as columns: ``obs`` has ``length + 1`` rows (the last is the next observation)."""

    id: str
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray  # float64
    terminated: bool
    truncated: bool
    t_started: int
    observation_space: Any = None
    action_space: Any = None

    @property
    def length(self) -> int:
        return int(self.actions.shape[0])


def _as_array(name: str, value: Any, eps_id: str) -> np.ndarray:
    if isinstance(value, dict | tuple) or (isinstance(value, list) and value and isinstance(value[0], dict | tuple)):
        raise SpecError(
            f"episode {eps_id}: {name} is a {type(value).__name__}; the Conduit replay buffer stores array "
            "observations and actions (Box/Discrete spaces), not nested (Dict/Tuple) ones"
        )
    return np.asarray(value)


def chunk_from_episode(eps: SingleAgentEpisode) -> Chunk:
    """Columns of one (numpy'ized or list-based) episode chunk."""
    obs = _as_array("observations", eps.get_observations(), eps.id_)
    actions = _as_array("actions", eps.get_actions(), eps.id_)
    rewards = np.asarray(eps.get_rewards(), dtype=np.float64).reshape(-1)
    n = len(eps)
    if actions.shape[0] != n or obs.shape[0] != n + 1 or rewards.shape[0] != n:
        raise SpecError(
            f"episode {eps.id_}: expected {n} actions/rewards and {n + 1} observations, got "
            f"{actions.shape[0]} / {rewards.shape[0]} / {obs.shape[0]}"
        )
    return Chunk(
        id=eps.id_,
        obs=obs,
        actions=actions,
        rewards=rewards,
        terminated=bool(eps.is_terminated),
        truncated=bool(eps.is_truncated),
        t_started=int(eps.t_started),
        observation_space=eps.observation_space,
        action_space=eps.action_space,
    )


def learner_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype RLlib's ``NumpyToTensor`` gives a column (floating point becomes float32 unless float16)."""
    if dtype.is_floating_point and dtype != torch.float16:
        return torch.float32
    return dtype


def _host(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


@dataclass
class PreparedBatch:
    """A sampled batch, ready for the learner, plus what rebuilding RLlib's episodes needs.

    ``columns`` hold exactly what RLlib's learner connector would produce from the
    equivalent one-step episodes. ``extras`` hold, per row, the float64 ``returns``
    and ``weights`` RLlib puts into those episodes, ``n_step``, the done flags and
    ``t_started`` (tensors or arrays; read only if the episodes are ever built).
    """

    columns: dict[str, torch.Tensor]
    extras: dict[str, Any]
    observation_space: Any = None
    action_space: Any = None
    consumed: bool = False

    @property
    def size(self) -> int:
        return int(self.columns["rewards"].shape[0])


def materialize(batch: PreparedBatch) -> list[SingleAgentEpisode]:
    """The one-step episodes RLlib's ``PrioritizedEpisodeReplayBuffer.sample`` returns for these rows."""
    obs = _host(batch.columns["obs"])
    new_obs = _host(batch.columns["new_obs"])
    actions = _host(batch.columns["actions"])
    ex = {k: _host(v) for k, v in batch.extras.items()}
    out = []
    for i in range(batch.size):
        out.append(
            SingleAgentEpisode(
                observations=[obs[i], new_obs[i]],
                observation_space=batch.observation_space,
                actions=[actions[i]],
                action_space=batch.action_space,
                rewards=[ex["returns"][i]],
                terminated=bool(ex["terminated"][i]),
                truncated=bool(ex["truncated"][i]),
                extra_model_outputs={"weights": [ex["weights"][i]], "n_step": [int(ex["n_step"][i])]},
                len_lookback_buffer=0,
                t_started=int(ex["t_started"][i]),
            )
        )
    return out


class SampledEpisodes(list):  # type: ignore[type-arg]
    """A ``list`` of one-step episodes that builds them on first access.

    ``len()`` answers without building anything; every other list operation builds
    the episodes first. Pickling yields a plain list of episodes.
    """

    __slots__ = ("_build", "_n", "conduit_batch")

    def __init__(self, batch: PreparedBatch, build: Callable[[PreparedBatch], list[SingleAgentEpisode]]) -> None:
        super().__init__()
        self.conduit_batch = batch
        self._build: Callable[[PreparedBatch], list[SingleAgentEpisode]] | None = build
        self._n = batch.size

    @property
    def materialized(self) -> bool:
        return self._build is None

    def _materialize(self) -> SampledEpisodes:
        build = self._build
        if build is not None:
            self._build = None
            list.extend(self, build(self.conduit_batch))
        return self

    def __len__(self) -> int:
        return self._n if self._build is not None else list.__len__(self)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (list, (list(self._materialize()),))

    def __repr__(self) -> str:
        if self._build is not None:
            return f"SampledEpisodes({self._n} one-step episodes, not built)"
        return list.__repr__(self)


def _materializing(name: str) -> Callable[..., Any]:
    base = getattr(list, name)

    def method(self: SampledEpisodes, *args: Any, **kwargs: Any) -> Any:
        return base(self._materialize(), *args, **kwargs)

    method.__name__ = name
    method.__doc__ = base.__doc__
    return method


for _name in (
    "__iter__", "__getitem__", "__setitem__", "__delitem__", "__contains__", "__reversed__",
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__iadd__", "__mul__",
    "__rmul__", "__imul__", "__copy__", "append", "extend", "insert", "pop", "remove", "clear",
    "index", "count", "sort", "reverse", "copy",
):
    if hasattr(list, _name):
        setattr(SampledEpisodes, _name, _materializing(_name))
