"""Fake hardware for the placement tests (flashbax's conftest pattern): topologies
with pinned memory, several GPUs, uneven links and capacities, on a CPU machine."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import strategies as st

from conduit.placement import Node, Topology, builtin_topology
from conduit.placement.units import GB, GIB

# Bandwidth values drawn from a short list, so ties (the hard case for "equal to
# brute force") are common.
_BW_GB_S = (5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0)


@pytest.fixture(scope="session")
def fake_topology() -> Topology:
    """A 4-GPU node shaped like half an MI250X node plus one small GPU.

    cuda:0-cuda:1 and cuda:2-cuda:3 are fast pairs (400 GB/s); 0-2 is 200; the
    rest 50. cuda:3 has only 8 GiB free (another tenant holds the rest).
    """
    node = Node.from_units(
        gpus=4,
        host_memory_gib=256,
        pinned_memory_gib=64,
        gpu_memory_gib=[32, 32, 32, 8],
        host_memcpy_gb_per_s=20,
        gpu_local_gb_per_s=800,
        host_to_gpu_gb_per_s=12,
        gpu_to_host_gb_per_s=10,
        pinned_to_gpu_gb_per_s=25,
        gpu_to_pinned_gb_per_s=25,
        gpu_to_gpu_gb_per_s=[
            [None, 400, 200, 50],
            [400, None, 50, 50],
            [200, 50, None, 400],
            [50, 50, 400, None],
        ],
    )
    return Topology(name="fake4", description="test fixture", nodes=(node,))


@pytest.fixture(scope="session")
def mi250x() -> Topology:
    return builtin_topology("mi250x_8gcd")


class Picker:
    """Random choices from a hypothesis ``data.draw`` or from a seeded ``random.Random``."""

    def __init__(
        self, draw: Callable[[st.SearchStrategy[Any]], Any] | None = None, rng: random.Random | None = None
    ) -> None:
        if (draw is None) == (rng is None):
            raise ValueError("give exactly one of draw, rng")
        self._draw, self._rng = draw, rng

    def choice(self, options: Sequence[Any]) -> Any:
        return self._draw(st.sampled_from(options)) if self._draw else self._rng.choice(options)  # type: ignore[union-attr]

    def integer(self, lo: int, hi: int) -> int:
        return self._draw(st.integers(lo, hi)) if self._draw else self._rng.randint(lo, hi)  # type: ignore[union-attr]

    def boolean(self) -> bool:
        return self.choice((False, True))


def make_random_topology(
    pick: Picker, *, gpus: int | None = None, homogeneous_memory: bool | None = None, nodes: int = 1
) -> Topology:
    """A random small topology: 1-4 GPUs per node, optional pinned memory, bandwidths from a short list."""
    g = gpus if gpus is not None else pick.integer(1, 4)
    pinned = pick.boolean()
    same = homogeneous_memory if homogeneous_memory is not None else pick.boolean()
    mem_gib = (1, 2, 3, 4, 6, 8)
    gpu_memory = [pick.choice(mem_gib)] * g if same else [pick.choice(mem_gib) for _ in range(g)]

    def bw() -> float:
        return float(pick.choice(_BW_GB_S)) * GB

    tables = []
    for _ in range(nodes):
        tables.append(
            Node(
                host_memory_bytes=pick.choice((2, 4, 16)) * GIB,
                pinned_memory_bytes=pick.choice((1, 2, 8)) * GIB if pinned else None,
                gpu_memory_bytes=tuple(m * GIB for m in gpu_memory),
                host_memcpy=bw(),
                gpu_local=tuple(pick.choice((400.0, 800.0, 1600.0)) * GB for _ in range(g)),
                host_to_gpu=tuple(bw() for _ in range(g)),
                gpu_to_host=tuple(bw() for _ in range(g)),
                pinned_to_gpu=tuple(bw() for _ in range(g)) if pinned else None,
                gpu_to_pinned=tuple(bw() for _ in range(g)) if pinned else None,
                gpu_to_gpu=tuple(tuple(0.0 if i == j else bw() for j in range(g)) for i in range(g)),
            )
        )
    return Topology(name="random", nodes=tuple(tables), inter_node=bw() if nodes > 1 else None)


@pytest.fixture(scope="session")
def random_topology() -> Callable[..., Topology]:
    """``random_topology(data.draw or random.Random(seed), gpus=..., homogeneous_memory=..., nodes=...)``."""

    def build(source: Any, **kw: Any) -> Topology:
        pick = Picker(rng=source) if isinstance(source, random.Random) else Picker(draw=source)
        return make_random_topology(pick, **kw)

    return build


def transition_bytes(d: int) -> int:
    """The paper's synthetic transition: float32 obs and next_obs of dimension d,
    int64 action, float32 reward, bool done."""
    return 2 * d * 4 + 8 + 4 + 1


@pytest.fixture(scope="session")
def sample_bytes_of() -> Callable[[int], int]:
    return transition_bytes
