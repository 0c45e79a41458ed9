"""PipelinedMinibatches: RLlib's own mini-batches in RLlib's order, one step ahead, failures surfaced."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("ray.rllib")

from conduit.integrations.rllib import PipelinedMinibatches, PipelineStats
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator

from conduit.errors import RuntimeFailed

pytestmark = pytest.mark.rllib


def make_batch(rows: int = 37, device: str = "cpu") -> MultiAgentBatch:
    data = SampleBatch({
        "obs": torch.arange(rows * 3, dtype=torch.float32, device=device).reshape(rows, 3),
        "advantages": torch.linspace(-1, 1, rows, device=device),
    })
    return MultiAgentBatch({"default_policy": data}, env_steps=rows)


def minibatches(it) -> list[bytes]:
    return [mb.policy_batches["default_policy"]["obs"].cpu().numpy().tobytes() for mb in it]


@pytest.mark.parametrize("depth", [1, 3])
def test_same_minibatches_in_the_same_order(depth):
    np.random.seed(0)
    want = minibatches(MiniBatchCyclicIterator(make_batch(), num_epochs=3, minibatch_size=8))
    np.random.seed(0)
    stats = PipelineStats()
    batch = make_batch()
    it = MiniBatchCyclicIterator(batch, num_epochs=3, minibatch_size=8)
    got = minibatches(PipelinedMinibatches(it, device="cpu", depth=depth, stats=stats, batch=batch))
    assert got == want and len(want) >= 3 * 37 // 8
    assert stats.minibatches == len(want) and stats.updates == 1


def test_a_failing_iterator_fails_the_update_with_its_traceback():
    def broken():
        yield make_batch()
        raise ValueError("boom in the mini-batch iterator")

    it = iter(PipelinedMinibatches(broken(), device="cpu", timeout_s=5))
    next(it)
    with pytest.raises(RuntimeFailed, match="boom"):
        next(it)


def test_an_abandoned_update_stops_the_worker():
    it = iter(PipelinedMinibatches(MiniBatchCyclicIterator(make_batch(), num_epochs=5, minibatch_size=4), device="cpu"))
    next(it)
    it.close()  # the conftest checks no conduit thread outlives the test


@pytest.mark.gpu
def test_cuda_side_stream_hands_over_the_same_minibatches():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    np.random.seed(1)
    want = minibatches(MiniBatchCyclicIterator(make_batch(device="cuda"), num_epochs=2, minibatch_size=8))
    np.random.seed(1)
    batch = make_batch(device="cuda")
    it = MiniBatchCyclicIterator(batch, num_epochs=2, minibatch_size=8)
    got = []
    for mb in PipelinedMinibatches(it, device="cuda", batch=batch):
        x = mb.policy_batches["default_policy"]["obs"]
        got.append((x * 1).cpu().numpy().tobytes())  # consumed on the learner's stream after the hand-off
    assert got == want
