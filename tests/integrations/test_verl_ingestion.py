"""Conduit-scheduled ingestion vs verl's serial order on random GRPO batches: bit-identical outputs.

Real verl 0.9.1 functions throughout (``extract_reward``, ``apply_kl_penalty``,
``compute_advantage``, the KL controllers); the stage callables stand in for the
worker groups (deterministic functions of the batch). No Ray.
"""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest

pytest.importorskip("verl")
import torch
from conduit.integrations.verl.ingest import AdvantageSpec, StageFns, run_conduit, run_serial
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo import core_algos

from conduit.ext import StageProfile, StageRunner
from conduit.scheduling.stages import plan as make_plan


def random_batch(seed: int, groups: int, n: int, prompt: int = 6, resp: int = 10) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    b = groups * n
    lengths = torch.randint(1, resp + 1, (b,), generator=g)
    response_mask = (torch.arange(resp)[None, :] < lengths[:, None]).long()
    attention = torch.cat([torch.ones(b, prompt, dtype=torch.long), response_mask], dim=1)
    uids = np.array(
        [u for u in (uuid.UUID(int=seed * 1000 + i).hex for i in range(groups)) for _ in range(n)], dtype=object
    )
    return DataProto.from_single_dict(
        {
            "input_ids": torch.randint(0, 50, (b, prompt + resp), generator=g),
            "prompts": torch.randint(0, 50, (b, prompt), generator=g),
            "responses": torch.randint(0, 50, (b, resp), generator=g),
            "attention_mask": attention,
            "response_mask": response_mask,
            "uid": uids,
        }
    )


def _seeded(batch: DataProto, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(batch.batch["responses"].sum()) * 31 + salt)


class Concurrency:
    """How many stage calls ran at once, at most (a stage's body runs inside ``with``)."""

    def __init__(self) -> None:
        self.lock, self.now, self.most = threading.Lock(), 0, 0

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


def make_fns(
    delay: float = 0.0, groups: dict[str, str] | None = None, values: bool = False, seen: Concurrency | None = None
) -> StageFns:
    seen = seen or Concurrency()

    def reward(batch: DataProto) -> DataProto:
        with seen:
            time.sleep(delay)
        r = batch.batch["responses"]
        mask = batch.batch["response_mask"]
        score = ((r * mask).sum(-1) % 3 == 0).float()
        rm = torch.zeros(r.shape, dtype=torch.float32)
        rm[torch.arange(r.shape[0]), mask.sum(-1) - 1] = score
        return DataProto.from_dict({"rm_scores": rm})

    def logp(key: str, salt: int):
        def fn(batch: DataProto) -> DataProto:
            with seen:
                time.sleep(delay)
            shape = batch.batch["responses"].shape
            out = {key: -torch.rand(shape, generator=_seeded(batch, salt))}
            if key == "old_log_probs":
                out["entropys"] = torch.rand(shape, generator=_seeded(batch, salt + 7))
            return DataProto.from_dict(out)

        return fn

    def value_fn(batch: DataProto) -> DataProto:
        with seen:
            time.sleep(delay)
        return DataProto.from_dict({"values": torch.randn(batch.batch["responses"].shape, generator=_seeded(batch, 3))})

    return StageFns(
        old_log_prob=logp("old_log_probs", 1),
        reward=reward,
        ref_log_prob=logp("ref_log_prob", 2),
        values=value_fn if values else None,
        groups=groups
        or {"reward": "rm_pool", "old_log_prob": "actor", "ref_log_prob": "ref_pool", "values": "critic_pool"},
    )


def spec_for(estimator: str, kl: bool, n: int) -> AdvantageSpec:
    algo = OmegaConf.create(
        {
            "adv_estimator": estimator,
            "gamma": 1.0,
            "lam": 0.95,
            "use_kl_in_reward": kl,
            "kl_penalty": "kl",
            "norm_adv_by_std_in_grpo": True,
        }
    )
    return AdvantageSpec(estimator, gamma=1.0, lam=0.95, num_repeat=n, use_kl_in_reward=kl, algorithm=algo)


KEYS = ("advantages", "returns", "token_level_rewards", "token_level_scores", "old_log_probs", "ref_log_prob")


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "gae"])
@pytest.mark.parametrize("kl", [False, True])
def test_conduit_ingestion_is_bit_identical_to_verls_serial_order(estimator: str, kl: bool) -> None:
    profile, runner = StageProfile(), StageRunner()
    try:
        for seed in range(4):  # random GRPO batches; the profile learns across them as in training
            n = 2 + seed % 3
            fns = make_fns(values=estimator == "gae")
            spec = spec_for(estimator, kl, n)
            ref, ref_metrics = run_serial(
                random_batch(seed, 3 + seed, n), fns, spec, core_algos.AdaptiveKLController(0.05, 6.0, 1000)
            )
            got, metrics, plan = run_conduit(
                random_batch(seed, 3 + seed, n),
                fns,
                spec,
                core_algos.AdaptiveKLController(0.05, 6.0, 1000),
                profile,
                runner,
            )
            for k in KEYS + (("values",) if estimator == "gae" else ()):
                assert torch.equal(ref.batch[k], got.batch[k]), (k, seed, plan.describe())
            assert sorted(ref.batch.keys()) == sorted(got.batch.keys())
            assert ref_metrics == metrics
            if seed == 0:  # nothing measured yet: equal priors and free overlap, so the model overlaps the groups
                assert plan.overlapped  # (later plans follow the measured stage costs, whatever they decide)
    finally:
        runner.close()


def test_a_colocated_group_never_overlaps_and_advantage_waits_for_its_producers() -> None:
    fns = make_fns(delay=0.05, groups={"reward": "actor", "old_log_prob": "actor", "ref_log_prob": "actor"})
    profile, runner = StageProfile(), StageRunner()
    try:
        _, _, plan = run_conduit(
            random_batch(0, 4, 2), fns, spec_for("grpo", True, 2), core_algos.FixedKLController(0.01), profile, runner
        )
    finally:
        runner.close()
    assert all(len(w) == 1 for w in plan.waves), plan.describe()
    assert plan.waves[-1] == ("advantage",)


def test_overlap_is_chosen_from_profiled_costs_and_runs_the_stages_at_once() -> None:
    serial_seen, seen = Concurrency(), Concurrency()
    spec = spec_for("grpo", False, 2)
    profile, runner = StageProfile(), StageRunner()
    try:
        run_serial(random_batch(1, 4, 2), make_fns(delay=0.15, seen=serial_seen), spec, None)
        _, _, plan = run_conduit(random_batch(1, 4, 2), make_fns(delay=0.15, seen=seen), spec, None, profile, runner)
    finally:
        runner.close()
    assert plan.overlapped
    assert serial_seen.most == 1  # verl's order: one stage at a time
    assert seen.most == 3, plan.describe()  # reward, old and reference log-prob on three pools: all at once
    # a measured overlap cost larger than what overlapping hides: the same model now keeps the stages apart
    profile.sync_s = 10.0
    from conduit.integrations.verl.ingest import ingestion_stages

    stages = ingestion_stages(random_batch(1, 4, 2), make_fns(delay=0.15), spec, None, {})
    assert not make_plan(stages, profile).overlapped
