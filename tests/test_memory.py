"""Recycled batch memory (conduit.memory): reused once dropped, never overwritten while alive."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit import Conduit
from conduit.core import Mode, Schedule
from conduit.memory import BatchMemory
from conduit.spec import ExperienceSpec

SPEC = ExperienceSpec.of(obs=((6,), "float32"), action=((), "int64"), done=((), "bool"), r=((2,), "bfloat16"))


def units(n: int, start: int = 0) -> dict[str, torch.Tensor]:
    base = torch.arange(start, start + n)
    return {
        "obs": base[:, None].float().expand(n, 6).contiguous(),
        "action": base,
        "done": base % 3 == 0,
        "r": base[:, None].to(torch.bfloat16).expand(n, 2).contiguous(),
    }


def runtime(**kw: object) -> Conduit:
    edp = Conduit(policy="off_policy", train_batch_size=8, capacity=64, rollout_unit_size=16, seed=0, **kw).start()
    for k in range(4):
        edp.push(units(16, 16 * k))
    edp.flush()
    for memory in (edp.delivery.memory(r) for r in range(edp.delivery.num_learners)):
        if memory is not None:
            memory.min_bytes = 0  # recycle even these tiny test fields
    return edp


def ptrs(batch) -> dict[str, int]:
    return {k: batch[k].data_ptr() for k in ("obs", "action", "done", "r")}


def test_memory_of_a_dropped_batch_is_reused_and_allocation_stays_bounded():
    with runtime() as edp:
        first = ptrs(edp.pull())  # dropped at once
        again = ptrs(edp.pull())
        assert again == first
        for _ in range(50):
            edp.pull()
        memory = edp.delivery.memory(0)
        assert memory.allocated <= 2 * len(SPEC.fields)  # one batch's blocks (two while one is held)
        assert memory.recycled >= 50 * len(SPEC.fields)


@pytest.mark.parametrize("keep", ["batch", "tensor", "view", "numpy"])
def test_nothing_alive_is_ever_overwritten(keep):
    with runtime() as edp:
        batch = edp.pull()
        expected = {k: v.clone() for k, v in batch.items()}
        held = {
            "batch": batch,
            "tensor": batch["obs"],
            "view": batch["obs"][2:5, 1:],
            "numpy": batch["obs"].numpy(),
        }[keep]
        del batch
        for _ in range(20):
            edp.pull()
        if keep == "batch":
            assert all(torch.equal(held[k], expected[k]) for k in expected)
        elif keep == "numpy":
            assert np.array_equal(held, expected["obs"].numpy())
        elif keep == "view":
            assert torch.equal(held, expected["obs"][2:5, 1:])
        else:
            assert torch.equal(held, expected["obs"])
        still = id(held)
        del held
        assert still  # the memory goes back to the free list with the last reference
        assert edp.delivery.memory(0).free >= 1


def test_a_recycled_batch_is_an_ordinary_set_of_tensors():
    with runtime() as edp:
        edp.pull()
        batch = edp.pull()  # recycled memory
        buf = io.BytesIO()
        torch.save(dict(batch), buf)  # fields do not share a storage under different dtypes
        buf.seek(0)
        loaded = torch.load(buf)
        assert all(torch.equal(loaded[k], batch[k]) for k in loaded)
        assert batch["done"].dtype == torch.bool and batch["r"].dtype == torch.bfloat16
        assert batch["obs"].is_contiguous() and batch["obs"].shape == (8, 6)


def test_a_batch_dropped_on_another_thread_comes_back():
    with runtime() as edp:
        batch = edp.pull()
        before = ptrs(batch)
        box = [batch]
        del batch
        t = threading.Thread(target=box.clear)
        t.start()
        t.join()
        assert ptrs(edp.pull()) == before


def test_recycling_off_and_batch_pool_use_their_own_memory():
    with runtime(tuning={"recycle_batches": False}) as edp:
        assert edp.delivery.memory(0) is None
        edp.pull()
    with runtime(tuning={"batch_pool": 2}) as edp:
        assert edp.delivery.memory(0) is None  # the explicit ring decides
        a = ptrs(edp.pull())
        edp.pull()
        assert ptrs(edp.pull()) == a  # overwritten two pulls later, by contract


def test_direct_buffer_samples_reuse_dropped_memory_and_keep_held_ones_intact():
    with runtime() as edp:
        buf = edp.buffer
        buf.sample(8)  # tiny fields: left to the allocator by the default threshold
        assert buf.memory.allocated == 0
        buf.memory.min_bytes = 0  # a new threshold is seen at the next sample
        first = buf.sample(8)
        assert torch.equal(first.data["action"], torch.from_numpy(first.ids))  # the rows the draw names
        before = ptrs(first.data)
        del first
        held = buf.sample(8)
        assert ptrs(held.data) == before  # the dropped batch's memory
        expected = {k: v.clone() for k, v in held.data.items()}
        for _ in range(10):
            s = buf.sample(8)
            assert torch.equal(s.data["action"], torch.from_numpy(s.ids))
            assert ptrs(s.data) != before
        assert all(torch.equal(held.data[k], expected[k]) for k in expected)
        assert buf.memory.recycled >= len(SPEC.fields)


def test_direct_buffer_samples_allocate_afresh_with_recycling_off():
    with runtime(tuning={"recycle_batches": False}) as edp:
        assert edp.buffer.memory is None
        s = edp.buffer.sample(8)
        assert torch.equal(s.data["action"], torch.from_numpy(s.ids))


def test_overlapped_granular_delivery_recycles_too():
    with runtime(pinned=Schedule(Mode(False, 1), Mode(True, 3))) as edp:
        for _ in range(30):
            edp.pull()
        memory = edp.delivery.memory(0)
        assert memory.recycled > memory.allocated


def test_on_policy_minibatches_recycle_and_keep_held_ones_intact():
    edp = Conduit(
        policy="on_policy", train_batch_size=32, rollout_unit_size=16, num_minibatches=4, num_epochs=2, seed=0
    ).start()
    edp.delivery.memory(0).min_bytes = 0
    with edp:
        held = []
        for it in range(4):
            edp.push(units(16, 32 * it))
            edp.push(units(16, 32 * it + 16))
            for k in range(8):
                b = edp.pull()
                assert b.info.iteration == it
                if k == 0:
                    held.append((b, {n: v.clone() for n, v in b.items()}))
        for b, copy in held:
            assert all(torch.equal(b[n], copy[n]) for n in copy)
        memory = edp.delivery.memory(0)
        assert memory.recycled > memory.allocated


def test_small_fields_are_left_to_the_gather_and_large_ones_are_recycled():
    spec = ExperienceSpec.of(obs=((512,), "float32"), done=((), "bool"))
    memory = BatchMemory(min_bytes=64 << 10)
    a = memory.take(spec, 64)  # obs: 128 KiB (recycled), done: 64 B (allocated by the gather)
    assert a is not None and set(a) == {"obs"}
    obs = a["obs"].data_ptr()
    del a
    b = memory.take(spec, 64)
    assert b is not None and b["obs"].data_ptr() == obs and memory.recycled == 1 and memory.allocated == 1
    assert b["obs"].shape == (64, 512) and b["obs"].dtype == torch.float32
    assert memory.take(spec, 8) is None  # no field of 8 rows reaches min_bytes: nothing to track


def test_by_default_only_fields_of_1_mib_and_up_are_recycled():
    """Smaller blocks the allocator reuses at once (measured faster than recycling's bookkeeping)."""
    memory = BatchMemory()
    spec = ExperienceSpec.of(obs=((400,), "float32"), big=((1_000,), "float32"))
    out = memory.take(spec, 512)  # obs: 800 KB, big: 2 MB
    assert out is not None and set(out) == {"big"}
    assert memory.take(ExperienceSpec.of(obs=((400,), "float32")), 512) is None


def test_changing_min_bytes_rechooses_the_fields_of_shapes_already_seen():
    spec = ExperienceSpec.of(obs=((512,), "float32"), done=((), "bool"))
    memory = BatchMemory()
    assert memory.take(spec, 64) is None  # 128 KiB < 1 MiB
    memory.min_bytes = 64 << 10
    out = memory.take(spec, 64)
    assert out is not None and set(out) == {"obs"}


def test_another_layout_starts_new_free_lists():
    memory = BatchMemory(keep=2, min_bytes=0)
    a = memory.take(SPEC, 4)
    del a
    b = memory.take(SPEC, 4)
    assert memory.recycled == len(SPEC.fields)
    c = memory.take(SPEC, 5)
    assert c["obs"].shape == (5, 6) and b["obs"].shape == (4, 6)
    del b, c
    memory.take(SPEC, 4)  # a few shapes are kept side by side (on-policy's last mini-batch may be shorter)
    assert memory.recycled == 2 * len(SPEC.fields)
    with pytest.raises(ValueError, match="keep=0"):
        BatchMemory(keep=0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 7)), min_size=1, max_size=40))
def test_held_batches_keep_their_contents_under_any_pull_and_drop_order(ops):
    """Pull (True) or drop the k-th held batch (False): every held batch stays exactly as delivered."""
    with runtime() as edp:
        held: list[tuple[object, dict[str, torch.Tensor]]] = []
        for pull, k in ops:
            if pull:
                b = edp.pull()
                held.append((b, {n: v.clone() for n, v in b.items()}))
            elif held:
                held.pop(k % len(held))
            for b, copy in held:
                assert all(torch.equal(b[n], copy[n]) for n in copy)


def test_a_learner_holding_every_pooled_block_gets_new_memory_and_recycling_goes_on():
    # the pool keeps the `keep` newest blocks: batches held for good do not stop the others from recycling
    memory = BatchMemory(keep=2, min_bytes=0)
    held = [memory.take(SPEC, 4) for _ in range(3)]  # all held: three blocks per field, the pool keeps two
    assert memory.allocated == 3 * len(SPEC.fields) and memory.free == 0
    for _ in range(5):
        memory.take(SPEC, 4)  # taken and dropped at once
    assert memory.recycled >= 4 * len(SPEC.fields)
    assert all(b["obs"].data_ptr() != memory.take(SPEC, 4)["obs"].data_ptr() for b in held)


def test_time_major_memory_hands_out_transposed_views_of_time_major_blocks_and_recycles_them():
    spec = ExperienceSpec.of(obs=((4, 3), "float32"), h=((4,), "bfloat16"), done=((), "bool"))
    memory = BatchMemory(time_major=True)
    out = memory.take(spec, 5)
    assert out is not None and set(out) == {"obs", "h"}  # every field with a time axis, whatever its size
    assert out["obs"].shape == (5, 4, 3) and out["obs"].transpose(0, 1).is_contiguous()
    assert out["h"].shape == (5, 4) and out["h"].dtype == torch.bfloat16 and out["h"].transpose(0, 1).is_contiguous()
    ptr = out["obs"].data_ptr()
    keep = out["obs"].transpose(0, 1).numpy()  # a numpy array of the time-major block holds it
    del out
    again = memory.take(spec, 5)
    assert again is not None and again["obs"].data_ptr() != ptr
    del keep, again
    assert memory.take(spec, 5)["obs"].data_ptr() == ptr


def test_time_major_delivery_gives_the_same_batches_laid_out_time_major():
    spec_units = {"obs": torch.arange(64 * 4 * 3, dtype=torch.float32).reshape(64, 4, 3), "a": torch.arange(64)}

    def batches(time_major: bool) -> list[dict[str, torch.Tensor]]:
        from conduit import Tuning

        edp = Conduit(
            policy="off_policy", train_batch_size=8, capacity=64, rollout_unit_size=16, seed=3,
            tuning=Tuning(time_major=time_major),
        ).start()
        with edp:
            for k in range(4):
                edp.push({n: v[16 * k : 16 * (k + 1)] for n, v in spec_units.items()})
            edp.flush()
            out = []
            for _ in range(6):
                b = edp.pull()
                assert b["obs"].transpose(0, 1).is_contiguous() == time_major
                out.append({k: b[k].clone() for k in ("obs", "a")})
            return out

    for plain, tm in zip(batches(False), batches(True)):
        assert torch.equal(plain["obs"], tm["obs"]) and torch.equal(plain["a"], tm["a"])


def test_recycled_tensors_are_not_made_by_torch_view_ops():
    """Freeing the result of a torch view op (``transpose``, ``view``, ``reshape``) releases the GIL, and a
    delivery worker waiting for it then runs its own Python in the middle of the learner's step; so a recycled
    block is laid out on the numpy side (a time-major block, a dtype numpy lacks) and handed over by one
    ``torch.from_numpy`` (a dtype view of the same width is not a view op): no tensor is an autograd view."""
    spec = ExperienceSpec.of(obs=((4, 3), "float32"), h=((4,), "bfloat16"), x=((2,), "float32"))
    for time_major in (False, True):
        out = BatchMemory(time_major=time_major, min_bytes=0).take(spec, 5)
        assert out is not None and set(out) == {"obs", "h", "x"}
        assert not [k for k, t in out.items() if t._is_view()], time_major
