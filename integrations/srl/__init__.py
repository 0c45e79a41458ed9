"""Conduit for SRL: Conduit's buffers as drop-ins for SRL's experience buffer.

SRL (Mei et al., ICLR 2024; ``openpsi-projects/srl``, package ``rlsrl``) keeps its
experience buffer inside each trainer worker: the stream thread ``put``\\s samples,
the trainer's GPU thread polls ``empty()`` and ``get()``\\s ``ReplayEntry``\\s, and an
algorithm's ``PyTorchGPUPrefetcher`` copies each batch to the GPU one step ahead.
This package provides buffers that satisfy that protocol and SRL's semantics, and
registers them under new buffer names by wrapping SRL's ``make_buffer``::

    from conduit.integrations.srl import install
    install()   # rlsrl.base.buffer (or the monorepo's base.buffer).make_buffer now also builds:

- ``conduit_queue``: SRL's default reuse queue (``priority_queue``), thread-safe, each
  batch stacked once into pinned, recycled staging memory (:mod:`.reuse_queue`);
- ``conduit_replay`` / ``conduit_prioritized``: uniform and prioritized replay over a
  :class:`conduit.Conduit` runtime; the prioritized one is an SRL
  ``PrioritizedReplayBuffer``, so priority feedback reaches Conduit's generation-checked
  ``update_priorities`` (:mod:`.replay`, :mod:`.prioritized`).

:class:`ConduitSampleConsumer` feeds what one ``consume_to`` reads into a Conduit
buffer in one push (:mod:`.consumer`). Entries and samples are SRL's own
``ReplayEntry`` and ``NamedArray`` (a buffer needs SRL's buffer layer loaded, or
the module to take them from). Buffers pickle (SRL's
``save_buffer_on_exit``): replay buffers through Conduit's checkpoint format.

SRL is not on PyPI and is never imported by ``import srl`` (an unrelated PyPI
name); nothing here imports SRL until ``install`` is called, and ``import conduit``
never imports this package.
"""

from __future__ import annotations

from conduit.ext import HandoffGuard, Staging

from .consumer import ConduitSampleConsumer, consumer_class, install_consumers
from .install import BUFFER_NAMES, Installation, install, installed, make, uninstall
from .locate import BUFFER_MODULES, SRLTypes, find, loaded, types_of
from .prioritized import ConduitPrioritizedReplay, prioritized_class
from .replay import ConduitReplayBuffer
from .reuse_queue import ConduitQueueBuffer

__all__ = [
    "BUFFER_MODULES",
    "BUFFER_NAMES",
    "ConduitPrioritizedReplay",
    "ConduitQueueBuffer",
    "ConduitReplayBuffer",
    "ConduitSampleConsumer",
    "HandoffGuard",
    "Installation",
    "SRLTypes",
    "Staging",
    "consumer_class",
    "find",
    "install",
    "install_consumers",
    "installed",
    "loaded",
    "make",
    "prioritized_class",
    "types_of",
    "uninstall",
]
