"""A growth trace end to end (the paper's Fig. 13): transition dimension 128 -> 20,000.

The real runtime, off-policy, with a :class:`PlacementPolicy` over a hand-built
topology whose four small "GPUs" are backed by CPU memory (``device_map``). As
the dimension grows the placement moves single GPU -> shared over 2 -> 3 -> 4
-> pageable host, migrating at each capacity boundary (and re-laying in place
between them). Every row carries its transition id; after each step the buffer
holds exactly the expected rows, zero-padded, in the same ring slots, and every
batch a learner thread pulls meanwhile holds only complete rows.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

import conduit
from conduit.placement import Node, PlacementKind, PlacementPolicy, Topology
from conduit.placement.units import GB, MIB

CAPACITY = 512
UNIT = 64
DIMS = (128, 512, 1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 7_000, 8_000, 10_000, 15_000, 20_000)
UNITS_PER_DIM = 3


def cpu_backed_topology() -> Topology:
    """Four 8 MiB "GPUs" (fast pairs 0-1, 2-3), 1 GiB of pageable host memory, no pinned memory."""
    links = [[0.0 if i == j else (200 if {i, j} in ({0, 1}, {2, 3}) else 100) * GB for j in range(4)] for i in range(4)]
    node = Node(
        host_memory_bytes=1024 * MIB,
        gpu_memory_bytes=(8 * MIB,) * 4,
        host_memcpy=20 * GB,
        gpu_local=(500 * GB,) * 4,
        host_to_gpu=(10 * GB,) * 4,
        gpu_to_host=(10 * GB,) * 4,
        gpu_to_gpu=tuple(tuple(r) for r in links),
    )
    return Topology(name="cpu-backed-4gpu", nodes=(node,))


def unit(first: int, n: int, dim: int) -> dict[str, torch.Tensor]:
    tid = torch.arange(first, first + n, dtype=torch.int64)
    value = (tid + 1).to(torch.float32).unsqueeze(1)
    return {
        "obs": value.expand(-1, dim).clone(),
        "next_obs": (-value).expand(-1, dim).clone(),
        "action": tid % 7,
        "reward": tid.to(torch.float32) / 2,
        "done": tid % 2 == 1,
        "tid": tid,
    }


class Trace:
    """The dimension each transition id was written at."""

    def __init__(self) -> None:
        self.first: list[int] = []
        self.dims: list[int] = []

    def add(self, first: int, dim: int) -> None:
        self.first.append(first)
        self.dims.append(dim)

    def dim_of(self, tid: np.ndarray) -> np.ndarray:
        return np.asarray(self.dims)[np.searchsorted(self.first, tid, side="right") - 1]


def check_rows(rows: dict[str, torch.Tensor], trace: Trace) -> None:
    """Each row is complete: its own values up to the width it was written at, zeros beyond."""
    tid = rows["tid"]
    width = rows["obs"].shape[1]
    assert rows["next_obs"].shape[1] == width
    dims = torch.from_numpy(trace.dim_of(tid.numpy()))
    mask = torch.arange(width).unsqueeze(0) < dims.unsqueeze(1)
    value = (tid + 1).to(torch.float32).unsqueeze(1)
    assert torch.equal(rows["obs"], torch.where(mask, value, 0.0))
    assert torch.equal(rows["next_obs"], torch.where(mask, -value, 0.0))
    assert torch.equal(rows["action"], tid % 7)
    assert torch.equal(rows["reward"], tid.to(torch.float32) / 2)
    assert torch.equal(rows["done"], tid % 2 == 1)


def test_growth_trace_migrates_at_capacity_boundaries_with_every_record_intact() -> None:
    policy = PlacementPolicy(
        cpu_backed_topology(), actors="cpu", learners="cuda:0", capacity=CAPACITY, headroom=0.0,
        device_map={f"cuda:{k}": "cpu" for k in range(4)},
    )
    trace = Trace()
    pulled = [0]
    failures: list[BaseException] = []
    stop = threading.Event()
    edp = conduit.Conduit(
        policy="off_policy", train_batch_size=32, capacity=CAPACITY, seed=0, storage=policy,
        growable={"obs", "next_obs"},
    )

    def learner() -> None:
        try:
            while not stop.is_set():
                batch = edp.pull(timeout=10)
                check_rows({k: batch[k] for k in ("obs", "next_obs", "action", "reward", "done", "tid")}, trace)
                assert torch.equal(batch["tid"], torch.from_numpy(batch.info.ids))
                pulled[0] += 1
        except BaseException as e:  # re-raised in the test thread
            failures.append(e)

    puller = threading.Thread(target=learner, name="test-learner")
    tid = 0
    placements = []
    with edp:
        for dim in DIMS:
            for _ in range(UNITS_PER_DIM):
                trace.add(tid, dim)  # before the push: the learner may see the rows right away
                edp.push(unit(tid, UNIT, dim))
                tid += UNIT
                if not puller.is_alive() and tid >= 64:
                    edp.flush()
                    puller.start()
            edp.flush()
            buf = edp.buffer
            assert isinstance(buf, conduit.buffers.ReplayBuffer)
            with buf.lock:
                contents = buf.contents()
                ids = buf.ids[: buf.size].copy()
                placements.append(policy.active)
            assert contents["obs"].shape[1] == dim
            assert torch.equal(contents["tid"], torch.from_numpy(ids))  # slot i still holds record ids[i]
            assert sorted(ids.tolist()) == list(range(max(0, tid - CAPACITY), tid))  # the newest, none lost
            check_rows(contents, trace)
            assert not failures, failures[0]
        stop.set()
        puller.join(15)
    assert not puller.is_alive()
    assert not failures, failures[0]
    assert pulled[0] > 0

    kinds = [p.kind for p in placements]
    sizes = [len(p.devices) for p in placements]
    assert kinds[0] is PlacementKind.SINGLE_GPU and kinds[-1] is PlacementKind.CPU_PAGEABLE
    assert [s for s, k in zip(sizes, kinds) if k is PlacementKind.SHARED_GPU] == sorted(
        s for s, k in zip(sizes, kinds) if k is PlacementKind.SHARED_GPU
    )
    assert {2, 3, 4} <= set(sizes)

    history = policy.history
    assert len(history) == len(DIMS) - 1 == edp.buffer.migrations
    moved = [h for h in history if h.changed]
    assert [str(h.target) for h in moved] == [
        "shared_gpu(cuda:0, cuda:1)",
        "shared_gpu(cuda:0, cuda:1, cuda:2)",
        "shared_gpu(cuda:0, cuda:1, cuda:2, cuda:3)",
        "cpu_pageable(cpu)",
    ]
    assert all(h.plan is not None and h.modeled_seconds > 0 for h in moved)
    assert all(h.in_place and h.plan is None for h in history if not h.changed)
    # each growth happens at the first unit of a dimension: every row written so far moves (up to a full ring)
    assert [h.rows_moved for h in history] == [min(CAPACITY, UNITS_PER_DIM * UNIT * k) for k in range(1, len(DIMS))]
    assert all(h.sample_bytes_after > h.sample_bytes_before for h in history)
