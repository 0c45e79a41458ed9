"""The off-policy learner's side of the runtime: priorities, beta, the generator, stored rows.

A mixin of :class:`conduit.Conduit`. A priority update names its batch the way the
framework does: the batch itself (or its ``BatchInfo``), the slot indices it drew (SRL's and
cpprb's ``update_priorities(indices, priorities)``), or nothing -- the newest delivered batch
still awaiting its update (RLlib's "the last sampled batch"). Delivered batches await their
update in a bounded list on the delivery path (:meth:`ReplayDelivery.awaited`), so the
generation check always has the ids the batch drew, whatever the framework kept of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from conduit.batch import Batch, BatchInfo
from conduit.buffers.base import ExperienceBuffer
from conduit.buffers.replay import ReplayBuffer
from conduit.config import ConduitConfig
from conduit.errors import ConfigError, SemanticsError
from conduit.paths.delivery import DeliveryPath
from conduit.paths.replay import ReplayDelivery
from conduit.samplers.prioritized import checked_priorities
from conduit.spec import Data

__all__ = ["ReplayFace"]


class ReplayFace:
    """Prioritized replay's feedback and the settings a framework owns (the runtime holds the attributes)."""

    config: ConduitConfig
    buffer: ExperienceBuffer | None
    delivery: DeliveryPath | None

    def _ensure_started(self) -> None: ...

    def update_priorities(
        self, batch: Batch | BatchInfo | np.ndarray | None, priorities: Any, *, beta: float | None = None
    ) -> int:
        """Prioritized replay: new priorities (e.g. |TD error|) for a delivered batch's rows.

        ``batch``: the batch (or its ``info``); an array of slot indices: the newest
        delivered batch that drew exactly those, still awaiting its update; ``None``:
        the newest delivered batch still awaiting its update. A batch awaits its update
        from delivery until it gets one (the newest 64 do); naming one that awaits none
        raises :class:`~conduit.errors.SemanticsError`, as does a batch drawn from another
        buffer; an update refused for its priorities leaves its batch awaiting. Rows whose
        slot was overwritten since the batch was sampled are skipped (generation check). Returns how many
        priorities were applied. ``beta``: the importance-sampling exponent of the draws
        from now on, for a framework that anneals it per training step (RLlib, SRL).
        """
        self._ensure_started()
        buf, delivery = self.buffer, self.delivery
        if not (isinstance(buf, ReplayBuffer) and buf.sampler.has_priorities and isinstance(delivery, ReplayDelivery)):
            raise SemanticsError("update_priorities needs off-policy replay with sampler='prioritized'")
        if isinstance(priorities, torch.Tensor):
            priorities = priorities.detach().to("cpu", torch.float64).numpy()
        pr = np.asarray(priorities)
        if beta is not None and not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta: expected 0 <= beta <= 1, got {beta}")
        key = batch.info if isinstance(batch, Batch) else batch
        if isinstance(key, BatchInfo) and key.rows.lineage not in (None, buf.lineage):
            raise SemanticsError(
                "update_priorities: this batch was drawn from another replay buffer (another Conduit, or one not "
                "restored from this one's checkpoint): its slots hold other rows here"
            )
        info, first = delivery.awaited(key, lambda b: checked_priorities(b.indices, b.ids, pr))
        # a batch's replay counts take its first update only (count_replays="feedback")
        return buf.update_priorities(info.indices, info.ids, pr, beta=beta, count=first)

    def set_beta(self, beta: float) -> None:
        """Prioritized replay: the importance-sampling exponent of the draws from now on (a batch already
        staged keeps the weights it was drawn with), for a framework that passes it at each sample (RLlib)."""
        self._replay("set_beta").set_beta(beta)

    def use_rng(self, rng: np.random.Generator) -> None:
        """Draw with ``rng`` from now on (a framework that owns its buffer's generator: RLlib's is settable)."""
        self._replay("use_rng").use_rng(rng)

    def load_rows(self, rows: Data, *, leaves: np.ndarray | None = None, max_priority: float = 1.0) -> int:
        """Fill this runtime's empty replay buffer with stored rows, oldest first, and their priorities: the
        portable contents :func:`conduit.ext.stored_in_order` reads from a checkpoint, written back into a buffer
        of another capacity or batch size, or into another shard. No ingestion hook runs (the rows are stored
        ones); ``leaves`` are the oldest rows' priorities after ``** alpha`` (see :meth:`ReplayBuffer.load_rows`).
        Returns the rows stored (the newest ``capacity`` of them)."""
        return self._replay("load_rows").load_rows(rows, leaves, max_priority)

    def _replay(self, what: str) -> ReplayBuffer:
        self._ensure_started()
        buf = self.buffer
        if not isinstance(buf, ReplayBuffer):
            raise ConfigError(f"{what} needs an off-policy runtime (a replay buffer), not {self.config.policy.value}")
        return buf
