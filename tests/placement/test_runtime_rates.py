"""Alg. 1 priced with delivery rates measured the way the runtime pulls (issue #34), on fake GPU machines.

On one H200 the planner put a GPU learner's buffer in host memory: the live profile measured raw copies (a host
gather at 85 GB/s on 16 threads, pinned->GPU at 55 GB/s) while the runtime's pulls from host memory ran at
4-7 GB/s and the GPU-resident buffer was 1.6-2.6x faster per push and pull. With the runtime-path rates the
topology now carries, the same machine's choice is the GPU.
"""

from __future__ import annotations

import pytest

from conduit.errors import PlacementError
from conduit.placement import Node, PlacementRequest, Topology, solve_placement

H200_COPIES = dict(
    host_memory_bytes=120 << 30, pinned_memory_bytes=60 << 30, gpu_memory_bytes=(130 << 30,), host_memcpy=18e9,
    host_gather=85e9, gpu_local=(1.4e12,), host_to_gpu=(10e9,), gpu_to_host=(15e9,), pinned_to_gpu=(55e9,),
    gpu_to_pinned=(54e9,), gpu_to_gpu=((0.0,),),
)
AS_THE_RUNTIME_PULLS = dict(gpu_gather=(400e9,), host_deliver_to_gpu=(5e9,), pinned_deliver_to_gpu=(6e9,))


def _choice(extra: dict, capacity: int = 100_000, sample_bytes: int = 40_021) -> str:
    topo = Topology(name="h200", nodes=(Node(**H200_COPIES, **extra),))
    request = PlacementRequest(actors="cpu", learners="cuda:0", capacity=capacity)
    return str(solve_placement(topo, request, sample_bytes).placement)


def test_copy_rates_alone_put_a_gpu_learners_buffer_in_host_memory() -> None:
    """The failure as it was: priced by copy rates, host memory looks cheaper."""
    assert _choice({}).startswith("cpu_")


def test_runtime_path_rates_put_it_on_the_gpu_when_it_fits() -> None:
    assert _choice(AS_THE_RUNTIME_PULLS) == "single_gpu(cuda:0)"


def test_where_it_does_not_fit_the_gpu_is_not_chosen() -> None:
    # 130 GiB of GPU memory against 1,000,000 x 160 KB rows: host tiers (or nothing) only
    try:
        choice = _choice(AS_THE_RUNTIME_PULLS, capacity=1_000_000, sample_bytes=160_021)
    except PlacementError:
        return
    assert not choice.startswith("single_gpu")


@pytest.mark.parametrize(
    ("src", "expected"),
    [("cuda:0", 400e9), ("cpu", 5e9), ("pinned", 6e9)],
)
def test_deliver_bandwidth_uses_the_runtime_path_where_measured(src: str, expected: float) -> None:
    topo = Topology(name="h200", nodes=(Node(**H200_COPIES, **AS_THE_RUNTIME_PULLS),))
    assert topo.deliver_bandwidth(src, "cuda:0") == expected
    plain = Topology(name="h200", nodes=(Node(**H200_COPIES),))
    assert plain.deliver_bandwidth(src, "cuda:0") != expected  # the copy-rate model as before


def test_topology_files_take_the_runtime_path_rates_in_user_units() -> None:
    node = Node(**{**{k: v for k, v in H200_COPIES.items()}, "gpu_gather_gb_per_s": 400, "gpus": 1,
                   "host_deliver_to_gpu_gb_per_s": 5, "pinned_deliver_to_gpu_gb_per_s": 6})
    assert node.gpu_gather == (400e9,) and node.host_deliver_to_gpu == (5e9,) and node.pinned_deliver_to_gpu == (6e9,)
    with pytest.raises(PlacementError, match="gpu_gather: expected 1 values"):
        Node(**H200_COPIES, gpu_gather=(1e9, 2e9))
