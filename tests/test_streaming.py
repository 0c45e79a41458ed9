"""Replay-ring writes with non-temporal stores: the copy itself, the storage path, who streams."""

from __future__ import annotations

import platform
import shutil
import sysconfig
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit import Conduit, Mode, Schedule
from conduit.samplers import sumtree
from conduit.spec import ExperienceSpec
from conduit.storage import TensorStorage, streaming
from tests.test_semantics import test_off_policy_integrity_and_bounded_staleness as off_policy_integrity

stream = streaming._native
built = pytest.mark.skipif(stream is None, reason="conduit._native is not built (no C compiler at install)")


def test_the_extension_is_built_where_a_c_compiler_is() -> None:
    """CI builds it (setup.py, optional=True): a silently skipped build would leave every ring write cached."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"], "Python.h").is_file()
    if platform.machine() in ("x86_64", "AMD64") and shutil.which(compiler) and headers:
        assert streaming.AVAILABLE, "conduit._native was not built although a C compiler is here: reinstall"
        assert sumtree.NATIVE  # the same extension: the prioritized sampler's C sum-tree


@built
@settings(max_examples=300, deadline=None)
@given(
    src_off=st.integers(0, 63), dst_off=st.integers(0, 63), n=st.integers(0, 4096), seed=st.integers(0, 2**31 - 1)
)
def test_a_streaming_copy_equals_memcpy_at_every_alignment_and_length(src_off: int, dst_off: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, 4096 + 128, dtype=np.uint8)
    dst = np.full(4096 + 128, 0xAB, dtype=np.uint8)
    expected = dst.copy()
    expected[dst_off : dst_off + n] = src[src_off : src_off + n]
    stream.copy(dst.ctypes.data + dst_off, src.ctypes.data + src_off, n)
    np.testing.assert_array_equal(dst, expected)  # every byte copied, none outside the range touched


@built
def test_a_streaming_copy_refuses_a_negative_length_and_a_null_address() -> None:
    buf = np.zeros(16, dtype=np.uint8)
    with pytest.raises(ValueError, match="nbytes=-1"):
        stream.copy(buf.ctypes.data, buf.ctypes.data, -1)
    with pytest.raises(ValueError, match="null"):
        stream.copy(0, buf.ctypes.data, 8)
    stream.copy(0, 0, 0)  # nothing to copy: fine


# -- the storage path -----------------------------------------------------------------------
DIM = 1024  # 4 KB rows: a write of 32 rows or more streams (MIN_BYTES = 128 KB)
SPEC = ExperienceSpec.of(obs=((DIM,), "float32"), action=((), "int64"), done=((), "bool"))
ROWS = 300


def rows_of(start: int, n: int) -> dict[str, torch.Tensor]:
    t = torch.arange(start, start + n)
    return {
        "obs": t.float().unsqueeze(1) + torch.arange(DIM).float() / DIM,
        "action": t * 3,
        "done": t % 2 == 0,
    }


@pytest.fixture
def one_thread():
    """One intra-op thread, as in a worker or an RL process that sets it: with more, ATen spreads a large
    write over its threads and the storage leaves it to ATen (a streaming copy runs on one thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes of every streaming copy the storage makes."""
    calls: list[int] = []
    real = streaming.copy

    def spy(dst: int, src: int, nbytes: int) -> None:
        calls.append(nbytes)
        real(dst, src, nbytes)

    monkeypatch.setattr(streaming, "copy", spy)
    return calls


@pytest.mark.skipif(not streaming.AVAILABLE, reason="no streaming copies here: conduit._native not built, or not x86-64")
def test_streaming_writes_land_like_cached_ones_and_only_large_copies_stream(counted: list[int], one_thread) -> None:
    fast, plain = TensorStorage(SPEC, ROWS, "cpu"), TensorStorage(SPEC, ROWS, "cpu")
    fast.set_streaming(True)
    assert fast.streaming and not plain.streaming
    pos = 0
    for n in (1, 31, 32, 100, 36, 64, 200, 7):  # under and over 32 rows; the ring's end reached, then crossed
        data = rows_of(1000 + pos, n)
        if n == 64:
            data["obs"] = data["obs"].t().contiguous().t()  # column-major: not a streaming source
        if n == 36:
            data["obs"] = data["obs"].clone().requires_grad_(True)  # numpy refuses it: torch copies
        fast.write(pos, data)
        plain.write(pos, {k: v.detach() for k, v in data.items()})
        pos = (pos + n) % ROWS
    for name in ("obs", "action", "done"):
        assert torch.equal(fast.read(0, ROWS)[name], plain.read(0, ROWS)[name]), name
    # obs rows of 32 and 100 streamed (contiguous, under the ring's end); 200 crosses the end: torch copies;
    # action/done never reach 128 KB
    assert counted == [32 * DIM * 4, 100 * DIM * 4]
    fast.set_streaming(False)
    fast.write(0, rows_of(0, 100))
    assert len(counted) == 2


def test_a_storage_streams_nothing_unless_asked(counted: list[int], one_thread) -> None:
    s = TensorStorage(SPEC, ROWS, "cpu")
    s.write(0, rows_of(0, 200))
    assert counted == [] and not s.streaming


# -- who streams ------------------------------------------------------------------------------
def units(start: int, n: int) -> dict[str, torch.Tensor]:
    """Rows whose every obs value is the row's id: a torn or stale row shows as a mixed one."""
    ids = torch.arange(start, start + n)
    return {"obs": ids.float().unsqueeze(1).expand(-1, DIM).contiguous(), "tid": ids}


@pytest.mark.skipif(not streaming.AVAILABLE, reason="no streaming copies here: conduit._native not built, or not x86-64")
def test_replay_rings_stream_and_on_policy_iterations_do_not(tmp_path, counted: list[int], one_thread) -> None:
    with Conduit(policy="off_policy", train_batch_size=16, capacity=512, seed=0) as edp:
        edp.push(units(0, 64))
        assert edp.buffer.storage.streaming and counted == [64 * DIM * 4]
        edp.save(tmp_path / "ckpt")
    with Conduit.from_checkpoint(tmp_path / "ckpt") as restored:
        assert restored.buffer.storage.streaming  # restored storage is a replay ring too
    counted.clear()
    with Conduit(policy="on_policy", train_batch_size=64, num_minibatches=2) as edp:
        edp.push(units(0, 64))
        edp.pull()
        assert counted == []  # an iteration is read back right away: it stays in the caches


@pytest.mark.skipif(not streaming.AVAILABLE, reason="no streaming copies here: conduit._native not built, or not x86-64")
@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlapped"])
def test_rows_written_by_streaming_copies_are_whole_when_learners_sample_them(
    overlap: bool, counted: list[int], request: pytest.FixtureRequest
):
    """Two actor threads push 64-row units (256 KB of obs: streamed) while a learner samples.

    Inline, the actors' threads write (one intra-op thread here); overlapped, the
    ingestion worker does, which keeps itself to one intra-op thread whatever the
    process has.

    Every delivered row must be the one its id names, all of it, whichever thread
    wrote it with streaming stores (fenced in the copy, before the buffer lock goes).
    """
    if not overlap:
        request.getfixturevalue("one_thread")
    mode = Mode(overlap, 2)
    with Conduit(
        pinned=Schedule(mode, Mode(overlap, 1)), policy="off_policy", train_batch_size=64, capacity=1024,
        rollout_unit_size=64, seed=0, timeout_s=30.0,
    ) as edp:
        errors: list[BaseException] = []

        def actor(k: int) -> None:
            try:
                for i in range(40):
                    edp.push(units((2 * i + k) * 64, 64))
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=actor, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        pulled = 0
        while any(t.is_alive() for t in threads) or pulled < 20:
            if not edp.ready():
                continue
            batch = edp.pull()
            obs, tid = batch["obs"], batch["tid"]
            assert torch.equal(obs, tid.float().unsqueeze(1).expand(-1, DIM)), "a torn or stale row was delivered"
            pulled += 1
        for t in threads:
            t.join()
        assert not errors
    assert counted, "no write streamed: the test would prove nothing"


@pytest.mark.skipif(not streaming.AVAILABLE, reason="no streaming copies here: conduit._native not built, or not x86-64")
def test_section_2_holds_with_every_ring_write_streamed(monkeypatch: pytest.MonkeyPatch, counted: list[int]) -> None:
    """docs/design.md §2 off-policy, under random pushes, pulls and schedules, with every write streamed.

    The property test of ``test_semantics`` with the threshold at one byte: its rows are a few bytes each, so
    every copy is all unaligned ends and short bodies, inline and on the ingestion worker.
    """
    monkeypatch.setattr(streaming, "MIN_BYTES", 1)
    off_policy_integrity()
    assert counted, "no write streamed: the property proved nothing about streaming"
