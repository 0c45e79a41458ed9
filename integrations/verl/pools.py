"""Which of verl's resource pools each post-generation stage runs on (two stages of one pool never run at once).

verl 0.9.1 builds its actor as ``Role.ActorRolloutRef`` where a reference policy shares the actor's workers,
else as ``Role.ActorRollout`` (``Role.Actor`` without the hybrid engine); the reference policy has workers of
its own only where ``Role.RefPolicy`` is mapped to a pool (and not LoRA's ``ref_in_actor``), else it runs on
the actor's. A stage whose role has no pool in verl's mapping runs on the actor's pool: an unknown pool is never
taken for a separate one, so such stages keep verl's order.
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo.utils import Role

__all__ = ["stage_pools"]

_ACTOR_ROLES = (Role.ActorRolloutRef, Role.ActorRollout, Role.Actor)


def stage_pools(trainer: Any) -> dict[str, str]:
    """``{stage: pool}`` for the old and reference log-probs, the values and the reward model."""
    mapping = getattr(getattr(trainer, "resource_pool_manager", None), "mapping", None) or {}
    roles = getattr(trainer, "role_worker_mapping", None) or mapping
    actor_role = next((r for r in _ACTOR_ROLES if r in roles and r in mapping), None)
    actor = str(mapping[actor_role]) if actor_role is not None else "actor"
    own_ref = Role.RefPolicy in roles and Role.RefPolicy in mapping and not getattr(trainer, "ref_in_actor", False)
    return {
        "old_log_prob": actor,
        "ref_log_prob": str(mapping[Role.RefPolicy]) if own_ref else actor,
        "values": str(mapping.get(Role.Critic, actor)),
        "reward": str(mapping.get(Role.RewardModel, actor)),
    }
