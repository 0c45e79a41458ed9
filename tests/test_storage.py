"""Storage contract: every implementation behaves as one preallocated ring of rows.

Parametrized over :class:`TensorStorage`, :class:`HostGatherStorage` and :class:`ShardedStorage` (several
layouts, uneven ones and migrated multi-segment ones included, all CPU shards
here); each is checked against a naive reference (a dict of plain tensors).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import conduit.storage.sharded as sharded_module
from conduit.errors import PlacementError
from conduit.spec import ExperienceSpec, FieldSpec
from conduit.storage import HostGatherStoragePolicy, RowLayout, ShardedStorage, Storage, TensorStorage
from conduit.storage.sharded import RowCopy, Segment, copy_block, move_rows

ROWS = 23
SPEC = ExperienceSpec.of(
    obs=FieldSpec("obs", (3,), torch.float32, growable=True),
    action=((), "int64"),
    done=((), "bool"),
    img=((2, 2), "uint8"),
)

# a layout where shards hold scattered, out-of-order ring ranges (what a migration produces)
SCRAMBLED = RowLayout(
    (9, 6, 8),
    [Segment(0, 4, 2, 4), Segment(4, 5, 0, 0), Segment(9, 6, 1, 0), Segment(15, 4, 2, 0), Segment(19, 4, 0, 5)],
)

Factory = Callable[[ExperienceSpec, int], Storage]
FACTORIES: dict[str, Factory] = {
    "tensor": lambda spec, rows: TensorStorage(spec, rows, "cpu"),
    "host-gather": lambda spec, rows: HostGatherStoragePolicy("cpu").create(spec, rows),
    "sharded-1": lambda spec, rows: ShardedStorage(spec, rows, [("cpu", rows)]),
    "sharded-even": lambda spec, rows: ShardedStorage(spec, rows, [("cpu", rows - 2 * (rows // 3))] + [("cpu", rows // 3)] * 2),
    "sharded-uneven": lambda spec, rows: ShardedStorage(spec, rows, [("cpu", 1), ("cpu", rows - 6), ("cpu", 5)]),
    "sharded-scrambled": lambda spec, rows: ShardedStorage(spec, rows, [("cpu", 9), ("cpu", 6), ("cpu", 8)], layout=SCRAMBLED),
}


@pytest.fixture(params=sorted(FACTORIES))
def make(request: pytest.FixtureRequest) -> Factory:
    return FACTORIES[request.param]


def rows_of(start: int, n: int, dim: int = 3) -> dict[str, torch.Tensor]:
    """``n`` rows whose values are derived from their number ``start..start+n``."""
    t = torch.arange(start, start + n)
    return {
        "obs": (t.float().unsqueeze(1) + torch.arange(dim).float() / 10),
        "action": t * 7,
        "done": t % 2 == 0,
        "img": (t % 251).to(torch.uint8).view(-1, 1, 1).expand(-1, 2, 2).clone(),
    }


class Reference:
    """The naive ring: one plain tensor per field, written row by row."""

    def __init__(self, spec: ExperienceSpec, rows: int) -> None:
        self.rows = rows
        self.t = {f.name: torch.zeros((rows, *f.shape), dtype=f.dtype) for f in spec}

    def write(self, start: int, data: dict[str, torch.Tensor]) -> None:
        n = next(iter(data.values())).shape[0]
        for i in range(n):
            for k, v in data.items():
                dst = self.t[k][(start + i) % self.rows]
                dst[tuple(slice(0, s) for s in v.shape[1:])] = v[i]

    def gather(self, idx: list[int]) -> dict[str, torch.Tensor]:
        return {k: torch.stack([v[i] for i in idx]) for k, v in self.t.items()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


def test_write_with_wrap_then_gather_and_read_equal_the_reference(make: Factory) -> None:
    s, ref = make(SPEC, ROWS), Reference(SPEC, ROWS)
    pos = 0
    for n in (5, 11, 9, 23, 1, 17):  # wraps several times; one write fills the whole ring
        data = rows_of(100 + pos, n)
        s.write(pos, data)
        ref.write(pos, data)
        pos = (pos + n) % ROWS
    rng = np.random.default_rng(0)
    for _ in range(5):
        idx = rng.integers(0, ROWS, size=40).tolist()
        assert_same(s.gather(torch.tensor(idx, dtype=torch.int64)), ref.gather(idx))
    assert_same(s.gather(torch.arange(ROWS), torch.device("cpu")), ref.gather(list(range(ROWS))))
    for start, n in ((0, ROWS), (20, 7), (5, 1), (13, 10)):
        assert_same(s.read(start, n), ref.gather([(start + i) % ROWS for i in range(n)]))


def test_gather_returns_new_tensors_in_index_order(make: Factory) -> None:
    s = make(SPEC, ROWS)
    s.write(0, rows_of(0, ROWS))
    idx = torch.tensor([22, 0, 22, 7, 15, 3, 3])
    out = s.gather(idx)
    assert out["action"].tolist() == [7 * i for i in idx.tolist()]
    out["action"].fill_(-1)  # not a view of the storage
    assert s.gather(idx)["action"].tolist() == [7 * i for i in idx.tolist()]
    assert s.gather(torch.tensor([], dtype=torch.int64))["obs"].shape == (0, 3)


@pytest.mark.parametrize("make", [FACTORIES["tensor"], FACTORIES["sharded-1"]], ids=["tensor", "sharded-1"])
def test_gather_fills_offered_memory_that_fits_and_allocates_for_the_rest(make: Factory) -> None:
    """Offered memory can be stale (a field widened since it was picked): only what fits is written into."""
    s, ref = make(SPEC, ROWS), Reference(SPEC, ROWS)
    s.write(0, rows_of(0, ROWS))
    ref.write(0, rows_of(0, ROWS))
    for idx in ([22, 0, 22, 7, 15, 3, 3, 9], [4, 1, 18]):  # a second batch size: the shapes are made afresh
        n = len(idx)
        offered = {
            "obs": torch.empty((n, 3)),  # fits
            "action": torch.empty((n,), dtype=torch.int32),  # another dtype
            "done": torch.empty((n + 1,), dtype=torch.bool),  # another number of rows
            "img": torch.empty((n, 2, 3), dtype=torch.uint8),  # another trailing shape (a widened field)
        }
        got = s.gather(torch.tensor(idx), None, offered)
        assert_same(got, ref.gather(idx))
        assert got["obs"].data_ptr() == offered["obs"].data_ptr()
        for name in ("action", "done", "img"):
            assert got[name].data_ptr() != offered[name].data_ptr(), name
        # a field offered nothing, or a tensor on another device, gets fresh memory too
        got = s.gather(torch.tensor(idx), None, {"obs": torch.empty((n, 3), device="meta")})
        assert_same(got, ref.gather(idx))


def test_growable_field_written_narrow_is_zero_padded(make: Factory) -> None:
    wide = ExperienceSpec.of(obs=FieldSpec("obs", (6,), torch.float32, growable=True), action=((), "int64"),
                             done=((), "bool"), img=((2, 2), "uint8"))
    s, ref = make(wide, ROWS), Reference(wide, ROWS)
    for start, n, dim in ((0, 10, 3), (10, 10, 6), (20, 8, 4)):  # the last one wraps
        data = rows_of(start, n, dim)
        s.write(start, data)
        ref.write(start, data)
    assert_same(s.read(0, ROWS), ref.gather(list(range(ROWS))))
    assert torch.count_nonzero(s.read(5, 5)["obs"][:, 3:]) == 0  # written at dim 3
    assert torch.count_nonzero(s.read(20, 8)["obs"][:, 4:]) == 0  # written at dim 4, across the wrap


def test_close_releases_and_devices_are_reported(make: Factory) -> None:
    s = make(SPEC, ROWS)
    assert s.devices == (torch.device("cpu"),)
    assert s.nbytes == ROWS * SPEC.bytes_per_sample
    s.close()


# -- the write fast path ------------------------------------------------------------------
FIXED = ExperienceSpec.of(  # no growable field: writes take the fast path (numpy for small copies)
    obs=((3,), "float32"), action=((), "int64"), done=((), "bool"), img=((2, 2), "uint8"), q=((2,), "bfloat16"),
)


def fixed_rows(start: int, n: int) -> dict[str, torch.Tensor]:
    data = rows_of(start, n)
    data["q"] = torch.arange(start, start + n).to(torch.bfloat16).unsqueeze(1).expand(-1, 2)  # a stride-0 view
    return data


@pytest.mark.parametrize("threads", [1, 2])
def test_fast_writes_equal_the_reference_whatever_the_source_tensor(make: Factory, threads: int) -> None:
    """One-row and ring-end writes, through numpy or torch, from strided, grad-requiring or bfloat16 sources."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        s, ref = make(FIXED, ROWS), Reference(FIXED, ROWS)
        pos = 0
        for n in (1, 1, 5, 16, ROWS, 1, 7):  # the ring end is reached exactly, never crossed, then wrapped
            data = fixed_rows(100 + pos, n)
            if n == 5:
                data["obs"] = data["obs"].t().contiguous().t()  # column-major: a strided source
            if n == 16:
                data["obs"] = data["obs"].clone().requires_grad_(True)  # numpy refuses it; torch copies it
            s.write(pos, data)
            ref.write(pos, {k: v.detach() for k, v in data.items()})
            pos = (pos + n) % ROWS
        assert_same(s.read(0, ROWS), ref.gather(list(range(ROWS))))
    finally:
        torch.set_num_threads(before)


def test_large_writes_below_and_above_the_parallel_grain_land_in_place() -> None:
    spec = ExperienceSpec.of(obs=((4096,), "float32"), done=((), "bool"))
    s = TensorStorage(spec, 40, "cpu")
    for start, n in ((0, 7), (7, 9), (16, 24)):  # 7 rows: under ATen's grain, 9 and 24: over it
        s.write(start, {"obs": torch.full((n, 4096), float(start)), "done": torch.ones(n, dtype=torch.bool)})
    out = s.read(0, 40)
    assert out["obs"][:, 0].tolist() == [0.0] * 7 + [7.0] * 9 + [16.0] * 24
    assert bool(out["done"].all()) and torch.equal(out["obs"], out["obs"][:, :1].expand(-1, 4096))


# -- layouts --------------------------------------------------------------------------------
def test_layout_validation_names_the_problem() -> None:
    with pytest.raises(PlacementError, match="shard_rows"):
        RowLayout((3, 0), [Segment(0, 3, 0, 0)])
    with pytest.raises(PlacementError, match="contiguous"):
        RowLayout((2, 2), [Segment(0, 2, 0, 0), Segment(3, 2, 1, 0)])
    with pytest.raises(PlacementError, match="covered exactly once"):
        RowLayout((4,), [Segment(0, 2, 0, 0), Segment(2, 2, 0, 1)])
    with pytest.raises(PlacementError, match="row counts"):
        ShardedStorage(SPEC, 10, [("cpu", 4), ("cpu", 5)])
    with pytest.raises(PlacementError, match="layout"):
        ShardedStorage(SPEC, 10, [("cpu", 5), ("cpu", 5)], layout=RowLayout.contiguous([4, 6]))


def test_layout_merges_adjacent_segments_and_identity_is_detected() -> None:
    layout = RowLayout((6,), [Segment(3, 3, 0, 3), Segment(0, 3, 0, 0)])
    assert layout.segments == (Segment(0, 6, 0, 0),) and layout.identity
    assert not RowLayout.contiguous([3, 3]).identity


@given(
    counts=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    data=st.data(),
)
def test_locate_and_pieces_agree_with_a_slot_table(counts: list[int], data: st.DataObject) -> None:
    layout = RowLayout.contiguous(counts) if data.draw(st.booleans()) else SCRAMBLED
    table = {}
    for s in layout.segments:
        for i in range(s.length):
            table[s.start + i] = (s.shard, s.offset + i)
    idx = torch.tensor(data.draw(st.lists(st.integers(0, layout.rows - 1), max_size=30)), dtype=torch.int64)
    shard, local = layout.locate(idx)
    assert list(zip(shard.tolist(), local.tolist())) == [table[i] for i in idx.tolist()]
    start, n = data.draw(st.integers(0, 3 * layout.rows)), data.draw(st.integers(0, layout.rows))
    got = [(at + i, (seg.shard, seg.offset + i)) for at, seg in layout.pieces(start, n) for i in range(seg.length)]
    assert got == [(i, table[(start + i) % layout.rows]) for i in range(n)]


def test_move_rows_copies_blocks_with_padding() -> None:
    narrow = ExperienceSpec.of(obs=((2,), "float32"), action=((), "int64"))
    wide = ExperienceSpec.of(obs=((4,), "float32"), action=((), "int64"))
    src = [TensorStorage(narrow, 5), TensorStorage(narrow, 5)]
    src[0].write(0, {"obs": torch.arange(10.0).view(5, 2), "action": torch.arange(5)})
    src[1].write(0, {"obs": -torch.arange(10.0).view(5, 2), "action": -torch.arange(5)})
    dst = [TensorStorage(wide, 6), TensorStorage(wide, 4)]
    move_rows(src, dst, [RowCopy(0, 1, 1, 0, 3), RowCopy(1, 0, 0, 2, 4)])
    assert dst[1].tensors["action"][:3].tolist() == [1, 2, 3]
    assert dst[0].tensors["action"][2:6].tolist() == [0, -1, -2, -3]
    assert torch.equal(dst[1].tensors["obs"][:3], torch.tensor([[2.0, 3, 0, 0], [4, 5, 0, 0], [6, 7, 0, 0]]))
    copy_block(src[0], 4, dst[1], 3, 1)
    assert dst[1].tensors["obs"][3].tolist() == [8.0, 9.0, 0.0, 0.0]


@pytest.mark.parametrize("rows", [0, 1, 7, 8, 9, 23])
def test_grown_rows_leaving_a_gpu_are_padded_in_chunks_then_copied_whole(monkeypatch, rows: int) -> None:
    """The GPU -> host path of a migration after growth (run here on host tensors: the same arithmetic), with
    chunks of 8 rows: every row whole, zeros beyond the old width, nothing written past the block."""
    monkeypatch.setattr(sharded_module, "PAD_CHUNK_BYTES", 8 * 6 * 4)  # 8 destination rows of 6 float32
    src = torch.arange(rows * 2 * 3, dtype=torch.float32).view(rows, 2, 3) + 1
    dst = torch.full((rows + 2, 2, 6), -1.0)
    sharded_module._padded_to_host(dst[1 : rows + 1], src, non_blocking=False)
    expected = torch.zeros((rows, 2, 6))
    expected[:, :, :3] = src
    assert torch.equal(dst[1 : rows + 1], expected)
    assert bool((dst[0] == -1).all()) and bool((dst[rows + 1] == -1).all())


# -- the gather's cost, by structure (timings belong to the benchmarks) ----------------------------
def test_sharded_gathers_do_no_more_work_than_their_layout_needs(monkeypatch) -> None:
    spec = ExperienceSpec.of(obs=((256,), "float32"), action=((), "int64"), reward=((), "float32"))
    plain = TensorStorage(spec, 20_000)
    one = ShardedStorage(spec, 20_000, [("cpu", 20_000)])
    four = ShardedStorage(spec, 20_000, [("cpu", 5_000)] * 4)
    data = {"obs": torch.randn(20_000, 256), "action": torch.arange(20_000), "reward": torch.randn(20_000)}
    for storage in (plain, one, four):
        storage.write(0, data)
    idx = torch.from_numpy(np.random.default_rng(0).integers(0, 20_000, 512))
    expected = plain.gather(idx)
    # one shard: the shard's own gather, called once with the same arguments (no index math, no copy)
    calls = []
    shard_gather = one.shards[0].gather
    one.shards[0].gather = lambda *a: calls.append(a) or shard_gather(*a)  # type: ignore[method-assign]
    got = one.gather(idx)
    assert len(calls) == 1 and calls[0][0] is idx
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    # four shards: one gather per shard and field, then one reorder per field back to the sampled order
    gathers: list[int] = []
    real = sharded_module.gather_into
    monkeypatch.setattr(sharded_module, "gather_into", lambda t, i, out: gathers.append(i.shape[0]) or real(t, i, out))
    got = four.gather(idx)
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    assert len(gathers) == 4 * 3 + 3 and sum(gathers) == 3 * 512 + 3 * 512



def test_large_host_fields_are_advised_for_huge_pages_where_the_kernel_offers_them() -> None:
    from conduit.storage import hugepages

    spec = ExperienceSpec.of(obs=((4096,), "float32"), reward=((), "float32"))  # 16 KB rows: obs is 16 MiB
    s = TensorStorage(spec, 1024)
    offered = hugepages.mode() in ("madvise", "always")
    assert s.huge_pages == (1 if offered else 0)  # obs only: reward's 4 KB is far under two huge pages
    assert not hugepages.advise(torch.empty(hugepages.MIN_BYTES // 4 - 1))  # too small to hold two
    # advice changes nothing a reader sees
    s.write(0, {"obs": torch.arange(1024 * 4096, dtype=torch.float32).view(1024, 4096), "reward": torch.ones(1024)})
    got = s.gather(torch.tensor([1023, 0, 512]))
    assert torch.equal(got["obs"][:, 0], torch.tensor([1023.0, 0.0, 512.0]) * 4096)
    s.close()
