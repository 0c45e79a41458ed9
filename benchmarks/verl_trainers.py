"""verl's own trainers against Conduit's, on the same toy workers (toy workers, simulated stage latencies; CPU).

What runs is what a user switches on: verl 0.9.1's trainer code against
Conduit's, nothing else changed.

- **V1, sync**: ``PPOTrainerSync._step_once`` (verl's) against
  ``ConduitPPOTrainerSync._step_once`` (``trainer.v1.trainer_mode=conduit_sync``).
- **V1, separate-async**: ``PPOTrainerSeparateAsync._step_once`` against
  ``ConduitPPOTrainerSeparateAsync._step_once`` (``conduit_separate_async``).
  Both V1 pairs sample with verl's own ``ReplayBuffer`` / ``ReplayBufferAsync``
  on real TransferQueue; one step is one ``_step_once`` (sample, the
  post-generation stages, the actor update).
- **V0**: ``RayPPOTrainer.fit`` against ``ConduitRayPPOTrainer.fit``, verl's
  ``__init__`` and ``fit()`` from first line to last, on verl's own
  ``ppo_trainer`` config; one step is verl's ``timing_s/step`` (generation to weight sync).

The workers are toys: ``examples/verl_grpo_cpu.py``'s tiny policy and its
in-process worker groups (the V1 ones as they are; for V0, the same policy
behind the calls ``fit()`` makes). Each worker stage (colocated reward model,
old log-prob, reference log-prob) sleeps ``--latency`` seconds to stand in for
a GPU stage, each role on a resource pool of its own, so the overlap Conduit
schedules has something to hide. V0 streams the reward from the rollout (verl's
default) and overlaps only the old and reference log-probs.

Measured per step: the wall time, and the *exposed post-generation path*: for
V1 the step less the sampling (``timing_raw["gen"]``) and the update; for V0
verl's own timers ``reward + old_log_prob + ref + values + adv``. Each run
builds a fresh trainer and takes one untimed warm-up step, then ``--steps``
timed ones (their median is the run's figure). Each repeat runs all six
trainers once, in a fresh random order; the table gives the median over the
repeats with its ``[min–max]``.

    python -m benchmarks.verl_trainers --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "verl_grpo_cpu.py"
#: row key -> its label: verl's trainer -> Conduit's
ROWS = {
    "v1_sync": "V1 `sync` → `conduit_sync`",
    "v1_separate_async": "V1 `separate_async` → `conduit_separate_async`",
    "v0": "V0 `RayPPOTrainer` → `ConduitRayPPOTrainer`",
}
SIDES = ("verl", "conduit")


def log(msg: str) -> None:
    print(f"verl_trainers: {msg}", file=sys.stderr, flush=True)


def load_example() -> ModuleType:
    """``examples/verl_grpo_cpu.py`` as a module: its toy policy, worker groups, generation and trainer setup."""
    spec = importlib.util.spec_from_file_location("verl_grpo_cpu_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def wipe_train_partition() -> None:
    import transfer_queue as tq

    listed = (tq.kv_list() or {}).get("train", {})
    if listed:
        tq.kv_clear(keys=list(listed), partition_id="train")


# ----------------------------------------------------------------------------------------------- V1 (TransferQueue)


def run_v1(
    ex: ModuleType, mode: str, conduit: bool, args: argparse.Namespace, seed: int, steps: int
) -> dict[str, Any]:
    """One run of a V1 trainer: a warm-up step, then ``steps`` timed ``_step_once`` calls."""
    import torch
    from conduit.integrations.verl.v1 import ConduitPPOTrainerSeparateAsync, ConduitPPOTrainerSync
    from verl.trainer.ppo.v1 import PPOTrainerSeparateAsync, PPOTrainerSync
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    cls = {
        ("sync", False): PPOTrainerSync,
        ("sync", True): ConduitPPOTrainerSync,
        ("separate_async", False): PPOTrainerSeparateAsync,
        ("separate_async", True): ConduitPPOTrainerSeparateAsync,
    }[(mode, conduit)]
    tr = ex.build_trainer(args.prompts, args.n, dp=2, latency=args.latency, cls=cls)
    # verl's own sampler for both trainers (what verl builds when no custom sampler is configured)
    tr.replay_buffer = (ReplayBuffer if mode == "sync" else ReplayBufferAsync)(mode, {}, None, "drop", {})
    tr.local_trigger_step = 0  # separate-async: the first update after a weight sync (pi_old saved on the CPU)
    rng = torch.Generator().manual_seed(seed)
    step_s, exposed_s, overlapped = [], [], 0
    try:
        for step in range(steps + 1):
            wipe_train_partition()
            ex.generate(tr.actor_rollout_wg.model, args.prompts, args.n, tr.global_steps, rng)
            metrics: dict[str, Any] = {}
            timing: dict[str, float] = {}
            t0 = time.perf_counter()
            tr._step_once(metrics, timing, args.prompts)
            took = time.perf_counter() - t0
            if step:  # step 0 warms up (and gives Conduit's planner its first measured stage costs)
                step_s.append(took)
                update = timing.get("update_actor", 0.0) + timing.get("update_critic", 0.0)
                exposed_s.append(took - timing["gen"] - update)
                overlapped = int(metrics.get("conduit/overlapped_stages", 0))
            tr.global_steps += 1
    finally:
        wipe_train_partition()
        if conduit:
            tr.conduit_runner.close()
    return {"step_s": step_s, "exposed_s": exposed_s, "overlapped_stages": overlapped}


# ------------------------------------------------------------------------------------------- V0 (verl's whole fit())


class V0Actor:
    """``actor_rollout_wg`` as V0's ``fit()`` calls it (no-padding TensorDicts), on the example's toy policy."""

    def __init__(self, policy: Any, latency: float, lr: float = 0.5) -> None:
        import torch

        self.model, self.latency = policy, latency
        self._dispatch_info = {"actor": [0, 1]}  # what verl's _balance_batch reads (dp 2)
        self.opt = torch.optim.SGD(policy.parameters(), lr=lr)

    def logp(self, td: Any) -> tuple[Any, Any]:
        """Per position t: log p(ids[t+1]) and the next-token entropy, as verl's engines return them (jagged)."""
        import torch

        lps, ents = [], []
        for ids in td["input_ids"].unbind():
            logits = torch.log_softmax(self.model(ids), -1)
            lps.append(torch.cat([logits[:-1].gather(-1, ids[1:, None]).squeeze(-1), logits.new_zeros(1)]))
            ents.append(-(logits.exp() * logits).sum(-1))
        return (torch.nested.as_nested_tensor(lps, layout=torch.jagged),
                torch.nested.as_nested_tensor(ents, layout=torch.jagged))

    def compute_log_prob(self, td: Any) -> Any:
        import torch
        from verl.utils import tensordict_utils as tu

        time.sleep(self.latency)
        with torch.no_grad():
            lp, ent = self.logp(td)
        return tu.get_tensordict({"log_probs": lp, "entropy": ent}, {"metrics": {"mfu": 0.0}})

    compute_ref_log_prob = compute_log_prob

    def update_actor(self, td: Any) -> Any:
        """A plain policy-gradient step on the advantages verl computed (one mini-batch)."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        lp = no_padding_2_padding(self.logp(td)[0], td)
        mask = td["response_mask"]
        loss = -(td["advantages"] * lp * mask).sum() / mask.sum().clamp(min=1)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return tu.get_tensordict({}, {"metrics": {"pg_loss": [loss.item()], "mfu": [0.0]}})


class V0Rollout:
    """``async_rollout_manager`` and ``checkpoint_manager``: samples from the example's policy, scores with verl's
    gsm8k reward manager (reward streamed with generation, verl's default), syncs weights."""

    def __init__(self, ex: ModuleType, actor: Any, seed: int) -> None:
        import copy

        from verl.workers.reward_manager.naive import NaiveRewardManager

        self.ex, self.actor, self.policy, self.seed = ex, actor, copy.deepcopy(actor), seed
        self.scorer = NaiveRewardManager(ex.CharTokenizer(), num_examine=0)

    def update_weights(self, global_steps: int) -> None:
        self.policy.load_state_dict(self.actor.state_dict())

    def sleep_replicas(self) -> None:
        pass

    def generate_sequences(self, prompts: Any) -> Any:
        import numpy as np
        import torch
        from verl import DataProto

        ex = self.ex
        g = torch.Generator().manual_seed(self.seed + prompts.meta_info["global_steps"])
        rows = []
        for messages in prompts.non_tensor_batch["raw_prompt"]:
            prompt = torch.tensor([ex.VOCAB.index(c) for c in messages[-1]["content"]])
            ids = torch.cat([prompt, torch.tensor([ex.VOCAB.index(c) for c in "####"])])
            with torch.no_grad():
                for _ in range(int(torch.randint(1, 3, (1,), generator=g))):
                    nxt = torch.multinomial(torch.softmax(self.policy(ids)[-1], -1), 1, generator=g)
                    ids = torch.cat([ids, nxt])
            rows.append((prompt, torch.cat([ids[len(prompt):], torch.tensor([ex.EOS])])))
        p_len, r_len = max(len(p) for p, _ in rows), max(len(r) for _, r in rows)
        prompts_t, responses = torch.full((len(rows), p_len), ex.PAD), torch.full((len(rows), r_len), ex.PAD)
        p_mask, r_mask = torch.zeros_like(prompts_t), torch.zeros_like(responses)
        for i, (p, r) in enumerate(rows):
            prompts_t[i, p_len - len(p):], p_mask[i, p_len - len(p):] = p, 1  # prompts left-padded
            responses[i, : len(r)], r_mask[i, : len(r)] = r, 1  # responses right-padded
        attention = torch.cat([p_mask, r_mask], -1)
        out = DataProto.from_dict({
            "prompts": prompts_t, "responses": responses, "response_mask": r_mask,
            "input_ids": torch.cat([prompts_t, responses], -1), "attention_mask": attention,
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        })
        scoring = DataProto(batch=out.batch, non_tensor_batch=dict(prompts.non_tensor_batch))
        out.batch["rm_scores"] = self.scorer(scoring)
        mm = np.empty(len(out), dtype=object)
        mm[:] = [{} for _ in range(len(out))]
        out.non_tensor_batch["multi_modal_inputs"] = mm  # fit() looks for images in every row
        out.meta_info["timing"] = {"generate_sequences": 0.0}
        return out


def v0_config(args: argparse.Namespace) -> Any:
    """verl's own ``ppo_trainer`` config, composed from the installed package with hydra."""
    import verl
    from hydra import compose, initialize_config_dir

    overrides = [
        "trainer.use_v1=false", "trainer.project_name=conduit_bench", "trainer.experiment_name=verl_trainers",
        "trainer.logger=[]", "trainer.total_epochs=1", "trainer.val_before_train=false",
        "trainer.resume_mode=disable", "trainer.balance_batch=true", "trainer.device=cpu",
        f"data.train_batch_size={args.prompts}", "data.dataloader_num_workers=0", "data.shuffle=false",
        "critic.enable=false", "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=true",
        f"actor_rollout_ref.rollout.n={args.n}", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.prompts * args.n}",
    ]
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def v0_rows(count: int, seed: int) -> list[dict[str, Any]]:
    """Dataset rows shaped as verl's ``RLHFDataset`` returns them (its ``collate_fn`` batches them)."""
    import torch

    rng = random.Random(seed)
    out = []
    for i in range(count):
        answer = str(rng.randrange(10))
        out.append({
            "raw_prompt": [{"role": "user", "content": answer * 2}], "data_source": "openai/gsm8k",
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),  # verl's dataset gives every batch a tensor
            "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"index": i}, "index": i,
            "tools_kwargs": {}, "interaction_kwargs": {},
        })
    return out


def run_v0(ex: ModuleType, conduit: bool, args: argparse.Namespace, seed: int, steps: int) -> dict[str, Any]:
    """One V0 ``fit()``: a warm-up step, then ``steps`` timed ones, read from what ``fit()`` logs."""
    import torch
    from conduit.integrations.verl.v0 import ConduitRayPPOTrainer
    from verl.single_controller.ray import ResourcePoolManager
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.utils import Role
    from verl.utils.tracking import Tracking

    cls = ConduitRayPPOTrainer if conduit else RayPPOTrainer
    config = v0_config(args)
    # actor and reference on pools of their own: the placement where the old and reference log-probs can overlap
    pools = ResourcePoolManager(
        resource_pool_spec={"actor_pool": [1], "ref_pool": [1]},
        mapping={Role.ActorRollout: "actor_pool", Role.RefPolicy: "ref_pool"},
    )
    tr = cls(
        config=config, tokenizer=ex.CharTokenizer(),
        role_worker_mapping={Role.ActorRollout: V0Actor, Role.RefPolicy: V0Actor}, resource_pool_manager=pools,
        train_dataset=v0_rows(args.prompts * (steps + 1), seed), val_dataset=v0_rows(args.prompts, seed),
    )
    torch.manual_seed(0)
    policy = ex.TinyPolicy()
    ref = ex.TinyPolicy()
    ref.load_state_dict(policy.state_dict())
    tr.actor_rollout_wg, tr.ref_policy_wg = V0Actor(policy, args.latency), V0Actor(ref, args.latency)
    tr.checkpoint_manager = tr.async_rollout_manager = V0Rollout(ex, policy, seed)
    logged: list[dict[str, Any]] = []
    original = Tracking.log
    Tracking.log = lambda self, data, step, backend=None: logged.append(dict(data))  # type: ignore[method-assign]
    try:
        tr.fit()
    finally:
        Tracking.log = original  # type: ignore[method-assign]
        if conduit:
            tr.conduit_runner.close()
    timed = logged[1:]  # the first step warms up
    path = ("reward", "old_log_prob", str(Role.RefPolicy), "values", "adv")
    return {
        "step_s": [m["timing_s/step"] for m in timed],
        "exposed_s": [sum(m.get(f"timing_s/{k}", 0.0) for k in path) for m in timed],
        "plan": getattr(tr, "conduit_last_plan", ""),
    }


# --------------------------------------------------------------------------------------------------- the harness


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    import transfer_queue as tq

    ex = load_example()
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("transfer_queue")]:
        logging.getLogger(name).setLevel(logging.ERROR)  # a thread-count warning on every call, on 2 cores
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    tq.init({"backend": {"SimpleStorage": {"num_data_storage_units": 1, "total_storage_size": 100000}}})
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {row: {side: [] for side in SIDES} for row in ROWS}

    def one(row: str, side: str, seed: int, steps: int) -> dict[str, Any]:
        with contextlib.redirect_stdout(sys.stderr):  # verl prints as it goes: stdout is the table's
            if row == "v0":
                return run_v0(ex, side == "conduit", args, seed, steps)
            return run_v1(ex, row.removeprefix("v1_"), side == "conduit", args, seed, steps)

    try:
        log("warm-up: every trainer once, untimed (the process's first calls import and allocate)")
        for row, side in [(row, side) for row in ROWS for side in SIDES]:
            one(row, side, args.seed, 0)
        for rep in range(args.repeats):
            order = [(row, side) for row in ROWS for side in SIDES]
            random.Random(args.seed * 1000 + rep).shuffle(order)
            for row, side in order:
                t0 = time.perf_counter()
                got = one(row, side, args.seed * 1000 + rep, args.steps)  # the same data for verl and Conduit
                runs[row][side].append(got)
                log(f"repeat {rep + 1}/{args.repeats}: {row} {side} "
                    f"{statistics.median(got['step_s']):.3f} s/step ({time.perf_counter() - t0:.1f} s)")
    finally:
        tq.close()
        if started:
            ray.shutdown()
    out: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k != "json"}, "rows": {}}
    for row, sides in runs.items():
        entry: dict[str, Any] = {}
        for side, got in sides.items():
            entry[side] = {m: summary([statistics.median(r[m]) for r in got]) for m in ("step_s", "exposed_s")}
            entry[side]["runs"] = got
        for m in ("step_s", "exposed_s"):
            entry[f"change_{m}"] = entry["conduit"][m]["median"] / entry["verl"][m]["median"] - 1
        out["rows"][row] = entry
    return out


def pct(x: float) -> str:
    return f"{x:+.0%}".replace("-", "−")


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    fmt = "{median:.3f} [{min:.3f}–{max:.3f}]".format
    lines = [
        f"Toy workers, simulated stage latencies ({s['latency']} s per worker stage); {s['prompts']} prompts × "
        f"n = {s['n']} per step; median [min–max] over {s['repeats']} repeats of {s['steps']} timed steps; seconds.",
        "",
        "| trainer: verl's → Conduit's | time per step, verl | with Conduit "
        "| exposed post-generation path, verl | with Conduit |",
        "|---|--:|--:|--:|--:|",
    ]
    for row, label in ROWS.items():
        e = result["rows"][row]
        lines.append(
            f"| {label} | {fmt(**e['verl']['step_s'])} | {fmt(**e['conduit']['step_s'])} ({pct(e['change_step_s'])})"
            f" | {fmt(**e['verl']['exposed_s'])} | {fmt(**e['conduit']['exposed_s'])} ({pct(e['change_exposed_s'])}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description="verl's own trainers (sync, separate_async, V0 RayPPOTrainer) against Conduit's, on the same "
        "toy workers with simulated stage latencies (CPU). Markdown table on stdout, progress on stderr."
    )
    ap.add_argument("--repeats", type=int, default=5, help="runs of every trainer, in a fresh random order each")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up step)")
    ap.add_argument("--latency", type=float, default=0.3, help="simulated seconds per worker stage (default 0.3)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("-n", type=int, default=4, help="responses per prompt (GRPO group size)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="also write every run's figures to PATH as JSON")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.steps < 1:
        ap.error("--repeats and --steps must be at least 1")
    warnings.filterwarnings("ignore", category=FutureWarning)  # RayPPOTrainer is marked deprecated in verl 0.9.1
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    warnings.filterwarnings("ignore", message=".* engine is not available.*")
    result = bench(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print(markdown(result))


if __name__ == "__main__":
    main()
