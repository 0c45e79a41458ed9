"""The stand-in workload's vocabulary that the command line needs before anything is measured.

Kept apart from :mod:`conduit.scheduling.workload` (which imports torch) so that
``conduit profile --help`` can list the choices without importing torch.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["DRIFT", "CostKind"]

#: how far a burn measured alone may move — from its target, or between two measurements — before a report says
#: the machine's speed moved (a quiet host's jitter stays within it; a busy host's speed changes do not)
DRIFT = 0.15


class CostKind(str, Enum):
    """How the stand-in loop spends its rollout and update time."""

    COMPUTE = "compute"  # burn CPU, as a CPU learner does
    SLEEP = "sleep"  # release the CPU, as a GPU learner or a remote actor does
