"""Conduit's V1 step on real TransferQueue vs verl's own ``PPOTrainerSync._step_once``: the same fields, bit for bit.

The trainer, stage methods, TransferQueue, reward manager and GRPO advantage are
verl's; the worker groups are the example's in-process toy (verl's engines need
GPUs). TransferQueue's controller and storage unit take the shared Ray session's
two CPUs for this module only (closed at its end).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")
tq = pytest.importorskip("transfer_queue")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "verl_grpo_cpu.py"
FIELDS = ["rm_scores", "old_log_probs", "ref_log_prob", "token_level_rewards", "advantages", "returns"]


@pytest.fixture(scope="module")
def example(ray_session):
    spec = importlib.util.spec_from_file_location("verl_grpo_cpu_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tq.init({"backend": {"SimpleStorage": {"num_data_storage_units": 1, "total_storage_size": 100000}}})
    yield mod
    tq.close()


def one_step(mod, cls, latency: float) -> tuple[dict, dict, float]:
    tr = mod.build_trainer(prompts=4, n=4, dp=2, latency=latency, cls=cls)
    mod.generate(tr.actor_rollout_wg.model, 4, 4, tr.global_steps, torch.Generator().manual_seed(7))
    metrics: dict = {}
    t0 = time.perf_counter()
    batch = cls._step_once(tr, metrics, {}, 4)
    took = time.perf_counter() - t0
    real = [k for k, t in zip(batch.keys, batch.tags) if not t.get("is_padding", False)]
    data = tq.kv_batch_get(keys=sorted(real), partition_id="train", select_fields=FIELDS)
    out = {f: [t.clone() for t in data[f].unbind()] for f in FIELDS}
    tq.kv_clear(keys=batch.keys, partition_id="train")
    if hasattr(tr, "conduit_runner"):
        tr.conduit_runner.close()
    return out, metrics, took


def test_conduit_sync_step_equals_verls_step_on_transfer_queue(example) -> None:
    from conduit.integrations.verl.v1 import ConduitPPOTrainerSync
    from verl.trainer.ppo.v1 import PPOTrainerSync

    class SerialStep(ConduitPPOTrainerSync):  # verl's own _step_once, with the same toy workers
        _step_once = PPOTrainerSync._step_once

    latency = 0.2
    ref, ref_metrics, _ = one_step(example, SerialStep, latency)
    got, metrics, _ = one_step(example, ConduitPPOTrainerSync, latency)
    for f in FIELDS:
        assert len(ref[f]) == len(got[f]) == 16
        assert all(torch.equal(a, b) for a, b in zip(ref[f], got[f])), f
    for k in ("actor/reward_kl_penalty", "actor/entropy", "actor/pg_loss"):
        assert ref_metrics[k] == metrics[k], k
    # reward, old and reference log-prob sit on three pools: all overlapped (how much time that saves is the
    # benchmark's to say: benchmarks/verl_path.py), and the parts of the path are reported in verl's metrics
    assert metrics["conduit/overlapped_stages"] == 2
    assert 0 <= metrics["conduit/exposed_path_s"] and 0 <= metrics["conduit/serial_path_s"]
