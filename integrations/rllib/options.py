"""What ``enable_conduit`` accepts, and what a Conduit replay buffer is built from.

Two pydantic models, for the same reasons the core uses pydantic: validation at
construction with messages that name the field and the received value, and a
plain-JSON form. That form matters here: RLlib deep-copies, pickles and
JSON-serializes ``replay_buffer_config``, so the options travel as a plain dict
under ``replay_buffer_config["conduit"]`` and every runtime object (threads,
queues, storage) is created lazily in the process that uses the buffer.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from conduit import ConfigError
from conduit.ext import explain

__all__ = ["BufferOptions", "ConduitRLlibOptions", "Staleness", "parse_options"]


class Staleness(str, Enum):
    """How a Conduit replay buffer relates to RLlib's stock buffer.

    ``exact``: RLlib's own buffer of the configured class runs inside
    (:mod:`.exact`), so the episodes kept and evicted, the draws from the buffer's
    ``rng``, the importance weights and the metrics are RLlib's by construction;
    the draw runs inline at ``sample()`` (an ``add`` or a priority update between
    two samples changes the next draw), so there is nothing to prefetch.
    ``prefetch``, ``max_staleness`` and ``storage_device`` apply to the bounded mode only.

    ``bounded``: Conduit's runtime (FIFO ring, vectorized prioritized sampler,
    overlapped ingestion, prefetching delivery). A batch handed out may have been
    drawn up to ``max_staleness`` batches earlier than an inline draw would have
    been; priority updates land on the transitions of the batch they belong to
    and are dropped for slots overwritten since (generation check).
    """

    EXACT = "exact"
    BOUNDED = "bounded"


class ConduitRLlibOptions(BaseModel):
    """Options of :func:`~conduit.integrations.rllib.enable_conduit`.

    Attributes:
        staleness: ``bounded`` (prefetching, the default) or ``exact`` (parity with RLlib).
        prefetch: bounded mode: ``True`` draws the next batch on Conduit's delivery
            worker while the learner trains, ``False`` draws it inline at ``sample()``,
            ``None`` leaves the choice to Conduit's schedule (its prior: overlap for
            GPU learners, inline for CPU learners, where a worker thread competes
            with the learner for cores and the GIL).
        max_staleness: bounded mode: batches a prefetched batch may lag (delivery granularity cap).
        prioritized: off-policy: prioritized replay; ``None`` follows the algorithm's buffer type.
        capacity / alpha / beta: override ``replay_buffer_config``'s values.
        storage_device: where transitions live (``"cpu"``, ``"pinned"``, ``"cuda:0"``; ``None``: cpu).
        prepared_batches: off-policy with an in-process learner: hand the learner
            ready tensors instead of episodes for its connector to rebuild.
        pipeline_minibatches: PPO: prepare mini-batch k+1 while k trains.
        prefetch_depth: PPO: mini-batches prepared ahead.
        seed: the buffer's sampling seed; ``None`` uses ``config.seed``.
        timeout_s: bound on every wait inside the adapter.
        sharded: off-policy: shard the buffer over the learner actors (``None``: when ``num_learners >= 2`` in
            the bounded mode; ``False`` keeps one buffer in the algorithm's process).
        sampling: sharded: ``"global"`` (one buffer's distribution over every shard) or ``"local"`` (each
            learner from its own shard).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    staleness: Staleness = Staleness.BOUNDED
    prefetch: bool | None = None
    max_staleness: Annotated[int, Field(gt=0, le=64)] = 1
    prioritized: bool | None = None
    capacity: Annotated[int, Field(gt=0)] | None = None
    alpha: Annotated[float, Field(ge=0.0)] | None = None
    beta: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    storage_device: str | None = None
    prepared_batches: bool = True
    pipeline_minibatches: bool = True
    prefetch_depth: Annotated[int, Field(gt=0, le=16)] = 1
    seed: int | None = None
    timeout_s: Annotated[float, Field(gt=0.0)] = 60.0
    sharded: bool | None = None
    sampling: Literal["global", "local"] = "global"

    @field_validator("storage_device")
    @classmethod
    def _a_device(cls, v: str | None) -> str | None:
        """Refused here, by name, as the runtime would refuse it at the first ``train()``."""
        if v is not None and v != "pinned":
            try:
                torch.device(v)
            except (RuntimeError, ValueError) as e:
                raise ValueError(f"{v!r} is not a torch device string (e.g. 'cpu', 'cuda:0', or 'pinned')") from e
        return v


class BufferOptions(BaseModel):
    """Everything a Conduit replay buffer needs beyond RLlib's own constructor arguments.

    Filled by ``enable_conduit`` and refreshed from the algorithm's config when the
    algorithm builds the buffer, so later changes to ``n_step``, ``gamma`` or the
    batch size are honoured.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    staleness: Staleness = Staleness.BOUNDED
    prefetch: bool | None = None
    max_staleness: Annotated[int, Field(gt=0, le=64)] = 1
    storage_device: str | None = None
    learner_device: str = "cpu"
    prepared_batches: bool = False
    train_batch_size: Annotated[int, Field(gt=0)] | None = None
    n_step: int | tuple[int, int] = 1
    gamma: Annotated[float, Field(ge=0.0, le=1.0)] = 0.99
    seed: int | None = None
    timeout_s: Annotated[float, Field(gt=0.0)] = 60.0
    sharded: bool | None = None
    sampling: Literal["global", "local"] = "global"


def parse_options(model: type[BaseModel], values: dict[str, Any] | None, where: str) -> Any:
    """Build ``model`` from ``values``, turning pydantic's error into a :class:`ConfigError`."""
    try:
        return model(**(values or {}))
    except ValidationError as exc:
        raise ConfigError(explain(exc, model, where)) from None
