"""PPO's mini-batch iterator, one step ahead: mini-batch k+1 is prepared while k trains.

RLlib's ``Learner.update`` only does ``for minibatch in batch_iter``; the iterator
(``MiniBatchCyclicIterator``) slices the train batch, concatenates pieces that
straddle an epoch boundary and reshuffles the whole batch at each boundary.
:class:`PipelinedMinibatches` runs that same iterator on a worker thread (the
core's :class:`~conduit.executor.Worker`: bounded waits, failures re-raised in
the learner's thread with their traceback), at most ``depth`` mini-batches
ahead. The mini-batches are RLlib's own, in RLlib's order: only this worker
draws from the global ``np.random`` the reshuffle uses, so the sequence is the
one the learner would have produced inline.

On a GPU learner the worker runs on a dedicated CUDA stream: it first waits for
the learner's stream (which produced the train batch), and each mini-batch is
handed over with an event the learner's stream waits on, its tensors recorded
on that stream so the caching allocator keeps them alive (docs/design.md §5).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import tree

from conduit.executor import POLL_S, FailureBox, StreamSet, Worker, handoff, wait_until

__all__ = ["PipelineStats", "PipelinedMinibatches"]

_END = object()


@dataclass
class PipelineStats:
    updates: int = 0
    minibatches: int = 0
    ready_on_request: int = 0  # mini-batches already prepared when the learner asked
    wait_s: float = 0.0  # learner time blocked on the worker (exposed)
    prepare_s: float = 0.0  # worker time preparing mini-batches (hidden when overlapped)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _tensors(minibatch: Any) -> dict[str, torch.Tensor]:
    leaves = tree.flatten({mid: dict(b) for mid, b in minibatch.policy_batches.items()})
    return {str(i): t for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)}


class PipelinedMinibatches:
    """Iterate ``source`` (RLlib mini-batches) with up to ``depth`` prepared ahead."""

    def __init__(
        self,
        source: Iterable[Any],
        *,
        device: torch.device | str | None,
        depth: int = 1,
        timeout_s: float = 60.0,
        stats: PipelineStats | None = None,
        batch: Any = None,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._source = source
        self._depth = depth
        self._timeout = timeout_s
        self.stats = stats or PipelineStats()
        self._cond = threading.Condition()
        self._ready: deque[tuple[Any, torch.cuda.Event | None]] = deque()
        self._done = False
        self._failure = FailureBox()
        self._streams = StreamSet(torch.device(device) if device is not None else torch.device("cpu"))
        self._batch = batch
        self._it: Iterator[Any] | None = None
        self._worker = Worker("ppo-minibatches", self._step, self._failure, self._cond)

    def _order_after_learner(self) -> None:
        """On CUDA: the worker's stream waits for the learner's stream, and reads of the batch are recorded."""
        stream = self._streams.stream
        if stream is None:
            return
        device = self._streams.device
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        self._streams.wait(event)
        if self._batch is not None:
            for t in _tensors(self._batch).values():
                if t.device.type == "cuda":
                    t.record_stream(stream)

    def _step(self) -> None:
        with self._cond:
            if self._done or len(self._ready) >= self._depth:
                self._cond.wait(POLL_S)
                return
        t0 = time.perf_counter()
        with self._streams.active():
            if self._it is None:
                self._it = iter(self._source)
            item = next(self._it, _END)
            event = self._streams.record()
        with self._cond:
            self.stats.prepare_s += time.perf_counter() - t0
            self._ready.append((item, event))
            self._done = item is _END
            self._cond.notify_all()

    def __iter__(self) -> Iterator[Any]:
        self.stats.updates += 1
        self._order_after_learner()
        self._worker.start()
        try:
            while True:
                with self._cond:
                    was_ready = bool(self._ready)
                    if not was_ready:
                        t0 = time.perf_counter()
                        wait_until(self._cond, lambda: bool(self._ready), self._timeout, self._failure,
                                   lambda: "the next PPO mini-batch from the pipeline worker")
                        self.stats.wait_s += time.perf_counter() - t0
                    item, event = self._ready.popleft()
                    self._cond.notify_all()
                if item is _END:
                    return
                self.stats.ready_on_request += int(was_ready)
                if event is not None:
                    handoff(_tensors(item), event)
                self.stats.minibatches += 1
                yield item
        finally:
            self._worker.stop(self._timeout)
