"""The ``verl.plugins`` entry point: registers Conduit's V1 trainers in every process that imports verl.

What: ``import verl`` loads every ``verl.plugins`` entry point (or the modules in
``VERL_USE_EXTERNAL_MODULES``). Loading this module is cheap: it only installs
an import hook, and when ``verl.trainer.ppo.v1`` finishes importing (the
trainer registry's module, which pulls in TransferQueue) it registers
``conduit_sync`` and ``conduit_separate_async`` with verl's own
``register_trainer``. If the V1 package is already imported, it registers at once.

Why: verl imports its plugins inside ``import verl`` in the driver, the TaskRunner
and every Ray worker, and swallows their errors at DEBUG level. So the plugin
stays cheap (no TransferQueue/Ray import unless the process imports V1 anyway)
and records what happened; :func:`status` reports it, and the version gate's
error is kept there instead of vanishing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["TRAINER_MODES", "register", "status"]

TARGET = "verl.trainer.ppo.v1"
#: trainer_mode name -> class name in :mod:`conduit.integrations.verl.v1`
TRAINER_MODES = {"conduit_sync": "ConduitPPOTrainerSync", "conduit_separate_async": "ConduitPPOTrainerSeparateAsync"}

log = logging.getLogger("conduit.integrations.verl")
STATE: dict[str, Any] = {"hook": False, "registered": [], "error": None}
LOCK = threading.Lock()


def register() -> list[str]:
    """Register Conduit's trainers with verl's registry (idempotent); returns the registered mode names."""
    with LOCK:
        if STATE["registered"]:
            return list(STATE["registered"])
        try:
            from .compat import check_versions

            check_versions()
            from verl.trainer.ppo.v1 import register_trainer

            from . import v1

            for mode, cls_name in TRAINER_MODES.items():
                register_trainer(mode)(getattr(v1, cls_name))
            STATE["registered"] = list(TRAINER_MODES)
            STATE["error"] = None
        except Exception as exc:  # verl would hide it: keep it for status() and say it once
            STATE["error"] = f"{type(exc).__name__}: {exc}"
            log.warning("conduit: verl trainers not registered: %s", STATE["error"])
        return list(STATE["registered"])


class RegisterAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Wraps the loader of ``verl.trainer.ppo.v1`` so that :func:`register` runs right after it executes."""

    def __init__(self) -> None:
        self.loader: Any = None

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self.loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        register()


def install() -> None:
    """Register now if verl's V1 package is imported, else when it is."""
    with LOCK:
        if STATE["hook"]:
            return
        STATE["hook"] = True
        if TARGET not in sys.modules:
            sys.meta_path.insert(0, RegisterAfterImport())
            return
    register()


def status() -> dict[str, Any]:
    """What the plugin did in this process: the trainer modes it registered, or why it did not."""
    from .compat import installed_versions

    return {
        "hook_installed": STATE["hook"],
        "registered": list(STATE["registered"]),
        "error": STATE["error"],
        "versions": installed_versions(),
    }


install()
