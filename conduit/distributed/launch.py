"""Starting a group of learner ranks: torch.multiprocessing on one machine, or Ray actors (as Ray Train and
RLlib's ``LearnerGroup`` do). Launching only: every byte of data then moves through ``torch.distributed``.

::

    def learner(rank, world, port):
        conduit.distributed.launch.init_process_group(rank, world, port)
        edp = conduit.distributed.Conduit(policy="off_policy", train_batch_size=256, capacity=100_000)
        ...

    torch.multiprocessing.spawn(learner, args=(4, conduit.distributed.launch.free_port()), nprocs=4)
    conduit.distributed.launch.ray_learners(learner, 4)        # the same function, in Ray actors

A single-host group binds to 127.0.0.1 only.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

__all__ = ["free_port", "init_process_group", "ray_learners"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the rendezvous port of a local group)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def init_process_group(
    rank: int, world: int, port: int, *, host: str = "127.0.0.1", backend: str = "gloo", timeout_s: float = 60.0
) -> None:
    """``torch.distributed.init_process_group`` over TCP at ``host:port`` (rank 0 listens there)."""
    dist.init_process_group(
        backend, init_method=f"tcp://{host}:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def ray_learners(
    fn: Callable[..., Any], world: int, *args: Any, num_cpus: float = 0.5, timeout_s: float = 300.0
) -> list[Any]:
    """Run ``fn(rank, world, port, *args)`` in ``world`` Ray actors (one per rank); their results by rank.

    Needs Ray initialised by the caller (``pip install ".[rllib]"`` in a clone of Conduit brings it). Each actor is a
    separate process that forms the torch.distributed group with the others through ``fn``.
    """
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the extra
        raise ImportError('ray_learners needs Ray: pip install ".[rllib]" (in a clone of Conduit)') from e

    @ray.remote(num_cpus=num_cpus)
    class _Learner:
        def run(self, rank: int, port: int) -> Any:
            return fn(rank, world, port, *args)

    port = free_port()
    actors = [_Learner.remote() for _ in range(world)]
    try:
        return ray.get([a.run.remote(r, port) for r, a in enumerate(actors)], timeout=timeout_s)
    finally:
        for a in actors:
            ray.kill(a)
