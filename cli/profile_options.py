"""What ``conduit profile`` profiles: one pydantic model for the command-line flags and the ``--config`` file.

The flags and the file's keys are the same names (``--batch-size`` is ``batch_size:``) and pass through
the same checks, so a file's ``dim: "big"`` or ``dim: -5`` is told what the flag ``--dim -5`` is told.
pydantic earns its place as it does for :class:`~conduit.ConduitConfig`: typed fields, bounds, and one
explanation per bad key (:func:`conduit.config.explain`).
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conduit.core import Policy
from conduit.errors import ConfigError
from conduit.files import read_mapping
from conduit.scheduling.kinds import CostKind

if TYPE_CHECKING:  # torch comes with these: imported when the command runs, so --help answers at once
    from conduit.scheduling.workload import SyntheticWorkload

__all__ = ["PolicyChoice", "ProfileOptions"]


class PolicyChoice(str, enum.Enum):
    """Which loop to profile."""

    OFF = "off"
    ON = "on"
    BOTH = "both"


_POLICIES = {
    PolicyChoice.OFF: (Policy.OFF_POLICY,),
    PolicyChoice.ON: (Policy.ON_POLICY,),
    PolicyChoice.BOTH: (Policy.OFF_POLICY, Policy.ON_POLICY),
}


class ProfileOptions(BaseModel):
    """The workload ``conduit profile`` runs; every field is also a flag of the same name."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)

    policy: PolicyChoice = PolicyChoice.BOTH
    dim: int = Field(1000, ge=1, strict=True, description="Transition dimension (float32 obs and next_obs).")
    batch_size: int = Field(512, ge=1, strict=True, description="Off-policy training batch size.")
    unit_size: int = Field(256, ge=1, strict=True, description="Transitions per rollout unit (one push).")
    capacity: int = Field(20_000, ge=1, strict=True, description="Off-policy replay capacity.")
    units_per_iteration: int = Field(4, ge=1, strict=True, description="On-policy rollout units per iteration.")
    minibatches: int = Field(4, ge=1, strict=True, description="On-policy mini-batches per epoch (M).")
    epochs: int = Field(1, ge=1, strict=True, description="On-policy epochs per iteration.")
    rollout_ms: float = Field(2.0, ge=0, description="Rollout cost per unit (ms).")
    update_ms: float = Field(8.0, ge=0, description="Update cost per training batch / mini-batch (ms).")
    cost: CostKind = CostKind.COMPUTE
    g_max: int = Field(4, ge=1, le=16, strict=True, description="Cap on off-policy granularities.")

    @classmethod
    def build(cls, flags: dict[str, Any], explicit: set[str], config: Path | None) -> ProfileOptions:
        """The options: the ``--config`` file's keys over the defaults, flags given on the command line over
        both. Either source's mistakes raise :class:`ConfigError` naming the key (and the file)."""
        values = dict(flags)
        where = "invalid profile options"
        if config is not None:
            where = f"--config file {str(config)!r}"
            from_file = read_mapping(config, "--config file")
            cls._checked({**values, **from_file}, where)  # every key of the file, also one a flag overrides
            values.update({k: v for k, v in from_file.items() if k not in explicit})
        return cls._checked(values, where)

    @classmethod
    def _checked(cls, values: dict[str, Any], where: str) -> ProfileOptions:
        from conduit.config import explain

        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(explain(exc, cls, where)) from None

    def workloads(self) -> list[SyntheticWorkload]:
        from conduit.scheduling.workload import SyntheticWorkload

        return [
            SyntheticWorkload(
                policy=policy, dim=self.dim, batch_size=self.batch_size, unit_size=self.unit_size,
                capacity=self.capacity, units_per_iteration=self.units_per_iteration,
                num_minibatches=self.minibatches, num_epochs=self.epochs, rollout_ms=self.rollout_ms,
                update_ms=self.update_ms, cost=self.cost,
            )
            for policy in _POLICIES[self.policy]
        ]
