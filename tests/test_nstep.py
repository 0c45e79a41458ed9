"""n-step returns at ingestion: segments in any split give the rows of the whole episode, returns as lfilter's."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
import scipy.signal
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.ext import NStepFolder


@dataclass
class Seg:
    id: str
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: bool
    truncated: bool
    t_started: int


def episode(length: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((length + 1, 3)), rng.integers(0, 4, length), rng.standard_normal(length)


def split(eid: str, obs, actions, rewards, cuts: list[int], terminated: bool) -> list[Seg]:
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(actions))), len(actions)]
    return [
        Seg(eid, obs[a : b + 1], actions[a:b], rewards[a:b], terminated and b == len(actions), False, a)
        for a, b in itertools.pairwise(bounds)
    ]


def lfilter_return(rewards: np.ndarray, gamma: float) -> float:
    """RLlib's n-step return: the discounted sum by ``scipy.signal.lfilter`` over the reversed window."""
    return float(scipy.signal.lfilter([1], [1, -gamma], rewards[::-1], axis=0)[-1])


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 30), n=st.integers(1, 5), cuts=st.lists(st.integers(0, 30), max_size=6),
       terminated=st.booleans(), seed=st.integers(0, 1000))
def test_any_split_gives_the_rows_of_the_whole_episode(length, n, cuts, terminated, seed):
    obs, actions, rewards = episode(length, seed)
    whole = NStepFolder(n, 0.9).fold(split("e", obs, actions, rewards, [], terminated))
    folder = NStepFolder(n, 0.9)
    parts = [folder.fold([s]) for s in split("e", obs, actions, rewards, cuts, terminated)]
    parts = [p for p in parts if p is not None]
    count = max(0, length - n + 1)
    if count == 0:
        assert whole is None and parts == []
        return
    joined = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    for k in whole:
        np.testing.assert_array_equal(joined[k], whole[k])
    assert list(whole["t"]) == list(range(count))
    np.testing.assert_array_equal(whole["obs"], obs[:count])
    np.testing.assert_array_equal(whole["new_obs"], obs[n : n + count])
    for t in range(count):
        assert whole["rewards"][t] == pytest.approx(lfilter_return(rewards[t : t + n], 0.9), rel=1e-12, abs=1e-12)
    assert whole["terminateds"].tolist() == [terminated and t == count - 1 for t in range(count)]
    assert not whole["truncateds"].any()
    assert folder.dropped_steps == (length - count if terminated else 0)


def test_open_episodes_are_bounded_and_state_round_trips():
    folder = NStepFolder(3, 0.5, max_open=2)
    for i in range(3):
        obs, actions, rewards = episode(4, i)
        folder.fold(split(f"e{i}", obs, actions, rewards, [], False))
    assert list(folder.open) == ["e1", "e2"]  # the oldest open episode is dropped
    assert folder.dropped_steps == 2  # ... with its two open steps, counted
    obs, actions, rewards = episode(4, 9)
    folder.fold([Seg("e2", obs, actions, rewards, False, False, 10)])  # not e2's next step (t0 4): a gap
    assert folder.dropped_steps == 4  # e2's open steps no window will cover
    again = NStepFolder(3, 0.5)
    again.load(folder.state())
    assert list(again.open) == ["e1", "e2"] and again.open["e2"].t0 == folder.open["e2"].t0
    with pytest.raises(ValueError, match="n_step=3"):
        NStepFolder(2, 0.5).load(folder.state())
    with pytest.raises(ValueError, match="int >= 1"):
        NStepFolder(0, 0.5)
