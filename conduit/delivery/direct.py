"""The inline off-policy pull of one batch, as one closure over everything it reads.

An off-policy pull of small transitions is a gather of ~70-100 us wrapped in
bookkeeping: the draw, the batch's provenance, the counts, the timing. Right
after the gather has streamed through the caches each Python step of that
bookkeeping costs several times its warm time, so every layer a pull passes
through — the delivery's placement and batch-memory checks,
``ReplayBuffer.sample`` and its ``Sampled``, the rows' device — is paid for.
Here what those layers decide once per schedule and placement is decided when
the closure is built, and a pull runs the rest from the closure's cells.
Measured at dim 128, batch 512 (ten processes, 41 interleaved repeats of 40
pulls each, against the same kind of runtime pulling through the layers): 3-4
us (3-4%) less a pull, less in nine processes of ten. What is left — ~7-11 us
of counters, timing, provenance, ``BatchInfo`` and ``Batch`` (taken out one at
a time: 1-3 us each) — is what a pull owes its users.

:func:`direct_pull` builds it for one learner when every batch of the current
schedule and placement would take the direct path: inline at
``g = 1``, no delivery hook, a host learner whose device holds the storage
(host rows: no CUDA stream order to keep), no batch memory recycled at this
batch's size (a ``batch_pool`` ring's memory is taken as the layered path takes
it, ``ReplayDelivery._recycled``). The closure re-checks, every pull, what can
change between pulls — the schedule (``set_mode``), the storage (a placement or
migration, also under the buffer's lock), tracing, the batch memory's
threshold, staged leftovers, the rate limiter — and returns None, leaving that
pull to the general path, where any has changed. What it does is the layered
direct path's (``ReplayDelivery._pull_layered``), step for step: the same
counters in the same order under the same locks, the buffer's own sampler,
storage gather and provenance (``ReplayBuffer.drawn``), ``_on_pulled``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from conduit.batch import Batch, BatchInfo
from conduit.executor import fail

if TYPE_CHECKING:
    from conduit.delivery.replay import ReplayDelivery

__all__ = ["DirectPull", "direct_pull"]

#: a pull that returns None handed the batch to the general path
DirectPull = Callable[[], "Batch | None"]


def direct_pull(delivery: ReplayDelivery, learner: int) -> DirectPull | None:
    """The fast inline pull for ``learner`` under the current schedule and storage; None where it does not apply."""
    buffer = delivery.buffer
    storage = buffer.storage
    mode = delivery.mode
    device = delivery.devices[learner]
    spec = buffer.spec
    if (
        storage is None
        or spec is None
        or mode.overlap
        or delivery._whole_g(mode) != 1
        or not delivery._hookless
        or device.type != "cpu"  # host rows for a host learner: no CUDA stream order to keep (ReplayBuffer.sample's)
        or storage.devices != (device,)
    ):
        return None
    n = delivery.batch_size
    memory = delivery._memory[learner]
    if memory is not None and memory.recycles(spec, n):
        return None
    min_bytes = memory.min_bytes if memory is not None else 0
    # batch_pool: the learner's ring of batch memory (ReplayDelivery._recycled) takes every batch
    pooled = memory is None and bool(delivery.batch_pool)
    recycled = delivery._recycled

    invoke_lock = delivery._invoke_locks[learner]
    lock = delivery._lock
    staged = delivery.staged[learner]
    stats = delivery.stats
    limiter = delivery.limiter
    graph = delivery.graph
    tracer = graph.tracer
    timings = graph.timings
    table = buffer.table
    buffer_lock = buffer.lock
    sample = buffer.sampler.sample
    rng = buffer.rng
    drawn = buffer.drawn
    gather = storage.gather
    perf_counter = time.perf_counter
    from_numpy = torch.from_numpy

    def pull() -> Batch | None:
        if (
            delivery.mode is not mode
            or buffer.storage is not storage
            or tracer.enabled
            or (memory is not None and memory.min_bytes != min_bytes)
        ):
            return None
        with invoke_lock:
            with lock:
                if staged or not limiter.can_sample(n, table.count):
                    return None  # leftovers to hand out, or not enough rows yet: the general path waits
                pulls = delivery.pulls
                index = pulls[learner]
                pulls[learner] = index + 1
                invocation = delivery._invocation
                delivery._invocation = invocation + 1
                stats.pulls += 1
                stats.invocations += 1
                stats.delivered_rows += n
            t0 = perf_counter()
            try:
                out = recycled(learner, n) if pooled else None
                with buffer_lock:
                    if buffer.storage is storage and table.count:  # ReplayBuffer.sample, its decisions made
                        draw = sample(n, table, rng)
                        idx = draw.tensor
                        if idx is None:
                            idx = from_numpy(draw.array)
                        data = gather(idx, None, out)
                        rows, weights, version = drawn(draw), draw.weights, buffer.inserted
                    else:  # placed elsewhere since the check above, or emptied: the general sample decides
                        s = buffer.sample(n, device, out)
                        data, rows, weights, version = s.data, s.rows, s.weights, s.version
            except Exception as exc:
                fail(delivery.failure, "delivery operator", exc)
            timings.append((perf_counter() - t0, 1.0))
            graph.invocations += 1
            info = BatchInfo(
                learner, index, index, version, invocation, None, None, None, False, rows, weights, mode,
                buffer.inserted,
            )
            # counted before the invocation lock goes, as the layered path does (a checkpoint pauses delivery there)
            delivery._on_pulled(learner, info, False)
        return Batch(data, info)

    return pull
