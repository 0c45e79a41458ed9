"""What a Conduit replay buffer reports: exact counters for tests, RLlib's metrics for results.

:class:`ConduitBufferStats` counts every path the adapter took (adds, prefetched
and inline samples, priority updates matched to their batch, rows dropped by the
generation check) so tests can assert them.

:class:`BufferReport` is the bounded mode's ``get_metrics()`` (the exact mode
returns RLlib's buffer's own). It reports the keys RLlib 2.60's
``EpisodeReplayBuffer._update_add_metrics`` / ``_update_sample_metrics`` log,
per-agent and per-module ones included, but the distinct episodes per sample
(ring rows carry no episode id), reduced the way RLlib's loggers reduce them, for
the counts the ring gives it (:mod:`.buffer` says which differ from stock RLlib's
by design). It does so cheaply. Stock RLlib logs about thirty values per ``add``
and per ``sample`` into the buffer's ``MetricsLogger``, reduces it on every
``get_metrics()`` (one *cycle*) and aggregates each result into the algorithm's
logger: about a millisecond per DQN training step. Here an ``add`` / ``sample``
only bumps a few integers and appends to short lists of the current cycle;
``get_metrics()`` closes the cycle (cheap); and :meth:`flush` turns every closed
cycle into the reduced stats RLlib's buffer logger would have produced from the
same values and aggregates them all in one call: sums and lifetime sums are
integer totals, and each windowed mean gets one value per cycle (the cycle's mean
of its last ``window`` values, ``NaN`` for a cycle without any), in order. Only
the flush is throttled; see ``ConduitAlgorithm`` for when it runs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from ray.rllib.core import DEFAULT_AGENT_ID, DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import (
    ACTUAL_N_STEP,
    AGENT_ACTUAL_N_STEP,
    AGENT_STEP_UTILIZATION,
    ENV_STEP_UTILIZATION,
    MODULE_ACTUAL_N_STEP,
    MODULE_STEP_UTILIZATION,
    NUM_AGENT_EPISODES_ADDED,
    NUM_AGENT_EPISODES_ADDED_LIFETIME,
    NUM_AGENT_EPISODES_EVICTED,
    NUM_AGENT_EPISODES_EVICTED_LIFETIME,
    NUM_AGENT_RESAMPLES,
    NUM_AGENT_STEPS_ADDED,
    NUM_AGENT_STEPS_ADDED_LIFETIME,
    NUM_AGENT_STEPS_EVICTED,
    NUM_AGENT_STEPS_EVICTED_LIFETIME,
    NUM_AGENT_STEPS_PER_SAMPLE,
    NUM_AGENT_STEPS_PER_SAMPLE_LIFETIME,
    NUM_AGENT_STEPS_SAMPLED,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_ADDED,
    NUM_ENV_STEPS_ADDED_LIFETIME,
    NUM_ENV_STEPS_EVICTED,
    NUM_ENV_STEPS_EVICTED_LIFETIME,
    NUM_ENV_STEPS_PER_SAMPLE,
    NUM_ENV_STEPS_PER_SAMPLE_LIFETIME,
    NUM_ENV_STEPS_SAMPLED,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_STORED,
    NUM_EPISODES_ADDED,
    NUM_EPISODES_ADDED_LIFETIME,
    NUM_EPISODES_EVICTED,
    NUM_EPISODES_EVICTED_LIFETIME,
    NUM_EPISODES_STORED,
    NUM_MODULE_EPISODES_ADDED,
    NUM_MODULE_EPISODES_ADDED_LIFETIME,
    NUM_MODULE_EPISODES_EVICTED,
    NUM_MODULE_EPISODES_EVICTED_LIFETIME,
    NUM_MODULE_RESAMPLES,
    NUM_MODULE_STEPS_ADDED,
    NUM_MODULE_STEPS_ADDED_LIFETIME,
    NUM_MODULE_STEPS_EVICTED,
    NUM_MODULE_STEPS_EVICTED_LIFETIME,
    NUM_MODULE_STEPS_PER_SAMPLE,
    NUM_MODULE_STEPS_PER_SAMPLE_LIFETIME,
    NUM_MODULE_STEPS_SAMPLED,
    NUM_MODULE_STEPS_SAMPLED_LIFETIME,
    NUM_RESAMPLES,
    REPLAY_BUFFER_RESULTS,
)

__all__ = ["BufferReport", "ConduitBufferStats"]

_A, _M = DEFAULT_AGENT_ID, DEFAULT_MODULE_ID
Key = str | tuple[str, str]

# (count, keys reduced with "sum", keys reduced with "lifetime_sum"): one counter feeds RLlib's
# whole-buffer, per-agent and per-module keys alike (one agent, one module).
_ADD_COUNTS: list[tuple[str, tuple[Key, ...], tuple[Key, ...]]] = [
    ("episodes_added", (NUM_EPISODES_ADDED, (NUM_AGENT_EPISODES_ADDED, _A), (NUM_MODULE_EPISODES_ADDED, _M)),
     (NUM_EPISODES_ADDED_LIFETIME, (NUM_AGENT_EPISODES_ADDED_LIFETIME, _A), (NUM_MODULE_EPISODES_ADDED_LIFETIME, _M))),
    ("episodes_evicted",
     (NUM_EPISODES_EVICTED, (NUM_AGENT_EPISODES_EVICTED, _A), (NUM_MODULE_EPISODES_EVICTED, _M)),
     (NUM_EPISODES_EVICTED_LIFETIME, (NUM_AGENT_EPISODES_EVICTED_LIFETIME, _A),
      (NUM_MODULE_EPISODES_EVICTED_LIFETIME, _M))),
    ("steps_added", (NUM_ENV_STEPS_ADDED, (NUM_AGENT_STEPS_ADDED, _A), (NUM_MODULE_STEPS_ADDED, _M)),
     (NUM_ENV_STEPS_ADDED_LIFETIME, (NUM_AGENT_STEPS_ADDED_LIFETIME, _A), (NUM_MODULE_STEPS_ADDED_LIFETIME, _M))),
    ("steps_evicted", (NUM_ENV_STEPS_EVICTED, (NUM_AGENT_STEPS_EVICTED, _A), (NUM_MODULE_STEPS_EVICTED, _M)),
     (NUM_ENV_STEPS_EVICTED_LIFETIME, (NUM_AGENT_STEPS_EVICTED_LIFETIME, _A),
      (NUM_MODULE_STEPS_EVICTED_LIFETIME, _M))),
]
_SAMPLE_COUNTS: list[tuple[str, tuple[Key, ...], tuple[Key, ...]]] = [
    ("steps_per_sample",
     (NUM_ENV_STEPS_PER_SAMPLE, (NUM_AGENT_STEPS_PER_SAMPLE, _A), (NUM_MODULE_STEPS_PER_SAMPLE, _M)),
     (NUM_ENV_STEPS_PER_SAMPLE_LIFETIME, (NUM_AGENT_STEPS_PER_SAMPLE_LIFETIME, _A),
      (NUM_MODULE_STEPS_PER_SAMPLE_LIFETIME, _M))),
    ("steps_sampled", (NUM_ENV_STEPS_SAMPLED, (NUM_AGENT_STEPS_SAMPLED, _A), (NUM_MODULE_STEPS_SAMPLED, _M)),
     (NUM_ENV_STEPS_SAMPLED_LIFETIME, (NUM_AGENT_STEPS_SAMPLED_LIFETIME, _A), (NUM_MODULE_STEPS_SAMPLED_LIFETIME, _M))),
    ("resamples", (NUM_RESAMPLES, (NUM_AGENT_RESAMPLES, _A), (NUM_MODULE_RESAMPLES, _M)), ()),
]
# windowed means: series -> keys
_ADD_MEANS: list[tuple[str, tuple[Key, ...]]] = [
    ("episodes_stored", (NUM_EPISODES_STORED,)),
    ("steps_stored", (NUM_ENV_STEPS_STORED,)),
]
_SAMPLE_MEANS: list[tuple[str, tuple[Key, ...]]] = [
    ("utilization", (ENV_STEP_UTILIZATION, (AGENT_STEP_UTILIZATION, _A), (MODULE_STEP_UTILIZATION, _M))),
    ("n_step", (ACTUAL_N_STEP, (AGENT_ACTUAL_N_STEP, _A), (MODULE_ACTUAL_N_STEP, _M))),
]
#: Conduit's own counters, reported next to RLlib's (``conduit_<name>``, reduced with "sum")
_CONDUIT_COUNTS = ("prefetched_samples", "priority_rows_dropped")


@dataclass
class ConduitBufferStats:
    """What the buffer did (exact counters; tests assert the adapter's paths ran)."""

    adds: int = 0
    added_timesteps: int = 0
    samples: int = 0
    prefetched_samples: int = 0
    inline_samples: int = 0
    sampled_timesteps: int = 0
    materialized_batches: int = 0
    priority_updates: int = 0
    priority_batches_matched: int = 0
    priority_rows_applied: int = 0
    priority_rows_dropped: int = 0
    staleness_max: int = 0
    staleness_sum: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class _Cycle:
    """What RLlib's buffer logs between two ``get_metrics()`` calls."""

    window: int
    counts: dict[str, int] = field(default_factory=dict)
    series: dict[str, deque[float]] = field(default_factory=dict)

    def count(self, name: str, value: int) -> None:
        self.counts[name] = self.counts.get(name, 0) + value

    def log(self, name: str, value: float) -> None:
        values = self.series.get(name)
        if values is None:
            values = self.series[name] = deque(maxlen=self.window)
        values.append(value)

    def mean(self, name: str) -> float:
        """RLlib's reduction of a windowed mean: ``nanmean`` of the last ``window`` values, NaN if none."""
        values = self.series.get(name)
        if not values:
            return float("nan")
        if len(values) == 1:  # the usual cycle (one add, one sample): nanmean of one value is the value
            return np.float64(values[0])
        if np.all(np.isnan(values)):
            return float("nan")
        return np.nanmean(values)


class BufferReport:
    """RLlib's replay-buffer metrics, recorded cheaply per call and reduced in one flush."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.current = _Cycle(window)
        self.closed: list[_Cycle] = []
        #: which families of keys were ever logged ("add", "sample", "n_step"):
        #: RLlib's logger keeps a key once logged and reduces it in every later cycle
        self.families: set[str] = set()
        self.conduit_reported = dict.fromkeys(_CONDUIT_COUNTS, 0)

    def added(self, steps: int, episodes: int, evicted_steps: int, evicted_episodes: int,
              stored_episodes: int, stored_steps: int) -> None:
        """One ``add()``: what RLlib's ``_update_add_metrics`` is given (one agent, one module)."""
        c = self.current
        c.count("episodes_added", episodes)
        c.count("episodes_evicted", evicted_episodes)
        c.count("steps_added", steps)
        c.count("steps_evicted", evicted_steps)
        c.log("episodes_stored", stored_episodes)
        c.log("steps_stored", stored_steps)
        self.families.add("add")

    def sampled(self, size: int, unique_steps: int, n_step_sum: int) -> None:
        """One ``sample()`` of ``size`` items: what RLlib's ``_update_sample_metrics`` is given.

        Ring rows carry no episode id, so the distinct episodes per sample are not reported; a ring
        row is never rejected, so there are no resamples.
        """
        c = self.current
        c.count("steps_per_sample", unique_steps)
        c.count("steps_sampled", size)
        c.count("resamples", 0)
        c.log("utilization", unique_steps / size)
        self.families.add("sample")
        if n_step_sum:  # RLlib logs the n-step means only when the mean is non-zero
            c.log("n_step", n_step_sum / size)
            self.families.add("n_step")

    def close_cycle(self) -> None:
        """RLlib's buffer reduces its logger here (``get_metrics()``): end the current cycle."""
        self.closed.append(self.current)
        self.current = _Cycle(self.window)

    @property
    def pending(self) -> bool:
        return bool(self.closed)

    def flush(self, logger: Any, lookup: dict[str, type], stats: ConduitBufferStats) -> int:
        """Aggregate every closed cycle into ``logger`` under ``REPLAY_BUFFER_RESULTS``; returns how many."""
        n = len(self.closed)
        if n:
            logger.aggregate([self.reduced(lookup, stats)], key=REPLAY_BUFFER_RESULTS)
        return n

    def reduced(self, lookup: dict[str, type], stats: ConduitBufferStats) -> dict[str, Any]:
        """The closed cycles as one reduced stats dict (what ``MetricsLogger.reduce()`` returns); takes them."""
        cycles, out = self.closed, {}
        self.closed = []
        count_groups = ([("add", _ADD_COUNTS)] if "add" in self.families else []) + (
            [("sample", _SAMPLE_COUNTS)] if "sample" in self.families else []
        )
        for _, table in count_groups:
            for name, sums, lifetimes in table:
                seen = [c.counts[name] for c in cycles if name in c.counts]
                total = sum(seen)
                for key in sums:
                    _put(out, key, _stat(lookup, "sum", [total] if seen else []))
                for key in lifetimes:
                    _put(out, key, _stat(lookup, "lifetime_sum", total))
        mean_groups = [(f, t) for f, t in (("add", _ADD_MEANS), ("sample", _SAMPLE_MEANS[:1]),
                                            ("n_step", _SAMPLE_MEANS[1:])) if f in self.families]
        for _, table in mean_groups:
            for name, keys in table:
                means = [c.mean(name) for c in cycles]
                for key in keys:
                    _put(out, key, _stat(lookup, "mean", means, window=self.window))
        for name in _CONDUIT_COUNTS:
            value = getattr(stats, name)
            _put(out, f"conduit_{name}", _stat(lookup, "sum", [value - self.conduit_reported[name]]))
            self.conduit_reported[name] = value
        return out


def _stat(lookup: dict[str, type], reduce: str, value: Any, window: int | None = None) -> Any:
    """A reduced leaf ``Stats`` as RLlib's buffer logger's ``reduce()`` returns it."""
    cls = lookup[reduce]
    if reduce == "lifetime_sum":
        s = cls(is_root=False, is_leaf=True)
        s.push(value)
        return s
    s = cls(window=window, is_root=False, is_leaf=True) if window else cls(is_root=False, is_leaf=True)
    s.values = list(value)  # as ``SeriesStats.reduce(compile=False)`` sets them: a plain list
    return s


def _put(out: dict[str, Any], key: Key, value: Any) -> None:
    if isinstance(key, tuple):
        out.setdefault(key[0], {})[key[1]] = value
    else:
        out[key] = value
