"""n-step returns at ingestion: episode segments in, n-step-ready transition rows out.

What: :class:`NStepFolder` takes segments of episodes as they arrive (any object
with the :class:`Segment` attributes: an episode id, its first step's index, the
observations -- one more than the actions, the last being the next observation --
actions, rewards and whether the episode ended there) and returns one row per
transition ``(o_t, a_t, R_t^(n), o_{t+n}, terminated, truncated)`` whose window of
``n`` steps is complete. The last ``n-1`` steps of an open episode wait for its
next segment; an episode's final ``n-1`` steps are dropped when it ends (no window
runs past an episode's end), and ``terminated`` / ``truncated`` are set only on the
window ending exactly at the episode's last step.

Why: with the return folded before a row is stored, delivery is a plain gather
of stored rows and nothing is recomputed per draw. The return is folded as
``R = r_t + gamma * (r_{t+1} + gamma * (...))``, the recursion (and the
floating-point result) of ``scipy.signal.lfilter`` over the window, which is how
RLlib's episode buffers compute it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = ["NStepFolder", "Segment", "fold_returns"]


class Segment(Protocol):
    """A contiguous piece of one episode: ``obs`` has one row more than ``actions`` (the next observation)."""

    id: str
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: bool
    truncated: bool
    t_started: int


def fold_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """``rewards[i, :]`` -> discounted sum, folded from the back like RLlib's ``lfilter``."""
    out = rewards[:, -1].astype(np.float64, copy=True)
    for k in range(rewards.shape[1] - 2, -1, -1):
        out = rewards[:, k] + gamma * out
    return out


@dataclass
class _Open:
    """Steps of an open episode whose window is not complete yet (``obs`` has one extra row)."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    t0: int


class NStepFolder:
    """Turns segments into rows; keeps at most ``max_open`` open episodes (oldest dropped)."""

    def __init__(self, n_step: int, gamma: float, max_open: int = 100_000) -> None:
        if not isinstance(n_step, int) or n_step < 1:
            raise ValueError(f"n_step must be an int >= 1, got {n_step!r}")
        self.n = n_step
        self.gamma = gamma
        self.max_open = max_open
        self.open: OrderedDict[str, _Open] = OrderedDict()
        self.dropped_steps = 0  # steps no complete window covers (episode ends, gaps, open episodes dropped)

    def fold(self, chunks: list[Segment]) -> dict[str, np.ndarray] | None:
        """Rows for every window the segments complete (``None`` if none)."""
        parts = [p for p in (self._fold_one(c) for c in chunks) if p is not None]
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def _fold_one(self, c: Segment) -> dict[str, np.ndarray] | None:
        n = self.n
        prev = self.open.pop(c.id, None)
        if prev is not None and prev.t0 + len(prev.actions) == c.t_started:
            obs = np.concatenate([prev.obs[:-1], c.obs])
            actions = np.concatenate([prev.actions, c.actions])
            rewards = np.concatenate([prev.rewards, c.rewards])
            t0 = prev.t0
        else:
            if prev is not None:  # the segment does not continue the open steps: no window will cover them
                self.dropped_steps += len(prev.actions)
            obs, actions, rewards, t0 = c.obs, c.actions, c.rewards, c.t_started
        m = len(actions)
        count = max(0, m - n + 1)
        done = c.terminated or c.truncated
        if done:
            self.dropped_steps += m - count
        else:
            self.open[c.id] = _Open(obs[count:], actions[count:], rewards[count:], t0 + count)
            while len(self.open) > self.max_open:
                self.dropped_steps += len(self.open.popitem(last=False)[1].actions)
        if count == 0:
            return None
        windows = np.lib.stride_tricks.sliding_window_view(rewards, n)[:count] if n > 1 else rewards[:count, None]
        last = np.zeros(count, dtype=bool)
        if done and m - n == count - 1:
            last[-1] = True
        return {
            "obs": obs[:count],
            "new_obs": obs[n : n + count],
            "actions": actions[:count],
            "rewards": fold_returns(windows, self.gamma),
            "terminateds": last & c.terminated,
            "truncateds": last & c.truncated,
            "t": t0 + np.arange(count, dtype=np.int64),
        }

    # -- persistence --------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "gamma": self.gamma,
            "dropped_steps": self.dropped_steps,
            "open": [(k, v.obs, v.actions, v.rewards, v.t0) for k, v in self.open.items()],
        }

    def load(self, state: dict[str, Any]) -> None:
        if state["n"] != self.n or state["gamma"] != self.gamma:
            raise ValueError(
                f"buffer state folds n_step={state['n']}, gamma={state['gamma']}; "
                f"this buffer folds n_step={self.n}, gamma={self.gamma}"
            )
        self.dropped_steps = int(state["dropped_steps"])
        self.open = OrderedDict((k, _Open(o, a, r, int(t))) for k, o, a, r, t in state["open"])
