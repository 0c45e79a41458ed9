"""Columnar transition rows addressed by slot, on Conduit storage.

The exact mode gives every stored time step the slot RLlib would give it (its
segment-tree node), so rows are written at scattered slots rather than at a
ring position. Observations, next observations and actions live in a Conduit
:class:`~conduit.storage.Storage` created by a
:class:`~conduit.storage.StoragePolicy` (so placement decides where they
reside); rewards, per-slot generations (the global transition id a slot holds)
stay on the host, where the n-step returns and the generation check use them.

Storage grows on demand: RLlib's free-node order only hands out a fresh node
when every freed one is in use, so the highest slot ever used is the largest
number of time steps ever held (the capacity, plus a temporary overflow when a
single episode is longer than the buffer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from conduit.spec import ExperienceSpec
from conduit.storage import FixedStorage, Storage, StoragePolicy, TensorStorage, copy_rows
from conduit.storage.tensor import fits

from .episodes import Chunk

__all__ = ["HostGatherStorage", "HostGatherStoragePolicy", "SlotStorage", "consecutive_runs"]


class HostGatherStorage(TensorStorage):
    """A :class:`~conduit.storage.TensorStorage` that gathers host rows with numpy fancy indexing.

    ``torch.index_select`` runs an OpenMP parallel region for large gathers; when
    other processes hold the cores, that region waits for them, and a gather's time
    swings with the load (``out=`` or not), while numpy's single-threaded fancy
    indexing waits for no one (BENCHMARKS.md, "RLlib end to end"). With ``out``
    (recycled batch memory) the rows land there (``np.take(..., out=)``), else in
    fresh memory.
    """

    def gather(
        self, indices: torch.Tensor, device: torch.device | None = None, out: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        if self.device.type != "cpu" or (device is not None and device.type != "cpu"):
            return super().gather(indices, device, out)
        idx = indices.cpu().numpy()
        result = {}
        for name, t in self.tensors.items():
            dst = out.get(name) if out is not None and fits(out.get(name), len(idx), t) else None
            if t.dtype == torch.bfloat16:  # no numpy dtype
                result[name] = torch.index_select(t, 0, indices.cpu(), **({} if dst is None else {"out": dst}))
            elif dst is not None:
                np.take(t.numpy(), idx, axis=0, out=dst.numpy())
                result[name] = dst
            else:
                result[name] = torch.from_numpy(t.numpy()[idx])
        return result


class HostGatherStoragePolicy(FixedStorage):
    """:class:`~conduit.storage.FixedStorage` placing rows in :class:`HostGatherStorage`."""

    def create(self, spec: ExperienceSpec, rows: int) -> Storage:
        return HostGatherStorage(spec, rows, self.device)


def consecutive_runs(slots: np.ndarray) -> list[tuple[int, int, int]]:
    """Split ``slots`` into maximal runs of step +1 or -1: ``(start, stop, step)`` positions."""
    n = len(slots)
    runs = []
    i = 0
    diffs = np.diff(slots)
    while i < n:
        j = i + 1
        step = int(diffs[i]) if i < n - 1 and abs(int(diffs[i])) == 1 else 0
        if step:
            while j < n and int(diffs[j - 1]) == step:
                j += 1
        runs.append((i, j, step or 1))
        i = j
    return runs


class SlotStorage:
    """``obs`` / ``next_obs`` / ``actions`` rows at slots ``[0, max_slots)``, plus host columns."""

    def __init__(self, max_slots: int, policy: StoragePolicy, initial_rows: int) -> None:
        self.max_slots = max_slots
        self.policy = policy
        self.initial_rows = min(max_slots, max(1, initial_rows))
        self.storage: Storage | None = None
        self.spec: ExperienceSpec | None = None
        self.rewards = np.zeros(max_slots, dtype=np.float64)
        self.gen = np.full(max_slots, -1, dtype=np.int64)
        self.next_gen = 0  # transitions ever written: the next generation id
        self.high_water = 0  # slots [0, high_water) have been written at least once

    @property
    def rows(self) -> int:
        return self.storage.rows if self.storage is not None else 0

    def _columns(self, chunk: Chunk, lo: int, hi: int) -> dict[str, torch.Tensor]:
        data = {
            "obs": torch.from_numpy(np.ascontiguousarray(chunk.obs[lo:hi])),
            "next_obs": torch.from_numpy(np.ascontiguousarray(chunk.obs[lo + 1 : hi + 1])),
            "actions": torch.from_numpy(np.ascontiguousarray(chunk.actions[lo:hi])),
        }
        if self.spec is None:
            self.spec = ExperienceSpec.infer(data)
        return self.spec.validate(data)

    def _ensure_rows(self, need: int) -> None:
        assert self.spec is not None
        if self.storage is None:
            self.storage = self.policy.create(self.spec, max(self.initial_rows, need))
            return
        if need <= self.storage.rows:
            return
        rows = min(self.max_slots, max(need, self.storage.rows + self.storage.rows // 2))
        new = self.policy.create(self.spec, rows)
        copy_rows(self.storage, new, self.storage.rows)
        self.storage.close()
        self.storage = new

    def write(self, slots: np.ndarray, chunk: Chunk, lo: int = 0, hi: int | None = None) -> None:
        """Store time steps ``lo..hi`` of ``chunk`` at ``slots`` (one slot per step), new generations."""
        hi = chunk.length if hi is None else hi
        slots = np.asarray(slots, dtype=np.int64)
        if len(slots) != hi - lo:
            raise ValueError(f"{len(slots)} slots for {hi - lo} time steps")
        if len(slots) == 0:
            return
        data = self._columns(chunk, lo, hi)
        self._ensure_rows(int(slots.max()) + 1)
        assert self.storage is not None
        for start, stop, step in consecutive_runs(slots):
            part = {k: v[start:stop] for k, v in data.items()}
            if step < 0:
                part = {k: v.flip(0) for k, v in part.items()}
            self.storage.write(int(slots[stop - 1] if step < 0 else slots[start]), part)
        self.rewards[slots] = chunk.rewards[lo:hi]
        self.gen[slots] = np.arange(self.next_gen, self.next_gen + len(slots))
        self.next_gen += len(slots)
        self.high_water = max(self.high_water, int(slots.max()) + 1)

    def release(self, slots: np.ndarray) -> None:
        """Slots no longer hold a transition (their generation becomes -1)."""
        self.gen[np.asarray(slots, dtype=np.int64)] = -1

    def gather(self, slots: np.ndarray, device: torch.device | None = None) -> dict[str, torch.Tensor]:
        assert self.storage is not None
        return self.storage.gather(torch.from_numpy(np.asarray(slots, dtype=np.int64)), device)

    # -- persistence ----------------------------------------------------------
    def state(self) -> dict[str, Any]:
        rows = {}
        if self.storage is not None and self.high_water:
            rows = {k: v.cpu().numpy() for k, v in self.storage.read(0, self.high_water).items()}
        return {
            "rows": rows,
            "spec": self.spec.to_json() if self.spec is not None else None,
            "rewards": self.rewards[: self.high_water].copy(),
            "gen": self.gen[: self.high_water].copy(),
            "next_gen": self.next_gen,
            "high_water": self.high_water,
        }

    def load(self, state: dict[str, Any]) -> None:
        hw = int(state["high_water"])
        if hw > self.max_slots:
            raise ValueError(f"state holds {hw} slots but this buffer addresses {self.max_slots}")
        self.spec = ExperienceSpec.from_json(state["spec"]) if state["spec"] is not None else None
        self.storage = None
        if self.spec is not None and hw:
            self._ensure_rows(hw)
            assert self.storage is not None
            self.storage.write(0, {k: torch.from_numpy(np.asarray(v)) for k, v in state["rows"].items()})
        self.rewards[:] = 0.0
        self.gen[:] = -1
        self.rewards[:hw] = state["rewards"]
        self.gen[:hw] = state["gen"]
        self.next_gen = int(state["next_gen"])
        self.high_water = hw

    def close(self) -> None:
        if self.storage is not None:
            self.storage.close()
            self.storage = None
