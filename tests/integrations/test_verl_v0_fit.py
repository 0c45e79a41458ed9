"""verl's real V0 ``RayPPOTrainer.fit()``, twice: verl's own class and Conduit's subclass give the same run, bit for bit.

What is real (verl 0.9.1): ``RayPPOTrainer.__init__`` (config checks, the
in-reward KL controller, the ``StatefulDataLoader`` over the rows with verl's
``collate_fn``, the dump executor), ``fit()`` itself from its first line to its
last, and everything it calls on the driver: ``_get_gen_batch``, the repeat and
union of the batch, ``_balance_batch``, ``extract_reward``,
``_compute_old_log_prob`` and ``_compute_ref_log_prob`` (padding to no-padding,
the worker-group call, back to padding), ``apply_kl_penalty``,
``compute_advantage`` (GRPO), ``_update_actor``, the metric helpers and the
``Tracking`` console logger. The config is verl's own ``ppo_trainer`` composed
with hydra from the installed package. The rewards are verl's
``NaiveRewardManager`` with the gsm8k scorer; the update's loss is verl's
vanilla PPO policy loss over mini-batches from verl's ``make_iterator``; the
resource pools are a real ``ResourcePoolManager`` (never asked to create a pool).

What is toy (verl's FSDP/Megatron engines, vLLM and Ray worker groups need GPUs):
the worker groups and the rollout. They are in-process objects with the calls
``fit()`` makes (``compute_log_prob``, ``compute_ref_log_prob``,
``update_actor`` on no-padding TensorDicts; ``generate_sequences``; the
checkpoint manager's ``update_weights`` and ``sleep_replicas``), running a tiny
randomly initialised torch policy (no download). The rollout samples from that
policy with a generator seeded per step, so two runs see the same data exactly
when their updates were the same.

The overlap is observed, not timed: the old and the reference log-prob pass
through one gate that counts how many are inside at once (a stage lingers up to
``HOLD_S`` for a partner in Conduit's run, not at all in verl's serial one, so that the
overlap shows however loaded the host is).
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

pytest.importorskip("verl")
import torch
from omegaconf import DictConfig

VOCAB = [*"0123456789# ", "<eos>", "<pad>"]
EOS, PAD = 12, 13
ANSWER_PREFIX = [VOCAB.index(c) for c in "#### "]
PROMPTS, N, STEPS = 4, 4, 2  # prompts per step, responses per prompt, training steps (one epoch)
HOLD_S = 30.0  # how long a log-prob stage of Conduit's run waits for its partner (verl's serial run: not at all)
CAPTURED = (
    "responses",
    "response_mask",
    "rm_scores",
    "old_log_probs",
    "ref_log_prob",
    "token_level_scores",
    "token_level_rewards",
    "advantages",
    "returns",
)


class CharTokenizer:
    """One token per character; what verl's reward manager and ``fit()`` use of a tokenizer."""

    eos_token_id, pad_token_id = EOS, PAD

    def encode(self, text: str) -> list[int]:
        return [VOCAB.index(c) for c in text]

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return "".join(VOCAB[int(i)] for i in ids if not (skip_special_tokens and int(i) in (EOS, PAD)))

    def batch_decode(self, rows: Any, skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(r, skip_special_tokens) for r in rows]


class TinyPolicy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(len(VOCAB), 16)
        self.out = torch.nn.Linear(16, len(VOCAB))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.emb(ids)))  # next-token logits at every position


def seeded_policy(seed: int) -> TinyPolicy:
    with torch.random.fork_rng():  # the global generator is left as it was
        torch.manual_seed(seed)
        return TinyPolicy()


def next_token_logp(model: TinyPolicy, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position t: log p(ids[t+1]) and the entropy of the next-token distribution, as verl's engines return them."""
    logp = torch.log_softmax(model(ids), -1)
    taken = logp[:-1].gather(-1, ids[1:, None]).squeeze(-1)
    return torch.cat([taken, taken.new_zeros(1)]), -(logp.exp() * logp).sum(-1)


def jagged(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


class Gate:
    """Counts the log-prob stages inside the worker groups at once; each lingers up to ``hold_s`` for a partner."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.cv = threading.Condition()
        self.active = 0
        self.entries: list[tuple[str, int, str]] = []  # (stage, how many were inside on entry, caller's thread)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        with self.cv:
            self.active += 1
            self.entries.append((name, self.active, threading.current_thread().name))
            self.cv.notify_all()
            self.cv.wait_for(lambda: self.active > 1, timeout=self.hold_s)
        try:
            yield
        finally:
            with self.cv:
                self.active -= 1


class ToyRefGroup:
    """``ref_policy_wg``: the reference log-prob on a frozen copy of the initial policy."""

    def __init__(self, model: TinyPolicy, gate: Gate) -> None:
        self.model, self.gate = model, gate

    def compute_ref_log_prob(self, td: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        with self.gate.stage("ref_log_prob"), torch.no_grad():
            outs = [next_token_logp(self.model, ids) for ids in td["input_ids"].unbind()]
        return tu.get_tensordict({"log_probs": jagged([o[0] for o in outs])})


class ToyActorGroup:
    """``actor_rollout_wg``: old log-prob and the PPO update (verl's policy loss) on the toy policy, dp 2."""

    def __init__(self, model: TinyPolicy, gate: Gate, actor_cfg: Any, lr: float) -> None:
        from verl.trainer.ppo import core_algos

        self.model, self.gate, self.actor_cfg = model, gate, actor_cfg
        self._dispatch_info = {"actor": [0, 1]}  # what _balance_batch asks for the dp size
        self.opt = torch.optim.SGD(model.parameters(), lr=lr)
        self.policy_loss = core_algos.get_policy_loss_fn(actor_cfg.policy_loss.loss_mode)
        self.updates: list[dict[str, torch.Tensor]] = []  # what each update received, padded fields

    def compute_log_prob(self, td: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        with self.gate.stage("old_log_prob"), torch.no_grad():
            outs = [next_token_logp(self.model, ids) for ids in td["input_ids"].unbind()]
        fields = {"log_probs": jagged([o[0] for o in outs])}
        if tu.get(td, "calculate_entropy", False):
            fields["entropy"] = jagged([o[1] for o in outs])
        return tu.get_tensordict(fields, {"metrics": {"mfu": 0.0}})

    def update_actor(self, td: Any) -> Any:
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        self.updates.append({k: td[k].clone() for k in CAPTURED})
        metrics: dict[str, list[float]] = defaultdict(list)
        batches = tu.make_iterator(
            td,
            mini_batch_size=tu.get(td, "mini_batch_size"),
            epochs=tu.get(td, "epochs"),
            seed=tu.get(td, "seed"),
            dataloader_kwargs=tu.get(td, "dataloader_kwargs"),
        )
        for mb in batches:
            lp = jagged([next_token_logp(self.model, ids)[0] for ids in mb["input_ids"].unbind()])
            loss, pg_metrics = self.policy_loss(
                old_log_prob=mb["old_log_probs"],
                log_prob=no_padding_2_padding(lp, mb),
                advantages=mb["advantages"],
                response_mask=mb["response_mask"],
                loss_agg_mode=self.actor_cfg.loss_agg_mode,
                config=self.actor_cfg,
            )
            self.opt.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.actor_cfg.grad_clip)
            self.opt.step()
            metrics["pg_loss"].append(loss.item())
            metrics["grad_norm"].append(grad_norm.item())
            for k, v in pg_metrics.items():
                metrics[k.removeprefix("actor/")].append(v)
        metrics["mfu"].append(0.0)
        return tu.get_tensordict({}, {"metrics": dict(metrics)})


class ToyCheckpointManager:
    """Weight sync from the trainer to the rollout: the rollout's copy of the policy takes the actor's weights."""

    def __init__(self, actor: TinyPolicy, rollout: TinyPolicy) -> None:
        self.actor, self.rollout = actor, rollout
        self.synced: list[int] = []

    def update_weights(self, global_steps: int) -> None:
        self.rollout.load_state_dict(self.actor.state_dict())
        self.synced.append(global_steps)

    def sleep_replicas(self) -> None:
        pass


class ToyRollout:
    """``async_rollout_manager``: samples "#### <digits>" from the rollout policy; rewards streamed in as ``rm_scores``."""

    def __init__(self, policy: TinyPolicy, tokenizer: CharTokenizer, seed: int) -> None:
        from verl.workers.reward_manager.naive import NaiveRewardManager

        self.policy, self.tokenizer, self.seed = policy, tokenizer, seed
        self.scorer = NaiveRewardManager(tokenizer, num_examine=0)  # verl's gsm8k scorer

    def generate_sequences(self, prompts: Any) -> Any:
        from verl import DataProto

        g = torch.Generator().manual_seed(self.seed + prompts.meta_info["global_steps"])
        allowed = torch.zeros(len(VOCAB), dtype=torch.bool)
        allowed[:10] = True  # digits only after the answer's prefix
        prompt_ids, response_ids = [], []
        for messages in prompts.non_tensor_batch["raw_prompt"]:
            prompt = torch.tensor(self.tokenizer.encode(messages[-1]["content"]))
            ids = torch.cat([prompt, torch.tensor(ANSWER_PREFIX)])
            with torch.no_grad():
                for _ in range(int(torch.randint(1, 3, (1,), generator=g))):
                    logits = self.policy(ids)[-1].masked_fill(~allowed, float("-inf"))
                    ids = torch.cat([ids, torch.multinomial(torch.softmax(logits, -1), 1, generator=g)])
            prompt_ids.append(prompt)
            response_ids.append(torch.cat([ids[len(prompt) :], torch.tensor([EOS])]))
        p_len, r_len = max(map(len, prompt_ids)), max(map(len, response_ids))
        prompts_t = torch.full((len(prompt_ids), p_len), PAD)
        responses = torch.full((len(response_ids), r_len), PAD)
        p_mask, r_mask = torch.zeros_like(prompts_t), torch.zeros_like(responses)
        for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
            prompts_t[i, p_len - len(p) :], p_mask[i, p_len - len(p) :] = p, 1  # prompts left-padded
            responses[i, : len(r)], r_mask[i, : len(r)] = r, 1  # responses right-padded
        attention_mask = torch.cat([p_mask, r_mask], -1)
        out = DataProto.from_dict(
            {
                "prompts": prompts_t,
                "responses": responses,
                "response_mask": r_mask,
                "input_ids": torch.cat([prompts_t, responses], -1),
                "attention_mask": attention_mask,
                "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            }
        )
        scoring = DataProto(batch=out.batch, non_tensor_batch=dict(prompts.non_tensor_batch))
        out.batch["rm_scores"] = self.scorer(scoring)
        mm = np.empty(len(out), dtype=object)
        mm[:] = [{} for _ in range(len(out))]
        out.non_tensor_batch["multi_modal_inputs"] = mm  # fit() looks for images in every row
        out.meta_info["timing"] = {"generate_sequences": 0.0}
        return out


def verl_config() -> DictConfig:
    """verl's own ``ppo_trainer`` config, composed from the installed package, sized for two CPU steps."""
    import verl
    from hydra import compose, initialize_config_dir

    overrides = [
        "trainer.use_v1=false",
        "trainer.project_name=conduit_tests",
        "trainer.experiment_name=v0_fit",
        "trainer.logger=[console]",
        "trainer.total_epochs=1",
        "trainer.val_before_train=false",
        "trainer.resume_mode=disable",
        "trainer.balance_batch=true",
        "trainer.device=cpu",
        f"data.train_batch_size={PROMPTS}",
        "data.dataloader_num_workers=0",
        "data.shuffle=false",
        "critic.enable=false",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.kl_coef=0.05",
        f"actor_rollout_ref.rollout.n={N}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # prompts: two updates of 8 sequences per step
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=0.5",
    ]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def rows(count: int) -> list[dict[str, Any]]:
    """Dataset rows shaped as verl's ``RLHFDataset`` returns them (``collate_fn`` batches them)."""
    g = torch.Generator().manual_seed(11)
    out = []
    for i in range(count):
        answer = str(int(torch.randint(0, 10, (1,), generator=g)))
        out.append(
            {
                "raw_prompt": [{"role": "user", "content": f"{answer}{answer} "}],
                "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
                "data_source": "openai/gsm8k",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"index": i},
                "index": i,
                "tools_kwargs": {},
                "interaction_kwargs": {},
            }
        )
    return out


@dataclass
class Run:
    trainer: Any
    actor: ToyActorGroup
    gate: Gate
    checkpoints: ToyCheckpointManager
    logged: list[tuple[int, dict[str, Any]]] = field(default_factory=list)


def fit(cls: type, monkeypatch: pytest.MonkeyPatch) -> Run:
    """Build ``cls`` with verl's ``__init__``, put the toy workers where ``init_workers`` would, run ``fit()``."""
    from verl.single_controller.ray import ResourcePoolManager
    from verl.trainer.ppo.utils import Role
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.tracking import Tracking

    config = verl_config()
    tokenizer = CharTokenizer()
    # actor and reference on pools of their own: the placement where Conduit can overlap them
    pools = ResourcePoolManager(
        resource_pool_spec={"actor_pool": [1], "ref_pool": [1]},
        mapping={Role.ActorRollout: "actor_pool", Role.RefPolicy: "ref_pool"},
    )
    trainer = cls(
        config=config,
        tokenizer=tokenizer,
        role_worker_mapping={Role.ActorRollout: ToyActorGroup, Role.RefPolicy: ToyRefGroup},
        resource_pool_manager=pools,
        train_dataset=rows(PROMPTS * STEPS),
        val_dataset=rows(PROMPTS),
    )
    # only Conduit's run may overlap the stages: there a stage waits for its partner however loaded the host is
    gate = Gate(HOLD_S if getattr(cls, "conduit_setup", None) else 0.0)
    policy, rollout_policy = seeded_policy(0), seeded_policy(1)  # the rollout's copy is synced before step 1
    ref = seeded_policy(0)
    actor_cfg = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    actor = ToyActorGroup(policy, gate, actor_cfg, lr=config.actor_rollout_ref.actor.optim.lr)
    trainer.actor_rollout_wg, trainer.ref_policy_wg = actor, ToyRefGroup(ref, gate)
    trainer.checkpoint_manager = checkpoints = ToyCheckpointManager(policy, rollout_policy)
    trainer.async_rollout_manager = ToyRollout(rollout_policy, tokenizer, seed=100)
    run = Run(trainer, actor, gate, checkpoints)

    def log(self: Any, data: dict[str, Any], step: int, backend: Any = None) -> None:
        run.logged.append((step, dict(data)))
        original(self, data, step, backend)

    original = Tracking.log
    try:
        with monkeypatch.context() as patch:
            patch.setattr(Tracking, "log", log)  # what fit() logs, recorded on its way to the console
            trainer.fit()
    finally:
        if hasattr(trainer, "conduit_runner"):
            trainer.conduit_runner.close()
    return run


@pytest.mark.filterwarnings("ignore:Warning. Class .*RayPPOTrainer.* is deprecated:FutureWarning")
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata's StatefulDataLoader
def test_conduit_v0_trainer_runs_verls_fit_bit_identically_and_overlaps_ref_with_old_log_prob(monkeypatch) -> None:
    from conduit.integrations.verl.v0 import ConduitRayPPOTrainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    base = fit(RayPPOTrainer, monkeypatch)
    ours = fit(ConduitRayPPOTrainer, monkeypatch)

    # fit() ran its whole loop in both: two steps, each updated the actor and synced the rollout's weights
    for run in (base, ours):
        assert run.trainer.global_steps == STEPS + 1 and [s for s, _ in run.logged] == [1, 2]
        assert run.checkpoints.synced == [0, 1, 2] and len(run.actor.updates) == STEPS

    # what the actor's update received at each step: bit-identical
    for step, (a, b) in enumerate(zip(base.actor.updates, ours.actor.updates), start=1):
        assert a["responses"].shape == (PROMPTS * N, len(ANSWER_PREFIX) + 3)
        for k in CAPTURED:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (step, k)
    # ...and none of it vacuous: rewards vary inside some group, the policy moved away from the reference
    first, second = base.actor.updates
    assert first["rm_scores"].sum() > 0 and first["advantages"].abs().sum() > 0
    assert not torch.equal(second["old_log_probs"], second["ref_log_prob"])
    assert not torch.equal(second["token_level_rewards"], second["token_level_scores"])  # the in-reward KL

    # the trained actors: the same weights, and different from where they started
    for (name, p), q in zip(base.actor.model.state_dict().items(), ours.actor.model.state_dict().values()):
        assert torch.equal(p, q), name
    assert not torch.equal(base.actor.model.out.weight, seeded_policy(0).out.weight)

    # the metrics verl logged: actor/* (entropy, in-reward KL, the update's) and critic/* (data) the same
    for (_, m), (_, n) in zip(base.logged, ours.logged):
        keys = sorted(k for k in m if k.startswith(("actor/", "critic/")))
        assert {"actor/entropy", "actor/reward_kl_penalty", "actor/pg_loss", "actor/grad_norm"} <= set(keys)
        assert keys == sorted(k for k in n if k.startswith(("actor/", "critic/")))
        assert all(m[k] == n[k] for k in keys), [k for k in keys if m[k] != n[k]]

    # verl's fit: old then reference log-prob, one at a time, on fit's thread
    assert [(s, inside) for s, inside, _ in base.gate.entries] == [("old_log_prob", 1), ("ref_log_prob", 1)] * STEPS
    # Conduit's: at every step both were inside the worker groups at once, run by the parent's methods
    # (each worker group called exactly once per step) from Conduit's stage threads
    entries = ours.gate.entries
    assert len(entries) == 2 * STEPS
    for step in range(STEPS):
        pair = entries[2 * step : 2 * step + 2]
        assert sorted(s for s, _, _ in pair) == ["old_log_prob", "ref_log_prob"]
        assert max(inside for _, inside, _ in pair) == 2, (step, pair)
        assert all(thread.startswith("conduit-verl") for _, _, thread in pair)
    plan = ours.trainer.conduit_last_plan  # the second step's plan, made from the first step's measured costs
    assert plan.startswith("(") and set(plan.strip("()").split(" || ")) == {"old_log_prob", "ref_log_prob"}


def test_on_verls_own_placement_every_stage_shares_the_actors_pool_and_none_overlaps():
    """verl's own task runner fuses the reference policy into the actor's workers (``Role.ActorRolloutRef``) and
    puts the critic and the reward model on the actor's pool: the stages share one pool, so none runs beside
    another (two calls into one worker group at once). With LoRA the reference runs in the actor
    (``Role.ActorRollout``); only a mapping of separate pools lets stages overlap."""
    from types import SimpleNamespace

    from conduit.integrations.verl.pools import stage_pools
    from omegaconf import open_dict
    from verl.single_controller.ray import ResourcePoolManager
    from verl.trainer.main_ppo_v0 import BaseTaskRunner
    from verl.trainer.ppo.utils import Role

    def placed(config: Any, **extra: Any) -> dict[str, str]:
        runner = BaseTaskRunner()
        runner.add_actor_rollout_worker(config)
        runner.add_critic_worker(config)
        runner.add_reward_model_resource_pool(config)
        pools = ResourcePoolManager(resource_pool_spec={"global_pool": [1]}, mapping=runner.mapping)
        trainer = SimpleNamespace(role_worker_mapping=runner.role_worker_mapping, resource_pool_manager=pools, **extra)
        return stage_pools(trainer)

    config = verl_config()
    with open_dict(config):
        config.reward.reward_model.enable = True
    assert placed(config, ref_in_actor=False) == dict.fromkeys(
        ("old_log_prob", "ref_log_prob", "values", "reward"), "global_pool")
    with open_dict(config):
        config.actor_rollout_ref.model.lora_rank = 8
    assert set(placed(config, ref_in_actor=True).values()) == {"global_pool"}
    apart = SimpleNamespace(resource_pool_manager=SimpleNamespace(
        mapping={Role.ActorRollout: "actor_pool", Role.RefPolicy: "ref_pool", Role.Critic: "critic_pool"}))
    assert stage_pools(apart) == {"old_log_prob": "actor_pool", "ref_log_prob": "ref_pool", "values": "critic_pool",
                                  "reward": "actor_pool"}
