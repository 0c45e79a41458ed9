"""Version gate: which verl and TransferQueue releases the adapter was tested against.

What: :func:`check_versions` reads the installed versions (``importlib.metadata``,
no import of verl) and raises :class:`UntestedVersion` naming what is installed,
what was tested and how to proceed. ``CONDUIT_VERL_ALLOW_UNTESTED=1`` downgrades
the error to a warning.

Why: verl's trainer internals move fast (V1 on TransferQueue, V0, a NeoProto
branch); the adapter overrides stage methods whose signatures it checks in its
tests against exactly these releases. Running on anything else silently would
risk a wrong training batch, so it says so instead.
"""

from __future__ import annotations

import os
import warnings
from importlib import metadata

__all__ = ["TESTED", "UntestedVersion", "check_versions", "installed_versions"]

#: distribution name -> tested versions (the ``verl`` extra pins the same)
TESTED: dict[str, tuple[str, ...]] = {"verl": ("0.9.1",), "TransferQueue": ("0.1.11",)}
ALLOW_ENV = "CONDUIT_VERL_ALLOW_UNTESTED"


class UntestedVersion(RuntimeError):
    """verl or TransferQueue is missing or not a version the adapter was tested with."""


def installed_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in TESTED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def check_versions(require_transfer_queue: bool = True) -> dict[str, str | None]:
    """Raise :class:`UntestedVersion` unless the installed verl (and TransferQueue) are tested releases."""
    found = installed_versions()
    problems = []
    for dist, tested in TESTED.items():
        if dist == "TransferQueue" and not require_transfer_queue:
            continue
        have = found[dist]
        if have is None:
            problems.append(f"{dist} is not installed (tested: {', '.join(tested)})")
        elif have not in tested:
            tested_s = ", ".join(tested)
            problems.append(f"{dist} {have} is installed; conduit.integrations.verl was tested with {tested_s}")
    if problems:
        msg = (
            "; ".join(problems)
            + '. Install the tested range with `pip install ".[verl]" (in a clone of Conduit)`, or set '
            + f"{ALLOW_ENV}=1 to run on this version at your own risk."
        )
        if os.getenv(ALLOW_ENV, "0") == "1" and all("not installed" not in p for p in problems):
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
        else:
            raise UntestedVersion(msg)
    return found
