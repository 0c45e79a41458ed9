"""What a learner pulls: a training-ready batch and the metadata to check it.

:class:`Batch` is a read-only mapping ``field -> tensor`` (so ``batch["obs"]``
works wherever a dict of tensors does) plus :class:`BatchInfo`, which records
where the rows came from and how they were delivered. The semantics tests of
docs/design.md §2 are written against these fields.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from conduit.core import Mode
from conduit.errors import closest

__all__ = ["Batch", "BatchInfo", "DrawnRows", "Sampled"]


class DrawnRows:
    """The rows one draw took: their slot indices and the transition ids those slots held at the draw.

    Made once per batch and read by few learners (prioritized replay's
    ``update_priorities``, semantics checks), so the numpy arrays are made
    when first read: right after a gather has gone through the caches each
    numpy call is slow, and a small pull would pay for two of them that most
    learners never read. A pure replay ring's ids are worked out from
    the ring's position captured at the draw — never read from the slot
    table later, whose slots may have been overwritten since:
    slot ``s`` held id ``next_id - 1 - ((pos - 1 - s) mod capacity)``.
    """

    __slots__ = ("_ids", "_indices", "_ring", "_tensor", "fed_back", "lineage", "times")

    def __init__(
        self,
        indices: np.ndarray | None = None,
        ids: np.ndarray | None = None,
        *,
        tensor: torch.Tensor | None = None,
        ring: tuple[int, int, int] | None = None,
    ) -> None:
        if indices is None and tensor is None:
            raise ValueError("DrawnRows needs the slot indices, as an array or a tensor")
        if ids is None and ring is None:
            raise ValueError("DrawnRows needs the ids, or the ring's (pos, next_id, capacity) to work them out")
        self._indices = indices
        self._tensor = tensor  # a host int64 index tensor (the gather's own) when ``indices`` is not given
        self._ids = ids
        self._ring = ring  # (pos, next_id, capacity) of a pure ring at the draw
        #: each row's replay count before this draw (``count_replays``), else None
        self.times: np.ndarray | None = None
        #: the replay buffer's lineage it was drawn from (an update names no other buffer's rows), None if unknown
        self.lineage: int | None = None
        #: a priority update has counted these rows (``count_replays="feedback"``: a batch counts once)
        self.fed_back = False

    @property
    def indices(self) -> np.ndarray:
        """Slot indices (int64)."""
        indices = self._indices
        if indices is None:
            assert self._tensor is not None
            indices = self._indices = self._tensor.numpy()
        return indices

    @property
    def ids(self) -> np.ndarray:
        """Global transition ids the slots held at the draw (int64)."""
        ids = self._ids
        if ids is None:
            assert self._ring is not None
            pos, next_id, capacity = self._ring
            ids = (pos - 1) - self.indices
            np.remainder(ids, capacity, out=ids)
            np.subtract(next_id - 1, ids, out=ids)
            self._ids = ids
        return ids

    def __len__(self) -> int:
        # a tensor's shape, not len(tensor): Tensor.__len__ is Python code, on every pull's count
        return len(self._indices) if self._indices is not None else self._tensor.shape[0]  # type: ignore[union-attr]

    def __getitem__(self, part: slice) -> DrawnRows:
        """The rows of one batch of a multi-batch draw, still unmade where these are."""
        rows = DrawnRows(
            None if self._indices is None else self._indices[part],
            None if self._ids is None else self._ids[part],
            tensor=None if self._tensor is None else self._tensor[part],
            ring=self._ring,
        )
        rows.times = None if self.times is None else self.times[part]
        rows.lineage = self.lineage
        return rows


class BatchInfo(NamedTuple):
    """Provenance of one delivered batch (immutable; a NamedTuple because one is built per pull).

    Attributes:
        learner: the data-parallel learner rank it was delivered to.
        pull_index: that learner's pull count when it was delivered (0-based).
        sampled_at_pull: that learner's pull count when its rows were sampled;
            ``pull_index - sampled_at_pull`` is its staleness in batches.
        buffer_version: transitions ingested when its rows were sampled.
        iteration: on-policy: the policy iteration; off-policy: the delivery
            invocation that produced it.
        epoch / minibatch: on-policy position in the iteration (None off-policy).
        last: the final mini-batch of its iteration for this learner (on-policy).
        rows: the rows' :attr:`indices` and :attr:`ids` (:class:`DrawnRows`: arrays made when first read).
        weights: importance-sampling weights (prioritized replay), else None.
        mode: the delivery mode (overlap, granularity) it ran under.
        version_at_delivery: transitions ingested when it was handed over.
        attachment: what the delivery hook attached to this batch (``learn_out.write(data, attach=...)``),
            else None; not checkpointed (a staged batch restored from a checkpoint has none).
    """

    learner: int
    pull_index: int
    sampled_at_pull: int
    buffer_version: int
    iteration: int
    epoch: int | None
    minibatch: int | None
    num_minibatches: int | None
    last: bool
    rows: DrawnRows
    weights: np.ndarray | None
    mode: Mode
    version_at_delivery: int = -1
    attachment: Any = None

    @property
    def indices(self) -> np.ndarray:
        """Off-policy: ring slots; on-policy: rows within the iteration."""
        return self.rows.indices

    @property
    def ids(self) -> np.ndarray:
        """Global transition ids (ingestion order) of the rows."""
        return self.rows.ids

    @property
    def times_sampled(self) -> np.ndarray | None:
        """With ``count_replays``: how many batches had drawn each row before this one (Reverb's
        ``times_sampled``, SRL's reuses), read at the draw; else None."""
        return self.rows.times

    def state_dict(self) -> dict[str, Any]:
        """This provenance as primitives and arrays (what a checkpoint of a staged batch holds)."""
        out = self._asdict()
        del out["attachment"]  # an object of the hook's, not provenance: a restored staged batch has none
        rows: DrawnRows = out.pop("rows")
        out["indices"], out["ids"] = np.array(rows.indices, dtype=np.int64), np.array(rows.ids, dtype=np.int64)
        out["times_sampled"] = None if rows.times is None else np.array(rows.times, dtype=np.int64)
        out["lineage"] = rows.lineage
        out["weights"] = None if self.weights is None else np.array(self.weights, dtype=np.float32)
        out["mode"] = self.mode.to_json()
        return out

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> BatchInfo:
        d = dict(state)
        rows = DrawnRows(_array(d.pop("indices"), np.int64), _array(d.pop("ids"), np.int64))
        times = d.pop("times_sampled", None)
        rows.times = None if times is None else _array(times, np.int64)
        lineage = d.pop("lineage", None)
        rows.lineage = None if lineage is None else int(lineage)
        weights = d.pop("weights")
        d.update(rows=rows, mode=Mode.from_json(d["mode"]))
        d["weights"] = None if weights is None else _array(weights, np.float32)
        return cls(**d)

    def __repr__(self) -> str:
        """A short summary; every field's full data is :meth:`describe` (or the attributes themselves)."""
        where = (
            f"iteration={self.iteration}, epoch={self.epoch}, minibatch={self.minibatch}/{self.num_minibatches}"
            if self.epoch is not None else f"invocation={self.iteration}"
        )
        weighted = "" if self.weights is None else ", weighted"
        return (
            f"BatchInfo({len(self.rows)} rows, learner={self.learner}, pull={self.pull_index}, {where}, "
            f"version={self.buffer_version}, staleness={self.staleness}, mode={self.mode}{weighted})"
        )

    def describe(self) -> dict[str, Any]:
        """Every field in full, the rows' slots, ids and weights included."""
        out = self._asdict()
        out.pop("rows")
        out.update(indices=self.indices, ids=self.ids)
        return out

    @property
    def staleness(self) -> int:
        """Batches between when an inline schedule would have sampled this one and its delivery."""
        return self.pull_index - self.sampled_at_pull

    @property
    def version_lag(self) -> int:
        """Transitions ingested between sampling and delivery (what prefetching did not see)."""
        return self.version_at_delivery - self.buffer_version


def _array(x: Any, dtype: type) -> np.ndarray:
    """A private numpy copy of an array or a host tensor."""
    return np.asarray(x.numpy() if isinstance(x, torch.Tensor) else x, dtype=dtype).copy()


class Sampled(NamedTuple):
    """One off-policy draw: gathered rows plus what the learner may need to know."""

    data: dict[str, torch.Tensor]
    rows: DrawnRows  # slots and the ids they held, as arrays when first read
    weights: np.ndarray | None
    version: int
    leaves: np.ndarray | None = None  # prioritized: the drawn rows' p^alpha and the beta of their weights
    beta: float | None = None

    # the rows' slots and ids, read through ``rows`` as a batch's info reads them
    indices = BatchInfo.indices
    ids = BatchInfo.ids


class Batch(Mapping[str, torch.Tensor]):
    """A training-ready batch on the learner's device."""

    __slots__ = ("_data", "info")

    def __init__(self, data: dict[str, torch.Tensor], info: BatchInfo) -> None:
        self._data = data
        self.info = info

    def __getitem__(self, key: str) -> torch.Tensor:
        try:
            return self._data[key]
        except KeyError:
            hint = closest(key, self._data) if isinstance(key, str) else None
            raise KeyError(
                f"batch has no field {key!r}" + (f" (did you mean {hint!r}?)" if hint else "")
                + f"; its fields: {', '.join(self._data) or 'none'} (the names pushed, as the spec declares them)"
            ) from None

    def __contains__(self, key: object) -> bool:  # Mapping's would build __getitem__'s message on a miss
        return key in self._data

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def clone(self) -> Batch:
        """A copy whose tensors own their memory: keep this one past the next pull (a batch's tensors may be
        views of the store or of a buffer the next pull reuses, and a kept view holds the whole store)."""
        return Batch({k: v.clone() for k, v in self._data.items()}, self.info)

    def __len__(self) -> int:
        return len(self._data)

    @property
    def size(self) -> int:
        """Rows in the batch."""
        return int(next(iter(self._data.values())).shape[0]) if self._data else 0

    @property
    def device(self) -> torch.device:
        return next(iter(self._data.values())).device

    @property
    def weights(self) -> torch.Tensor | None:
        """Importance weights as a tensor on the batch's device (prioritized replay)."""
        if self.info.weights is None:
            return None
        return torch.from_numpy(self.info.weights).to(self.device)

    def to_dict(self) -> dict[str, torch.Tensor]:
        return dict(self._data)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in self._data.items())
        return f"Batch({fields}; learner={self.info.learner}, iteration={self.info.iteration})"

