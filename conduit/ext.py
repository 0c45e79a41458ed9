"""The extension surface: what a framework adapter or a custom component builds on, beside :mod:`conduit`.

``conduit`` is the API a training loop uses (the runtime, its config, batches,
hooks, errors). An adapter that plugs a framework into the runtime sometimes needs
a little more of the core, and this module is that little more — the one other
place it may import from (``tests/test_house.py`` checks every import of
``integrations/`` against ``conduit.__all__``, this module's ``__all__`` and
``conduit.distributed.__all__``):

- host memory a framework's *own* prefetcher reads from (:class:`Staging`, pinned
  where CUDA is, recycled; :class:`HandoffGuard`; :class:`BatchMemory`);
- the core's CUDA streams and their hand-off (:class:`StreamSet`, :func:`handoff`),
  so an adapter never makes a stream or an event of its own;
- prefetch as a node (:class:`Prefetcher`): a framework's own iterator run ahead on
  the core's worker, so an adapter never starts a thread of its own;
- the protocols a custom component implements: storage (:class:`Storage`,
  :class:`StoragePolicy`) and samplers (:class:`Sampler`, :class:`Draw`).

Everything else under ``conduit.*`` is internal and may change without notice.
Importing this module imports torch (the runtime's modules), unlike ``import conduit``.
"""

from __future__ import annotations

from conduit.executor import StreamSet, handoff
from conduit.memory import BatchMemory, HandoffGuard, Staging
from conduit.prefetch import Prefetcher, PrefetchStats
from conduit.samplers.base import Draw, Sampler
from conduit.storage import Storage, StoragePolicy

__all__ = [
    "BatchMemory",
    "Draw",
    "HandoffGuard",
    "PrefetchStats",
    "Prefetcher",
    "Sampler",
    "Staging",
    "Storage",
    "StoragePolicy",
    "StreamSet",
    "handoff",
]
