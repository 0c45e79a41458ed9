"""The CUDA stream path (dedicated streams, event hand-off, record_stream).

Skipped cleanly on machines without CUDA; run on a GPU machine with
``pytest -m gpu``.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from conduit import Conduit, Mode, Schedule
from conduit.executor import StreamSet
from tests.helpers import transitions

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PLACEMENTS = ["cpu", "pinned", "cuda:0"]


@pytest.mark.parametrize("storage", PLACEMENTS)
@pytest.mark.parametrize("overlap", [False, True])
def test_off_policy_batches_arrive_on_the_learner_gpu_intact(storage, overlap):
    with Conduit(
        policy="off_policy", train_batch_size=64, capacity=4096, learner_device="cuda:0", storage_device=storage,
        seed=0, pinned=Schedule(Mode(overlap, 1), Mode(overlap, 2)),
    ) as edp:
        for u in range(16):
            edp.push(transitions(128, dim=256, start=128 * u))
        edp.flush()
        for _ in range(20):
            b = edp.pull()
            assert b.device.type == "cuda"
            # consume on the learner's stream right away: the hand-off event must order it
            expected = b["tid"].float().unsqueeze(1).expand(-1, 256)
            assert torch.equal(b["obs"], expected)
            assert torch.equal(b["tid"].cpu(), torch.from_numpy(b.info.ids))


@pytest.mark.parametrize("storage", PLACEMENTS)
def test_on_policy_pipelined_minibatches_on_gpu(storage):
    with Conduit(
        policy="on_policy", train_batch_size=512, num_minibatches=8, num_epochs=2, learner_device="cuda:0",
        storage_device=storage, seed=0,
    ) as edp:
        for it in range(3):
            edp.push(transitions(512, dim=64, start=512 * it))
            mbs = list(edp.minibatches())
            for e in (0, 1):
                rows = torch.cat([b["tid"] for b in mbs if b.info.epoch == e]).cpu().tolist()
                assert sorted(rows) == list(range(512 * it, 512 * it + 512))


@pytest.mark.parametrize("storage", PLACEMENTS)
@pytest.mark.parametrize("overlap", [False, True])
def test_on_policy_gpu_learner_gets_the_same_minibatches_with_or_without_the_store_layout(storage, overlap):
    # a host store is laid out but a GPU learner's copy starts from a gather; a GPU store is not laid out
    def consume(presort: bool) -> list[list[int]]:
        got = []
        q = Mode(overlap, Fraction(1, 4)) if overlap else Mode(False, 1)
        with Conduit(
            policy="on_policy", train_batch_size=256, num_minibatches=4, num_epochs=2, learner_device="cuda:0",
            storage_device=storage, seed=3, tuning={"presort": presort}, pinned=Schedule(q, q),
        ) as edp:
            for it in range(3):
                for u in range(4):
                    edp.push(transitions(64, dim=32, start=256 * it + 64 * u))
                for b in edp.minibatches():
                    assert b.device.type == "cuda"
                    assert torch.equal(b["obs"][:, 0], b["tid"].float())  # consumed on the learner's stream
                    got.append(b["tid"].cpu().tolist())
        return got

    assert consume(True) == consume(False)


def test_each_path_gets_its_own_stream_and_events_order_the_handoff():
    s = StreamSet(torch.device("cuda:0"))
    assert s.stream is not None and s.stream != torch.cuda.current_stream()
    with s.active():
        x = torch.ones(1 << 20, device="cuda:0") * 3
    ev = s.record()
    torch.cuda.current_stream().wait_event(ev)
    assert float(x.sum()) == 3 * (1 << 20)


def test_ring_writes_and_gathers_on_separate_streams_never_tear_rows():
    # tiny ring, heavy overwrite: every delivered row must be one whole transition
    with Conduit(
        policy="off_policy", train_batch_size=256, capacity=512, learner_device="cuda:0", storage_device="cuda:0",
        seed=0, pinned=Schedule(Mode(True, 1), Mode(True, 1)),
    ) as edp:
        for u in range(64):
            edp.push(transitions(256, dim=512, start=256 * u))
            if edp.ready():
                b = edp.pull()
                assert torch.equal(b["obs"][:, 0], b["obs"][:, -1])
                assert torch.equal(b["obs"][:, 0].long(), b["tid"])


@pytest.mark.parametrize("copy", [True, False])
@pytest.mark.parametrize("storage", PLACEMENTS)
def test_a_unit_still_being_written_on_the_actors_stream_is_ingested_after_its_kernels(storage, copy):
    # the actor queues a long kernel, then the unit's contents, and pushes at once: the overlapped writer (its own
    # stream) must wait for those kernels, and the unit's memory must outlive the actor's reference to it
    with Conduit(
        policy="off_policy", train_batch_size=64, capacity=4096, storage_device=storage, seed=0,
        pinned=Schedule(Mode(True, 1), Mode(False, 1)), copy_on_push=copy,
    ) as edp:
        for u in range(8):
            unit = {k: v.cuda() for k, v in transitions(256, dim=64, start=0).items()}
            torch.cuda._sleep(50_000_000)  # ~tens of ms of GPU time queued before the real contents
            tid = torch.arange(256 * u, 256 * (u + 1), device="cuda")
            unit["tid"].copy_(tid)
            unit["obs"].copy_(tid.float().unsqueeze(1).expand(-1, 64))
            edp.push(unit)
            del unit, tid  # the actor lets go at once: only the runtime's reference keeps the memory
        edp.flush()
        torch.cuda.synchronize()
        stored = edp.buffer.storage.read(0, 8 * 256)
        assert stored["tid"].cpu().tolist() == list(range(8 * 256))
        assert torch.equal(stored["obs"].cpu(), stored["tid"].cpu().float().unsqueeze(1).expand(-1, 64))


@pytest.mark.parametrize("storage", ["cpu", "pinned"])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("batch_pool", [0, 2])
def test_host_rows_for_a_gpu_learner_are_gathered_onto_it_through_pinned_staging(
    monkeypatch, storage, overlap, batch_pool
):
    """No hook: the gather itself targets the learner's GPU (pinned staging, an async DMA), into the learner's
    recycled memory where ``batch_pool`` offers it; the rows are the sampled ones."""
    from conduit.storage import TensorStorage

    targets = []
    real = TensorStorage.gather

    def gather(self, indices, device=None, out=None):
        targets.append(device)
        return real(self, indices, device, out)

    monkeypatch.setattr(TensorStorage, "gather", gather)
    with Conduit(
        policy="off_policy", train_batch_size=64, capacity=4096, learner_device="cuda:0", storage_device=storage,
        seed=0, tuning={"batch_pool": batch_pool}, pinned=Schedule(Mode(overlap, 1), Mode(overlap, 1)),
    ) as edp:
        for u in range(8):
            edp.push(transitions(128, dim=256, start=128 * u))
        edp.flush()
        kept = []
        for _ in range(6):
            b = edp.pull()
            assert torch.equal(b["obs"], b["tid"].float().unsqueeze(1).expand(-1, 256))
            assert torch.equal(b["tid"].cpu(), torch.from_numpy(b.info.ids))
            kept.append(b)
        if batch_pool:  # the ring's memory: every batch_pool-th pull lands in the same blocks
            assert kept[-1]["obs"].data_ptr() in {k["obs"].data_ptr() for k in kept[:-1]}
    assert targets and all(t == torch.device("cuda:0") for t in targets)


def test_a_delivery_hook_still_reads_rows_where_the_buffer_keeps_them():
    seen = []
    edp = Conduit(
        policy="off_policy", train_batch_size=64, capacity=4096, learner_device="cuda:0", storage_device="pinned",
        seed=0,
    )

    @edp.register_delivery(input="ExperienceBuffer", output="Learner")
    def scale(exp_in, learn_out):
        d = exp_in.read()
        seen.append(d["obs"].device.type)
        learn_out.write({**d, "obs": d["obs"] * 2})

    with edp:
        edp.push(transitions(256, dim=32))
        b = edp.pull()
        assert b["obs"].device.type == "cuda" and seen and set(seen) == {"cpu"}  # (a prefetched batch's too)
        assert torch.equal(b["obs"], 2 * b["tid"].float().unsqueeze(1).expand(-1, 32))
