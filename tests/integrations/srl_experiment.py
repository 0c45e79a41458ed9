"""A tiny real SRL experiment on CPU, in one process, with SRL's buffer or Conduit's (opt-in test helper).

SRL's ``ActorWorker`` (inline inference with SRL's actor-critic policy) -> SRL's IP (zmq)
sample stream on 127.0.0.1 -> SRL's ``TrainerWorker`` (buffer ``--buffer``, SRL's PPO
trainer ``mappo``) -> SRL's filesystem parameter DB -> back to the actor. The environment,
a 1-D corridor, is defined here; everything else is SRL's own code, imported from the
checkout ``CONDUIT_SRL_SRC`` names (never copied into this repository). With a
``conduit_*`` buffer name, Conduit's buffers are installed into SRL's ``make_buffer``.

    CONDUIT_SRL_SRC=/path/to/srl python tests/integrations/srl_experiment.py --buffer conduit_queue

Prints the mean episode return of a uniformly random policy, of the first episodes (initial
policy) and of the last episodes (trained policy) on a ``RESULT`` line. Fails if no trainer
step happened, or, with ``--require-gain G``, if the end return is below the random policy's
plus G. ``--save-buffer`` turns on ``save_buffer_on_exit`` and then starts a second trainer
worker with ``load_buffer_on_restart`` from the same parameter DB, printing what it loaded.

What SRL needs to run here (Python 3.11, a CPU build of torch), all patched at run time in this
process only: Python 3.10's rule for dataclass defaults while SRL's modules import (3.11 rejects
SRL's dataclass-instance defaults); ``gym`` as ``gymnasium``; a ``wandb`` whose ``Settings`` takes
SRL's ``start_method``; ``MARL_TESTING=1`` (one in-memory name registry for every worker, as SRL's
own tests set); ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` (SRL's parameter DB calls ``torch.load`` with
the default that was ``weights_only=False`` before torch 2.6: without it a saved buffer, SRL's or
Conduit's, never loads and SRL's read loop spins); the parameter DB in a temp dir; the trainer's
one-rank DDP group over a file store (nothing listens on a network port but zmq and gloo on
127.0.0.1); without CUDA, ``pin_memory`` as the identity and a CPU ``PyTorchGPUPrefetcher`` with its
one-step-delayed ``push``.
"""
import argparse
import contextlib
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import time
import types
from typing import ClassVar

import numpy as np

from conduit.distributed.launch import free_port  # 127.0.0.1 only

ROOT = os.environ.get("CONDUIT_SRL_SRC", "")
SRL_SRC = os.path.join(ROOT, "src") if os.path.isdir(os.path.join(ROOT, "src", "rlsrl")) else ROOT
CORRIDOR_LENGTH, EPISODE_STEPS = 4, 10  # uniform random policy reaches the goal ~34% of the time


# ---------------------------------------------------------------- shims (process-local, runtime only)
@contextlib.contextmanager
def py310_dataclass_defaults():
    """Python 3.11 rejects any unhashable dataclass default (SRL's configs use dataclass instances
    as defaults, e.g. `parameter_db: ParameterDB = ParameterDB(...)`); 3.10 only rejected
    list/dict/set. Restore the 3.10 rule while SRL's modules are imported."""
    orig = dataclasses._get_field

    def get_field(cls, name, *args):
        try:
            return orig(cls, name, *args)
        except ValueError:
            raw = cls.__dict__[name]
            default = raw.default if isinstance(raw, dataclasses.Field) else raw
            if isinstance(default, (list, dict, set)):
                raise
            # Re-run the stock logic on a hashable placeholder, then put the real default back.
            if isinstance(raw, dataclasses.Field):
                raw.default = None
            else:
                setattr(cls, name, None)
            try:
                f = orig(cls, name, *args)
            finally:
                if isinstance(raw, dataclasses.Field):
                    raw.default = default
                else:
                    setattr(cls, name, raw)
            f.default = default
            return f

    dataclasses._get_field = get_field
    try:
        yield
    finally:
        dataclasses._get_field = orig


def import_srl(workdir):
    os.environ["MARL_TESTING"] = "1"  # as rlsrl.testing does: keep one in-memory name_resolve for all workers
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # gloo (trainer's 1-rank DDP group) binds loopback only
    # SRL's parameter DB reads with torch.load's default, which torch >= 2.6 made weights_only=True: it refuses
    # any pickled buffer (SRL's own too), and SRL's read loop then retries forever. SRL was written for False.
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    sys.path.insert(0, SRL_SRC)
    import gymnasium
    sys.modules.setdefault("gym", gymnasium)  # rlsrl.api.env_utils does `import gym` (gym not installed)
    import torch
    torch.set_num_threads(1)
    with py310_dataclass_defaults():
        # imported for their registrations: the "actor-critic" policy and "mappo" trainer, the INLINE inference
        # client, the IP sample stream
        import rlsrl.api.config
        import rlsrl.api.environment
        import rlsrl.api.trainer as trainer_api
        import rlsrl.legacy.algorithm
        import rlsrl.legacy.algorithm.ppo.mappo as mappo
        import rlsrl.system.api.parameter_db as parameter_db
        import rlsrl.system.api.worker_base as worker_base
        import rlsrl.system.impl.actor_worker
        import rlsrl.system.impl.inline_inference
        import rlsrl.system.impl.remote_sample  # noqa: F401
        import rlsrl.system.impl.trainer_worker as trainer_worker

    class Wandb(types.ModuleType):
        """worker_base passes wandb.Settings(start_method=...), which current wandb rejects."""
        Settings = staticmethod(lambda start_method=None, **kw: wandb.Settings(**kw))
        __getattr__ = staticmethod(lambda name: getattr(wandb, name))

    wandb = worker_base.wandb
    worker_base.wandb = Wandb("wandb")

    parameter_db.PytorchFilesystemParameterDB.ROOT = os.path.join(workdir, "param_db")  # not ~/marl_checkpoints
    trainer_worker.find_free_port = free_port  # SRL's binds ('', 0): every interface

    # The trainer's GPU thread always builds a 1-rank DDP group with init_method tcp://<host ip>:<port>;
    # use a FileStore in the temp dir instead of a TCPStore listening on all interfaces.
    orig_distributed = trainer_api.PytorchTrainer.distributed

    def distributed(self, rank, world_size, init_method, **kw):
        assert world_size == 1, "only the single-trainer case is shimmed"
        return orig_distributed(self, rank, world_size, f"file://{workdir}/ddp_store", **kw)

    trainer_api.PytorchTrainer.distributed = distributed

    if not torch.cuda.is_available():
        torch.Tensor.pin_memory = lambda self, *a, **k: self  # replay buffers pin; CPU torch refuses

        class CPUPrefetcher:
            """PyTorchGPUPrefetcher without CUDA streams; same one-step-delayed push() semantics."""

            def __init__(self):
                self.pending = None

            def push(self, sample):
                ready, self.pending = self.pending, (sample, trainer_api.recursive_apply(
                    sample, lambda x: torch.tensor(x, dtype=torch.float32)))
                return ready

        mappo.PyTorchGPUPrefetcher = CPUPrefetcher  # mappo builds PyTorchGPUPrefetcher() unconditionally


# ---------------------------------------------------------------- toy environment
def make_corridor_class():
    import rlsrl.api.environment as env_api

    class Corridor(env_api.Environment):
        """Start at cell 0; action 1 moves right, 0 moves left (wall at 0). Reward 1 and `done` on
        reaching cell CORRIDOR_LENGTH; `truncated` after EPISODE_STEPS steps. Return = success."""
        returns: ClassVar[list[float]] = []  # every finished episode's return, in order, across all instances

        def __init__(self, seed=0):
            self.pos, self.t, self.ret = 0, 0, 0.0

        @property
        def agent_count(self):
            return 1

        @property
        def observation_spaces(self):
            return [{"obs": (CORRIDOR_LENGTH + 1,)}]

        @property
        def action_spaces(self):
            return [None]

        def _result(self, reward, done, truncated):
            obs = np.zeros(CORRIDOR_LENGTH + 1, dtype=np.float32)
            obs[self.pos] = 1
            return [env_api.StepResult(obs={"obs": obs},
                                       reward=np.array([reward], dtype=np.float32),
                                       done=np.array([done], dtype=np.uint8),
                                       truncated=np.array([truncated], dtype=np.uint8),
                                       info={"episode_return": np.array([self.ret], dtype=np.float32)})]

        def reset(self):
            self.pos, self.t, self.ret = 0, 0, 0.0
            return self._result(0.0, False, False)

        def step(self, actions):
            self.pos = max(0, self.pos + (1 if int(actions[0].x[0]) == 1 else -1))
            self.t += 1
            done = self.pos == CORRIDOR_LENGTH
            reward = 1.0 if done else 0.0
            self.ret += reward
            truncated = not done and self.t >= EPISODE_STEPS
            if done or truncated:
                Corridor.returns.append(self.ret)
            return self._result(reward, done, truncated)

    env_api.register("tiny-corridor", Corridor)
    return Corridor


def random_policy_return(episodes=5000, seed=0):
    rng, total = random.Random(seed), 0.0
    for _ in range(episodes):
        pos = 0
        for _ in range(EPISODE_STEPS):
            pos = max(0, pos + rng.choice((-1, 1)))
            if pos == CORRIDOR_LENGTH:
                total += 1.0
                break
    return total / episodes


# ---------------------------------------------------------------- experiment
def make_configs(buffer_name, buffer_args, port):
    import rlsrl.api.config as c
    exp, trial, policy_name = "srl-tiny", f"t{os.getpid()}", "default"
    policy = c.Policy(type_="actor-critic",
                      args=dict(obs_dim={"obs": CORRIDOR_LENGTH + 1}, action_dim=2, hidden_dim=32,
                                num_dense_layers=1, num_rnn_layers=0, popart=False, layernorm=False,
                                shared_backbone=True, seed=1))
    trainer = c.Trainer(type_="mappo",
                        args=dict(discount_rate=0.98, gae_lambda=0.95, eps_clip=0.2, value_loss="mse",
                                  entropy_bonus_weight=0.01, optimizer="adam",
                                  optimizer_config=dict(lr=3e-3), popart=False, max_grad_norm=10.0,
                                  bootstrap_steps=1, ppo_epochs=2))
    sample_stream = c.SampleStream(type_=c.SampleStream.Type.IP,
                                   plugin=c.IpStreamPlugin(address=f"127.0.0.1:{port}"))
    inference_stream = c.InferenceStream(
        type_=c.InferenceStream.Type.INLINE,
        plugin=c.InlineInferenceStreamPlugin(policy=policy, policy_name=policy_name,
                                             pull_interval_seconds=0.5,
                                             param_db=c.ParameterDB(c.ParameterDB.Type.FILESYSTEM)))
    actor = c.ActorWorker(env=c.Environment(type_="tiny-corridor"), ring_size=4, inference_splits=4,
                          sample_streams=[sample_stream], inference_streams=[inference_stream],
                          agent_specs=[c.AgentSpec(index_regex=".*", inference_stream_idx=0,
                                                   sample_stream_idx=0, sample_steps=16,
                                                   bootstrap_steps=1)],
                          max_num_steps=10_000)
    trainer_worker = c.TrainerWorker(policy_name=policy_name, trainer=trainer, policy=policy,
                                     sample_stream=sample_stream, buffer_name=buffer_name,
                                     buffer_args=buffer_args, push_frequency_seconds=0.2,
                                     push_frequency_steps=1, log_frequency_seconds=1)
    setup = c.ExperimentConfig(actors=[actor], trainers=[trainer_worker])
    setup.set_worker_information(exp, trial)
    for w in (actor, trainer_worker):
        w.worker_info.log_wandb, w.worker_info.log_terminal = False, False
    return actor, trainer_worker


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--buffer", default="priority_queue", help="TrainerWorker.buffer_name")
    ap.add_argument("--buffer-args", default='{"max_size": 16, "reuses": 2, "batch_size": 4}',
                    help="TrainerWorker.buffer_args, as JSON")
    ap.add_argument("--trainer-steps", type=int, default=60, help="stop after this many trainer steps ...")
    ap.add_argument("--env-steps", type=int, default=2000, help="... and this many environment steps")
    ap.add_argument("--max-seconds", type=float, default=150, help="hard wall-clock bound of the loop")
    ap.add_argument("--window", type=int, default=40, help="episodes averaged for start/end returns")
    ap.add_argument("--require-gain", type=float, default=None,
                    help="if given, fail unless end return >= random-policy return + this")
    ap.add_argument("--save-buffer", action="store_true",
                    help="save_buffer_on_exit, then load it back in a second trainer worker (load_buffer_on_restart)")
    args = ap.parse_args()
    if not SRL_SRC:
        sys.exit("set CONDUIT_SRL_SRC to a checkout of openpsi-projects/srl")

    workdir = tempfile.mkdtemp(prefix="srl_tiny_")
    try:
        run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run(args, workdir):
    import_srl(workdir)
    if args.buffer.startswith("conduit_"):
        from conduit.integrations import srl as conduit_srl
        conduit_srl.install()  # Conduit's names into SRL's own make_buffer; every other name stays SRL's
    from rlsrl.system.impl.actor_worker import ActorWorker
    from rlsrl.system.impl.trainer_worker import TrainerWorker
    Corridor = make_corridor_class()

    actor_cfg, trainer_cfg = make_configs(args.buffer, json.loads(args.buffer_args), free_port())
    trainer_cfg.save_buffer_on_exit = args.save_buffer
    t0 = time.monotonic()
    trainer = TrainerWorker()
    trainer.configure(trainer_cfg)  # binds the zmq PULL socket on 127.0.0.1
    trainer._poll()  # first poll: 1-rank DDP setup, pushes policy version 0, starts the GPU thread
    actor = ActorWorker()
    actor.configure(actor_cfg)  # inline inference client pulls version 0 from the parameter DB
    trainer.start()
    actor.start()

    polls, env_steps, trainer_steps = 0, 0, 0
    while ((trainer_steps < args.trainer_steps or env_steps < args.env_steps)
           and time.monotonic() - t0 < args.max_seconds):
        env_steps += actor._poll().sample_count
        trainer._poll()
        trainer_steps = trainer.gpu_thread.distributed_steps
        polls += 1
    wall = time.monotonic() - t0
    returns = list(Corridor.returns)
    buffer = trainer._TrainerWorker__buffer
    version = trainer.gpu_thread._GPUThread__trainer.policy.version  # = PPO updates done
    trainer.exit()  # SRL's shutdown: saves the buffer if asked, stops the GPU thread
    actor.exit()
    import torch.distributed as dist
    if dist.is_initialized():  # the trainer's one-rank DDP group, which SRL leaves to its process's exit
        dist.destroy_process_group()

    w = min(args.window, len(returns) // 2)
    start, end, rand = np.mean(returns[:w]), np.mean(returns[-w:]), random_policy_return()
    print(f"buffer={args.buffer} ({type(buffer).__module__}.{type(buffer).__name__}) buffer_args={args.buffer_args}")
    print(f"polls={polls} env_steps={env_steps} episodes={len(returns)} trainer_steps={trainer_steps} "
          f"policy_version={version} wall={wall:.1f}s")
    print(f"RESULT random_policy_return={rand:.3f} start_return={start:.3f} (first {w} episodes) "
          f"end_return={end:.3f} (last {w} episodes)")
    if args.save_buffer:
        import rlsrl.base.name_resolve as name_resolve
        name_resolve.reset()  # what a restarted experiment finds: none of the exited workers' names
        restarted = TrainerWorker()  # the same experiment and trial (so the same parameter DB), a fresh stream port
        _, again = make_configs(args.buffer, json.loads(args.buffer_args), free_port())
        again.load_buffer_on_restart = True
        restarted.configure(again)
        restarted._poll()  # the GPU thread's setup loads the buffer from the parameter DB
        loaded = restarted._TrainerWorker__buffer
        print(f"RELOADED {type(loaded).__module__}.{type(loaded).__name__} qsize={loaded.qsize()} "
              f"saved_qsize={buffer.qsize()}")
        restarted.exit()
        assert type(loaded) is type(buffer) and loaded is not buffer, (type(loaded), type(buffer))
        close = getattr(loaded, "close", None)
        if close is not None:
            close()
    close = getattr(buffer, "close", None)
    if close is not None:
        close()
    assert trainer_steps > 0 and len(returns) >= 2, "no training happened"
    if args.require_gain is not None:
        assert end >= rand + args.require_gain, f"no learning: end {end:.3f} vs random {rand:.3f}"


if __name__ == "__main__":
    main()
