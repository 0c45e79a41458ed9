"""verl's post-generation stages on a ``DataProto``, as Conduit stages, and verl's serial order beside them.

What: :class:`StageFns` holds the stage callables a trainer already has
(colocated reward model, old / reference log-prob, values: verl's own worker
calls); :func:`ingestion_stages` turns them into :class:`conduit.ext.Stage` nodes
with explicit dependencies; :func:`run_conduit` plans and runs them with the
core's cost model, :func:`run_serial` runs them in verl's V0 ``fit`` order.
Both end in :func:`advantage_block`, which is verl's ``adv`` section:
``extract_reward``, ``apply_kl_penalty`` (KL-in-reward) or the plain copy,
rollout correction, and ``compute_advantage``, all verl's functions.

Why: the same functions on the same inputs give the same tensors; only the
order (and the overlap) of independent stages changes. The advantage needs the
reward always, old and reference log-probs only with KL-in-reward or rollout
correction, values only for estimators that read them (GAE): those are its
producers, so it runs as early as they allow and never earlier.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from verl import DataProto
from verl.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage
from verl.trainer.ppo.reward import extract_reward

from conduit.ext import Plan, Stage, StageProfile, StageRunner
from conduit.scheduling.stages import plan

from .metrics import PathMeter

__all__ = ["AdvantageSpec", "StageFns", "advantage_block", "ingestion_stages", "run_conduit", "run_serial"]

#: estimators whose advantage reads the critic's values
VALUE_ESTIMATORS = frozenset({"gae"})


@dataclass(frozen=True)
class AdvantageSpec:
    """What verl's ``adv`` section reads from ``config.algorithm`` (and ``rollout.n``)."""

    adv_estimator: str
    gamma: float = 1.0
    lam: float = 1.0
    num_repeat: int = 1
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    algorithm: Any = None  # verl's AlgoConfig (or its DictConfig), passed on as compute_advantage(config=...)

    @classmethod
    def from_config(cls, config: Any) -> AdvantageSpec:
        algo = config.algorithm
        return cls(
            adv_estimator=str(algo.adv_estimator),
            gamma=algo.gamma,
            lam=algo.lam,
            num_repeat=config.actor_rollout_ref.rollout.n,
            norm_adv_by_std_in_grpo=algo.get("norm_adv_by_std_in_grpo", True),
            use_kl_in_reward=bool(algo.use_kl_in_reward),
            kl_penalty=algo.kl_penalty,
            algorithm=algo,
        )

    def rollout_correction(self, batch: DataProto) -> Any:
        cfg = self.algorithm.get("rollout_correction", None) if self.algorithm is not None else None
        if cfg is None or cfg.get("bypass_mode", False) or "rollout_log_probs" not in batch.batch:
            return None
        return cfg


@dataclass
class StageFns:
    """The trainer's own stage calls. Each takes the post-generation batch and returns a ``DataProto`` of new keys.

    ``reward`` is a colocated reward model (``None`` when ``rm_scores`` came with
    generation, as verl's streamed reward loop gives them); ``groups`` names the
    worker group of each stage (stages of one group never overlap).
    """

    old_log_prob: Callable[[DataProto], DataProto]
    reward: Callable[[DataProto], DataProto] | None = None
    ref_log_prob: Callable[[DataProto], DataProto] | None = None
    values: Callable[[DataProto], DataProto] | None = None
    groups: Mapping[str, str] = field(default_factory=dict)

    def group(self, stage: str) -> str:
        return self.groups.get(stage, stage)


def advantage_block(batch: DataProto, spec: AdvantageSpec, kl_ctrl: Any) -> tuple[DataProto, dict[str, Any]]:
    """verl's ``adv`` section of ``RayPPOTrainer.fit`` on a batch that carries every producer's keys."""
    metrics: dict[str, Any] = {}
    reward_tensor, reward_extra = extract_reward(batch)
    batch.batch["token_level_scores"] = reward_tensor
    if reward_extra:
        batch.non_tensor_batch.update({k: np.array(v) for k, v in reward_extra.items()})
    if spec.use_kl_in_reward:
        batch, kl_metrics = apply_kl_penalty(batch, kl_ctrl=kl_ctrl, kl_penalty=spec.kl_penalty)
        metrics.update(kl_metrics)
    else:
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    corr = spec.rollout_correction(batch)
    if corr is not None:
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

        batch, is_metrics = compute_rollout_correction_and_add_to_batch(batch, corr)
        metrics.update(is_metrics)
    batch = compute_advantage(
        batch,
        adv_estimator=spec.adv_estimator,
        gamma=spec.gamma,
        lam=spec.lam,
        num_repeat=spec.num_repeat,
        norm_adv_by_std_in_grpo=spec.norm_adv_by_std_in_grpo,
        config=spec.algorithm,
    )
    return batch, metrics


def _merge(batch: DataProto, name: str, out: DataProto | None) -> DataProto:
    """Union one stage's output into ``batch`` as verl does (old log-prob's entropy is a metric, not a key)."""
    if out is None:
        return batch
    if name == "old_log_prob" and "entropys" in out.batch.keys():
        out.batch.pop("entropys")
    return batch.union(out)


def _view(batch: DataProto) -> DataProto:
    """A shallow copy: new key sets, the same tensors (stages add keys to it while others read the original)."""
    return DataProto(
        batch=batch.batch.copy(), non_tensor_batch=dict(batch.non_tensor_batch), meta_info=dict(batch.meta_info)
    )


ORDER = ("reward", "old_log_prob", "ref_log_prob", "values")


def ingestion_stages(
    batch: DataProto, fns: StageFns, spec: AdvantageSpec, kl_ctrl: Any, outputs: dict[str, Any]
) -> list[Stage]:
    """The stage graph for one batch, in verl's order. The advantage reads its producers from ``outputs``."""
    producers = ["reward"] if fns.reward is not None else []
    needs_logp = spec.use_kl_in_reward or (
        spec.algorithm is not None and spec.algorithm.get("rollout_correction", None) is not None
    )
    stages: list[Stage] = []
    for name in ORDER:
        fn = getattr(fns, name)
        if fn is None:
            continue
        stages.append(Stage(name, fns.group(name), (), _bind(fn, batch)))
        if name in ("old_log_prob", "ref_log_prob") and needs_logp:
            producers.append(name)
        if name == "values" and spec.adv_estimator in VALUE_ESTIMATORS:
            producers.append(name)

    def advantage() -> tuple[DataProto, dict[str, Any]]:
        view = _view(batch)
        for n in ORDER:
            if n in producers:
                view = _merge(view, n, outputs[n])
        return advantage_block(view, spec, kl_ctrl)

    stages.append(
        Stage(
            "advantage", fns.group("advantage") if "advantage" in fns.groups else "driver", tuple(producers), advantage
        )
    )
    return stages


def _bind(fn: Callable[[DataProto], DataProto], batch: DataProto) -> Callable[[], DataProto]:
    return lambda: fn(batch)


def _finish(batch: DataProto, outputs: Mapping[str, Any]) -> tuple[DataProto, dict[str, Any]]:
    """Union every stage's output in verl's order, then the advantage's new keys."""
    for n in ORDER:
        if n in outputs:
            batch = _merge(batch, n, outputs[n])
    adv, metrics = outputs["advantage"]
    for k in adv.batch.keys():  # new keys, and keys the advantage section replaced (rollout correction's mask)
        if k not in batch.batch.keys() or adv.batch[k] is not batch.batch[k]:
            batch.batch[k] = adv.batch[k]
    for k, v in adv.non_tensor_batch.items():
        batch.non_tensor_batch.setdefault(k, v)
    return batch, metrics


def run_conduit(
    batch: DataProto,
    fns: StageFns,
    spec: AdvantageSpec,
    kl_ctrl: Any,
    profile: StageProfile,
    runner: StageRunner,
    meter: PathMeter | None = None,
) -> tuple[DataProto, dict[str, Any], Plan]:
    """Plan the stage graph from the profiled costs, run it, return the batch as verl's serial order leaves it."""
    outputs: dict[str, Any] = {}
    stages = ingestion_stages(batch, fns, spec, kl_ctrl, outputs)
    the_plan = plan(stages, profile)
    meter = meter or PathMeter()
    with meter.exposed():
        _, timings = runner.run(stages, the_plan, profile, outputs)
        batch, metrics = _finish(batch, outputs)
    for t in timings:
        for n, s in t.stage_s.items():
            meter.add_stage(n, s)
    meter.overlapped += sum(len(t.names) - 1 for t in timings)
    meter.plan = the_plan.describe()
    return batch, metrics, the_plan


def run_serial(batch: DataProto, fns: StageFns, spec: AdvantageSpec, kl_ctrl: Any) -> tuple[DataProto, dict[str, Any]]:
    """verl's V0 order, stage after stage (the reference the Conduit schedule must reproduce bit for bit)."""
    for name in ORDER:
        fn = getattr(fns, name)
        if fn is not None:
            batch = _merge(batch, name, fn(batch))
    return advantage_block(batch, spec, kl_ctrl)
