"""RLlib's episode replay semantics, bit for bit, over Conduit's columnar storage.

This reproduces ``PrioritizedEpisodeReplayBuffer`` (and the uniform
``EpisodeReplayBuffer``) of RLlib 2.60 exactly — which episodes are kept and
evicted, which node each time step gets, the draw order from ``rng``, the
rejection of windows that run past an episode's end, the importance weights and
the n-step returns — without episode objects: time steps are rows in a
:class:`~.columnar.SlotStorage`, RLlib's ``_indices`` list is three numpy
columns, and sampling is vectorized (the random stream is consumed in exactly
RLlib's order; ``pow`` runs per element as RLlib's scalar code does, since
numpy's SIMD ``power`` can differ in the last bit).

The one deliberate difference: a priority update is dropped for a time step
whose node was freed or reassigned since it was sampled (generation check),
where RLlib would overwrite whatever the node holds now. DQN and SAC never add
between a sample and its update, so their runs are unaffected.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from conduit.storage import StoragePolicy

from .columnar import SlotStorage
from .episode_table import EpisodeTable
from .episodes import Chunk
from .segment_tree import RLlibSegmentTrees, rllib_tree_leaves

__all__ = ["ExactDraw", "ExactStore"]


@dataclass
class ExactDraw:
    """One ``sample()``: rows in RLlib's order and everything the batch and priority update need."""

    slots: np.ndarray  # slot of o_t / a_t (the sampled node)
    next_slots: np.ndarray  # slot whose next_obs is o_{t+n}
    returns: np.ndarray  # float64 n-step returns
    n_step: np.ndarray
    weights: np.ndarray  # float64
    terminated: np.ndarray
    truncated: np.ndarray
    t_started: np.ndarray
    gens: np.ndarray
    resamples: int
    episodes: int


class _Column:
    """An append-mostly int64 column."""

    def __init__(self) -> None:
        self.data = np.zeros(1024, dtype=np.int64)
        self.n = 0

    def view(self) -> np.ndarray:
        return self.data[: self.n]

    def extend(self, values: np.ndarray) -> None:
        k = len(values)
        if self.n + k > len(self.data):
            new = np.zeros(max(2 * len(self.data), self.n + k), dtype=np.int64)
            new[: self.n] = self.data[: self.n]
            self.data = new
        self.data[self.n : self.n + k] = values
        self.n += k

    def keep(self, mask: np.ndarray) -> None:
        kept = self.view()[mask]
        self.data[: len(kept)] = kept
        self.n = len(kept)


class ExactStore:
    """Time steps of episodes, kept, evicted and drawn the way RLlib's episode buffers do."""

    def __init__(
        self, capacity: int, *, prioritized: bool, alpha: float, policy: StoragePolicy, seed: int | None
    ) -> None:
        self.capacity = capacity
        self.prioritized = prioritized
        self.alpha = alpha
        self.rng = np.random.default_rng(seed)
        self.nodes = rllib_tree_leaves(capacity)
        self.tree = RLlibSegmentTrees(self.nodes) if prioritized else None
        self.free: deque[int] = deque(range(self.nodes), maxlen=self.nodes)
        self.max_priority: float = 1.0
        self.episodes = EpisodeTable()
        self.rows = SlotStorage(self.nodes, policy, capacity + max(64, capacity // 8))
        # RLlib's `_indices`: (global episode index, time step, node) per stored time step
        self.ix_eps, self.ix_ts, self.ix_node = _Column(), _Column(), _Column()
        self.node_to_sample = np.full(self.nodes, -1, dtype=np.int64)
        self.num_timesteps = 0  # RLlib's `_num_timesteps` counter
        self.num_added = 0  # `_num_timesteps_added`

    def __len__(self) -> int:
        return self.ix_node.n

    # -- add ----------------------------------------------------------------------
    def add(self, chunks: list[Chunk], weight: float | None = None) -> tuple[int, int, int, int]:
        """Add chunks; returns (steps added, episodes added, steps evicted, episodes evicted)."""
        if self.prioritized:
            return self._add_prioritized(chunks, self.max_priority if weight is None else weight)
        return self._add_uniform(chunks)

    def _take_nodes(self, k: int) -> np.ndarray:
        free = self.free
        return np.fromiter((free.popleft() for _ in range(k)), dtype=np.int64, count=k)

    def _store(self, chunk: Chunk, nodes: np.ndarray, leaf: float | None) -> None:
        eps = self.episodes
        index = eps.id_to_index.get(chunk.id)
        if index is None:
            index = eps.append(chunk.id)
        old_len = eps.extend(index, nodes.tolist(), chunk.terminated, chunk.truncated)
        j = len(self)
        self.ix_eps.extend(np.full(len(nodes), index))
        self.ix_ts.extend(old_len + np.arange(len(nodes)))
        self.ix_node.extend(nodes)
        self.node_to_sample[nodes] = j + np.arange(len(nodes))
        self.rows.write(nodes, chunk)
        if self.tree is not None and leaf is not None:
            self.tree.set(nodes, np.full(len(nodes), leaf))

    def _drop_indices(self, evicted: list[int]) -> int:
        """Splice evicted episodes out of `_indices`, freeing their nodes in `_indices` order."""
        gone = np.isin(self.ix_eps.view(), evicted)
        freed = self.ix_node.view()[gone]
        if self.tree is not None:
            self.tree.clear(freed)
        self.free.extendleft(freed.tolist())
        self.node_to_sample[freed] = -1
        self.rows.release(freed)
        for col in (self.ix_eps, self.ix_ts, self.ix_node):
            col.keep(~gone)
        self.node_to_sample[self.ix_node.view()] = np.arange(len(self))
        return len(freed)

    def _add_prioritized(self, chunks: list[Chunk], weight: float) -> tuple[int, int, int, int]:
        eps = self.episodes
        new_ids = [c.id for c in chunks]
        for c in chunks:
            self.num_timesteps += c.length
            self.num_added += c.length
        evicted_ids: list[str] = []
        evicted_index: list[int] = []
        steps_evicted = 0
        while (
            self.num_timesteps > self.capacity
            and len(eps) > 0
            and len((set(eps.id_to_index) | set(new_ids)) - set(evicted_ids)) != 1
        ):
            eps_id, index, length = eps.popleft()
            evicted_ids.append(eps_id)
            evicted_index.append(index)
            steps_evicted += length
            if eps_id in new_ids:
                sub = chunks[new_ids.index(eps_id)].length
                self.num_timesteps -= sub
                self.num_added -= sub
            self.num_timesteps -= length
        if evicted_index:
            self._drop_indices(evicted_index)
        leaf = float(weight) ** self.alpha
        steps = new_eps = 0
        for c in chunks:
            if c.id in evicted_ids:
                continue
            new_eps += c.id not in eps.id_to_index
            self._store(c, self._take_nodes(c.length), leaf)
            steps += c.length
        return steps, new_eps, steps_evicted, len(evicted_index)

    def _add_uniform(self, chunks: list[Chunk]) -> tuple[int, int, int, int]:
        eps = self.episodes
        steps = new_eps = steps_evicted = n_evicted = 0
        for c in chunks:
            self.num_timesteps += c.length
            self.num_added += c.length
            steps += c.length
            new_eps += c.id not in eps.id_to_index
            self._store(c, self._take_nodes(c.length), None)
            while self.num_timesteps > self.capacity and len(eps) > 1:
                _, index, length = eps.popleft()
                self.num_timesteps -= length
                steps_evicted += length
                n_evicted += 1
                self._drop_indices([index])
        return steps, new_eps, steps_evicted, n_evicted

    # -- sample -------------------------------------------------------------------
    def _lookup(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sample = self.node_to_sample[nodes]
        index = self.ix_eps.view()[sample]
        return index, self.ix_ts.view()[sample], self.episodes.row(index)

    def sample(self, batch_size: int, n_step: int | tuple[int, int] | None, gamma: float, beta: float) -> ExactDraw:
        if len(self) == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        if self.prioritized:
            return self._sample_prioritized(batch_size, n_step, gamma, beta)
        return self._sample_uniform(batch_size, n_step or 1, gamma)

    def _sample_prioritized(self, batch_size: int, n_step: Any, gamma: float, beta: float) -> ExactDraw:
        assert self.tree is not None
        tree = self.tree
        total = tree.total()
        num = len(self)
        max_weight = ((tree.minimum() / total) * num) ** (-beta)
        random_n = isinstance(n_step, tuple)
        nodes_out: list[np.ndarray] = []
        n_out: list[np.ndarray] = []
        resamples = 0
        need = batch_size
        while need > 0:
            if random_n:  # RLlib interleaves one integers() per candidate: draw one at a time
                node = tree.find(np.array([self.rng.random() * tree.total()]))
                n = np.array([int(self.rng.integers(n_step[0], n_step[1]))])
            else:
                node = tree.find(self.rng.random(need) * tree.total())
                n = np.full(need, n_step or 1, dtype=np.int64)
            _, ts, row = self._lookup(node)
            ok = ts + n <= self.episodes.length[row]
            resamples += int((~ok).sum())
            nodes_out.append(node[ok])
            n_out.append(n[ok])
            need -= int(ok.sum())
        nodes = np.concatenate(nodes_out)
        steps = np.concatenate(n_out)
        probs = tree.leaf(nodes) / total
        raw = [x ** (-beta) for x in (probs * num).tolist()]
        weights = np.array(raw, dtype=np.float64) / max_weight * 1
        return self._finish(nodes, steps, gamma, weights, resamples, clip=False)

    def _sample_uniform(self, batch_size: int, n_step: Any, gamma: float) -> ExactDraw:
        num = len(self)
        random_n = isinstance(n_step, tuple)
        picks: list[int] = []
        steps: list[int] = []
        count = 0
        while count < batch_size:
            if random_n:
                k = np.array([int(self.rng.integers(num))])
                n = np.array([int(self.rng.integers(n_step[0], n_step[1]))])
            else:
                k = self.rng.integers(num, size=batch_size - count)
                n = np.full(len(k), n_step, dtype=np.int64)
            nodes = self.ix_node.view()[k]
            _, ts, row = self._lookup(nodes)
            length = self.episodes.length[row]
            # RLlib's counter: a window clipped by the episode's end may add <= 0 items
            end = np.where(ts + n - 1 > length, length, ts + n - 1)
            inc = end - ts - (n - 1) + 1
            inc[inc == 0] = 1
            picks.extend(nodes.tolist())
            steps.extend(n.tolist())
            count += int(inc.sum())
        return self._finish(np.array(picks, dtype=np.int64), np.array(steps, dtype=np.int64), gamma,
                            np.ones(len(picks)), 0, clip=True)

    def _finish(self, nodes: np.ndarray, steps: np.ndarray, gamma: float, weights: np.ndarray,
                resamples: int, clip: bool) -> ExactDraw:
        index, ts, row = self._lookup(nodes)
        length = self.episodes.length[row]
        stop = np.minimum(ts + steps, length) if clip else ts + steps
        if np.all(steps == 1):
            next_slots, returns = nodes, self.rows.rewards[nodes].copy()
        else:
            next_slots = np.empty(len(nodes), dtype=np.int64)
            returns = np.empty(len(nodes), dtype=np.float64)
            for i in range(len(nodes)):
                window = self.episodes.slots[int(row[i])][int(ts[i]) : int(stop[i])]
                next_slots[i] = window[-1]
                ret = 0.0
                for r in self.rows.rewards[window][::-1].tolist():
                    ret = r + gamma * ret
                returns[i] = ret
        at_end = ts + steps == length
        return ExactDraw(
            slots=nodes, next_slots=next_slots, returns=returns, n_step=steps, weights=weights,
            terminated=at_end & self.episodes.terminated[row], truncated=at_end & self.episodes.truncated[row],
            t_started=ts, gens=self.rows.gen[nodes].copy(), resamples=resamples, episodes=len(np.unique(index)),
        )

    # -- priorities -----------------------------------------------------------------
    def update_priorities(self, nodes: np.ndarray, gens: np.ndarray, priorities: np.ndarray) -> int:
        """RLlib's update for a sampled batch, skipping nodes reassigned since; returns how many applied."""
        assert self.tree is not None
        pr = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if len(pr) != len(nodes):
            raise ValueError(f"update_priorities: {len(pr)} priorities for a batch of {len(nodes)} transitions")
        live = self.rows.gen[nodes] == gens
        if not live.any():
            return 0
        values = [max(p, 1e-12) for p in pr[live].tolist()]
        self.max_priority = max([self.max_priority, *values])
        leaves = np.array([p**self.alpha for p in values], dtype=np.float64)
        live_nodes = nodes[live]
        # duplicates: the later update wins, as in RLlib's sequential loop
        _, last = np.unique(live_nodes[::-1], return_index=True)
        keep = len(live_nodes) - 1 - last
        self.tree.set(live_nodes[keep], leaves[keep])
        return int(live.sum())

    # -- persistence ------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "prioritized": self.prioritized,
            "tree": self.tree.state() if self.tree is not None else None,
            "free": np.fromiter(self.free, dtype=np.int64, count=len(self.free)),
            "max_priority": self.max_priority,
            "episodes": self.episodes.state(),
            "rows": self.rows.state(),
            "indices": np.stack([self.ix_eps.view(), self.ix_ts.view(), self.ix_node.view()]),
            "num_timesteps": self.num_timesteps,
            "num_added": self.num_added,
            "rng": self.rng.bit_generator.state,
        }

    def load(self, state: dict[str, Any]) -> None:
        if state["capacity"] != self.capacity or state["prioritized"] != self.prioritized:
            raise ValueError(
                f"buffer state is for capacity={state['capacity']}, prioritized={state['prioritized']}; "
                f"this buffer has capacity={self.capacity}, prioritized={self.prioritized}"
            )
        if self.tree is not None:
            self.tree.load(state["tree"])
        self.free = deque(state["free"].tolist(), maxlen=self.nodes)
        self.max_priority = state["max_priority"]
        self.episodes.load(state["episodes"])
        self.rows.load(state["rows"])
        for col, values in zip((self.ix_eps, self.ix_ts, self.ix_node), state["indices"]):
            col.n = 0
            col.extend(values)
        self.node_to_sample[:] = -1
        self.node_to_sample[self.ix_node.view()] = np.arange(len(self))
        self.num_timesteps = int(state["num_timesteps"])
        self.num_added = int(state["num_added"])
        self.rng.bit_generator.state = state["rng"]

    def close(self) -> None:
        self.rows.close()
