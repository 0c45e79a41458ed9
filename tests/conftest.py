"""Shared fixtures: a clean default registry, small data makers, hypothesis profiles."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import pytest
import torch
from hypothesis import HealthCheck, settings

import conduit

settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("CONDUIT_HYPOTHESIS_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _fresh_default_runtime():
    """Every test starts with no module-level hooks and no default runtime."""
    conduit.reset()
    yield
    conduit.reset()


@pytest.fixture(autouse=True)
def _no_leaked_threads():
    """A test must not leave Conduit worker threads behind."""
    before = {t.ident for t in threading.enumerate()}
    yield
    leaked = [
        t for t in threading.enumerate() if t.ident not in before and t.name.startswith("conduit-") and t.is_alive()
    ]
    for t in leaked:
        t.join(2.0)
    still = [t.name for t in leaked if t.is_alive()]
    assert not still, f"conduit threads outlived the test: {still}"


def transitions(n: int, dim: int = 4, start: int = 0) -> dict[str, torch.Tensor]:
    """``n`` transitions whose ``tid`` field numbers them ``start..start+n-1``."""
    tid = torch.arange(start, start + n, dtype=torch.int64)
    return {
        "obs": tid.to(torch.float32).unsqueeze(1).repeat(1, dim),
        "action": tid % 3,
        "reward": torch.ones(n),
        "done": torch.zeros(n, dtype=torch.bool),
        "tid": tid,
    }


cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="session")
def ray_session():
    """``ray.init`` once per test session, shared by every folder that needs Ray (never a bare ``ray.init()``:
    it could attach to another cluster); skips where Ray is not installed."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # Ray starts its workers at niceness 15: beside any busy process at 0 (a build, another job) the learner
    # and TransferQueue actors of these tests then get a thirtieth of the CPU, and a test that takes a minute
    # on a quiet host runs past its timeout on a busy one
    os.environ.setdefault("RAY_worker_niceness", "0")
    started = False
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        started = True
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def ray_free_cpus(ray_session) -> Callable[[float], None]:
    """A function that waits, bounded, until the session's Ray has ``cpus`` CPUs free, and fails naming the actors
    that hold them otherwise.

    TransferQueue's controller and storage unit take one CPU each, all of this session's two: on a loaded host the
    actors of a test that just ended (a killed learner, a closed TransferQueue) can take a while to give theirs
    back, and ``tq.init`` would then wait for them without a word until pytest-timeout ends it.
    """

    def wait(cpus: float, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while ray_session.available_resources().get("CPU", 0.0) < cpus:
            if time.monotonic() > deadline:
                from ray.util.state import list_actors

                alive = [f"{a.class_name} ({a.actor_id[:8]})" for a in list_actors(filters=[("state", "=", "ALIVE")])]
                pytest.fail(
                    f"Ray has {ray_session.available_resources().get('CPU', 0.0)} of {cpus} CPUs free after "
                    f"{timeout_s:.0f} s; alive actors holding them: {', '.join(alive) or 'none listed'}"
                )
            time.sleep(0.5)

    return wait
