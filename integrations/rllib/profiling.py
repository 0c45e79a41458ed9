"""How much of an iteration the experience path costs, measured the same way with and without Conduit.

The exposed experience-path latency (docs/design.md §4) is the time the training
loop waits on experience handling: for DQN/SAC the replay buffer's ``add``,
``sample``, ``get_metrics`` and ``update_priorities`` plus the learner turning
the sample into a train batch (``_make_batch_if_necessary``: RLlib's learner
connector, or taking Conduit's prepared tensors); for PPO the learner connector
(with GAE) plus the time the update loop waits for its next mini-batch.
Work Conduit overlaps with rollout or update on its own threads is hidden and
not counted — only what the loop waits for is.

:class:`ExperiencePathTimer` wraps those methods on the live objects (the
algorithm's buffer and its in-process learner), so stock RLlib and Conduit are
measured by the same code. With learner actors (``num_learners >= 1``) only the
driver's side is timed: the buffer's calls, or with the buffer sharded over the
learners, the driver's ``add`` plus the slowest learner's pull of each update;
a learner actor's connector (stock RLlib) is inside its update and not counted.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["ExperiencePathTimer", "measure_iterations", "summary_table"]

_BUFFER_METHODS = ("add", "sample", "get_metrics", "update_priorities")


class _TimedIterator:
    def __init__(self, it: Any, timer: ExperiencePathTimer) -> None:
        self._it = it
        self._timer = timer

    def __iter__(self) -> Iterator[Any]:
        source = iter(self._it)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(source)
            except StopIteration:
                self._timer.charge("minibatch_wait", time.perf_counter() - t0)
                return
            self._timer.charge("minibatch_wait", time.perf_counter() - t0)
            yield item


class ExperiencePathTimer:
    """Accumulates exposed experience-path seconds of one algorithm (in-process learner)."""

    def __init__(self, algo: Any) -> None:
        self.seconds: dict[str, float] = {}
        self._patched: list[tuple[Any, str]] = []
        buffer = getattr(algo, "local_replay_buffer", None)
        if buffer is not None:
            for name in _BUFFER_METHODS:
                self._wrap(buffer, name, f"buffer.{name}")
        shards = getattr(algo, "conduit_shards", None)
        if shards is not None:
            self._wrap(shards, "add", "shards.add")
            original_train = shards.train

            @functools.wraps(original_train)
            def train(*args: Any, **kwargs: Any) -> Any:
                before = shards.pull_s
                try:
                    return original_train(*args, **kwargs)
                finally:
                    self.charge("shards.pull", shards.pull_s - before)

            shards.train = train
            self._patched.append((shards, "train"))
        learner = getattr(algo.learner_group, "_learner", None) if algo.config.num_learners == 0 else None
        if learner is None:
            return
        self._wrap(learner, "_make_batch_if_necessary", "learner.make_batch")
        original = learner._create_iterator_if_necessary

        @functools.wraps(original)
        def create_iterator(*args: Any, **kwargs: Any) -> Any:
            it = original(*args, **kwargs)
            return it if isinstance(it, dict) else _TimedIterator(it, self)

        learner._create_iterator_if_necessary = create_iterator
        self._patched.append((learner, "_create_iterator_if_necessary"))

    def charge(self, key: str, dt: float) -> None:
        self.seconds[key] = self.seconds.get(key, 0.0) + dt

    def _wrap(self, obj: Any, name: str, key: str) -> None:
        original: Callable[..., Any] = getattr(obj, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.charge(key, time.perf_counter() - t0)

        setattr(obj, name, timed)
        self._patched.append((obj, name))

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def reset(self) -> dict[str, float]:
        """The seconds so far (by part), then start from zero."""
        out, self.seconds = self.seconds, {}
        return out

    def close(self) -> None:
        """Remove the wrappers (the objects' class methods show through again)."""
        for obj, name in self._patched:
            obj.__dict__.pop(name, None)
        self._patched.clear()


def measure_iterations(
    algos: Mapping[str, Any], iterations: int, verbose: bool = True
) -> dict[str, list[dict[str, Any]]]:
    """Train each algorithm ``iterations`` times, interleaved (A, B, A, B, ...).

    Interleaving exposes every run to the same machine load over time, which
    matters on a shared machine. Per iteration: wall time, exposed
    experience-path time and its share, mean episode return, env steps.
    """
    timers = {label: ExperiencePathTimer(algo) for label, algo in algos.items()}
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in algos}
    try:
        for i in range(iterations):
            for label, algo in algos.items():
                timer = timers[label]
                timer.reset()
                t0 = time.perf_counter()
                result = algo.train()
                wall = time.perf_counter() - t0
                runners = result.get("env_runners", {})
                row = {
                    "label": label,
                    "iteration": i,
                    "wall_s": wall,
                    "experience_s": timer.total,
                    "share": timer.total / wall if wall > 0 else 0.0,
                    "return_mean": runners.get("episode_return_mean"),
                    "env_steps": runners.get("num_env_steps_sampled_lifetime"),
                    "parts": dict(timer.seconds),
                }
                results[label].append(row)
                if verbose:
                    ret = row["return_mean"]
                    print(
                        f"[{label}] iter {i}: {wall:.2f}s, experience path {timer.total * 1e3:.0f} ms "
                        f"({row['share']:.0%}), return {'n/a' if ret is None else f'{ret:.1f}'}",
                        flush=True,
                    )
    finally:
        for timer in timers.values():
            timer.close()
    return results


def summary_table(results: Mapping[str, list[dict[str, Any]]], skip: int = 1) -> str:
    """Markdown: median iteration time and exposed experience path per run (first ``skip`` iterations dropped)."""
    lines = [
        f"| run | iterations timed / run (the first {skip} warm up) | iteration time (s, median) "
        "| exposed experience path (ms/iter, median) | share of iteration |",
        "|---|---|---|---|---|",
    ]
    for label, rows in results.items():
        kept = rows[skip:] if len(rows) > skip else rows
        wall = statistics.median(r["wall_s"] for r in kept)
        exp = statistics.median(r["experience_s"] for r in kept)
        share = statistics.median(r["share"] for r in kept)
        lines.append(f"| {label} | {len(kept)} of {len(rows)} | {wall:.3f} | {exp * 1e3:.1f} | {share:.1%} |")
    return "\n".join(lines)
