"""One consistent point of a running runtime: its components' state captured, and restored, together.

The runtime's :meth:`~conduit.Conduit.state_dict`, ``save`` and ``restore`` go
through here; :mod:`conduit.checkpoint` writes and reads what this captures.
Capturing walks the lock order of :mod:`conduit.paths.base` whole: both paths
pause between invocations (pushes still queue, learners still take staged
batches), the delivery's counts settle, the buffer's admissions and the queue
are read in one hold of the ingestion's condition, and the rows — which only a
write changes, and writes are paused — are copied last, holding up no pull.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from conduit._version import __version__
from conduit.buffers.base import ExperienceBuffer
from conduit.config import ConduitConfig
from conduit.core import Schedule
from conduit.paths.delivery import DeliveryPath
from conduit.paths.ingestion import IngestionPath
from conduit.spec import ExperienceSpec

__all__ = ["State", "apply", "capture", "manifest", "quiesced"]

#: component name -> its state dict (tensors, arrays and primitives only)
State = dict[str, dict[str, Any]]


@contextlib.contextmanager
def quiesced(ingestion: IngestionPath, delivery: DeliveryPath, timeout: float | None = None) -> Iterator[None]:
    """Hold both paths still between invocations; units pushed meanwhile stay queued."""
    with ingestion.paused(timeout), delivery.paused(timeout):
        yield


def capture(
    buffer: ExperienceBuffer, ingestion: IngestionPath, delivery: DeliveryPath, timeout: float | None = None
) -> State:
    """The three components' state at one point (see the module docstring)."""
    with quiesced(ingestion, delivery, timeout):
        with delivery.settled(timeout):
            delivery_state = delivery.state_dict()
            # pushes still admit and queue while ingestion is paused: what the buffer has admitted (the
            # rate limiter's inserts, the on-policy push side) and the queue are read in one hold
            with ingestion.cond:
                buffer_state = buffer.state_dict(rows=False)
                queued = ingestion.queued()
        buffer_state["rows"] = buffer.rows_state()
        ingestion_state = ingestion.state_dict(queued)
    return {"buffer": buffer_state, "ingestion": ingestion_state, "delivery": delivery_state}


def apply(
    buffer: ExperienceBuffer, ingestion: IngestionPath, delivery: DeliveryPath, state: Mapping[str, dict[str, Any]]
) -> None:
    """Continue from :func:`capture` (into components that hold no data yet)."""
    with quiesced(ingestion, delivery):  # an overlapped worker claims nothing before every component is restored
        buffer.load_state_dict(state["buffer"])
        delivery.load_state_dict(state["delivery"])
        ingestion.load_state_dict(state["ingestion"])


def manifest(config: ConduitConfig, spec: ExperienceSpec | None, schedule: Schedule, state: State) -> dict[str, Any]:
    """What a checkpoint says of itself in plain JSON: what to rebuild the runtime from, and a summary."""
    return {
        "conduit_version": __version__,
        "policy": config.policy.value,
        "config": config.model_dump(mode="json"),
        "spec": spec.to_json() if spec is not None else None,
        "schedule": schedule.to_json(),
        "buffer": {"inserted": int(state["buffer"]["inserted"])},
        "delivery": {"pulls": [int(p) for p in state["delivery"]["pulls"]]},
    }
