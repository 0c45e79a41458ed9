"""Registering Conduit's buffers with SRL: a wrapper around SRL's ``make_buffer``.

SRL has no buffer registry: ``make_buffer(name, **buffer_args)`` is an ``if/elif``
chain in its buffer module, and its trainer (and buffer) workers call it as a module
attribute at call time (``buffer_api.make_buffer(cfg.buffer_name, **cfg.buffer_args)``).
So replacing the module attribute with a wrapper is enough: the names in
:data:`BUFFER_NAMES` build Conduit's buffers, every other name goes to SRL's own
function, untouched. ::

    from conduit.integrations.srl import install
    install()                       # finds rlsrl.base.buffer or base.buffer
    # TrainerWorker(buffer_name="conduit_queue", buffer_args=dict(max_size=16, reuses=2, batch_size=8))

Processes: SRL starts workers with ``multiprocessing``'s default *fork*, so a patch
made in the launcher is inherited. Under *spawn* a child imports modules afresh;
the :class:`Installation` that ``install()`` returns is picklable and installs again
wherever it is unpickled — put it in anything the workers receive (the
``ConduitSampleConsumer`` carries one), or import :mod:`conduit.integrations.srl.auto`
from the experiment's module, which installs on import.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .locate import find, types_of
from .prioritized import ConduitPrioritizedReplay, prioritized_class
from .replay import ConduitReplayBuffer
from .reuse_queue import ConduitQueueBuffer

__all__ = ["BUFFER_NAMES", "Installation", "install", "installed", "make", "prioritized_class", "uninstall"]

log = logging.getLogger("conduit.integrations.srl")

#: buffer name -> what it builds (``conduit_prioritized`` becomes an SRL ``PrioritizedReplayBuffer`` subclass)
BUFFER_NAMES: dict[str, type[Any]] = {
    ConduitQueueBuffer.NAME: ConduitQueueBuffer,
    ConduitReplayBuffer.NAME: ConduitReplayBuffer,
    ConduitPrioritizedReplay.NAME: ConduitPrioritizedReplay,
}
#: the attribute that marks a wrapper (and holds SRL's own function)
ORIGINAL = "__conduit_original__"

_lock = threading.Lock()


def make(name: str, module: ModuleType | None = None, **buffer_args: Any) -> Any:
    """Build Conduit buffer ``name`` with SRL's types from ``module`` (default: the SRL buffer module loaded)."""
    if name not in BUFFER_NAMES:
        raise KeyError(f"{name!r} is not a Conduit SRL buffer; expected one of {sorted(BUFFER_NAMES)}")
    types = types_of(module)
    cls = prioritized_class(types) if name == ConduitPrioritizedReplay.NAME else BUFFER_NAMES[name]
    return cls(**buffer_args, srl_types=types)


def _wrapper(module: ModuleType, original: Callable[..., Any]) -> Callable[..., Any]:
    def make_buffer(name: str, **buffer_args: Any) -> Any:
        if name in BUFFER_NAMES:
            return make(name, module, **buffer_args)
        return original(name, **buffer_args)

    make_buffer.__doc__ = f"SRL's make_buffer, plus Conduit's buffers {sorted(BUFFER_NAMES)}."
    setattr(make_buffer, ORIGINAL, original)
    return make_buffer


def installed(module: ModuleType) -> bool:
    """Whether ``module.make_buffer`` is Conduit's wrapper."""
    return hasattr(getattr(module, "make_buffer", None), ORIGINAL)


@dataclass(frozen=True)
class Installation:
    """Where Conduit's buffers are registered: picklable, and unpickling installs again (spawned workers)."""

    modules: tuple[str, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reinstall, (self.modules,))


def _reinstall(modules: tuple[str, ...]) -> Installation:
    for name in modules:
        install(name)
    return Installation(modules)


def install(module: str | ModuleType | None = None) -> Installation:
    """Wrap SRL's ``make_buffer`` (idempotent); ``module``: SRL's buffer module or its name (default: found by name).

    Raises ``ImportError`` with what was tried when SRL's buffer layer cannot be imported.
    """
    mod = find(module)
    with _lock:
        if not installed(mod):
            mod.make_buffer = _wrapper(mod, mod.make_buffer)
            log.info("conduit: %s.make_buffer now also builds %s", mod.__name__, ", ".join(sorted(BUFFER_NAMES)))
    return Installation((mod.__name__,))


def uninstall(module: str | ModuleType | None = None) -> None:
    """Put SRL's own ``make_buffer`` back (idempotent)."""
    mod = find(module)
    with _lock:
        original = getattr(mod.make_buffer, ORIGINAL, None)
        if original is not None:
            mod.make_buffer = original
