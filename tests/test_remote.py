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


def _reusing_actor_main(actor, units: int) -> None:
    import numpy as np

    buf = {"obs": np.zeros((64, 16), np.float32), "tid": np.zeros(64, np.int64)}
    with actor:
        for u in range(units):
            buf["tid"][:] = np.arange(64) + 64 * u
            buf["obs"][:] = buf["tid"][:, None]
            actor.push(buf)
            buf["tid"][:] = -1  # the next rollout starts writing into the same arrays at once
            buf["obs"][:] = -1


def test_an_actor_process_refilling_one_buffer_gets_every_unit_received_as_pushed():
    # the queue pickles after put returns: without the copy in push, the refill reaches the runtime
    with Conduit(policy="off_policy", train_batch_size=4, capacity=4096, timeout_s=60) as edp:
        channel = edp.actor_channel(maxsize=4)
        proc = mp.get_context("spawn").Process(target=_reusing_actor_main, args=(channel.actor(), 40))
        proc.start()
        proc.join(60)
        assert proc.exitcode == 0
        channel.drain(40)
        edp.flush()
        got = edp.buffer.contents()
        assert sorted(got["tid"].tolist()) == list(range(40 * 64))
        assert (got["obs"] == got["tid"].float().unsqueeze(1)).all()
