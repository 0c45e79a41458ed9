"""Conduit for verl: post-generation stages as scheduled Conduit operators, KnitTrans-style admission.

::

    pip install ".[verl]"                                                              # from a clone
    python -m verl.trainer.main_ppo trainer.v1.trainer_mode=conduit_sync ...          # V1 (TransferQueue)
    python -m verl.trainer.main_ppo trainer.v1.trainer_mode=conduit_separate_async ...
    # admission (V1, async modes): trainer.v1.sampler.custom_sampler.path=pkg://conduit.integrations.verl.sampler
    #                         trainer.v1.sampler.custom_sampler.name=ConduitAdmissionBuffer

The ``verl.plugins`` entry point (:mod:`.plugin`) registers the trainers in every
process that imports verl; V0 users take :class:`ConduitRayPPOTrainer` (a
``RayPPOTrainer`` subclass). Verl's reward functions, advantage estimators,
losses and engines are called, never copied. :func:`status` says whether the
plugin registered (verl hides plugin errors).

The engines are the core's: the stage graph and its runner (:mod:`conduit.stages`,
on the core's lanes), the wave planner (:mod:`conduit.scheduling.stages`) and
group-aware admission (:mod:`conduit.grouping`); this package maps verl onto them.
``import conduit`` imports none of this package. The user's page: ``docs/verl.md``.
"""

from __future__ import annotations

from .compat import TESTED, UntestedVersion, check_versions
from .plugin import status

__all__ = ["TESTED", "UntestedVersion", "check_versions", "status"]
