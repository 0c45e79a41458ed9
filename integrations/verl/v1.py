"""Conduit's V1 trainers (verl's TransferQueue trainer): the same stage methods, scheduled as a Conduit graph.

What: :class:`ConduitStepMixin` overrides ``_step_once`` only. Sampling, the
stage methods (``_compute_reward_colocate``, ``_compute_old_log_prob``,
``_compute_ref_log_prob``, ``_compute_values``, ``_compute_advantage``), the
updates and every worker call are verl's own; the mixin decides their order:

- ``_balance_batch`` first (metadata only; its synthetic padding rows carry
  zero ``rm_scores`` whatever the reward does, as in verl),
- reward (on the sampled keys, as verl does before balancing) ∥ old log-prob ∥
  reference log-prob ∥ values, where :func:`conduit.scheduling.stages.plan` says the overlap pays
  and their worker groups (resource pools) differ,
- the advantage after all of them (it reads every field they write),
- then the critic and actor updates as verl runs them.

Each concurrent stage gets its own copy of the ``KVBatchMeta`` (the stage
methods write ``extra_info``) and its own metrics dict, merged in verl's order.
Timings land in ``timing_raw`` under verl's names and ``conduit/*``.

Why: the stages write disjoint TransferQueue fields, so overlapping them changes
no tensor; the scheduler only hides the latency of independent stages.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from omegaconf import open_dict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1 import PPOTrainerSeparateAsync, PPOTrainerSync
from verl.utils.debug import marked_timer

from conduit import ConfigError
from conduit.ext import Stage, StageProfile, StageRunner
from conduit.scheduling.stages import plan

from .metrics import PathMeter
from .pools import stage_pools

__all__ = ["ConduitPPOTrainerSeparateAsync", "ConduitPPOTrainerSync", "ConduitStepMixin", "copy_meta"]

#: verl's timer name of each stage (so verl's own timing_s/* keys keep their meaning)
TIMER = {
    "reward": "reward",
    "old_log_prob": "old_log_prob",
    "ref_log_prob": "ref",
    "values": "values",
    "advantage": "adv",
}


def copy_meta(batch: KVBatchMeta) -> KVBatchMeta:
    """An independent ``KVBatchMeta`` over the same keys (tags and extra_info are deep-copied by its constructor)."""
    return KVBatchMeta(
        keys=list(batch.keys),
        tags=batch.tags,
        partition_id=batch.partition_id,
        fields=None if batch.fields is None else list(batch.fields),
        extra_info=batch.extra_info,
    )


def refuse_group_filtering(config: Any) -> None:
    """DAPO's group filtering (``algorithm.filter_groups``) is verl's built-in sampler's: a custom sampler owns its
    filtering, and Conduit's admission sampler has none, so the pair is refused before anything is built."""
    filtering = (config.get("algorithm", {}).get("filter_groups", None) or {}).get("enable", False)
    custom = (config.trainer.v1.get("sampler", {}).get("custom_sampler", None) or {}).get("name", None)
    if filtering and custom == "ConduitAdmissionBuffer":
        raise ConfigError(
            "algorithm.filter_groups (DAPO's group filtering) is done by verl's own sampler; Conduit's admission "
            "sampler does not filter groups: drop trainer.v1.sampler.custom_sampler, or disable filter_groups"
        )


class ConduitStepMixin:
    """Put before a verl V1 trainer class; overrides ``_step_once`` only."""

    conduit_profile: StageProfile
    conduit_runner: StageRunner
    #: verl's mode this trainer runs as (verl's code branches on ``trainer_mode == "sync"``)
    base_mode: str = "sync"

    def __init__(self, config: Any) -> None:
        refuse_group_filtering(config)
        self.conduit_mode = str(config.trainer.v1.trainer_mode)
        with open_dict(config):
            config.trainer.v1.trainer_mode = self.base_mode
        super().__init__(config)  # type: ignore[call-arg]

    def conduit_setup(self) -> None:
        if not hasattr(self, "conduit_runner"):
            self.conduit_profile = StageProfile()
            self.conduit_runner = StageRunner(prefix="verl")

    def conduit_groups(self) -> dict[str, str]:
        """Worker group (resource pool) of each stage."""
        return {**stage_pools(self), "advantage": "driver"}

    def conduit_ingest(self, batch: KVBatchMeta, metrics: dict, timing_raw: dict, meter: PathMeter) -> KVBatchMeta:
        """The colocated reward, balance, then the log-prob/values stages as planned, then the advantage; verl's
        methods all. The reward model scores first, as in verl: ``_balance_batch`` pads a batch by copying its first
        row, scores included (on verl's placement it shares the actor's pool: nothing to overlap it with)."""
        self.conduit_setup()
        groups = self.conduit_groups()
        if self.reward_loop_manager.reward_loop_worker_handles is None:  # type: ignore[attr-defined]
            t0 = time.perf_counter()
            with marked_timer(TIMER["reward"], timing_raw, color="yellow"):
                batch = self._compute_reward_colocate(batch, metrics=metrics)  # type: ignore[attr-defined]
            meter.add_stage("reward", time.perf_counter() - t0)
        balanced = self._balance_batch(batch, metrics=metrics)  # type: ignore[attr-defined]
        parts: dict[str, dict] = {}
        outputs: dict[str, Any] = {}

        def stage(name: str, method: Any, on: KVBatchMeta, needs: tuple[str, ...] = ()) -> Stage:
            parts[name] = {}
            return Stage(name, groups[name], needs, lambda: method(copy_meta(on), metrics=parts[name]))

        stages = [stage("old_log_prob", self._compute_old_log_prob, balanced)]  # type: ignore[attr-defined]
        if self.use_reference_policy:  # type: ignore[attr-defined]
            stages.append(stage("ref_log_prob", self._compute_ref_log_prob, balanced))  # type: ignore[attr-defined]
        if self.use_critic:  # type: ignore[attr-defined]
            stages.append(stage("values", self._compute_values, balanced))  # type: ignore[attr-defined]
        producers = tuple(s.name for s in stages)  # V1's advantage reads every field they write
        stages.append(stage("advantage", self._compute_advantage, balanced, producers))  # type: ignore[attr-defined]
        the_plan = plan(stages, self.conduit_profile)
        _, timings = self.conduit_runner.run(stages, the_plan, self.conduit_profile, outputs)
        for name in [s.name for s in stages]:
            metrics.update(parts[name])
        for t in timings:
            for n, s in t.stage_s.items():
                timing_raw[TIMER[n]] = timing_raw.get(TIMER[n], 0.0) + s
                meter.add_stage(n, s)
        meter.overlapped += sum(len(t.names) - 1 for t in timings)
        meter.plan = the_plan.describe()
        out: KVBatchMeta = outputs["advantage"]
        # the stages' extra_info edits (temperature, entropy flags) as verl's in-place edits would leave them
        info = copy.deepcopy(balanced.extra_info or {})
        info.update(out.extra_info or {})
        out.extra_info = info
        return out

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        """verl's ``_step_once`` with stages 2-7 (reward .. advantage) run by Conduit's plan."""
        meter = PathMeter()
        with marked_timer("gen", timing_raw, color="red"):
            self.on_sample_begin()  # type: ignore[attr-defined]
            batch, off_policy_metrics = self.replay_buffer.sample(  # type: ignore[attr-defined]
                global_steps=self.global_steps,
                partition_id="train",
                batch_size=sample_batch_size,  # type: ignore
            )
            metrics.update(off_policy_metrics)
            batch.extra_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature  # type: ignore
            self.on_sample_end()  # type: ignore[attr-defined]
        with meter.exposed():
            batch = self.conduit_ingest(batch, metrics, timing_raw, meter)
        if self.use_critic:  # type: ignore[attr-defined]
            with marked_timer("update_critic", timing_raw, color="pink"):
                batch = self._update_critic(batch, metrics=metrics)  # type: ignore[attr-defined]
        if self.config.trainer.critic_warmup <= self.global_steps:  # type: ignore[attr-defined]
            with marked_timer("update_actor", timing_raw, color="red"):
                batch = self._update_actor(batch, metrics=metrics)  # type: ignore[attr-defined]
        meter.publish(metrics, timing_raw)
        metrics["conduit/sync_s"] = self.conduit_profile.sync_s
        return batch


class ConduitPPOTrainerSync(ConduitStepMixin, PPOTrainerSync):
    """``trainer.v1.trainer_mode=conduit_sync``: verl's sync trainer, ingestion scheduled by Conduit."""


class ConduitPPOTrainerSeparateAsync(ConduitStepMixin, PPOTrainerSeparateAsync):
    """``trainer.v1.trainer_mode=conduit_separate_async``: verl's separate-async trainer, the same ingestion."""

    base_mode = "separate_async"
