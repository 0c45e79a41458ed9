"""Ingestion through SRL's sample stream: a ``SampleConsumer`` that hands a Conduit buffer whole groups.

SRL's trainer thread calls ``stream.consume_to(buffer, max_iter=1024)``, and every
consumer (ZMQ, shared memory, ...) calls ``buffer.put(sample)`` once per sample it
reads. :class:`ConduitSampleConsumer` wraps any SRL consumer: the samples one
``consume_to`` reads are collected and given to the Conduit buffer's ``put_many``,
so a replay buffer ingests them in one push (Conduit's ingestion granularity)
instead of one push each. Every sample read is put exactly once, in order; a
buffer without ``put_many`` (any SRL buffer) gets the plain per-sample ``put``.

Two ways in, as SRL's stream API allows:

- an instance in ``TrainerWorker.sample_stream``: ``rlsrl``'s ``make_consumer``
  passes ``SampleConsumer`` instances through unchanged, which is why the class is
  made a subclass of SRL's ``SampleConsumer`` (:func:`consumer_class`);
- :func:`install_consumers`: wraps the stream module's ``make_consumer`` (a module
  attribute, looked up at call time like ``make_buffer``) so every consumer it
  makes, through ``rlsrl``'s registry (``register_consumer``) or the monorepo's
  ``if/elif``, comes back wrapped.

A pickled consumer carries the :class:`~.install.Installation` it was made with:
unpickling it in a spawned worker registers Conduit's buffers there too.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .install import Installation
from .locate import first_module

__all__ = ["STREAM_MODULES", "ConduitSampleConsumer", "consumer_class", "install_consumers"]

#: SRL's sample-stream module, by the name each SRL distribution gives it
STREAM_MODULES = ("rlsrl.system.api.sample_stream", "distributed.system.sample_stream")
ORIGINAL = "__conduit_original__"

_lock = threading.Lock()
_classes: dict[int, type[Any]] = {}


class _Collector:
    """What an SRL consumer's ``consume_to`` puts into: it keeps the samples, in order."""

    def __init__(self) -> None:
        self.samples: list[Any] = []

    def put(self, x: Any) -> bool:
        self.samples.append(x)
        return False


class ConduitSampleConsumer:
    """Wraps an SRL ``SampleConsumer``: ``consume_to`` puts what it read into a Conduit buffer at once."""

    def __init__(self, inner: Any, installation: Installation | None = None) -> None:
        self.inner = inner
        self.installation = installation
        #: samples handed to buffers, and ``consume_to`` calls that handed any
        self.consumed = self.groups = 0

    def consume_to(self, buffer: Any, max_iter: int = 16) -> int:
        put_many: Callable[[list[Any]], int] | None = getattr(buffer, "put_many", None)
        if put_many is None:
            return int(self.inner.consume_to(buffer, max_iter))
        collector = _Collector()
        count = int(self.inner.consume_to(collector, max_iter))
        if collector.samples:
            put_many(collector.samples)
            self.consumed += len(collector.samples)
            self.groups += 1
        return count

    def consume(self) -> Any:
        return self.inner.consume()

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()

    def __reduce__(self) -> tuple[Any, ...]:
        module = self.stream_module.__name__ if self.stream_module is not None else None
        return (_rebuild, (self.inner, self.installation, module))

    #: the SRL stream module whose ``SampleConsumer`` this class subclasses (None: the plain class)
    stream_module: ModuleType | None = None


def consumer_class(stream_module: ModuleType | None) -> type[ConduitSampleConsumer]:
    """:class:`ConduitSampleConsumer` as a subclass of ``stream_module.SampleConsumer`` (made once per module)."""
    base = getattr(stream_module, "SampleConsumer", None)
    if base is None:
        return ConduitSampleConsumer
    with _lock:
        cls = _classes.get(id(base))
        if cls is None:
            cls = type(
                "ConduitSampleConsumer", (ConduitSampleConsumer, base),
                {"__module__": __name__, "stream_module": stream_module, "__doc__": ConduitSampleConsumer.__doc__},
            )
            _classes[id(base)] = cls
        return cls


def _rebuild(inner: Any, installation: Installation | None, module: str | None) -> ConduitSampleConsumer:
    stream_module = importlib.import_module(module) if module else None
    return consumer_class(stream_module)(inner, installation)


def find_stream(module: str | ModuleType | None = None) -> ModuleType:
    """SRL's sample-stream module (``ImportError`` naming what was tried)."""
    candidates = (module,) if module else STREAM_MODULES
    return first_module(candidates, ("make_consumer", "SampleConsumer"), "SRL's sample-stream module")


def install_consumers(
    module: str | ModuleType | None = None, installation: Installation | None = None
) -> type[ConduitSampleConsumer]:
    """Wrap the stream module's ``make_consumer`` (idempotent): every consumer it makes comes back as a
    :class:`ConduitSampleConsumer`. Returns the consumer class (to build instances for ``sample_stream``)."""
    mod = find_stream(module)
    cls = consumer_class(mod)
    with _lock:
        current = mod.make_consumer
        if not hasattr(current, ORIGINAL):

            def make_consumer(spec: Any, *args: Any, **kwargs: Any) -> Any:
                made = current(spec, *args, **kwargs)
                return made if isinstance(made, ConduitSampleConsumer) else cls(made, installation)

            setattr(make_consumer, ORIGINAL, current)
            mod.make_consumer = make_consumer
    return cls
