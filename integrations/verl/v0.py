"""Conduit's V0 trainer: ``RayPPOTrainer`` with old log-prob ∥ reference log-prob ∥ values where pools differ.

What: ``RayPPOTrainer.fit`` is one long method, so the subclass interposes on
its stage methods instead of rewriting it. When ``fit`` asks for the old
log-prob, :meth:`ConduitRayPPOTrainer._compute_old_log_prob` plans the
old/ref/values stages with :func:`conduit.scheduling.stages.plan` (profiled costs, the core's
cost model, one stage per resource pool at a time), runs them, and returns
the old log-prob; ``fit``'s next calls to ``_compute_ref_log_prob`` and
``_compute_values`` on the same batch return the results already computed. Every call is the parent's own method.

Why: the reference and critic passes read only generation outputs, never the
old log-prob; when they sit on their own pools they can run beside it.

Metrics: ``fit`` keeps its metrics dict and ``timing_raw`` to itself, so the gain
shows in verl's own timers: ``timing_s/old_log_prob`` covers the stages run
beside it, and ``timing_s/ref`` (and ``values``) drop to the time of handing the
result over. The V1 trainers also report ``conduit/*`` parts of the path. Start
it with ``verl.trainer.main_ppo.run_ppo(config, task_runner_class=...)`` and a
TaskRunner that builds this class, or assign ``main_ppo_v0.RayPPOTrainer``.
"""

from __future__ import annotations

from typing import Any

from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from conduit.ext import Stage, StageProfile, StageRunner
from conduit.scheduling.stages import plan

from .pools import stage_pools

__all__ = ["ConduitRayPPOTrainer"]


class ConduitRayPPOTrainer(RayPPOTrainer):
    """verl's V0 trainer; the old/ref/values stages run as Conduit plans them."""

    conduit_profile: StageProfile
    conduit_runner: StageRunner

    def conduit_setup(self) -> None:
        if not hasattr(self, "conduit_runner"):
            self.conduit_profile = StageProfile()
            self.conduit_runner = StageRunner(prefix="verl")
            self.conduit_pending: dict[str, tuple[DataProto, Any]] = {}
            self.conduit_last_plan = ""

    def _compute_old_log_prob(self, batch: DataProto) -> Any:
        self.conduit_setup()
        pools = stage_pools(self)
        stages = [
            Stage("old_log_prob", pools["old_log_prob"], (),
                  lambda: super(ConduitRayPPOTrainer, self)._compute_old_log_prob(batch))
        ]
        if self.use_reference_policy:
            stages.append(Stage("ref_log_prob", pools["ref_log_prob"], (),
                                lambda: super(ConduitRayPPOTrainer, self)._compute_ref_log_prob(batch)))
        if self.use_critic:
            stages.append(Stage("values", pools["values"], (),
                                lambda: super(ConduitRayPPOTrainer, self)._compute_values(batch)))
        the_plan = plan(stages, self.conduit_profile)
        self.conduit_last_plan = the_plan.describe()
        outputs: dict[str, Any] = {}
        first = next(w for w in the_plan.waves if "old_log_prob" in w)
        if len(stages) == 1 or len(first) == 1:  # nothing to overlap with the old log-prob: verl's order
            return super()._compute_old_log_prob(batch)
        wave_stages = [s for s in stages if s.name in first]
        wave_plan = type(the_plan)((first,), the_plan.predicted_s, the_plan.serial_s)
        self.conduit_runner.run(wave_stages, wave_plan, self.conduit_profile, outputs)
        for s in wave_stages:
            if s.name != "old_log_prob":
                self.conduit_pending[s.name] = (batch, outputs[s.name])
        return outputs["old_log_prob"]

    def conduit_take(self, name: str, batch: DataProto) -> Any | None:
        pending = getattr(self, "conduit_pending", {}).pop(name, None)
        if pending is None or pending[0] is not batch:  # another batch: compute as verl would
            return None
        return pending[1]

    def _compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        out = self.conduit_take("ref_log_prob", batch)
        return out if out is not None else super()._compute_ref_log_prob(batch)

    def _compute_values(self, batch: DataProto) -> DataProto:
        out = self.conduit_take("values", batch)
        return out if out is not None else super()._compute_values(batch)
