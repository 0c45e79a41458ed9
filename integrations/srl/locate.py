"""Where SRL's buffer layer lives in this process, and which entry and sample types to hand out.

SRL is not on PyPI and two unrelated PyPI projects install a top-level ``srl``
package (``srl`` 0.1.0 and ``srl-framework``), so SRL is never detected by
``import srl``. Its buffer layer is found by the module names SRL itself uses:
``rlsrl.base.buffer`` (the packaged ``srl-local`` release) and ``base.buffer``
(the monorepo, run from its root). A module of that name counts as SRL's only if
it has SRL's ``make_buffer``, ``ReplayEntry`` and ``PrioritizedReplayBuffer``.

Nothing here imports SRL unless asked (:func:`find`, called by ``install``); a
buffer built directly takes the types of the buffer module it is given, else of
SRL's buffer module if this process has loaded it (:func:`loaded`); without
either it is refused (the buffers exist to be handed to SRL's trainer, and hand
out SRL's own ``ReplayEntry`` and ``NamedArray``).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = [
    "BUFFER_MODULES", "HOST_FIELDS", "SRLTypes", "find", "loaded", "looks_like_srl", "namedarray_of", "types_named",
    "types_of",
]

#: fields a GPU learner still gets as host numpy: SRL's trainer filters stale samples with numpy on them
HOST_FIELDS = ("policy_version_steps",)

#: SRL's buffer module, by the name each SRL distribution gives it (the packaged release first)
BUFFER_MODULES = ("rlsrl.base.buffer", "base.buffer")
_NEEDED = ("make_buffer", "ReplayEntry", "PrioritizedReplayBuffer")


def looks_like_srl(module: ModuleType) -> bool:
    """Whether ``module`` is SRL's buffer module (it has SRL's factory, entry type and PER class)."""
    return all(hasattr(module, name) for name in _NEEDED)


def loaded() -> ModuleType | None:
    """SRL's buffer module if this process has already imported it (imports nothing)."""
    for name in BUFFER_MODULES:
        module = sys.modules.get(name)
        if module is not None and looks_like_srl(module):
            return module
    return None


def find(module: str | ModuleType | None = None) -> ModuleType:
    """SRL's buffer module: ``module`` (a name or the module), else the first of :data:`BUFFER_MODULES` that imports.

    Raises ``ImportError`` naming each candidate and why it failed.
    """
    return first_module(
        (module,) if module else BUFFER_MODULES, _NEEDED, "SRL's buffer module",
        ". SRL is not on PyPI: clone openpsi-projects/srl and `pip install -e .` (package rlsrl), or put the "
        "monorepo's root on sys.path; then `pip install '.[srl]'` in a clone of Conduit for the buffer layer's own "
        "dependencies",
    )


def first_module(candidates: tuple[str | ModuleType, ...], needed: tuple[str, ...], what: str, hint: str = ""
                 ) -> ModuleType:
    """The first of ``candidates`` (names or modules) that imports and has each of ``needed``; else ``ImportError``
    naming each candidate and why it was not it (an SRL checkout may fail to import: its Python version, a
    missing dependency)."""
    reasons = []
    for cand in candidates:
        try:
            mod = cand if isinstance(cand, ModuleType) else importlib.import_module(cand)
        except Exception as e:
            reasons.append(f"{cand}: {type(e).__name__}: {e}")
            continue
        if all(hasattr(mod, name) for name in needed):
            return mod
        reasons.append(f"{mod.__name__}: not {what} (needs {', '.join(needed)})")
    raise ImportError(f"{what} was not found (" + "; ".join(reasons) + ")" + hint)


def namedarray_of(buffer_module: ModuleType) -> ModuleType | None:
    """SRL's ``namedarray`` module beside its buffer module (``rlsrl.base.namedarray`` / ``base.namedarray``)."""
    mod = getattr(buffer_module, "namedarray", None)
    if isinstance(mod, ModuleType) and hasattr(mod, "NamedArray"):
        return mod
    package = buffer_module.__name__.rpartition(".")[0]
    try:
        mod = importlib.import_module(f"{package}.namedarray" if package else "namedarray")
    except ImportError:
        return None
    return mod if hasattr(mod, "NamedArray") else None


@dataclass(frozen=True)
class SRLTypes:
    """The classes a buffer hands out and subclasses: those of SRL's buffer module (or of a module like it)."""

    replay_entry: type[Any]
    prioritized_base: type[Any]
    named_array: type[Any]
    #: the SRL buffer module they come from
    module: ModuleType

    @property
    def source(self) -> str:
        return self.module.__name__


def types_of(module: ModuleType | None = None) -> SRLTypes:
    """The types of SRL's buffer ``module`` (default: the one this process has loaded).

    Raises ``ImportError`` when no module is given and SRL's buffer layer is not loaded, or when the
    module has no ``namedarray`` beside it.
    """
    module = module if module is not None else loaded()
    if module is None:
        raise ImportError(
            "SRL's buffer layer is not loaded in this process, and the Conduit SRL buffers hand out its types "
            "(ReplayEntry, NamedArray): call conduit.integrations.srl.install() "
            f"(it finds {' or '.join(BUFFER_MODULES)}), "
            "import SRL's buffer module first, or pass the module to make(name, module, ...)"
        )
    na = namedarray_of(module)
    if na is None:
        raise ImportError(f"{module.__name__} has no namedarray module beside it with SRL's NamedArray")
    return SRLTypes(module.ReplayEntry, module.PrioritizedReplayBuffer, na.NamedArray, module)


def types_named(module: str | None) -> SRLTypes:
    """:func:`types_of` the buffer module named ``module`` (what a pickled buffer records), else of the loaded one.

    A module that cannot be imported where the buffer is unpickled falls back to the loaded SRL.
    """
    if module is None:
        return types_of()
    try:
        mod = importlib.import_module(module)
    except Exception:  # not importable here (missing, or an SRL checkout that fails to import): the loaded one
        return types_of()
    return types_of(mod) if looks_like_srl(mod) else types_of()
