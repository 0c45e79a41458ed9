"""verl V1 custom sampler: :class:`ConduitAdmissionBuffer`, admission control on verl's replay buffer.

What: a ``ReplayBufferAsync`` subclass for ``trainer.v1.sampler.custom_sampler``
(``path=pkg://conduit.integrations.verl.sampler``, ``name=ConduitAdmissionBuffer``).
``sample`` polls TransferQueue's prompt tags (every ``poll_interval`` seconds,
not verl's fixed 2 s), hands the finished groups to an
:class:`~.admission.AdmissionController`, evicts the stale ones (verl's own
``_clear_groups``) and refills them and any quota deficit through verl's
``refill_fn``, and returns as soon as a feasible unit of whole groups is there.

``sampler_kwargs``: ``group_size`` (rollout.n), ``dp_size``, ``mini_batch_groups``
(ppo_mini_batch_size), ``batch_groups`` (train_batch_size), optional ``quotas``
(data source -> groups; the trajectory tag ``data_source`` names a group's
source), ``poll_interval`` and ``timeout_s``.

Why: the first mini-batch starts when its groups are done, not when the
slowest group of the whole train batch is.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

from .admission import ANY, AdmissionConfig, AdmissionController, GroupInfo

__all__ = ["ConduitAdmissionBuffer"]


class ConduitAdmissionBuffer(ReplayBufferAsync):
    """verl's replay buffer with Conduit's constraint-preserving admission."""

    def __init__(
        self,
        trainer_mode: str,
        trainer_config: Any,
        max_off_policy_threshold: int | None,
        max_off_policy_strategy: str,
        sampler_kwargs: Any,
        refill_fn: Any = None,
        **kwargs: Any,
    ) -> None:
        kw = dict(sampler_kwargs or {})
        super().__init__(
            trainer_mode=trainer_mode,
            trainer_config=trainer_config,
            max_off_policy_threshold=max_off_policy_threshold,
            max_off_policy_strategy=max_off_policy_strategy,
            sampler_kwargs=sampler_kwargs,
            poll_interval=float(kw.get("poll_interval", 0.05)),
            refill_fn=refill_fn,
        )
        self.timeout_s = float(kw.get("timeout_s", 3600.0))
        self.admission = AdmissionController(
            AdmissionConfig(
                group_size=int(kw["group_size"]),
                mini_batch_groups=int(kw["mini_batch_groups"]),
                dp_size=int(kw.get("dp_size", 1)),
                batch_groups=int(kw["batch_groups"]),
                max_staleness=max_off_policy_threshold,
                quotas=dict(kw["quotas"]) if kw.get("quotas") else None,
            )
        )
        self.admitted_step: int | None = None

    def group_source(self, partition_id: str, uid: str) -> str:
        for key, tag in self.partitions[partition_id].items():
            if key.split("_")[0] == uid:
                return str(tag.get("data_source", ANY))
        return ANY

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        if partition_id == "val":
            return super().sample(global_steps, partition_id, batch_size)
        if self.admission.complete or self.admitted_step is None:
            self.admission.next_batch()
            self.admitted_step = global_steps
        deadline = time.monotonic() + self.timeout_s
        metrics: dict[str, float] = {"conduit/admission_wait_s": 0.0}
        t0 = time.monotonic()
        evicted = refilled = 0
        while True:
            self._sync_metadata_from_transfer_queue()
            steps = self.prompt_global_steps[partition_id]
            finished = [
                GroupInfo(u, steps.get(u, global_steps), self.group_source(partition_id, u))
                for u in self.finished_keys[partition_id]
            ]
            inflight = Counter(ANY for _ in self.pending_keys[partition_id] | self.running_keys[partition_id])
            units = max(1, batch_size // self.admission.config.unit_groups)
            decision = self.admission.offer(finished, inflight, global_steps, max_units=units)
            if decision.stale:
                self._clear_groups(partition_id, {g.uid for g in decision.stale})
                evicted += len(decision.stale)
            refill = len(decision.stale) + sum(decision.deficit.values())
            if refill and self.refill_fn is not None:
                self.refill_fn(refill)
                refilled += refill
            if decision.admitted:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no feasible mini-batch of whole groups within {self.timeout_s}s")
            time.sleep(self.poll_interval)
        metrics["conduit/admission_wait_s"] = time.monotonic() - t0
        metrics["conduit/admitted_groups"] = len(decision.admitted)
        metrics["conduit/evicted_stale_groups"] = evicted  # over every poll of this call
        metrics["conduit/refilled_groups"] = refilled
        uids = [g.uid for g in decision.admitted]
        return self._materialize_batch(partition_id, uids, dict(self.partitions[partition_id])), metrics
