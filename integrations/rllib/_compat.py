"""The one place the RLlib adapter imports Ray, with a clear error when it is missing.

Ray earns its place only here: the adapter plugs into RLlib's own classes
(``EpisodeReplayBuffer``, ``Learner``, ``Algorithm``), so it cannot exist without
them. Nothing in the core imports this package, so ``import conduit`` never
pulls in Ray.

The adapter touches RLlib internals (the replay-buffer call sequence of DQN's
``training_step``, ``Learner._make_batch_if_necessary``,
``Learner._create_iterator_if_necessary``, ``Algorithm.get_state``), so the
tested RLlib range is pinned and other versions get a warning.
"""

from __future__ import annotations

import logging

log = logging.getLogger("conduit.integrations.rllib")

#: The RLlib versions the adapter is tested against (the ``rllib`` extra pins the same range).
TESTED_RAY_RANGE = ("2.60", "2.61")

try:
    import ray
    import ray.rllib
except ImportError as exc:  # pragma: no cover - exercised only without ray
    raise ImportError(
        'conduit.integrations.rllib needs RLlib: pip install ".[rllib]" (in a clone of Conduit) '
        f"(ray[rllib]>={TESTED_RAY_RANGE[0]},<{TESTED_RAY_RANGE[1]})"
    ) from exc


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def check_ray_version(version: str | None = None) -> bool:
    """Whether ``version`` (default: the installed Ray) lies in the tested range; warns if not."""
    version = version or ray.__version__
    lo, hi = (_version_tuple(v) for v in TESTED_RAY_RANGE)
    ok = lo <= _version_tuple(version) < hi
    if not ok:
        log.warning(
            "conduit.integrations.rllib is tested with ray[rllib]>=%s,<%s but ray %s is installed; "
            "the adapter relies on RLlib internals that may have changed",
            *TESTED_RAY_RANGE,
            version,
        )
    return ok


RAY_VERSION_OK = check_ray_version()

__all__ = ["RAY_VERSION_OK", "TESTED_RAY_RANGE", "check_ray_version", "log"]
