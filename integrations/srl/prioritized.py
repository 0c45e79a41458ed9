"""``conduit_prioritized``: SRL's ``PrioritizedReplayBuffer`` with Conduit's runtime inside.

The uniform buffer of :mod:`.replay` plus proportional PER: ``alpha``, ``beta`` (and
SRL's ``beta_scheduler``), ``max_priority``; ``get()`` adds ``sampling_indices`` and
the ``sampling_weight`` metadata, and replays are counted at ``update_priorities``, as
SRL counts them. The class handed out is a subclass of SRL's ``PrioritizedReplayBuffer``
(:func:`prioritized_class`), so the trainer's ``isinstance`` gate sends priorities to
:meth:`ConduitPrioritizedReplay.update_priorities`, which applies them through the
runtime's generation-checked ``update_priorities`` (priorities for samples overwritten
since the draw are dropped).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, ClassVar

import numpy as np
import torch

import conduit
from conduit import BatchInfo, ConfigError, SemanticsError

from .locate import SRLTypes
from .replay import CLASSES, ConduitReplayBuffer

__all__ = ["ConduitPrioritizedReplay", "SamplingIndices", "prioritized_class"]


class SamplingIndices(np.ndarray):
    """``ReplayEntry.sampling_indices``: the drawn slots (int64), carrying the batch's provenance for the priority
    update (``info``), so feedback lands on the transitions drawn, never on whatever holds those slots now."""

    info: BatchInfo | None

    def __new__(cls, slots: np.ndarray, info: BatchInfo | None) -> SamplingIndices:
        obj = np.asarray(slots, dtype=np.int64).view(cls)
        obj.info = info
        return obj

    def __array_finalize__(self, obj: Any) -> None:
        self.info = getattr(obj, "info", None)




class ConduitPrioritizedReplay(ConduitReplayBuffer):
    """``conduit_prioritized``: proportional PER (made an SRL ``PrioritizedReplayBuffer`` by :func:`.install.make`)."""

    NAME: ClassVar[str] = "conduit_prioritized"
    prioritized: ClassVar[bool] = True

    def __init__(
        self,
        max_size: int,
        sample_length: int,
        batch_size: int,
        warmup_transitions: int,
        seed: int = 0,
        burn_in_steps: int = 0,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_scheduler: Any = None,
        max_priority: float = 1.0,
        priority_interpolation_eta: float | None = None,
        **conduit_kw: Any,
    ) -> None:
        if alpha < 0:
            raise ConfigError(f"alpha: expected >= 0, got {alpha}")
        if not 0 < beta <= 1:
            raise ConfigError(f"beta: expected 0 < beta <= 1, got {beta}")
        if priority_interpolation_eta is not None:
            raise ConfigError(
                "priority_interpolation_eta: initial priorities from the sample's TD error are not supported by "
                "conduit_prioritized (new samples get the maximum priority); use prioritized_replay_buffer for it"
            )
        if beta_scheduler is not None and getattr(beta_scheduler, "init_value", beta) != beta:
            raise ConfigError(f"beta_scheduler.init_value={beta_scheduler.init_value} differs from beta={beta}")
        if max_priority <= 0:
            raise ConfigError(f"max_priority: expected > 0, got {max_priority}")
        super().__init__(max_size, batch_size, warmup_transitions, seed, sample_length, sample_length, **conduit_kw)
        self.alpha, self.beta, self.max_priority = alpha, beta, max_priority
        self.beta_scheduler = beta_scheduler
        self.burn_in_steps = burn_in_steps
        self.training_steps = 0
        self._kwargs.update(
            burn_in_steps=burn_in_steps, alpha=alpha, beta=beta, beta_scheduler=beta_scheduler,
            max_priority=max_priority,
        )
        del self._kwargs["batch_length"]

    def _sampler_fields(self) -> dict[str, Any]:
        # SRL's PER takes priorities > 0 as given: the smallest eps Conduit allows changes no draw
        # (and new samples start at SRL's ``max_priority``, as SRL's running maximum does)
        return {"sampler": "prioritized", "prioritized": conduit.PrioritizedReplay(
            alpha=self.alpha, beta=self.beta, eps=1e-300, max_priority=self.max_priority)}

    def _annotate(self, sample: Any, info: BatchInfo) -> SamplingIndices:
        weights = np.asarray(info.weights, dtype=np.float32)
        sample.register_metadata(sampling_weight=weights)
        return SamplingIndices(info.indices, info)

    def update_priorities(self, idxes: np.ndarray, priorities: Any) -> int:
        """New priorities for a batch ``get()`` returned (``entry.sampling_indices``); returns how many applied."""
        if isinstance(priorities, torch.Tensor):
            priorities = priorities.detach().cpu().numpy()
        pr = np.asarray(priorities, dtype=np.float64)
        idx = np.asarray(idxes)
        if idx.shape != (self.batch_size,) or pr.shape != (self.batch_size,):
            raise ValueError(
                f"update_priorities: expected indices and priorities of shape ({self.batch_size},), "
                f"got {idx.shape} and {pr.shape}"
            )
        if not np.all(pr > 0):
            raise ValueError("update_priorities: SRL's PER takes priorities > 0")
        info = self._match(idxes)
        edp = self.edp
        assert edp is not None
        self.training_steps += 1  # (the trainer thread's; the replay counts are the runtime's: count_replays)
        if self.beta_scheduler is not None:  # SRL anneals beta at each feedback, for the draws after it
            self.beta = float(self.beta_scheduler.get(self.training_steps))
        return edp.update_priorities(info, pr, beta=self.beta)

    def _match(self, idxes: np.ndarray) -> BatchInfo:
        info = getattr(idxes, "info", None)
        if info is not None and np.array_equal(info.indices, idxes):
            return info
        for cand in reversed(list(self._handed)):  # indices that lost their provenance: the newest batch they match
            if np.array_equal(cand.indices, idxes):
                return cand
        raise SemanticsError(
            "update_priorities: these sampling_indices match no batch this buffer handed out recently; "
            "pass the entry's own sampling_indices"
        )

    def _adapter_state(self) -> dict[str, Any]:
        return {**super()._adapter_state(), "training_steps": self.training_steps, "beta": self.beta}

    def _load_adapter_state(self, state: dict[str, Any]) -> None:
        super()._load_adapter_state(state)
        self.training_steps = int(state["training_steps"])
        self.beta = float(state["beta"])


_classes: weakref.WeakKeyDictionary[type[Any], type[Any]] = weakref.WeakKeyDictionary()
_classes_lock = threading.Lock()


def prioritized_class(types: SRLTypes) -> type[ConduitPrioritizedReplay]:
    """``conduit_prioritized``'s class for ``types``: a subclass of their ``PrioritizedReplayBuffer`` (made once per
    base), so SRL's trainer's ``isinstance`` gate routes priority feedback to it. SRL's ``__init__`` never runs."""
    base = types.prioritized_base
    with _classes_lock:
        cls = _classes.get(base)
        if cls is None:
            cls = type(
                "ConduitPrioritizedReplayBuffer", (ConduitPrioritizedReplay, base),
                {"__module__": __name__, "__doc__": ConduitPrioritizedReplay.__doc__},
            )
            _classes[base] = cls
        return cls


CLASSES[ConduitPrioritizedReplay.NAME] = prioritized_class
