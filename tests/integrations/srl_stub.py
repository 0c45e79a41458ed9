"""An SRL-protocol stub, written from SRL's documented buffer protocol (docs/srl.md), never from SRL's code.

CI cannot fetch SRL and SRL's code must not be committed, so the contract tests run the
adapter against this module as if it were SRL's buffer module (``rlsrl.base.buffer``):
it has the names the adapter looks for (``make_buffer``, ``ReplayEntry``,
``PrioritizedReplayBuffer``, a ``namedarray`` with ``NamedArray``), a sample-stream
part (``SampleConsumer``, ``make_consumer`` with ``register_consumer``), and
:func:`trainer_step`, the trainer's GPU-thread step as the notes describe it (§1.4):
``empty() -> get()``, the staleness filter on ``policy_version_steps``,
``trainer.step(sample)``, and priority feedback only through the
``isinstance(buffer, PrioritizedReplayBuffer)`` gate. The few tests here check the
stub itself against the documented protocol.
"""

from __future__ import annotations

import bisect
import collections
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# -- base/namedarray.py, as documented: a nested record of arrays ------------------------------------------


class NamedArray:
    def __init__(self, **kwargs: Any) -> None:
        object.__setattr__(self, "_fields", tuple(sorted(kwargs)))
        object.__setattr__(self, "_meta", {})
        for k, v in kwargs.items():
            object.__setattr__(self, k, v)

    def __setattr__(self, k: str, v: Any) -> None:
        if k not in self._fields:
            raise AttributeError(k)
        object.__setattr__(self, k, v)

    def __getitem__(self, k: str) -> Any:
        return getattr(self, k)

    def items(self):
        return [(k, getattr(self, k)) for k in self._fields]

    def keys(self):
        return list(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self._meta)

    def register_metadata(self, **kw: Any) -> None:
        self._meta.update(kw)

    def length(self, dim: int = 0) -> int:
        for _, v in self.items():  # arrays at this level only: a nested record is skipped
            if isinstance(v, np.ndarray) and dim < v.ndim:
                return v.shape[dim]
        raise IndexError(dim)

    @property
    def shape(self) -> dict[str, Any]:
        """As SRL's record has one: its fields' shapes as a (nested) dict, so a record is not told from an
        array by having a ``shape``."""
        return {k: None if v is None else v.shape for k, v in self.items()}

    def min_of(self, k: str, ignore_negative: bool = True) -> float:
        v = np.asarray(self[k], dtype=np.float64)
        return float(np.nanmin(np.where(v >= 0, v, np.nan))) if np.any(v >= 0) else float("nan")

    def average_of(self, k: str, ignore_negative: bool = True) -> float:
        v = np.asarray(self[k], dtype=np.float64)
        return float(np.nanmean(np.where(v >= 0, v, np.nan)))


namedarray = sys.modules[__name__]  # the adapter finds ``NamedArray`` beside the buffer module


# -- base/buffer.py, as documented ----------------------------------------------------------------------------


@dataclass(order=True)
class ReplayEntry:
    reuses_left: int
    receive_time: float
    sample: Any = field(compare=False)
    reuses: int = field(default=0, compare=False)
    sampling_indices: Any = field(default=None, compare=False)


class Buffer:
    def put(self, x): raise NotImplementedError
    def get(self): raise NotImplementedError
    def empty(self): raise NotImplementedError
    def qsize(self): raise NotImplementedError


class PriorityQueueBuffer(Buffer):
    """The documented default: most reuses left then newest first; drop fewest-left-oldest on overflow."""

    def __init__(self, max_size=16, reuses=1, batch_size=1):
        self.items, self.tmp, self.max_size, self.reuses, self.batch_size = [], [], max_size, reuses, batch_size

    def put(self, x):
        self.tmp.append(x)
        if len(self.tmp) < self.batch_size:
            return False
        group, self.tmp = self.tmp[: self.batch_size], self.tmp[self.batch_size :]
        stacked = _stack(group)
        bisect.insort(self.items, ReplayEntry(self.reuses, time.time(), stacked))
        while len(self.items) > self.max_size:
            self.items.pop(0)
        return True

    def get(self):
        r = self.items.pop()
        r.reuses_left -= 1
        r.reuses += 1
        if r.reuses_left > 0:
            bisect.insort(self.items, r)
        return r

    def empty(self):
        return not self.items

    def qsize(self):
        return len(self.items)


def _zeros_like(x):
    if isinstance(x, NamedArray):
        return NamedArray(**{k: None if v is None else _zeros_like(v) for k, v in x.items()})
    return np.zeros_like(x)


def _stack(xs):
    """Recursively stack on axis 1: all None stays None, some None are filled with zeros of the others' shape
    (a whole record too), as the notes document SRL's aggregation."""
    present = [x for x in xs if x is not None]
    if not present:
        return None
    xs = [_zeros_like(present[0]) if x is None else x for x in xs]
    if isinstance(xs[0], NamedArray):
        return NamedArray(**{k: _stack([x[k] for x in xs]) for k in xs[0].keys()})
    return np.stack(xs, axis=1)


class PrioritizedReplayBuffer(Buffer):
    """Only the class matters here: the trainer's gate for ``update_priorities``."""

    def update_priorities(self, idxes, priorities):
        raise NotImplementedError


def make_buffer(name, **buffer_args):
    if name == "priority_queue":
        return PriorityQueueBuffer(**buffer_args)
    raise NotImplementedError(name)


# -- system/api/sample_stream.py, as documented ----------------------------------------------------------------


class NothingToConsume(Exception):
    pass


class SampleConsumer:
    def consume_to(self, buffer, max_iter): raise NotImplementedError
    def consume(self): raise NotImplementedError


class DequeSampleConsumer(SampleConsumer):
    """A thread-safe in-process stream: ``post`` from any thread, ``consume_to`` puts one sample at a time."""

    def __init__(self):
        self.samples = collections.deque()

    def post(self, sample):
        self.samples.append(sample)

    def consume_to(self, buffer, max_iter=16):
        count = 0
        for _ in range(max_iter):
            try:
                sample = self.samples.popleft()
            except IndexError:
                break
            buffer.put(sample)
            count += 1
        return count

    def consume(self):
        try:
            return self.samples.popleft()
        except IndexError:
            raise NothingToConsume() from None


CONSUMERS: dict[str, Any] = {"deque": lambda spec: DequeSampleConsumer()}


def register_consumer(type_, factory):
    CONSUMERS[type_] = factory


def make_consumer(spec, *args, **kwargs):
    if isinstance(spec, SampleConsumer):
        return spec
    return CONSUMERS[spec](spec, *args, **kwargs)


# -- the trainer's GPU thread (trainer_worker.py: GPUThread._run_step), as documented -------------------------


@dataclass
class StepLog:
    trained: list = field(default_factory=list)  # samples the trainer stepped on
    skipped: int = 0  # samples the staleness filter dropped
    idle: int = 0  # polls that found the buffer empty
    priority_updates: int = 0


def trainer_step(
    buffer, log: StepLog, *, version=0, preemption_steps=1_000_000, priorities=None, gate=PrioritizedReplayBuffer
) -> None:
    """One poll of the GPU thread: ``empty -> get -> filter -> step -> isinstance-gated update_priorities``
    (``gate``: the class SRL's trainer checks, its buffer module's ``PrioritizedReplayBuffer``)."""
    if buffer.empty():
        log.idle += 1
        return
    entry = buffer.get()
    low = entry.sample.min_of("policy_version_steps", ignore_negative=True)
    if low is None or np.isnan(low) or low < 0 or version - low > preemption_steps:
        log.skipped += 1
        return
    entry.sample.policy_name = None
    log.trained.append(entry)
    if priorities is not None and isinstance(buffer, gate):
        buffer.update_priorities(entry.sampling_indices, priorities(entry))
        log.priority_updates += 1


def sample(i: int, t: int = 4, version: int = 0, dim: int = 3) -> NamedArray:
    """An SRL-shaped sample ``[T, ...]`` whose every value encodes ``i`` (and, in ``t``, the time step)."""
    steps = np.arange(t, dtype=np.float32)[:, None]
    return NamedArray(
        obs=np.float32(i) + 0.001 * steps + np.zeros((t, dim), np.float32),
        reward=np.full((t, 1), i, np.float32),
        done=np.zeros((t, 1), np.bool_),
        policy_version_steps=np.full((t, 1), version, np.int64),
        policy_name=None,
        analyzed_result=NamedArray(ret=np.full((t, 1), i, np.float32), value=None),
    )


def actor_sample(i: int, t: int = 4, version: int = 0, info: bool = True) -> NamedArray:
    """A sample as SRL's actors post it: ``obs`` and ``action`` records, an ``info`` record (``None`` at steps
    with none), ``analyzed_result`` with ``None`` leaves, ``policy_state`` ``None``, a string ``policy_name``."""
    return NamedArray(
        obs=NamedArray(obs=np.full((t, 3), i, np.float32), mask=np.ones((t, 2), np.uint8)),
        action=NamedArray(x=np.full((t, 1), i % 3, np.int32)),
        reward=np.full((t, 1), i, np.float32),
        done=np.zeros((t, 1), np.uint8), truncated=np.zeros((t, 1), np.uint8), on_reset=np.zeros((t, 1), np.uint8),
        info=NamedArray(episode_return=np.full((t, 1), i, np.float32)) if info else None,
        info_mask=np.zeros((t, 1), np.uint8),
        policy_state=None,
        analyzed_result=NamedArray(log_probs=np.zeros((t, 1), np.float32), value=np.zeros((t, 1), np.float32),
                                   ret=None),
        policy_name=np.array([["default"]] * t),
        policy_version_steps=np.full((t, 1), version, np.int64),
    )


def ids_of(batch_sample: Any) -> np.ndarray:
    """The sample ids of a time-major ``[T, B, ...]`` batch (column b's reward)."""
    return np.asarray(batch_sample.reward)[0, :, 0].astype(np.int64)
