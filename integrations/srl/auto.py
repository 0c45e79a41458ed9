"""Import this module to register Conduit's buffers with SRL on import (a spawned worker, an experiment module).

::

    import conduit.integrations.srl.auto  # noqa: F401  (in the module that defines the experiment)

It calls :func:`~.install.install` for SRL's buffer module — the names in the
``CONDUIT_SRL_BUFFER_MODULES`` environment variable (comma-separated), else
``rlsrl.base.buffer`` / ``base.buffer`` — so every process that imports the
experiment registers ``conduit_queue``, ``conduit_replay`` and ``conduit_prioritized``,
whether it was forked or spawned. This is the one module of the adapter that acts
on import; importing :mod:`conduit.integrations.srl` itself changes nothing.
"""

from __future__ import annotations

import os

from .install import Installation, install

__all__ = ["INSTALLATION", "MODULES_ENV"]

#: the environment variable naming SRL's buffer module(s) when they are not at SRL's usual names
MODULES_ENV = "CONDUIT_SRL_BUFFER_MODULES"


def _install_all() -> Installation:
    names = [n.strip() for n in os.environ.get(MODULES_ENV, "").split(",") if n.strip()]
    if not names:
        return install()
    done: list[str] = []
    for name in names:
        done += install(name).modules
    return Installation(tuple(done))


#: what was installed when this module was imported
INSTALLATION = _install_all()
