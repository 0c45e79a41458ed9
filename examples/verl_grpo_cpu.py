"""GRPO on CPU with Conduit's verl adapter: verl's real V1 trainer stages on real TransferQueue, end to end.

What runs for real: verl 0.9.1's ``PPOTrainerSync`` stage methods (through
Conduit's ``ConduitPPOTrainerSync._step_once``: ``_balance_batch``,
``_compute_reward_colocate``, ``_compute_old_log_prob``, ``_compute_ref_log_prob``,
``_compute_advantage`` with ``apply_kl_penalty`` and the GRPO estimator,
``_update_actor``), TransferQueue 0.1.11 storage on Ray, verl's
``NaiveRewardManager`` with the gsm8k scorer (``default_compute_score``), and
Conduit's admission sampler (a verl ``ReplayBuffer`` subclass).

What is toy: the workers. verl's FSDP/Megatron engines need GPUs, so the worker
groups are in-process objects with verl's worker-group interface that run a
tiny randomly-initialised torch policy built here (embedding + linear over a
13-token vocabulary: digits, ``#`` and space; no download). Generation samples
from that policy and writes trajectories to TransferQueue as verl's agent loop
does; the policy update is a plain policy-gradient step on the advantages verl
computed. Stage latencies are what the toy model takes plus ``--latency``
seconds, so the overlap Conduit picks is visible in the printed metrics.

    python examples/verl_grpo_cpu.py --iterations 3
"""

from __future__ import annotations

import argparse
import time
import uuid
from types import SimpleNamespace
from typing import Any

import numpy as np
import ray
import torch
import transfer_queue as tq
from conduit.integrations.verl.sampler import ConduitAdmissionBuffer
from conduit.integrations.verl.v1 import ConduitPPOTrainerSync
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.ppo.utils import Role
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.workers.reward_manager.naive import NaiveRewardManager

VOCAB = "0123456789# ."
EOS, PAD = 12, 11


class CharTokenizer:
    eos_token_id, pad_token_id = EOS, PAD

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(VOCAB[int(i)] for i in ids if not (skip_special_tokens and int(i) == EOS))


class TinyPolicy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(len(VOCAB), 16)
        self.out = torch.nn.Linear(16, len(VOCAB))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.emb(ids)))  # next-token logits per position


def token_logp(model: TinyPolicy, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.log_softmax(model(ids[:-1]), -1)
    lp = logits.gather(-1, ids[1:, None]).squeeze(-1)
    ent = -(logits.exp() * logits).sum(-1)
    z = torch.zeros(1)
    return torch.cat([z, lp]), torch.cat([z, ent])  # aligned with input_ids, as verl's workers return them


class ToyWorkerGroup:
    """verl's worker-group calls on KVBatchMeta, run in-process: read from TransferQueue, write back."""

    def __init__(self, model: TinyPolicy, dp: int, latency: float, lr: float = 0.5) -> None:
        self.model, self.latency = model, latency
        self._dispatch_info = {"actor": list(range(dp))}  # what verl's _balance_batch reads
        self.opt = torch.optim.SGD(model.parameters(), lr=lr)

    def _get(self, batch, fields):
        return tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)

    def compute_log_prob(self, batch):
        time.sleep(self.latency)
        data = self._get(batch, ["input_ids"])
        with torch.no_grad():
            outs = [token_logp(self.model, ids) for ids in data["input_ids"].unbind()]
        fields = TensorDict(
            {
                "log_probs": torch.nested.as_nested_tensor([o[0] for o in outs], layout=torch.jagged),
                "entropy": torch.nested.as_nested_tensor([o[1] for o in outs], layout=torch.jagged),
            },
            batch_size=len(batch),
        )
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
        return batch

    compute_ref_log_prob = compute_log_prob

    # verl's separate-async trainer keeps the policy the old log-prob is computed with (pi_old) on the CPU
    def save_model_to_cpu(self, slot: int) -> None:
        self.saved = {**getattr(self, "saved", {}), slot: {k: v.clone() for k, v in self.model.state_dict().items()}}

    def restore_model_from_cpu(self, slot: int) -> None:
        self.model.load_state_dict(self.saved[slot])

    def clear_cpu_model(self, slot: int) -> None:
        self.saved.pop(slot, None)

    def update_actor(self, batch):
        data = self._get(batch, ["input_ids", "advantages", "response_mask"])
        self.opt.zero_grad()
        loss = torch.zeros(())
        for ids, adv, mask in zip(
            data["input_ids"].unbind(), data["advantages"].unbind(), data["response_mask"].unbind()
        ):
            lp = token_logp(self.model, ids)[0][-len(adv) :]
            loss = loss - (adv * lp * mask).sum() / max(1, int(mask.sum()))
        (loss / len(batch)).backward()
        self.opt.step()
        return {"metrics": {"pg_loss": [loss.item() / len(batch)], "mfu": [0.0]}}


class RewardModelManager:
    """The colocated-RM hand-off verl's ``_compute_reward_colocate`` calls, scoring with verl's reward manager."""

    reward_loop_worker_handles = None

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.manager = NaiveRewardManager(CharTokenizer(), num_examine=0)

    def compute_rm_score(self, data: DataProto) -> DataProto:
        time.sleep(self.latency)
        gts = [p[-1]["ground_truth"] for p in data.non_tensor_batch["raw_prompt"]]
        data.non_tensor_batch["reward_model"] = np.array([{"ground_truth": g} for g in gts], dtype=object)
        data.non_tensor_batch["data_source"] = np.array(["openai/gsm8k"] * len(data), dtype=object)
        return DataProto.from_dict({"rm_scores": self.manager(data)})


def generate(policy: TinyPolicy, prompts: int, n: int, step: int, rng: torch.Generator) -> None:
    """Sample n responses per prompt from the policy and write them to TransferQueue as verl's agent loop does."""
    keys, fields, tags = [], [], []
    for _ in range(prompts):
        uid = uuid.UUID(int=int(torch.randint(0, 2**62, (1,), generator=rng))).hex  # seeded: reproducible runs
        answer = int(torch.randint(0, 10, (1,), generator=rng))
        prompt = torch.tensor([VOCAB.index(c) for c in f"{answer}{answer}.{answer} "])
        tq.kv_put(
            key=uid,
            partition_id="train",
            fields=None,
            tag={"is_prompt": True, "status": "finished", "global_steps": step},
        )
        for s in range(n):
            ids = torch.cat([prompt, torch.tensor([VOCAB.index(c) for c in "#### "])])  # the answer's format
            with torch.no_grad():
                for _ in range(int(torch.randint(1, 3, (1,), generator=rng))):
                    nxt = torch.multinomial(torch.softmax(policy(ids)[-1], -1), 1, generator=rng)
                    ids = torch.cat([ids, nxt])
            resp = ids[len(prompt) :]
            keys.append(f"{uid}_{s}_0")
            fields.append(
                {
                    "prompts": prompt,
                    "responses": resp,
                    "input_ids": ids,
                    "attention_mask": torch.ones_like(ids),
                    "position_ids": torch.arange(len(ids)),
                    "response_mask": torch.ones_like(resp),
                    "uid": uid,
                    "raw_prompt": [{"role": "user", "content": VOCAB[answer], "ground_truth": str(answer)}],
                }
            )
            tags.append(
                {
                    "status": "success",
                    "prompt_len": len(prompt),
                    "response_len": len(resp),
                    "seq_len": len(ids),
                    "global_steps": step,
                }
            )
    tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)


def build_trainer(prompts: int, n: int, dp: int, latency: float, cls: type = ConduitPPOTrainerSync) -> Any:
    cfg = OmegaConf.create(
        {
            "trainer": {"critic_warmup": 0, "v1": {"trainer_mode": "conduit_sync"}},
            "algorithm": {
                "adv_estimator": "grpo",
                "gamma": 1.0,
                "lam": 1.0,
                "use_kl_in_reward": True,
                "kl_penalty": "kl",
                "norm_adv_by_std_in_grpo": True,
            },
            "reward": {"reward_model": {"enable_resource_pool": True}},
            "actor_rollout_ref": {
                "rollout": {"temperature": 1.0, "n": n, "calculate_log_probs": False},
                "actor": {
                    "loss_agg_mode": "token-mean",
                    "loss_scale_factor": None,
                    "ppo_mini_batch_size": prompts,
                    "ppo_epochs": 1,
                    "data_loader_seed": 0,
                    "shuffle": False,
                    "calculate_entropy": False,
                    "entropy_coeff": 0.0,
                },
            },
        }
    )
    from verl.trainer.ppo import core_algos

    tr = object.__new__(cls)  # verl's __init__ builds Ray pools and loads a model: not on CPU
    tr.config, tr.global_steps, tr.use_critic, tr.use_reference_policy, tr.ref_in_actor = cfg, 1, False, True, False
    tr.tokenizer, tr.kl_ctrl_in_reward = CharTokenizer(), core_algos.FixedKLController(0.001)
    # actor, reference and reward model on pools of their own (as with verl's separate resource pools)
    tr.resource_pool_manager = SimpleNamespace(
        mapping={Role.ActorRollout: "actor_pool", Role.RefPolicy: "ref_pool", Role.RewardModel: "rm_pool"}
    )
    torch.manual_seed(0)
    policy = TinyPolicy()
    ref = TinyPolicy()
    ref.load_state_dict(policy.state_dict())
    tr.actor_rollout_wg = ToyWorkerGroup(policy, dp, latency)
    tr.ref_policy_wg = ToyWorkerGroup(ref, dp, latency)
    tr.reward_loop_manager = RewardModelManager(latency)
    tr.replay_buffer = ConduitAdmissionBuffer(
        "sync",
        {},
        None,
        "drop",
        {"group_size": n, "mini_batch_groups": prompts, "dp_size": dp, "batch_groups": prompts},
    )
    tr.on_sample_begin = tr.on_sample_end = lambda: None  # no rollout replicas to wake or put to sleep here
    return tr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--latency", type=float, default=0.3, help="simulated seconds per worker stage")
    args = ap.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tq.init({"backend": {"SimpleStorage": {"num_data_storage_units": 1, "total_storage_size": 100000}}})
    try:
        tr = build_trainer(args.prompts, args.n, dp=2, latency=args.latency)
        rng = torch.Generator().manual_seed(0)
        for it in range(args.iterations):
            generate(tr.actor_rollout_wg.model, args.prompts, args.n, tr.global_steps, rng)
            metrics, timing = {}, {}
            batch = tr._step_once(metrics, timing, args.prompts)
            scores = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["rm_scores"])
            reward = float(sum(s.sum() for s in scores["rm_scores"].unbind())) / len(batch)
            print(
                f"iter {it}: reward {reward:.3f}  {metrics['conduit/overlapped_stages']} stages overlapped,"
                f" exposed {metrics['conduit/exposed_path_s']:.2f}s"
                f" (stages alone {metrics['conduit/serial_path_s']:.2f}s)"
                f"  kl {metrics['actor/reward_kl_penalty']:.4f}"
                f"  pg_loss {metrics['actor/pg_loss']:.3f}"
            )
            tq.kv_clear(keys=batch.keys, partition_id="train")
            tr.global_steps += 1
        print("timing_raw:", {k: round(v, 3) for k, v in timing.items()})
        tr.conduit_runner.close()
    finally:
        tq.close()
        ray.shutdown()


if __name__ == "__main__":
    main()
