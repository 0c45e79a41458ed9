"""What a Conduit replay buffer reports: exact counters for tests, RLlib's metrics for results.

:class:`ConduitBufferStats` counts every path the adapter took (adds, prefetched
and inline samples, priority updates matched to their batch, rows dropped by the
generation check) so tests can assert them. :class:`BufferReport` feeds RLlib's
``MetricsLogger`` a smaller set of RLlib's replay-buffer keys: counts accumulate
in plain integers and are logged and reduced at most every ``interval_s`` —
DQN asks after every sample, and reducing the logger costs more than the sample.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from ray.rllib.utils.metrics import (
    ACTUAL_N_STEP,
    NUM_ENV_STEPS_ADDED,
    NUM_ENV_STEPS_ADDED_LIFETIME,
    NUM_ENV_STEPS_EVICTED,
    NUM_ENV_STEPS_EVICTED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_STORED,
    NUM_EPISODES_ADDED,
    NUM_EPISODES_ADDED_LIFETIME,
    NUM_EPISODES_EVICTED,
    NUM_EPISODES_EVICTED_LIFETIME,
    NUM_EPISODES_STORED,
    NUM_RESAMPLES,
)

__all__ = ["BufferReport", "ConduitBufferStats"]

_LIFETIME = {
    NUM_ENV_STEPS_ADDED: NUM_ENV_STEPS_ADDED_LIFETIME,
    NUM_EPISODES_ADDED: NUM_EPISODES_ADDED_LIFETIME,
    NUM_ENV_STEPS_EVICTED: NUM_ENV_STEPS_EVICTED_LIFETIME,
    NUM_EPISODES_EVICTED: NUM_EPISODES_EVICTED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED: NUM_ENV_STEPS_SAMPLED_LIFETIME,
}


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


class BufferReport:
    """Accumulates RLlib's replay-buffer counts; logs and reduces them at most every ``interval_s``."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.counts = dict.fromkeys(
            (NUM_ENV_STEPS_ADDED, NUM_EPISODES_ADDED, NUM_ENV_STEPS_EVICTED, NUM_EPISODES_EVICTED,
             NUM_ENV_STEPS_SAMPLED, NUM_RESAMPLES), 0
        )
        self.n_step_mean = 0.0
        self._reported = {"prefetched_samples": 0, "priority_rows_dropped": 0}
        self._last = -float("inf")

    def added(self, steps: int, episodes: int, evicted_steps: int, evicted_episodes: int) -> None:
        c = self.counts
        c[NUM_ENV_STEPS_ADDED] += steps
        c[NUM_EPISODES_ADDED] += episodes
        c[NUM_ENV_STEPS_EVICTED] += evicted_steps
        c[NUM_EPISODES_EVICTED] += evicted_episodes

    def sampled(self, size: int, n_step_mean: float, resamples: int) -> None:
        self.counts[NUM_ENV_STEPS_SAMPLED] += size
        self.counts[NUM_RESAMPLES] += resamples
        self.n_step_mean = n_step_mean

    def report(self, logger: Any, window: int, episodes: int, timesteps: int, stats: ConduitBufferStats) -> Any:
        """``logger.reduce()`` with everything since the last report, or ``{}`` if too soon."""
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return {}
        self._last = now
        logger.log_value(NUM_EPISODES_STORED, episodes, reduce="mean", window=window)
        logger.log_value(NUM_ENV_STEPS_STORED, timesteps, reduce="mean", window=window)
        logger.log_value(ACTUAL_N_STEP, self.n_step_mean, reduce="mean", window=window)
        for key, value in self.counts.items():
            logger.log_value(key, value, reduce="sum")
            if key in _LIFETIME:
                logger.log_value(_LIFETIME[key], value, reduce="lifetime_sum")
        for key, done in self._reported.items():
            value = getattr(stats, key)
            logger.log_value(f"conduit_{key}", value - done, reduce="sum")
            self._reported[key] = value
        self.counts = dict.fromkeys(self.counts, 0)
        return logger.reduce()
