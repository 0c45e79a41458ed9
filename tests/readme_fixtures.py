"""The placeholders README.md's code blocks leave to the reader, filled with the smallest real thing.

``tests/test_readme.py`` runs every Python block of the README in a namespace made of
these names, so a block that would crash as written fails the suite.
"""

from __future__ import annotations

import tempfile

import numpy as np
import torch

#: how many loop iterations each block runs
iterations = 3
#: where a block saves a checkpoint
checkpoint_dir = tempfile.mkdtemp(prefix="conduit-readme-")
_rng = np.random.default_rng(0)


def rollout(rows: int = 256) -> dict[str, np.ndarray]:
    """One rollout unit: a dict of arrays with a leading batch dimension."""
    return {
        "obs": _rng.standard_normal((rows, 4)).astype(np.float32),
        "action": _rng.integers(0, 2, rows),
        "reward": _rng.standard_normal(rows).astype(np.float32),
    }


def rollouts(total: int = 4096, unit: int = 512):
    """One on-policy iteration's rollout units."""
    for _ in range(total // unit):
        yield rollout(unit)


def fw_ingestion_ops(d):
    """A framework's own ingestion logic (here: none)."""
    return d


def fw_delivery_ops(d):
    """A framework's own delivery logic (here: none)."""
    return d


def update(batch) -> torch.Tensor:
    """A learner's update; returns |TD error| per row, as a DQN update would."""
    return batch["reward"].abs() + 0.01
