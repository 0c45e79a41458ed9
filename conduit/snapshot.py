"""One consistent point of a running runtime: its components' state captured, and restored, together.

The runtime's :meth:`~conduit.Conduit.state_dict`, ``save`` and ``restore`` go
through here; :mod:`conduit.checkpoint` writes and reads what this captures.
Capturing walks the lock order of :mod:`conduit.paths.base` whole: both paths
pause between invocations (pushes still queue, learners still take staged
batches), the delivery's counts settle, the buffer's admissions and the queue
are read in one hold of the ingestion's condition, and the rows — which only a
write changes, and writes are paused — are copied last, holding up no pull.

Loading reads what :mod:`conduit.checkpoint` verified, but its checksums are no
signature: :func:`rebuild` and :func:`check` take no field of a checkpoint on
trust. Each is checked for its type, and every number that sizes an allocation
against the data files that would have to hold it (a replay capacity against
the slot table saved in ``buffer.pt``), before anything is built: whatever is
wrong is a :class:`~conduit.errors.CheckpointError` naming the field.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from conduit._version import __version__
from conduit.buffers.base import ExperienceBuffer
from conduit.config import ConduitConfig
from conduit.core import Policy, Schedule, is_feasible_mode
from conduit.errors import CheckpointError, ConduitError
from conduit.paths.delivery import DeliveryPath
from conduit.paths.ingestion import IngestionPath
from conduit.slots import slots_in_order
from conduit.spec import ExperienceSpec

__all__ = [
    "State", "Stored", "apply", "capture", "check", "manifest", "quiesced", "rebuild", "slots_in_order",
    "stored_in_order",
]

#: component name -> its state dict (tensors, arrays and primitives only)
State = dict[str, dict[str, Any]]
COMPONENTS = ("buffer", "ingestion", "delivery")
#: what a replay checkpoint's ``buffer.pt`` holds at least per slot: the slot table's ids and use counts (int64)
SLOT_BYTES = 16
DAMAGED = "the checkpoint is damaged, or was edited or written by something else: load another checkpoint"


@contextlib.contextmanager
def quiesced(ingestion: IngestionPath, delivery: DeliveryPath, timeout: float | None = None) -> Iterator[None]:
    """Hold both paths still between invocations; units pushed meanwhile stay queued."""
    with ingestion.paused(timeout), delivery.paused(timeout):
        yield


def capture(
    buffer: ExperienceBuffer, ingestion: IngestionPath, delivery: DeliveryPath, timeout: float | None = None
) -> State:
    """The three components' state at one point (see the module docstring)."""
    with quiesced(ingestion, delivery, timeout):
        with delivery.settled(timeout):
            delivery_state = delivery.state_dict()
            # pushes still admit and queue while ingestion is paused: what the buffer has admitted (the
            # rate limiter's inserts, the on-policy push side) and the queue are read in one hold
            with ingestion.cond:
                buffer_state = buffer.state_dict(rows=False)
                queued = ingestion.queued()
        buffer_state["rows"] = buffer.rows_state()
        ingestion_state = ingestion.state_dict(queued)
    return {"buffer": buffer_state, "ingestion": ingestion_state, "delivery": delivery_state}


def apply(
    buffer: ExperienceBuffer, ingestion: IngestionPath, delivery: DeliveryPath, state: Mapping[str, dict[str, Any]]
) -> None:
    """Continue from :func:`capture` (into components that hold no data yet)."""
    with quiesced(ingestion, delivery):  # an overlapped worker claims nothing before every component is restored
        for name, component in (("buffer", buffer), ("delivery", delivery), ("ingestion", ingestion)):
            try:
                component.load_state_dict(state[name])
            except ConduitError:
                raise
            except Exception as e:  # a state that is not what capture() writes: a field missing, or of a wrong type
                raise CheckpointError(f"the {name} state is malformed ({type(e).__name__}: {e}); {DAMAGED}") from e


def manifest(config: ConduitConfig, spec: ExperienceSpec | None, schedule: Schedule, state: State) -> dict[str, Any]:
    """What a checkpoint says of itself in plain JSON: what to rebuild the runtime from, and a summary."""
    return {
        "conduit_version": __version__,
        "policy": config.policy.value,
        "config": config.model_dump(mode="json"),
        "spec": spec.to_json() if spec is not None else None,
        "schedule": schedule.to_json(),
        "buffer": {"inserted": int(state["buffer"]["inserted"])},
        "delivery": {"pulls": [int(p) for p in state["delivery"]["pulls"]]},
    }


# -- a checkpoint's manifest, checked ------------------------------------------------------------------------
def _field(where: Path, manifest: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """``manifest[key]`` where it is of ``kind``; else CheckpointError naming the field and what it holds."""
    if key not in manifest:
        raise CheckpointError(f"{where}: the manifest has no {key!r}; {DAMAGED}")
    value = manifest[key]
    if not isinstance(value, kind):
        names = {dict: "a mapping", str: "a string", list: "a list", type(None): "null"}
        expected = " or ".join(names.get(k, k.__name__) for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise CheckpointError(f"{where}: the manifest's {key!r} is {value!r:.80}, expected {expected}; {DAMAGED}")
    return value


def _spec(where: Path, manifest: Mapping[str, Any]) -> ExperienceSpec | None:
    raw = _field(where, manifest, "spec", (dict, type(None)))
    try:
        return ExperienceSpec.from_json(raw) if raw else None
    except Exception as e:  # a field missing, a dtype unknown, a shape not of integers
        raise CheckpointError(f"{where}: the manifest's 'spec' is malformed ({type(e).__name__}: {e}); "
                              f"{DAMAGED}") from e


def rebuild(
    where: Path, manifest: Mapping[str, Any], overrides: Mapping[str, Any]
) -> tuple[ConduitConfig, ExperienceSpec | None, Schedule]:
    """The config (``overrides`` applied), spec and schedule a checkpoint's runtime is rebuilt from, each checked
    (see the module docstring); a replay capacity more than ``buffer.pt`` could hold is refused."""
    raw = _field(where, manifest, "config", dict)
    try:
        saved = ConduitConfig(**raw)
    except ConduitError as e:
        raise CheckpointError(f"{where}: the manifest's 'config' is not valid ({e}); {DAMAGED}") from None
    files = manifest.get("files") or {}
    held = files.get("buffer.pt", {}).get("bytes", 0) if isinstance(files, dict) else 0
    if saved.capacity is not None and saved.capacity * SLOT_BYTES > held:
        raise CheckpointError(
            f"{where}: the manifest's config says capacity={saved.capacity}, but buffer.pt holds {held} bytes, "
            f"too few for the slot table of that many slots ({SLOT_BYTES} bytes each at least); {DAMAGED}"
        )
    spec = _spec(where, manifest)
    try:
        schedule = Schedule.from_json(_field(where, manifest, "schedule", dict))
    except CheckpointError:
        raise
    except Exception as e:  # a mode missing, a granularity not a number
        raise CheckpointError(f"{where}: the manifest's 'schedule' is malformed ({type(e).__name__}: {e}); "
                              f"{DAMAGED}") from e
    for path, mode, space in (("ingestion", schedule.ingestion, saved.ingestion_space),
                              ("delivery", schedule.delivery, saved.delivery_space)):
        if not is_feasible_mode(saved.policy, mode, space):
            raise CheckpointError(f"{where}: the manifest's 'schedule' runs {path} at {mode}, which its config "
                                  f"({saved.policy.value}) cannot run; {DAMAGED}")
    config = ConduitConfig(**{**raw, **overrides}) if overrides else saved
    return config, spec, schedule


def check(where: str | Path, manifest: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    """A loaded checkpoint's manifest and state (:func:`conduit.checkpoint.load`) are what :func:`manifest` and
    :func:`capture` write, as far as restoring reads them before building anything; else CheckpointError."""
    where = Path(where)
    policy = _field(where, manifest, "policy", str)
    if policy not in {p.value for p in Policy}:
        raise CheckpointError(f"{where}: the manifest's policy is {policy!r}, not one Conduit knows; {DAMAGED}")
    _spec(where, manifest)
    missing = [name for name in COMPONENTS if not isinstance(state.get(name), dict)]
    if missing:
        raise CheckpointError(f"{where}: the checkpoint holds no {' or '.join(missing)} state (its components: "
                              f"{', '.join(map(str, state)) or 'none'}); {DAMAGED}")
    buffer = state["buffer"]
    if policy == Policy.OFF_POLICY.value:  # replay: the capacity must be the slot table's, read from the file
        capacity, table, sampler = buffer.get("capacity"), buffer.get("table"), buffer.get("sampler")
        ids = table.get("ids") if isinstance(table, dict) else None
        shape = tuple(np.shape(ids)) if ids is not None else None
        if type(capacity) is not int or shape != (capacity,):
            raise CheckpointError(
                f"{where}: buffer.pt says capacity={capacity!r:.40}, but its slot table holds "
                f"{'no ids' if shape is None else f'ids of shape {shape}'}; {DAMAGED}"
            )
        if not (isinstance(sampler, dict) and isinstance(sampler.get("kind"), str)):
            raise CheckpointError(f"{where}: buffer.pt names no sampler kind; {DAMAGED}")


class Stored(NamedTuple):
    """A replay buffer's live rows read back from its ``state_dict``, oldest first."""

    #: the slot each row was in, oldest first
    slots: np.ndarray
    #: each field's rows, oldest first (empty when the buffer held none)
    rows: dict[str, torch.Tensor]
    #: prioritized replay: each row's priority after ``** alpha`` (the sampler's leaf), else None
    leaves: np.ndarray | None
    #: prioritized replay: the sampler's max priority (what new rows get), else 1.0
    max_priority: float


def stored_in_order(state: Mapping[str, Any]) -> Stored:
    """The live rows of a replay buffer's ``state_dict`` taken with ``rows=True``, in ingestion order.

    A pure function of the state, so a framework's checkpoint format or a re-sharding can be
    written from Conduit's own checkpoint without reaching into a running buffer.
    """
    slots = slots_in_order(np.asarray(state["table"]["ids"]))
    stored = state.get("rows") or {}
    index = torch.from_numpy(slots)
    rows = {k: v.index_select(0, index) for k, v in stored.items()} if slots.size else {}
    sampler = state["sampler"]
    if "leaves" not in sampler:
        return Stored(slots, rows, None, 1.0)
    return Stored(slots, rows, np.asarray(sampler["leaves"], dtype=np.float64)[slots], float(sampler["max_priority"]))
