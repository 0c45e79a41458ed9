"""Lazy package exports (PEP 562): a name is imported from its module on first use, and so is a submodule.

Why: ``conduit.cli`` is a subpackage of ``conduit``, so every ``conduit ...``
command runs ``conduit/__init__.py`` first; importing torch there costs more
than a second before ``--help`` can answer. The public names stay where they
are (``conduit.Conduit``, ``from conduit import ExperienceSpec``); each is
imported from its module the first time it is read.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["exports"]


Getattr = Callable[[str], Any]


def exports(package: str, modules: Mapping[str, str]) -> tuple[Getattr, Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose public names live in ``modules``.

    ``modules`` maps a module to its public names, space-separated.
    """
    where = {name: module for module, names in modules.items() for name in names.split()}
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:  # a submodule read as an attribute (``conduit.errors.ConfigError``) is imported too
            if name.startswith("_") or importlib.util.find_spec(f"{package}.{name}") is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            return importlib.import_module(f"{package}.{name}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # the next read is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
