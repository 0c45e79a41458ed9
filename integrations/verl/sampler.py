"""verl V1 custom sampler: :class:`ConduitAdmissionBuffer`, admission control on verl's replay buffer.

What: a ``ReplayBufferAsync`` subclass for ``trainer.v1.sampler.custom_sampler``
(``path=pkg://conduit.integrations.verl.sampler``, ``name=ConduitAdmissionBuffer``).
``sample`` polls TransferQueue's prompt tags (every ``poll_interval`` seconds,
not verl's fixed 2 s) and maps verl's state onto an
:class:`conduit.ext.AdmissionController` (the core's group-aware admission,
:mod:`conduit.grouping`), which holds the rules; this module
only reads TransferQueue and acts on the decisions.

What verl's trainer does with ``sample``: ``PPOTrainer.step`` calls
``_step_once`` ``parameter_sync_step`` times, each sampling
``train_batch_size / parameter_sync_step`` prompts and running the whole PPO
pipeline (old log-prob, advantage, update) on exactly what ``sample`` returned.
It cannot consume part of a step: whatever ``sample`` leaves out is trained at a
later step, by a newer policy. So:

- **sync** (``trainer_mode="sync"``, ``parameter_sync_step=1``): the sampler is
  verl's own ``ReplayBuffer``: it waits until the step's ``batch_size`` groups
  are terminal and returns them all, at that step, the oldest first; no
  staleness (verl: on-policy), no eviction or refill (verl's sync trainer
  fetches prompts a train batch at a time, and pads a failed group downstream).
  There is no early mini-batch in sync mode: that would be off-policy.
- **async** (``colocate_async``, ``separate_async``): verl itself samples each
  of a step's ``parameter_sync_step`` mini-batches as soon as it is there; the
  sampler returns exactly ``batch_size`` groups per call, as soon as that many
  whole (exactly ``group_size`` trajectories), fresh (verl's span rule with
  ``max_off_policy_strategy`` ``drop``; ``wait`` holds sampling while an
  in-flight group reached the bound and evicts nothing), quota-feasible groups
  are finished, in whole admission units (divisible by dp and the PPO
  mini-batch: verl never pads them). Stale, failed and short groups are evicted
  (verl's ``_clear_groups``) and refilled one for one through verl's
  ``refill_fn``, plus any per-source quota deficit. verl's own
  ``wait_for_sampleable`` / ``get_sampleable_count`` see the same rules.

Every uid is handed over at most once (the controller refuses a second offer).

``sampler_kwargs``: ``group_size`` (rollout.n), ``dp_size``, ``mini_batch_groups``
(ppo_mini_batch_size), ``batch_groups`` (train_batch_size), optional ``quotas``
(data source -> groups, async only; the trajectory tag ``data_source`` names a
group's source), ``poll_interval`` and ``timeout_s``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync, _accumulate_eviction_metrics
from verl.utils.skip import SkipManager

from conduit import ConfigError
from conduit.ext import ANY_SOURCE, AdmissionConfig, AdmissionController, GroupInfo

__all__ = ["ConduitAdmissionBuffer"]


class ConduitAdmissionBuffer(ReplayBufferAsync):
    """verl's replay buffer with Conduit's constraint-preserving admission (verl's rules kept, see the module)."""

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
                strategy=max_off_policy_strategy,
                on_policy=trainer_mode == "sync",  # verl's own choice of ReplayBuffer over ReplayBufferAsync
            )
        )
        self.admitted_step: int | None = None
        steps = int((trainer_config or {}).get("parameter_sync_step", 1) or 1)
        if trainer_mode != "sync" and self.admission.config.batch_groups % steps == 0:
            try:  # each of a step's parameter_sync_step samples: whole admission units, known now
                self.admission.check_want(self.admission.config.batch_groups // steps)
            except ValueError as e:
                raise ConfigError(f"sampler_kwargs with parameter_sync_step={steps}: {e}") from None

    def terminal_groups(self, partition_id: str, global_steps: int) -> list[GroupInfo]:
        """verl's terminal (finished or failed) prompt groups, with their trajectory counts and sources."""
        rows: Counter[str] = Counter()
        source: dict[str, str] = {}
        quotas = self.admission.config.quotas is not None
        for key, tag in self.partitions[partition_id].items():
            uid = key.split("_")[0]
            rows[uid] += 1
            if quotas and "data_source" not in tag:  # else every group is of no source: no quota would ever fill
                raise ConfigError(
                    f"sampler_kwargs.quotas: trajectory {key!r} has no data_source tag; verl 0.9.1's agent loop "
                    "stores data_source as a field, not a TransferQueue tag: tag it in your agent loop, or drop quotas"
                )
            source.setdefault(uid, str(tag.get("data_source", ANY_SOURCE)))
        steps = self.prompt_global_steps[partition_id]
        failed = self.failure_keys[partition_id]
        return [
            GroupInfo(u, steps.get(u, global_steps), source.get(u, ANY_SOURCE), rows[u], u in failed)
            for u in self.finished_keys[partition_id] | failed
        ]

    def inflight(self, partition_id: str) -> tuple[Counter[str], int | None]:
        """Groups pending or running (prompt tags name no source), and the oldest step among them."""
        keys = self.pending_keys[partition_id] | self.running_keys[partition_id]
        steps = self.prompt_global_steps[partition_id]
        return Counter({ANY_SOURCE: len(keys)} if keys else {}), min((steps[k] for k in keys), default=None)

    def _terminal_eviction_reasons(self, global_steps: int, partition_id: str) -> tuple[set, set, set, Counter]:
        """verl's eviction hook (its ``wait_for_sampleable`` / ``get_sampleable_count``) with the controller's rules."""
        if partition_id == "val" or self.admission.config.on_policy:
            return set(), set(), set(), Counter()
        groups = self.terminal_groups(partition_id, global_steps)
        stale = {g.uid for g in groups if not self.admission.misfit(g) and self.admission.stale(g, global_steps)}
        return stale, set(), {g.uid for g in groups if self.admission.misfit(g)}, Counter()

    @SkipManager.annotate_tq(role="rollout_tq", phase="sample")  # verl's rollout dump/skip, as on its own sample
    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        if partition_id == "val":
            return super().sample(global_steps, partition_id, batch_size)
        if self.admitted_step != global_steps:  # a new step: its quotas start (a step never inherits a partial one)
            self.admission.next_batch()
            self.admitted_step = global_steps
        seen: dict[str, GroupInfo] = {}
        evicted: dict[str, Any] = {}  # verl's own eviction metrics, over every poll of this call

        def snapshot() -> tuple[list[GroupInfo], Counter[str], int | None]:
            self._sync_metadata_from_transfer_queue()
            groups = self.terminal_groups(partition_id, global_steps)
            seen.update({g.uid: g for g in groups})
            return (groups, *self.inflight(partition_id))

        def evict(uids: set[str]) -> None:
            """verl's own eviction (its ``_evict_terminal_groups``: clears the groups, reports its metrics)."""
            stale = {u for u in uids if u in seen and not self.admission.misfit(seen[u])}
            _, n_stale, _, m = self._evict_terminal_groups(global_steps, partition_id,
                                                           (stale, set(), uids - stale, Counter()))
            _accumulate_eviction_metrics(evicted, m, n_stale)

        polled = self.admission.poll(snapshot, global_steps, batch_size, evict=evict, refill=self.refill_fn,
                                     timeout_s=self.timeout_s, interval_s=self.poll_interval)
        uids = [g.uid for g in polled.admitted]
        if self.admission.config.on_policy and not any(g.size for g in polled.admitted):
            raise RuntimeError("Sync replay buffer selected terminal groups with no materializable trajectories.")
        metrics: dict[str, float] = {
            "conduit/admission_wait_s": polled.wait_s,
            "conduit/admitted_groups": len(uids),
            "conduit/evicted_stale_groups": polled.stale,  # over every poll of this call
            "conduit/evicted_misfit_groups": polled.misfit,
            "conduit/refilled_groups": polled.refilled,
            "conduit/blocked_polls": polled.blocked,
        }
        return self._materialize_batch(partition_id, uids, dict(self.partitions[partition_id])), {**evicted, **metrics}
