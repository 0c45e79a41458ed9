"""Host storage with a gather that waits for no one: numpy fancy indexing instead of ``index_select``.

For a host learner on a CPU that other processes load (a framework's env runners and
learner beside the buffer), hand :class:`HostGatherStoragePolicy` to
:class:`conduit.Conduit` (``storage=``): rows stay in host memory and a gather runs
single-threaded, so its time does not swing with the load; the class says why. The
RLlib adapter's bounded mode uses it for CPU-only learners.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from conduit.spec import ExperienceSpec
from conduit.storage.base import Storage
from conduit.storage.policy import FixedStorage
from conduit.storage.tensor import TensorStorage, fits

__all__ = ["HostGatherStorage", "HostGatherStoragePolicy"]


class HostGatherStorage(TensorStorage):
    """A :class:`~conduit.storage.TensorStorage` that gathers host rows with numpy fancy indexing.

    ``torch.index_select`` runs an OpenMP parallel region for large gathers; when
    other processes hold the cores, that region waits for them, and a gather's time
    swings with the load (``out=`` or not), while numpy's single-threaded fancy
    indexing waits for no one (measured in BENCHMARKS.md, "RLlib end to end"). With ``out``
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
