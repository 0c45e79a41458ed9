"""Ray's start-up warnings that say nothing to a user running an example, filtered out — opt in, examples only.

Each pattern names a warning Ray or gymnasium prints on every local run of a
stock RLlib config, whatever the user does: about Ray's own defaults, an RLlib
deprecation inside RLlib, a monitoring package, an environment RLlib registers
twice. Everything else Ray logs still shows.
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["BENIGN", "quiet_ray_startup"]

#: substrings of messages that are not the user's business in a local example
BENIGN = (
    "Token authentication is enabled for this Ray cluster",  # Ray's default for any cluster, a local one too
    "on the new API stack! This is the new default behavior",  # RLlib announcing its own default
    "`RLModule(config=[RLModuleConfig object])` has been deprecated",  # raised inside RLlib's own catalogs
    "Install gputil for GPU system monitoring",  # an optional monitoring package
)


class _Benign(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(pattern in message for pattern in BENIGN)


def quiet_ray_startup() -> None:
    """Drop :data:`BENIGN` from Ray's loggers and gymnasium's re-registration warning (idempotent)."""
    for name in ("ray", "ray.rllib", "ray._private", "ray.tune"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Benign) for f in logger.filters):
            logger.addFilter(_Benign())
        for handler in logger.handlers:
            if not any(isinstance(f, _Benign) for f in handler.filters):
                handler.addFilter(_Benign())
    warnings.filterwarnings("ignore", message=r".*Overriding environment rllib-single-agent-env", category=UserWarning)
