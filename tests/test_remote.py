"""Actor processes pushing into one runtime through a torch.multiprocessing channel."""

from __future__ import annotations

import torch.multiprocessing as mp

from conduit import Conduit


def _actor_main(actor, k: int, units: int) -> None:
    import torch

    with actor:
        for u in range(units):
            tid = torch.arange(8) + 1000 * k + 8 * u
            actor.push({"obs": tid.float().unsqueeze(1), "tid": tid})


def test_actor_processes_push_concurrently_and_nothing_is_lost():
    with Conduit(policy="off_policy", train_batch_size=4, capacity=1000, timeout_s=60) as edp:
        channel = edp.actor_channel(maxsize=4)
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_actor_main, args=(channel.actor(), k, 10)) for k in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        channel.drain(20)
        edp.flush()
        expected = sorted(1000 * k + i for k in range(2) for i in range(80))
        assert sorted(edp.buffer.contents()["tid"].tolist()) == expected
        assert edp.pull()["obs"].shape == (4, 1)
