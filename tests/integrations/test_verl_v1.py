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
def example(ray_free_cpus):
    spec = importlib.util.spec_from_file_location("verl_grpo_cpu_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ray_free_cpus(2)  # TransferQueue's controller and storage unit take one CPU each
    tq.init({"backend": {"SimpleStorage": {"num_data_storage_units": 1, "total_storage_size": 100000}}})
    yield mod
    tq.close()


def one_step(mod, cls, latency: float, mode: str = "sync") -> tuple[dict, dict, float]:
    tr = mod.build_trainer(prompts=4, n=4, dp=2, latency=latency, cls=cls)
    if mode == "separate_async":
        _separate_async(tr)
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
    metrics["test/pi_old_saved"] = 0 in getattr(tr.actor_rollout_wg, "saved", {})
    return out, metrics, took


def _separate_async(tr) -> None:
    """What verl's separate-async trainer sets up in ``__init__``/``_setup`` (its rollout replicas aside)."""
    from types import SimpleNamespace

    tr.hybrid_rollout_config = SimpleNamespace(enable_switch=False)
    tr.local_trigger_step, tr._step_sample_wait_seconds, tr._step_wait_samples = 0, 0.0, 0


@pytest.mark.parametrize("mode", ["sync", "separate_async"])
def test_conduit_step_equals_verls_step_on_transfer_queue(example, mode: str) -> None:
    from conduit.integrations.verl.v1 import ConduitPPOTrainerSeparateAsync, ConduitPPOTrainerSync
    from verl.trainer.ppo.v1 import PPOTrainerSeparateAsync, PPOTrainerSync

    conduit_cls, verl_cls = {"sync": (ConduitPPOTrainerSync, PPOTrainerSync),
                             "separate_async": (ConduitPPOTrainerSeparateAsync, PPOTrainerSeparateAsync)}[mode]

    class SerialStep(conduit_cls):  # verl's own _step_once, with the same toy workers
        _step_once = verl_cls._step_once

    latency = 0.2
    ref, ref_metrics, _ = one_step(example, SerialStep, latency, mode)
    got, metrics, _ = one_step(example, conduit_cls, latency, mode)
    if mode == "separate_async":  # verl's own old log-prob of that trainer ran: it keeps pi_old on the CPU
        assert metrics["test/pi_old_saved"] and ref_metrics["test/pi_old_saved"]
    for f in FIELDS:
        assert len(ref[f]) == len(got[f]) == 16
        assert all(torch.equal(a, b) for a, b in zip(ref[f], got[f])), f
    for k in ("actor/reward_kl_penalty", "actor/entropy", "actor/pg_loss"):
        assert ref_metrics[k] == metrics[k], k
    # the colocated reward model scores first, as in verl; old and reference log-prob sit on two pools: overlapped
    # (how much time that saves is the benchmark's to say: benchmarks/verl_path.py), and the parts of the path are
    # reported in verl's metrics
    assert metrics["conduit/overlapped_stages"] == 1
    assert 0 <= metrics["conduit/exposed_path_s"] and 0 <= metrics["conduit/serial_path_s"]


def test_a_padded_batch_keeps_the_reward_models_extra_fields_as_verls_step(example) -> None:
    """verl pads a batch its data-parallel size does not divide by copying the first row, after the colocated reward
    model scored it: the padding rows carry its extra fields (here ``acc``), so the batch the update fetches whole
    has them. 3 prompts x n=3 over dp=2 pads (the padding rows lacked ``acc`` and the whole fetch dropped it)."""
    import numpy as np
    from conduit.integrations.verl.v1 import ConduitPPOTrainerSync
    from verl.trainer.ppo.v1 import PPOTrainerSync

    class ScoredWithExtras(example.RewardModelManager):
        def compute_rm_score(self, data):
            out = super().compute_rm_score(data)
            out.non_tensor_batch["acc"] = np.array([float(s.sum()) for s in out.batch["rm_scores"]], dtype=object)
            out.meta_info["reward_extra_keys"] = ["acc"]
            return out

    class SerialStep(ConduitPPOTrainerSync):  # verl's own _step_once, with the same toy workers
        _step_once = PPOTrainerSync._step_once

    got = {}
    for name, cls in (("verl", SerialStep), ("conduit", ConduitPPOTrainerSync)):
        tr = example.build_trainer(prompts=3, n=3, dp=2, latency=0.0, cls=cls)
        tr.reward_loop_manager = ScoredWithExtras(0.0)
        example.generate(tr.actor_rollout_wg.model, 3, 3, tr.global_steps, torch.Generator().manual_seed(7))
        batch = cls._step_once(tr, {}, {}, 3)
        try:
            data = tq.kv_batch_get(keys=batch.keys, partition_id="train")  # every field, as verl's workers fetch
            got[name] = (len(batch.keys), sorted(data.keys()), [float(x.data) for x in data.get("acc", [])])
        finally:
            tq.kv_clear(keys=batch.keys, partition_id="train")
            if hasattr(tr, "conduit_runner"):
                tr.conduit_runner.close()
    assert got["conduit"] == got["verl"]
    assert got["verl"][0] > 9 and "acc" in got["verl"][1], got["verl"][:2]


def _group(uid: str, n: int, step: int, status: str, source: str | None = "gsm8k") -> None:
    """A prompt's tag and, once finished, its ``n`` trajectories, written as verl's agent loop writes them."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    if status == "finished":
        keys = [f"{uid}_{s}_0" for s in range(n)]
        fields = [{"input_ids": torch.arange(4) + s, "uid": uid} for s in range(n)]
        tags = [{"status": "success", "global_steps": step} | ({} if source is None else {"data_source": source})
                for _ in range(n)]
        tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)
    tq.kv_put(key=uid, partition_id="train", fields=None,
              tag={"is_prompt": True, "status": status, "global_steps": step})


def test_admission_buffer_polls_transfer_queue_and_admits_whole_groups_as_they_finish(example) -> None:
    """The sampler's TransferQueue loop: groups finish out of order while ``sample`` polls; the first unit of
    whole groups is handed over while the rest still generate; a stale group is evicted and refilled.

    Early mini-batches are verl's async trainers' (``separate_async``, here ``parameter_sync_step=2``: each
    ``sample`` asks for 2 of the step's 4 groups); verl's sync trainer takes the whole step (the oracle tests)."""
    import threading

    from conduit.integrations.verl.sampler import ConduitAdmissionBuffer

    n, refills = 4, []

    generating: list[str] = []  # groups that finish once a refill was asked for (after the poll that asked)

    def refill(k: int) -> None:  # verl's refill_fn submits k fresh prompts: they are pending, then generate
        refills.append(k)
        for i in range(k):
            _group(f"refill{len(refills)}x{i}", n, 3, "pending")
        while generating:
            _group(generating.pop(), n, 3, "finished")

    buf = ConduitAdmissionBuffer("separate_async", {}, 1, "drop",
                                 {"group_size": n, "mini_batch_groups": 2, "dp_size": 2, "batch_groups": 4,
                                  "poll_interval": 0.01, "timeout_s": 60},
                                 refill_fn=refill)
    uids = [f"adm{k}" for k in range(4)]
    for u in uids:
        _group(u, n, 1, "running")
    release, second_finished = threading.Event(), threading.Event()

    def generation() -> None:  # groups 2 and 0 first, then (once the test says so) 3 and 1
        for u in (uids[2], uids[0]):
            _group(u, n, 1, "finished")
        release.wait(60)
        for u in (uids[3], uids[1]):
            _group(u, n, 1, "finished")
        second_finished.set()

    t = threading.Thread(target=generation, daemon=True)
    t.start()
    first, m1 = buf.sample(1, "train", 2)
    early = not second_finished.is_set()  # handed over while half the batch was still generating
    release.set()
    second, m2 = buf.sample(1, "train", 2)
    t.join(60)
    tq.kv_clear(keys=[*first.keys, *second.keys], partition_id="train")
    groups = [sorted({k.split("_")[0] for k in b.keys}) for b in (first, second)]
    assert early and groups == [sorted(uids[:3:2]), sorted(uids[1::2])]
    for b in (first, second):  # whole groups, divisible by dp x mini-batch
        assert len(b.keys) == 2 * n and all(sum(k.startswith(u + "_") for k in b.keys) == n for u in {
            k.split("_")[0] for k in b.keys})
    assert m1["conduit/admitted_groups"] == m2["conduit/admitted_groups"] == 2 and not refills

    # a new batch at step 3: a group generated at step 1 is past the bound (1): evicted and refilled, never admitted
    # new0 and new1 finish only after the poll that evicts "old": the call's metrics must count both polls
    _group("old", n, 1, "finished")
    for u in ("new0", "new1"):
        _group(u, n, 3, "running")
    generating.extend(["new1", "new0"])
    got, m3 = buf.sample(3, "train", 2)
    listed = (tq.kv_list() or {}).get("train", {})
    tq.kv_clear(keys=[*got.keys, *(k for k in listed if k.startswith("refill"))], partition_id="train")
    assert sorted({k.split("_")[0] for k in got.keys}) == ["new0", "new1"]
    # the stale group: refilled one for one, as verl's async buffer does (no quotas: no other refill)
    assert refills == [1] and not generating
    assert m3["conduit/evicted_stale_groups"] == 1 and m3["conduit/refilled_groups"] == 1
    # and verl's own eviction metrics, as its async buffer reports them (the group was generated at step 1: span 3)
    stale = {k: v for k, v in m3.items() if "/off_policy/evicted_samples" in k}
    assert {k.split("/", 1)[1]: v for k, v in stale.items()} == {
        "off_policy/evicted_samples": 1, "off_policy/evicted_samples_staleness/mean": 3.0,
        "off_policy/evicted_samples_staleness/max": 3.0, "off_policy/evicted_samples_staleness/min": 3.0}
    assert not any(k == "old" or k.startswith("old_") for k in listed)  # cleared from the queue


def test_quotas_need_a_data_source_tag_and_say_so_at_once(example) -> None:
    """verl 0.9.1's agent loop stores ``data_source`` as a field, not a tag: with per-source quotas every group
    would be of no source and never fill one; the sampler says so at its first poll (not after its hour-long
    timeout, refilling prompts meanwhile)."""
    from conduit.integrations.verl.sampler import ConduitAdmissionBuffer

    from conduit import ConfigError

    refills: list[int] = []
    buf = ConduitAdmissionBuffer("separate_async", {}, 1, "drop",
                                 {"group_size": 2, "mini_batch_groups": 1, "batch_groups": 2, "poll_interval": 0.01,
                                  "quotas": {"gsm8k": 1, "math": 1}, "timeout_s": 60}, refill_fn=refills.append)
    _group("untagged", 2, 1, "finished", source=None)
    try:
        with pytest.raises(ConfigError, match="no data_source tag"):
            buf.sample(1, "train", 1)
    finally:
        listed = (tq.kv_list() or {}).get("train", {})
        tq.kv_clear(keys=list(listed), partition_id="train")
    assert refills == []
