"""Fixtures for the real-RLlib tests: tiny configs (the one Ray instance per session: tests/conftest.py).

Ray is imported inside the fixtures, so collecting this folder without the
``rllib`` extra only skips the modules (each calls ``pytest.importorskip``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


@pytest.fixture
def cartpole_chunks():
    """A function returning real CartPole episode chunks from a local SingleAgentEnvRunner, seeded.

    Seeded (the environments and the random actions' space both): the same
    chunks every run. Unseeded, a run now and then (one fresh-clone CI run here) fed RLlib's own
    ``EpisodeReplayBuffer`` (the reference the exact-mode tests compare with) an
    eviction its bookkeeping cannot handle (an IndexError inside ``add``, when
    the evicted episode's last step is the last index it holds).
    """
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    config = DQNConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=2).debugging(seed=0)
    runner = SingleAgentEnvRunner(config=config)
    runner.env.action_space.seed(0)  # random_actions samples this space, which the config's seed does not reach

    def sample(num_timesteps: int):
        return runner.sample(num_timesteps=num_timesteps, random_actions=True)

    yield sample
    runner.stop()


@pytest.fixture(scope="module")
def transfer_queue(ray_free_cpus):
    """verl's TransferQueue (one storage unit) on the shared Ray session, for one module; emptied after each use
    of :func:`tq_clean`. Skips without verl / TransferQueue."""
    pytest.importorskip("verl")
    tq = pytest.importorskip("transfer_queue")
    ray_free_cpus(2)  # its controller and storage unit take one CPU each
    tq.init({"backend": {"SimpleStorage": {"num_data_storage_units": 1, "total_storage_size": 100000}}})
    yield tq
    tq.close()


@pytest.fixture
def tq_clean(transfer_queue):
    """The module's TransferQueue, with nothing left in any partition before and after the test."""

    def wipe() -> None:
        for partition, items in (transfer_queue.kv_list() or {}).items():
            if items:
                transfer_queue.kv_clear(keys=list(items), partition_id=partition)

    wipe()
    yield transfer_queue
    wipe()


@pytest.fixture(scope="session")
def srl_module():
    """SRL's own buffer module, imported from the checkout at ``CONDUIT_SRL_SRC`` (skips without one).

    SRL's replay buffers pin their storage, which a CPU build of torch refuses: without CUDA,
    ``Tensor.pin_memory`` is the identity for the session (Conduit checks CUDA itself before pinning).
    """
    src = os.environ.get("CONDUIT_SRL_SRC")
    if not src:
        pytest.skip("set CONDUIT_SRL_SRC to an SRL checkout (openpsi-projects/srl or openpsi-project/srl)")
    import torch
    from conduit.integrations import srl

    root = Path(src)
    sys.path.insert(0, str(root / "src") if (root / "src" / "rlsrl").is_dir() else str(root))
    mp = pytest.MonkeyPatch()
    if not torch.cuda.is_available():
        mp.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    try:
        module = srl.find()
    except ImportError as e:
        mp.undo()
        pytest.skip(f"SRL's buffer layer does not import here: {e}")
    yield module
    mp.undo()
