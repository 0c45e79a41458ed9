"""RLlib's episode replay buffers with Conduit inside: its runtime (bounded) or RLlib's own buffer (exact).

``ConduitPrioritizedEpisodeReplayBuffer`` subclasses RLlib's
``PrioritizedEpisodeReplayBuffer`` (so DQN's ``training_step`` routes TD errors to
its ``update_priorities``) and ``ConduitEpisodeReplayBuffer`` subclasses
``EpisodeReplayBuffer``. Outside, RLlib's interface and data format: ``add``
takes episode chunks, ``sample`` returns one-step ``SingleAgentEpisode``\\s with
``weights`` and ``n_step`` in ``extra_model_outputs``, ``update_priorities``
applies to the last sampled batch, ``get_metrics`` / ``get_state`` /
``set_state`` / ``__len__`` as RLlib defines them. Inside, one of two stores (see
:class:`~.options.Staleness`): :class:`~.exact.ExactReplay` (RLlib's own buffer
of the same class, run as is: its draws and metrics are RLlib's by construction)
or :class:`~.bounded_store.BoundedStore` (Conduit's runtime over columnar
storage, prefetching delivery).

RLlib's metrics (``get_metrics``): the exact mode returns RLlib's buffer's own
``get_metrics()``. The bounded mode (see :mod:`.buffer_report`) reports RLlib's keys but
``num_episodes_per_sample`` (and its per-agent / per-module keys: ring rows carry no
episode id); its counts of what was added (env steps, episodes) and sampled (env
steps; resamples are 0) are exact. What differs follows from its storage: the
ring evicts rows first-in first-out, not whole episodes, so the evicted and stored
counts differ; rows are n-step-folded transitions, so with ``n_step > 1`` the
steps added trail the env steps by up to ``n - 1`` per open episode and an
episode's last ``n - 1`` steps are never added; the per-sample distinct env steps
count distinct rows of a batch drawn from those rows.

Thread safety: RLlib's buffers are not thread-safe; here every public call takes
one lock, so the buffer is the single owner of its store, and the store's own
worker threads only touch the core runtime's (thread-safe) ring.

Nothing unpicklable is created before it is needed: the constructor takes plain
values (``replay_buffer_config`` entries), the bounded mode's runtime starts at the
first ``sample()``, and pickling a buffer pickles its constructor arguments and state.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import numpy as np
import torch
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils import force_list
from ray.rllib.utils.replay_buffers import EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer

from conduit import ConfigError, RuntimeStats

from .bounded_store import BoundedStore
from .buffer_report import BufferReport, ConduitBufferStats
from .episodes import PreparedBatch, SampledEpisodes, chunk_from_episode, materialize
from .exact import ExactReplay, prepared_batch
from .options import BufferOptions, Staleness, parse_options

__all__ = ["ConduitBufferStats", "ConduitEpisodeReplayBuffer", "ConduitPrioritizedEpisodeReplayBuffer"]

#: 2: the exact mode's state is RLlib's buffer's own; the bounded mode's is unchanged since 1
STATE_VERSION = 2
_LOADS = {Staleness.BOUNDED.value: (1, 2), Staleness.EXACT.value: (2,)}


class _RLlibAttribute:
    """A public attribute RLlib's buffer keeps up to date: in exact mode the running RLlib buffer's own (the
    wrapper's copy, set by RLlib's constructor, would never change); in bounded mode the wrapper's."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        store = obj.__dict__.get("_store")
        if isinstance(store, ExactReplay):
            return getattr(store.buffer, self.name)
        try:
            return obj.__dict__[self.name]
        except KeyError:  # (before RLlib's constructor set it)
            raise AttributeError(self.name) from None

    def __set__(self, obj: Any, value: Any) -> None:
        store = obj.__dict__.get("_store")
        if isinstance(store, ExactReplay):
            setattr(store.buffer, self.name, value)
        else:
            obj.__dict__[self.name] = value


class _ConduitReplay:
    """The shared implementation, mixed in front of RLlib's buffer class."""

    _prioritized: ClassVar[bool] = False
    #: the RLlib buffer class the exact mode runs (the one the config names)
    _rllib_class: ClassVar[type[EpisodeReplayBuffer]] = EpisodeReplayBuffer
    #: RLlib's constructor default for this class (EpisodeReplayBuffer: 64; the prioritized one: 1)
    _default_length_T: ClassVar[int] = 64

    episodes = _RLlibAttribute()
    episode_id_to_index = _RLlibAttribute()
    sampled_timesteps = _RLlibAttribute()

    def __init__(
        self,
        capacity: int = 10000,
        *,
        batch_size_B: int = 16,
        batch_length_T: int | None = None,
        alpha: float = 1.0,
        beta: float = 0.4,
        metrics_num_episodes_for_smoothing: int = 100,
        conduit: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        batch_length_T = self._default_length_T if batch_length_T is None else batch_length_T
        EpisodeReplayBuffer.__init__(
            self,  # type: ignore[arg-type]
            capacity=capacity, batch_size_B=batch_size_B, batch_length_T=batch_length_T,
            metrics_num_episodes_for_smoothing=metrics_num_episodes_for_smoothing,
        )
        if alpha < 0:
            raise ConfigError(f"alpha: expected >= 0, got {alpha}")
        self.options: BufferOptions = parse_options(BufferOptions, conduit, "replay_buffer_config['conduit']")
        self._alpha = alpha
        self._beta = beta
        self._init_kwargs = dict(
            capacity=capacity, batch_size_B=batch_size_B, batch_length_T=batch_length_T, alpha=alpha, beta=beta,
            metrics_num_episodes_for_smoothing=metrics_num_episodes_for_smoothing,
            conduit=self.options.model_dump(mode="json"),
        )
        self._lock = threading.RLock()
        self._device = torch.device(self.options.learner_device)
        self._store: ExactReplay | BoundedStore
        if self.options.staleness is Staleness.EXACT:
            rllib_args: dict[str, Any] = dict(
                capacity=capacity, batch_size_B=batch_size_B, batch_length_T=batch_length_T,
                metrics_num_episodes_for_smoothing=metrics_num_episodes_for_smoothing,
            )
            if self._prioritized:
                rllib_args["alpha"] = alpha
            self._store = ExactReplay(self._rllib_class, prioritized=self._prioritized, seed=self.options.seed,
                                      **rllib_args)
        else:
            self._store = BoundedStore(
                capacity, prioritized=self._prioritized, alpha=alpha, beta=beta, options=self.options
            )
        self._spaces: tuple[Any, Any] = (None, None)
        self._episodes_added = 0
        self.stats = ConduitBufferStats()
        self._report = BufferReport(metrics_num_episodes_for_smoothing)
        #: bounded mode: True makes ``get_metrics()`` only mark RLlib's reduce point; the owner calls
        #: ``flush_metrics``. The exact mode always returns RLlib's own ``get_metrics()``.
        self.defer_metrics = False

    # -- RLlib's `rng` attribute (users set it for reproducibility) ------------------------
    @property
    def rng(self) -> np.random.Generator:
        store = self.__dict__.get("_store")
        if isinstance(store, ExactReplay):
            return store.buffer.rng
        return store.rng if store is not None else np.random.default_rng()

    @rng.setter
    def rng(self, value: np.random.Generator) -> None:
        store = self.__dict__.get("_store")
        if isinstance(store, ExactReplay):
            store.buffer.rng = value
        elif store is not None:  # RLlib's own constructor sets an unseeded rng before the store exists
            store.rng = value

    @property
    def staleness(self) -> Staleness:
        return self.options.staleness

    # -- add ---------------------------------------------------------------------------
    def add(self, episodes: SingleAgentEpisode | list[SingleAgentEpisode], weight: float | None = None) -> None:
        store = self._store
        if isinstance(store, ExactReplay):
            episodes = force_list(episodes)
            if not episodes:
                return
            with self._lock:
                steps = store.add(episodes, weight)
                self.stats.adds += 1
                self.stats.added_timesteps += steps
            return
        chunks = [chunk_from_episode(e) for e in force_list(episodes)]
        if not chunks:
            return
        with self._lock:
            if self._spaces[0] is None:
                self._spaces = (chunks[0].observation_space, chunks[0].action_space)
            new_eps = sum(c.id not in store.episode_last_row for c in chunks)
            before, overflow = store.num_episodes, max(0, store.rows_total - store.capacity)
            steps = store.add(chunks)  # FIFO: rows past capacity overwrite the oldest
            ev_steps = max(0, store.rows_total - store.capacity) - overflow
            ev_eps = max(0, before + new_eps - store.num_episodes)
            self._episodes_added += new_eps
            self.stats.adds += 1
            self.stats.added_timesteps += steps
            self._report.added(steps, new_eps, ev_steps, ev_eps, self.get_num_episodes(), self.get_num_timesteps())

    # -- sample --------------------------------------------------------------------------
    def sample(
        self,
        num_items: int | None = None,
        *,
        batch_size_B: int | None = None,
        batch_length_T: int | None = None,
        n_step: int | tuple[int, int] | None = None,
        beta: float = 0.0,
        gamma: float = 0.99,
        include_infos: bool = False,
        include_extra_model_outputs: bool = False,
        to_numpy: bool = False,
        sample_episodes: bool | None = None,
        lookback: int = 0,
        min_batch_length_T: int = 0,
        **kwargs: Any,
    ) -> list[SingleAgentEpisode]:
        """One-step episodes, as RLlib's buffer returns them (built lazily for a Conduit learner).

        Exact mode: RLlib's own ``sample`` with these arguments, drawn now (never ahead: an ``add``
        or a priority update before this call changes what it draws).
        """
        if num_items is not None and batch_size_B is not None:
            raise ValueError("Cannot call `sample()` with both `num_items` and `batch_size_B` provided!")
        if sample_episodes is None:  # RLlib's default for this class: [B, T] sequences (uniform), episodes (PER)
            sample_episodes = self._prioritized
        if isinstance(self._store, ExactReplay):
            return self._sample_exact(
                dict(num_items=num_items, batch_size_B=batch_size_B, batch_length_T=batch_length_T, n_step=n_step,
                     beta=beta, gamma=gamma, include_infos=include_infos,
                     include_extra_model_outputs=include_extra_model_outputs, to_numpy=to_numpy,
                     sample_episodes=sample_episodes, lookback=lookback, min_batch_length_T=min_batch_length_T,
                     **kwargs)
            )
        size = num_items or batch_size_B or self.batch_size_B
        self._check_sample_args(include_infos, include_extra_model_outputs, sample_episodes, batch_length_T,
                                min_batch_length_T, beta)
        with self._lock:
            store = self._store
            self._check_fold(n_step, gamma)
            batch, info = store.sample(size, beta)
            # rows carry no episode id: distinct episodes per sample is not reported in this mode
            self._report.sampled(size, len(np.unique(info.ids)), store.folder.n * size)
            self.stats.prefetched_samples += int(info.mode.overlap)
            self.stats.inline_samples += int(not info.mode.overlap)
            self.stats.staleness_sum += info.staleness
            self.stats.staleness_max = max(self.stats.staleness_max, info.staleness)
            batch.observation_space, batch.action_space = self._spaces
            self.stats.samples += 1
            self.stats.sampled_timesteps += batch.size
            self.sampled_timesteps += batch.size  # RLlib's attribute

        def build(b: PreparedBatch) -> list[SingleAgentEpisode]:
            self.stats.materialized_batches += 1
            episodes = materialize(b)
            return [e.to_numpy() for e in episodes] if to_numpy else episodes

        if self.options.prepared_batches:
            return SampledEpisodes(batch, build)
        return build(batch)

    def _sample_exact(self, args: dict[str, Any]) -> list[SingleAgentEpisode]:
        store = self._store
        assert isinstance(store, ExactReplay)
        with self._lock:
            episodes = store.sample(**args)
            self.stats.samples += 1
            self.stats.inline_samples += 1
            self.stats.sampled_timesteps += len(episodes)
        one_step = args["sample_episodes"] and not (
            args["batch_length_T"] or args["lookback"] or args["min_batch_length_T"] or args["include_infos"]
            or args["include_extra_model_outputs"]
        )
        if not (self.options.prepared_batches and one_step and episodes):
            return episodes
        batch = prepared_batch(episodes, self._device)

        def build(b: PreparedBatch) -> list[SingleAgentEpisode]:
            return episodes  # RLlib's own episodes, as its buffer returned them

        return SampledEpisodes(batch, build)

    def _check_sample_args(self, infos: bool, extra: bool, episodes: bool, length_t: int | None,
                           min_length_t: int, beta: float) -> None:
        if infos or extra:
            raise NotImplementedError(
                "include_infos / include_extra_model_outputs: the bounded-mode Conduit replay buffer stores "
                "observations, actions and rewards only (staleness='exact' runs RLlib's buffer, which has them)"
            )
        if beta < 0:
            raise ValueError(f"beta: expected >= 0, got {beta}")
        if not self._prioritized and (not episodes or length_t or min_length_t):
            raise NotImplementedError(
                "the bounded-mode Conduit EpisodeReplayBuffer samples one-step episodes (sample_episodes=True, "
                f"batch_length_T=0, min_batch_length_T=0); got sample_episodes={episodes}, "
                f"batch_length_T={length_t}, min_batch_length_T={min_length_t}"
            )

    def _check_fold(self, n_step: int | tuple[int, int] | None, gamma: float) -> None:
        assert isinstance(self._store, BoundedStore)
        folder = self._store.folder
        if (n_step or 1) != folder.n or gamma != folder.gamma:
            raise ConfigError(
                f"sample(n_step={n_step}, gamma={gamma}): this bounded-mode buffer folds n-step returns at "
                f"ingestion with n_step={folder.n}, gamma={folder.gamma}; build it with the algorithm's values "
                "(enable_conduit does) or use staleness='exact'"
            )

    # -- priorities ------------------------------------------------------------------------
    def update_priorities(self, priorities: Any, module_id: str | None = None) -> int:
        """New priorities for the last sampled batch that has none yet; returns how many landed.

        Exact mode: RLlib's own ``update_priorities``. Bounded mode: the runtime's, for the newest
        delivered batch still awaiting its update (each batch takes one); rows whose transition left
        the buffer since the batch was drawn are skipped.
        """
        with self._lock:
            if not self._prioritized:
                return 0
            store = self._store
            if isinstance(store, ExactReplay):
                applied = store.update_priorities(priorities, module_id)
                self._count_update(applied, applied)
                return applied
            if isinstance(priorities, torch.Tensor):
                priorities = priorities.detach().cpu().numpy()
            pr = np.asarray(priorities, dtype=np.float64).reshape(-1)
            applied = store.update_priorities(pr)
            self._count_update(len(pr), applied)
            return applied

    def _count_update(self, rows: int, applied: int) -> None:
        s = self.stats
        s.priority_updates += 1
        s.priority_batches_matched += 1
        s.priority_rows_applied += applied
        s.priority_rows_dropped += rows - applied

    # -- sizes (RLlib's accessors) ---------------------------------------------------------
    def __len__(self) -> int:
        return self.get_num_timesteps()

    def get_num_timesteps(self, module_id: str | None = None) -> int:
        store = self._store
        return store.buffer.get_num_timesteps() if isinstance(store, ExactReplay) else len(store)

    def get_num_episodes(self, module_id: str | None = None) -> int:
        store = self._store
        return store.buffer.get_num_episodes() if isinstance(store, ExactReplay) else store.num_episodes

    def get_num_episodes_evicted(self, module_id: str | None = None) -> int:
        store = self._store
        if isinstance(store, ExactReplay):
            return store.buffer.get_num_episodes_evicted()
        return max(0, self._episodes_added - store.num_episodes)

    def get_added_timesteps(self, module_id: str | None = None) -> int:
        store = self._store
        return store.buffer.get_added_timesteps() if isinstance(store, ExactReplay) else store.rows_total

    def get_sampled_timesteps(self, module_id: str | None = None) -> int:
        store = self._store
        return store.buffer.get_sampled_timesteps() if isinstance(store, ExactReplay) else self.stats.sampled_timesteps

    # -- metrics ------------------------------------------------------------------------------
    def get_metrics(self) -> dict[str, Any]:
        """RLlib's replay-buffer metrics since the last call, reduced as RLlib's buffer reduces them.

        Exact mode: RLlib's buffer's own ``get_metrics()``. Bounded mode, with :attr:`defer_metrics`
        set (``ConduitAlgorithm`` sets it): this only marks RLlib's reduce point and returns ``{}``;
        the algorithm then calls :meth:`flush_metrics`, throttled, and always before it compiles an
        iteration's results, so the values are RLlib's at every iteration's end.
        """
        with self._lock:
            store = self._store
            if isinstance(store, ExactReplay):
                return store.buffer.get_metrics()
            self._report.close_cycle()
            if self.defer_metrics:
                return {}
            return self._report.reduced(self.metrics.stats_cls_lookup, self.stats)

    def flush_metrics(self, logger: Any) -> int:
        """Bounded mode: aggregate the metrics of every finished cycle into ``logger`` (the algorithm's),
        under ``REPLAY_BUFFER_RESULTS`` as RLlib's DQN does; returns how many cycles were flushed."""
        with self._lock:
            if isinstance(self._store, ExactReplay):
                return 0
            return self._report.flush(logger, self.metrics.stats_cls_lookup, self.stats)

    def runtime_stats(self) -> RuntimeStats | None:
        """The bounded mode's :class:`conduit.Conduit` runtime counters (None in exact mode or before
        the first ``sample()`` started the runtime)."""
        with self._lock:
            store = self._store
            if isinstance(store, BoundedStore) and store.edp is not None:
                return store.edp.stats()
            return None

    def conduit_stats(self) -> dict[str, int]:
        with self._lock:
            return self.stats.as_dict()

    # -- contents and persistence ------------------------------------------------------------
    def contents(self) -> dict[str, np.ndarray]:
        """Stored transitions as columns (exact: RLlib's episodes in order; bounded: oldest first)."""
        with self._lock:
            return self._store.contents()

    def get_state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "conduit_version": STATE_VERSION,
                "staleness": self.options.staleness.value,
                "prioritized": self._prioritized,
                "store": self._store.state(),
                "stats": self.stats.as_dict(),
                "spaces": self._spaces,
                "episodes_added": self._episodes_added,
            }

    def set_state(self, state: dict[str, Any]) -> None:
        version, staleness = state.get("conduit_version"), state.get("staleness")
        if version not in _LOADS.get(str(staleness), ()):
            raise ConfigError(
                f"not a Conduit replay-buffer state this version loads (conduit_version={version!r}, "
                f"staleness={staleness!r}; expected {STATE_VERSION}); RLlib's own buffer states cannot be loaded "
                "into it"
            )
        if staleness != self.options.staleness.value or state["prioritized"] != self._prioritized:
            raise ConfigError(
                f"buffer state is staleness={staleness!r}, prioritized={state['prioritized']}; "
                f"this buffer is staleness={self.options.staleness.value!r}, prioritized={self._prioritized}"
            )
        with self._lock:
            self._store.load(state["store"])
            self.stats = ConduitBufferStats(**state["stats"])
            self._spaces = tuple(state["spaces"])  # type: ignore[assignment]
            self._episodes_added = int(state["episodes_added"])

    def close(self) -> None:
        """Stop the bounded mode's runtime workers (idempotent); the algorithm calls it on ``stop()``."""
        with self._lock:
            if isinstance(self._store, BoundedStore):
                self._store.close()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self._init_kwargs, self.get_state()))


def _rebuild(cls: type[_ConduitReplay], kwargs: dict[str, Any], state: dict[str, Any]) -> _ConduitReplay:
    buffer = cls(**kwargs)
    buffer.set_state(state)
    return buffer


class ConduitEpisodeReplayBuffer(_ConduitReplay, EpisodeReplayBuffer):
    """Uniform replay: RLlib's ``EpisodeReplayBuffer`` interface, Conduit inside (exact mode: the RLlib buffer)."""

    _prioritized = False
    _rllib_class = EpisodeReplayBuffer


class ConduitPrioritizedEpisodeReplayBuffer(_ConduitReplay, PrioritizedEpisodeReplayBuffer):
    """Prioritized replay: RLlib's ``PrioritizedEpisodeReplayBuffer`` interface, Conduit inside (exact mode:
    the RLlib buffer)."""

    _prioritized = True
    _rllib_class = PrioritizedEpisodeReplayBuffer
    _default_length_T = 1
