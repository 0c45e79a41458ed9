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
- the reuse queue (:class:`ReuseQueue`, :class:`Reusable`): batches formed once and handed
  out most-reuses-left, newest first, behind the core's lock, so an adapter keeps no store
  of its own;
- n-step returns at ingestion (:class:`NStepFolder`, :class:`Segment`): episode segments
  folded into n-step-ready rows before they are stored;
- prefetch as a node (:class:`Prefetcher`): a framework's own iterator run ahead on
  the core's worker, so an adapter never starts a thread of its own;
- the protocols a custom component implements: storage (:class:`Storage`,
  :class:`StoragePolicy`, and the stock :class:`TensorStorage` and
  :class:`FixedStorage` a custom one extends, :class:`HostGatherStoragePolicy` for host rows gathered
  single-threaded on a loaded CPU, and :func:`fits`, whether offered
  batch memory can take a gather) and samplers (:class:`Sampler`,
  :class:`Draw`);
- the off-policy buffer a runtime holds (:class:`ReplayBuffer`: its lock, draws,
  priorities and contents), for an adapter that reseeds it, and :func:`stored_in_order`
  (:class:`Stored`): a buffer's rows and priorities read back, oldest first, from its
  ``state_dict`` -- a framework's own checkpoint format written from Conduit's checkpoint --
  and :func:`slots_in_order`, the slots of a table's ids in id order;
- nested records (:class:`RecordLayout`, :func:`flatten_record`, :func:`build_record`, ...): samples
  that nest (a mapping of mappings, SRL's ``NamedArray``) stored as flat dotted fields and rebuilt
  with their nesting, sequence samples batched time-major;
- what a loop waits on (:class:`WaitTimer`, :func:`measure_interleaved`, :func:`summary_table`): the
  exposed experience path measured on live objects, the same way with and without Conduit;
- a checkpoint as bytes (:func:`pack`, :func:`unpacked`), for a framework that pickles its buffer
  object or ships it as one value: ``Conduit.save``'s files, checked as on disk when restored;
- :func:`explain`: an adapter's own pydantic options fail with the core's
  ``ConfigError`` message;
- stage graphs (:class:`Stage`, :class:`Plan`, :class:`StageProfile`,
  :class:`StageRunner`): a workload's per-iteration stages run wave by wave on
  the core's lanes, so an adapter never starts a thread pool of its own (the
  waves come from the planner, ``conduit.scheduling.stages.plan``, which sits
  above the core and so is not re-exported here);
- group-aware admission (:class:`AdmissionController`, :class:`AdmissionConfig`,
  :class:`GroupInfo`, :class:`Admission`, :data:`ANY_SOURCE`): groups of rows
  admitted whole, each once, in early mini-batches.

Everything else under ``conduit.*`` is internal and may change without notice.
Importing this module imports torch (the runtime's modules), unlike ``import conduit``.
"""

from __future__ import annotations

from conduit.buffers.replay import ReplayBuffer
from conduit.checkpoint import pack, unpacked
from conduit.config import explain
from conduit.executor import StreamSet, handoff
from conduit.exposure import WaitTimer, measure_interleaved, summary_table
from conduit.grouping import ANY_SOURCE, Admission, AdmissionConfig, AdmissionController, GroupInfo
from conduit.memory import BatchMemory, HandoffGuard, Staging
from conduit.nstep import NStepFolder, Segment
from conduit.prefetch import Prefetcher, PrefetchStats
from conduit.records import (
    RecordLayout,
    as_row,
    build_record,
    conform_record,
    flatten_record,
    is_numeric_leaf,
    is_record,
    stack_rows,
    stack_time_major,
    unify_records,
)
from conduit.reuse import Reusable, ReuseQueue
from conduit.samplers.base import Draw, Sampler
from conduit.snapshot import Stored, slots_in_order, stored_in_order
from conduit.stages import Plan, Stage, StageProfile, StageRunner, WaveTiming
from conduit.storage import FixedStorage, HostGatherStoragePolicy, Storage, StoragePolicy, TensorStorage
from conduit.storage.tensor import fits

__all__ = [
    "ANY_SOURCE",
    "Admission",
    "AdmissionConfig",
    "AdmissionController",
    "BatchMemory",
    "Draw",
    "FixedStorage",
    "GroupInfo",
    "HandoffGuard",
    "HostGatherStoragePolicy",
    "NStepFolder",
    "Plan",
    "PrefetchStats",
    "Prefetcher",
    "RecordLayout",
    "ReplayBuffer",
    "Reusable",
    "ReuseQueue",
    "Sampler",
    "Segment",
    "Stage",
    "StageProfile",
    "StageRunner",
    "Staging",
    "Storage",
    "StoragePolicy",
    "Stored",
    "StreamSet",
    "TensorStorage",
    "WaitTimer",
    "WaveTiming",
    "as_row",
    "build_record",
    "conform_record",
    "explain",
    "fits",
    "flatten_record",
    "handoff",
    "is_numeric_leaf",
    "is_record",
    "measure_interleaved",
    "pack",
    "slots_in_order",
    "stack_rows",
    "stack_time_major",
    "stored_in_order",
    "summary_table",
    "unify_records",
    "unpacked",
]
