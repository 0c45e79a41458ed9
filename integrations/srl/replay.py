"""``conduit_replay``: SRL's uniform replay buffer with Conduit's runtime inside (and the base of PER's).

Outside, SRL's ``SimpleReplayBuffer`` / ``PrioritizedReplayBuffer`` as its trainer uses
them: the same constructor arguments (``max_size``, ``batch_size``,
``warmup_transitions``, ``seed``, ``sample_length``, ``batch_length``; PER adds
``alpha``, ``beta``, ``beta_scheduler``, ``max_priority``), ``put(sample)`` of a
``[T, ...]`` sample, ``empty()`` until ``warmup_transitions`` transitions are stored,
``qsize()`` in transitions, and ``get()`` returning SRL's ``ReplayEntry`` with a
time-major ``[T, B, ...]`` sample, ``reuses_left=-1``, ``receive_time=-1`` and
``reuses`` = the mean replay count of the drawn samples (counted at the draw for
uniform replay, at ``update_priorities`` for PER, as SRL counts them). PER is
:mod:`.prioritized`.

Inside, a :class:`conduit.Conduit` off-policy runtime whose row is one SRL sample
(every field ``[T, ...]``): the trainer thread's ``get()`` is a ``pull()`` and the
stream thread's ``put()`` a ``push()``, both thread-safe. For a host learner
(``learner_device="cpu"``: the trainer's own prefetcher copies to its GPU) a
batch is gathered time-major (``[T, B, ...]``, one copy: ``Tuning.time_major``; where CUDA is, into
page-locked :class:`conduit.ext.Staging` blocks for the trainer's prefetcher) and a delivery hook
builds SRL's sample from it, on Conduit's delivery worker, overlapping the trainer's update (the
default for uniform replay everywhere, and for PER where CUDA is available: on a CPU, PER
draws each batch after the previous batch's feedback, as SRL's trainer thread does); for a
GPU learner Conduit gathers straight onto the device and the sample's fields are tensors there.

Differences from SRL, on purpose or not supported: a uniform draw is with replacement
(Conduit's uniform selector; SRL draws a batch without replacement); chunks shorter
than a sample (``batch_length < sample_length``) and PER's TD-error initial
priorities (``priority_interpolation_eta``) are refused with a ``ConfigError``.
"""

from __future__ import annotations

import math
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

import conduit
from conduit import BatchInfo, ConfigError, Reader, SemanticsError, SpecError, Writer
from conduit.ext import HandoffGuard, RecordLayout, Staging, as_row, pack, stack_rows, unpacked

from .locate import HOST_FIELDS, SRLTypes, types_named

__all__ = ["CLASSES", "ConduitReplayBuffer", "positive"]



class ConduitReplayBuffer:
    """``conduit_replay``: uniform replay of whole samples (see the module docstring)."""

    NAME: ClassVar[str] = "conduit_replay"
    prioritized: ClassVar[bool] = False

    def __init__(
        self,
        max_size: int,
        batch_size: int,
        warmup_transitions: int,
        seed: int = 0,
        sample_length: int | None = None,
        batch_length: int | None = None,
        *,
        learner_device: str = "cpu",
        timeout_s: float = 60.0,
        conduit_config: dict[str, Any] | None = None,
        srl_types: SRLTypes | None = None,
    ) -> None:
        positive(max_size=max_size, batch_size=batch_size)
        if warmup_transitions < 0:
            raise ConfigError(f"warmup_transitions: expected >= 0, got {warmup_transitions}")
        if batch_length is not None and sample_length is not None and batch_length != sample_length:
            raise ConfigError(
                f"batch_length={batch_length} with sample_length={sample_length}: the Conduit SRL replay buffers "
                "draw whole samples (batch_length == sample_length); use SRL's simple_replay_buffer for chunks"
            )
        if sample_length is not None and max(batch_size, math.ceil(warmup_transitions / sample_length)) > max_size:
            raise ConfigError(  # (refused at make_buffer, not at the stream thread's first put)
                f"warmup_transitions={warmup_transitions} and batch_size={batch_size} need more than max_size="
                f"{max_size} samples of sample_length={sample_length}: the buffer would never be ready"
            )
        self.max_size, self.batch_size, self.warmup_transitions = int(max_size), int(batch_size), warmup_transitions
        self.seed, self.sample_length, self.batch_length = seed, sample_length, batch_length
        self.learner_device = torch.device(learner_device)
        self.timeout_s = timeout_s
        self.conduit_config = dict(conduit_config or {})
        self.types = srl_types or types_named(None)
        self._kwargs: dict[str, Any] = dict(
            max_size=max_size, batch_size=batch_size, warmup_transitions=warmup_transitions, seed=seed,
            sample_length=sample_length, batch_length=batch_length, learner_device=learner_device,
            timeout_s=timeout_s, conduit_config=self.conduit_config,
        )
        # the runtime's creation at the first put (any stream thread may put first)
        self._lock = threading.Lock()
        self.layout: RecordLayout | None = None
        self.edp: conduit.Conduit | None = None
        self.staging = Staging() if self.learner_device.type == "cpu" else None
        self._guard = HandoffGuard()
        self._warm = False  # a pull can always be served (see _warmed)

    # -- the runtime, made at the first put (the sample length is known then) -------------------
    def _config(self, layout: RecordLayout) -> conduit.ConduitConfig:
        t = layout.length
        fields: dict[str, Any] = dict(
            policy="off_policy", train_batch_size=self.batch_size, capacity=self.max_size,
            min_size_to_sample=max(self.batch_size, math.ceil(self.warmup_transitions / t)),
            seed=self.seed, learner_device=str(self.learner_device), timeout_s=self.timeout_s,
            # SRL's ``reuses``: a uniform replay counts a sample at its draw, PER at its priority update
            count_replays="feedback" if self.prioritized else "draw",
        )
        fields.update(self._sampler_fields())
        # the next batch is gathered on Conduit's delivery worker while the trainer thread runs its update: on a
        # GPU trainer, and for uniform replay on a CPU one too, where the gather otherwise sits inline between
        # two updates. PER on a CPU keeps SRL's order (each draw after the previous batch's feedback): a batch
        # drawn ahead would not see those priorities. ``conduit_config={"pinned": ...}`` overrides either.
        if not self.prioritized or (self.staging is not None and self.staging.pinned):
            fields["pinned"] = conduit.SchedulePin(delivery_overlap=True)
        if self.staging is not None and not self.staging.pinned:  # the gather writes [T, B, ...] itself
            fields["tuning"] = conduit.Tuning(time_major=True)
        fields.update(self.conduit_config)
        return conduit.ConduitConfig(**fields)

    def _sampler_fields(self) -> dict[str, Any]:
        return {"sampler": "uniform"}

    def _runtime(self, layout: RecordLayout) -> conduit.Conduit:
        """The runtime, which holds this buffer only weakly: SRL never closes a buffer, it drops it, and then the
        runtime is closed (its worker and storage freed) with it."""
        edp = conduit.Conduit(self._config(layout))
        if self.staging is not None:
            edp.register_delivery(input="ExperienceBuffer", output="Learner")(_held_weakly(self))
        weakref.finalize(self, edp.close)
        return edp

    def _begin(self, sample: Any) -> None:
        """Learn the stream's layout from its first sample and start the runtime (caller holds the lock)."""
        layout = RecordLayout.of(sample)
        if self.batch_length is not None and self.batch_length != layout.length:  # (sample_length was not given)
            raise ConfigError(
                f"batch_length={self.batch_length} with samples of length {layout.length}: the Conduit SRL replay "
                "buffers draw whole samples (batch_length == sample_length); use SRL's simple_replay_buffer for chunks"
            )
        if self.sample_length is not None and layout.length != self.sample_length:
            raise RuntimeError(
                f"the sample received has length {layout.length} on axis 0, the buffer was configured with "
                f"sample_length={self.sample_length}"
            )
        if layout.other:
            raise SpecError(
                f"fields {sorted(layout.other)} are not numeric arrays: a Conduit replay buffer stores numbers "
                "(SRL's replay buffers store them in numeric arrays too)"
            )
        self.layout = layout  # before the runtime: its delivery hook lays batches out by it
        edp = self._runtime(layout)
        edp.start()
        self.layout, self.edp, self.sample_length = layout, edp, layout.length
        self._kwargs["sample_length"] = layout.length

    def deliver(self, exp_in: Reader, learn_out: Writer) -> None:
        """Delivery hook: each batch of ``[B, T, ...]`` rows as the transposed view of a ``[T, B, ...]`` block (one
        output row per input row, as a delivery hook must) -- on a CPU trainer the gather wrote that layout itself
        (``Tuning.time_major``), for a GPU trainer's prefetcher it is copied into a page-locked block; and the
        batch's SRL sample (uniform replay: its whole ``ReplayEntry``, with the replay counts), made here while the
        trainer updates and attached to the batch, so ``get`` on the trainer thread only pulls. Uniform replay
        counts at the draw, as SRL does; this hook runs the draws in their order, so the counts are SRL's."""
        data = exp_in.read()
        assert self.staging is not None and self.layout is not None
        b = self.batch_size
        rows = next(iter(data.values())).shape[0]
        times = exp_in.info["drawn"].times  # each drawn sample's replay count before this batch (count_replays)
        pinned = self.staging.pinned
        for start in range(0, rows, b):
            # (one batch per invocation, the usual case: the gathered tensors themselves, not slices of them)
            part = dict(data) if rows == b else {k: v[start : start + b] for k, v in data.items()}
            # the [T, B, ...] blocks as numpy arrays and the [B, T, ...] rows over them, laid out on the numpy
            # side: torch releases the GIL when it frees a view op's result (conduit.memory), and the trainer
            # thread frees these while the delivery worker waits to gather the next batch
            if pinned:  # the trainer's prefetcher copies to its GPU from page-locked blocks
                blocks = self.staging.take(
                    {k: ((v.shape[1], v.shape[0], *v.shape[2:]), v.dtype) for k, v in part.items()}
                )
                for k, v in part.items():
                    blocks[k].transpose(0, 1).copy_(v)
                arrays = {k: blk.numpy() for k, blk in blocks.items()}
                out = {k: torch.from_numpy(a.swapaxes(0, 1)) for k, a in arrays.items()}
            else:  # gathered time-major (Tuning.time_major): the blocks are the rows' own memory
                arrays = {k: np.ascontiguousarray(v.numpy().swapaxes(0, 1)) for k, v in part.items()}
                out = part
            sample = self.layout.rebuild(arrays, self.types.named_array)
            entry = None
            if not self.prioritized:  # (PER's entry carries its sampling indices: made by get)
                reuses = float(times[start : start + b].mean())
                entry = self.types.replay_entry(
                    reuses_left=-1, receive_time=-1, sample=sample, reuses=reuses, sampling_indices=None
                )
            learn_out.write(out, attach=(sample, entry))

    # -- SRL's buffer protocol -------------------------------------------------------------------
    def put(self, x: Any) -> None:
        """Store one ``[T, ...]`` sample (the stream thread)."""
        self.put_many([x])

    def put_many(self, xs: list[Any]) -> int:
        """Store samples in one push (what :class:`~.consumer.ConduitSampleConsumer` calls); returns how many."""
        if not xs:
            return 0
        for x in xs:
            if hasattr(x, "policy_name"):
                x.policy_name = None  # as SRL's replay buffers do: a non-numeric field the trainer never reads
        with self._lock:
            if self.edp is None:
                self._begin(xs[0])
        layout, edp = self.layout, self.edp
        assert layout is not None and edp is not None
        names = layout.numeric
        leaves = [layout.leaves(x) for x in xs]
        for lv in leaves:
            t = int(lv[names[0]].shape[0])
            if t != layout.length:
                raise RuntimeError(
                    f"the sample received has length {t} on axis 0, this buffer's samples have {layout.length}"
                )
        if len(xs) == 1:
            unit = {k: as_row(leaves[0][k]) for k in names}
        else:
            unit = {k: stack_rows([lv[k] for lv in leaves]) for k in names}
        edp.push(unit)
        return len(xs)

    def empty(self) -> bool:
        """Whether fewer than ``warmup_transitions`` transitions (or a batch's samples) are stored: cheap."""
        edp = self.edp
        return edp is None or not edp.ready()

    def qsize(self) -> int:
        """Stored transitions (samples times their length)."""
        edp = self.edp
        if edp is None or edp.buffer is None:
            return 0
        return int(edp.buffer.rows) * int(self.sample_length or 0)

    def full(self) -> bool:
        edp = self.edp
        return edp is not None and edp.buffer is not None and edp.buffer.rows == self.max_size

    def get(self) -> Any:
        """The next batch as SRL's ``ReplayEntry`` (the trainer thread; raises ``queue.Empty`` while :meth:`empty`)."""
        edp, layout = self.edp, self.layout
        if edp is None or layout is None or not (self._warm or self._warmed(edp)):
            raise queue.Empty("the Conduit SRL buffer has not reached warmup_transitions yet")
        batch = edp.pull(timeout=self.timeout_s)
        info = batch.info
        sample, entry = info.attachment or (None, None)  # what the delivery hook built (a host learner's batch)
        if self.staging is not None and self.staging.pinned:
            self._guard.handed(list(batch.values()))
        if entry is not None:  # uniform replay
            return entry
        if sample is None:  # a GPU learner's batch (tensors on its device), or one restored from a checkpoint
            sample = layout.rebuild({k: self._out(k, batch[k]) for k in layout.numeric}, self.types.named_array)
        reuses = float(info.times_sampled.mean())  # the drawn samples' replay counts before this draw
        indices = self._annotate(sample, info)
        return self.types.replay_entry(
            reuses_left=-1, receive_time=-1, sample=sample, reuses=reuses, sampling_indices=indices
        )

    def _warmed(self, edp: conduit.Conduit) -> bool:
        """Whether a pull can be served now; once it can, without a rate limit it always can (a replay buffer's
        rows never fall below the warmup), and ``get`` no longer asks."""
        ready = edp.ready()
        self._warm = ready and edp.config.rate_limit is None
        return ready

    def _out(self, name: str, v: torch.Tensor) -> Any:
        if v.device.type == "cpu":  # the [T, B, ...] block, as a numpy view (see deliver)
            return v.numpy().swapaxes(0, 1)
        tm = v.transpose(0, 1)  # a view of the device gather
        if name in HOST_FIELDS:
            return tm.cpu().numpy()
        return tm.contiguous()

    def _annotate(self, sample: Any, info: BatchInfo) -> np.ndarray | None:
        """PER's ``sampling_indices`` (and its weights as the sample's metadata); None for uniform replay."""
        return None

    # -- lifecycle and persistence ------------------------------------------------------------------
    def close(self) -> None:
        """Stop the runtime's workers (idempotent). SRL never closes a buffer; its process exit does."""
        if self.edp is not None:
            self.edp.close()

    def stats(self) -> conduit.RuntimeStats | None:
        return self.edp.stats() if self.edp is not None else None

    def _adapter_state(self) -> dict[str, Any]:
        layout = self.layout.state() if self.layout is not None else None
        return {"layout": layout}

    def _load_adapter_state(self, state: dict[str, Any]) -> None:
        """(the replay counts are the runtime's, in its checkpoint)"""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles as its constructor arguments plus Conduit's checkpoint as bytes (:func:`conduit.ext.pack`): SRL's
        trainer pickles the whole buffer into its parameter DB (``save_buffer_on_exit``), and a running runtime
        does not pickle. Unpickling restores the checkpoint with every check a checkpoint on disk gets."""
        edp = self.edp
        blob = None
        if edp is not None:
            # (no hook changes the adapter's state: the replay counts are the runtime's, in its checkpoint)
            blob = (pack(lambda path: edp.save(path, timeout=self.timeout_s)), self._adapter_state())
        module = self.types.module.__name__ if self.types.module is not None else None
        return (_rebuild, (type(self).NAME, self._kwargs, blob, module))

    def resume(self, files: dict[str, bytes], state: dict[str, Any]) -> None:
        """Continue from a pickle's checkpoint (a fresh buffer: what unpickling does)."""
        if self.edp is not None:
            raise SemanticsError("resume into a fresh buffer (this one already holds samples)")
        layout = RecordLayout.from_state(state["layout"])
        self.layout = layout  # before the runtime: its delivery hook lays batches out by it
        self._load_adapter_state(state)  # PER's beta is the sampler's from the start
        edp = self._runtime(layout)
        with unpacked(files) as root:
            edp.restore(root)
        edp.start()
        self.layout, self.edp, self.sample_length = layout, edp, layout.length

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_size={self.max_size}, batch_size={self.batch_size}, "
            f"stored={self.qsize()} transitions, types={self.types.source})"
        )


def _held_weakly(buffer: ConduitReplayBuffer) -> Callable[[Reader, Writer], None]:
    """The delivery hook (:meth:`ConduitReplayBuffer.deliver`) over a weak reference to ``buffer``: the
    runtime's worker keeps no dropped buffer alive."""
    ref = weakref.ref(buffer)

    def time_major(exp_in: Reader, learn_out: Writer) -> None:
        live = ref()
        if live is None:
            raise conduit.RuntimeClosed("the SRL buffer this runtime served was dropped")
        live.deliver(exp_in, learn_out)

    return time_major


def _rebuild(
    name: str, kwargs: dict[str, Any], blob: tuple[dict[str, bytes], dict[str, Any]] | None, module: str | None = None
) -> Any:
    """Unpickle: the class (an SRL subclass for PER) is resolved with the SRL types of the unpickling process."""
    types = types_named(module)
    buffer = CLASSES[name](types)(**kwargs, srl_types=types)
    if blob is not None:
        buffer.resume(*blob)
    return buffer


#: each buffer name's class for the SRL types of a process (:mod:`.prioritized` adds ``conduit_prioritized``)
CLASSES: dict[str, Callable[[SRLTypes], type[Any]]] = {ConduitReplayBuffer.NAME: lambda types: ConduitReplayBuffer}


def positive(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, (int, np.integer)) or v <= 0:
            raise ConfigError(f"{name}: expected a positive int, got {v!r}")
