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

__all__ = ["ConduitPrioritizedReplay", "prioritized_class"]


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

    def _annotate(self, sample: Any, info: BatchInfo) -> np.ndarray:
        weights = np.asarray(info.weights, dtype=np.float32)
        sample.register_metadata(sampling_weight=weights)
        return np.array(info.indices, dtype=np.int64)  # the trainer's to keep: the runtime matches them at feedback

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
        # the runtime matches the indices to the newest batch it delivered with them (one awaiting its first update
        # first: SRL's trainer repeats the last entry's update as it stops), applies them generation-checked
        # (dropped where a slot holds a new sample now) and counts the replays at a batch's first update
        steps = self.training_steps + 1
        beta = float(self.beta_scheduler.get(steps)) if self.beta_scheduler is not None else self.beta
        edp = self.edp
        if edp is None:
            raise SemanticsError("update_priorities: nothing was sampled from this buffer yet")
        try:
            applied = edp.update_priorities(idx.astype(np.int64), pr, beta=beta)
        except SemanticsError as exc:
            raise SemanticsError(
                "update_priorities: these sampling_indices match no batch this buffer handed out recently; pass the "
                "entry's own sampling_indices"
            ) from exc
        self.training_steps, self.beta = steps, beta  # SRL anneals beta at each feedback, for the draws after it
        return applied

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
