"""Prefetch as a node: any iterator run ahead on the core's worker, its items handed over in order.

A framework's own batching logic (RLlib's ``MiniBatchCyclicIterator``, a data
loader, a sampler with its own random stream) stays untouched and only moves off
the learner's thread: :class:`Prefetcher` runs ``iter(source)`` on a
:class:`~conduit.executor.Worker` (bounded waits, the first failure re-raised in
the consumer's thread with its traceback), at most ``depth`` items ahead. Only
the worker advances the source, so the items come in the order, and from the
random stream, the consumer would have produced inline — torchdata's
prefetch-as-a-node, with Conduit's executor underneath.

On a GPU the worker runs on the core's dedicated CUDA stream (:class:`~conduit.executor.StreamSet`):
it first waits for the consumer's stream (which produced the source's input),
and each item is handed over with an event the consumer's stream waits on, its
tensors recorded on that stream so the caching allocator keeps them alive
(:func:`~conduit.executor.handoff`). ``tensors`` says which tensors an item holds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

import torch

from conduit.executor import POLL_S, FailureBox, StreamSet, Worker, handoff, wait_until

__all__ = ["PrefetchStats", "Prefetcher"]

T = TypeVar("T")
_END = object()


@dataclass
class PrefetchStats:
    updates: int = 0  # passes over a source (one ``iter()`` each)
    minibatches: int = 0  # items handed over
    ready_on_request: int = 0  # items already prepared when the consumer asked
    wait_s: float = 0.0  # consumer time blocked on the worker (exposed)
    prepare_s: float = 0.0  # worker time preparing items (hidden when overlapped)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _no_tensors(item: Any) -> Mapping[str, torch.Tensor]:
    return {}


class Prefetcher(Generic[T]):
    """Iterate ``source`` with up to ``depth`` items prepared ahead on the core's worker (one pass)."""

    def __init__(
        self,
        source: Iterable[T],
        *,
        device: torch.device | str | None = None,
        depth: int = 1,
        timeout_s: float = 60.0,
        stats: PrefetchStats | None = None,
        tensors: Callable[[Any], Mapping[str, torch.Tensor]] = _no_tensors,
        inputs: Any = None,
        name: str = "prefetch",
    ) -> None:
        """``tensors(x)``: the tensors of an item (handed to the consumer's stream), or of ``inputs`` — what the
        source reads, which the worker's stream must not free before it has read it."""
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._source = source
        self._depth = depth
        self._timeout = timeout_s
        self._tensors = tensors
        self._inputs = inputs
        self.stats = stats or PrefetchStats()
        self._cond = threading.Condition()
        self._ready: deque[tuple[Any, torch.cuda.Event | None]] = deque()
        self._done = False
        self._failure = FailureBox()
        self._streams = StreamSet(torch.device(device) if device is not None else torch.device("cpu"))
        self._it: Iterator[T] | None = None
        self._worker = Worker(name, self._step, self._failure, self._cond)

    def _order_after_consumer(self) -> None:
        """On CUDA: the worker's stream waits for the consumer's stream, and its reads of the inputs are recorded."""
        stream = self._streams.stream
        if stream is None:
            return
        device = self._streams.device
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        self._streams.wait(event)
        if self._inputs is not None:
            for t in self._tensors(self._inputs).values():
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

    def __iter__(self) -> Iterator[T]:
        self.stats.updates += 1
        self._order_after_consumer()
        self._worker.start()
        try:
            while True:
                with self._cond:
                    was_ready = bool(self._ready)
                    if not was_ready:
                        t0 = time.perf_counter()
                        wait_until(self._cond, lambda: bool(self._ready), self._timeout, self._failure,
                                   lambda: f"the next item from the {self._worker.name} worker")
                        self.stats.wait_s += time.perf_counter() - t0
                    item, event = self._ready.popleft()
                    self._cond.notify_all()
                if item is _END:
                    return
                self.stats.ready_on_request += int(was_ready)
                if event is not None:
                    handoff(self._tensors(item), event)
                self.stats.minibatches += 1
                yield item
        finally:
            self._worker.stop(self._timeout)
