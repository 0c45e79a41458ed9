"""What ``Conduit.stats()`` reports: the counters of one runtime, in one record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from conduit.buffers.base import ExperienceBuffer
from conduit.paths.delivery import DeliveryPath
from conduit.paths.ingestion import IngestionPath
from conduit.remote import ActorChannel

__all__ = ["RuntimeStats", "collect"]


@dataclass(frozen=True)
class RuntimeStats:
    """Counters of one runtime (exact: nothing is estimated)."""

    pushed_units: int
    pushed_rows: int
    ingested_rows: int
    ingestion_invocations: int
    buffer_rows: int
    buffer_version: int
    pulls: int
    delivered_rows: int
    delivery_invocations: int
    push_s: float
    push_blocked_s: float
    pull_s: float
    pull_wait_s: float
    #: actor processes of ``Conduit.actor_channel`` that died, and the units they had sent but not handed over
    actors_lost: int = 0
    units_lost_in_transit: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def collect(
    ingestion: IngestionPath | None,
    delivery: DeliveryPath | None,
    buffer: ExperienceBuffer | None,
    channels: Sequence[ActorChannel] = (),
) -> RuntimeStats:
    """The counters of a runtime's parts now (zeros for parts not built yet)."""
    ing = ingestion.stats if ingestion else None
    dlv = delivery.stats if delivery else None
    losses = [loss for c in channels for loss in c.stats().lost]
    return RuntimeStats(
        pushed_units=ing.pushed_units if ing else 0,
        pushed_rows=ing.pushed_rows if ing else 0,
        ingested_rows=ing.ingested_rows if ing else 0,
        ingestion_invocations=ing.invocations if ing else 0,
        buffer_rows=buffer.rows if buffer else 0,
        buffer_version=buffer.inserted if buffer else 0,
        pulls=dlv.pulls if dlv else 0,
        delivered_rows=dlv.delivered_rows if dlv else 0,
        delivery_invocations=dlv.invocations if dlv else 0,
        push_s=ing.push_s if ing else 0.0,
        push_blocked_s=ing.blocked_s if ing else 0.0,
        pull_s=dlv.pull_s if dlv else 0.0,
        pull_wait_s=dlv.wait_s if dlv else 0.0,
        actors_lost=len(losses),
        units_lost_in_transit=sum(loss.lost_in_transit for loss in losses),
    )
