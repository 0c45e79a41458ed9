"""Topology models: units, validation messages, bandwidth lookup, files, shipped machines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from conduit.errors import PlacementError
from conduit.placement import DeviceKind, Node, Topology, builtin_topology, list_builtin_topologies
from conduit.placement.units import GB, GIB, expand_unit_keys

SHIPPED = ("a100_2node", "a100_8x_nvlink", "mi250x_2node", "mi250x_8gcd")


def _node(**over: object) -> dict[str, object]:
    data: dict[str, object] = dict(
        gpus=2,
        host_memory_gib=16,
        pinned_memory_gib=4,
        gpu_memory_gib=8,
        host_memcpy_gb_per_s=20,
        gpu_local_gb_per_s=800,
        host_to_gpu_gb_per_s=12,
        gpu_to_host_gb_per_s=10,
        pinned_to_gpu_gb_per_s=25,
        gpu_to_pinned_gb_per_s=24,
        gpu_to_gpu_gb_per_s=300,
    )
    data.update(over)
    return data


def test_builtin_names() -> None:
    assert list_builtin_topologies() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_shipped_topology_round_trips(name: str, suffix: str, tmp_path: Path) -> None:
    topo = builtin_topology(name)
    path = tmp_path / f"{name}{suffix}"
    topo.save(path)
    again = Topology.load(path)
    assert again == topo
    assert again.to_dict() == topo.to_dict()
    assert [d.id for d in again.devices] == [d.id for d in topo.devices]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_topology_shape(name: str) -> None:
    topo = builtin_topology(name)
    nodes = 2 if "2node" in name else 1
    assert len(topo.nodes) == nodes
    assert len(topo.gpus()) == 8 * nodes
    assert all(n.has_pinned for n in topo.nodes)
    if nodes == 2:
        assert topo.inter_node == 25 * GB
        assert topo.bandwidth("node0/cuda:0", "node1/cuda:0") == 25 * GB
        assert topo.nodes[0] == topo.nodes[1]  # the YAML anchor reuses one node table


def test_mi250x_reads_the_paper(mi250x: Topology) -> None:
    bw = mi250x.bandwidth
    for a, b in ((0, 1), (2, 3), (4, 5), (6, 7)):
        assert bw(f"cuda:{a}", f"cuda:{b}") == bw(f"cuda:{b}", f"cuda:{a}") == 400 * GB
    assert {bw("cuda:0", f"cuda:{j}") / GB for j in range(1, 8)} == {400, 200, 100, 50}
    assert all(bw("cpu", f"cuda:{g}") < bw("pinned", f"cuda:{g}") == 72 * GB for g in range(8))
    agg = [sum(bw(f"cuda:{g}", f"cuda:{o}") for o in range(8) if o != g) for g in range(8)]
    assert min(agg[0::2]) > max(agg[1::2])  # even ranks 0/2/4/6 are the high-bandwidth ones
    assert mi250x.device("cuda:3").memory_bytes == int(63.5 * GIB)


def test_a100_is_uniform() -> None:
    topo = builtin_topology("a100_8x_nvlink")
    assert {topo.bandwidth(f"cuda:{i}", f"cuda:{j}") for i in range(8) for j in range(8) if i != j} == {300 * GB}
    assert topo.device("cuda:7").memory_bytes == 79 * GIB


def test_units_expand_and_scale() -> None:
    out = expand_unit_keys({"a_gb_per_s": [1, 2.5], "b_gib": 1.5, "c_gb": 2, "plain": 3})
    assert out == {"a": [1e9, 2.5e9], "b_bytes": int(1.5 * GIB), "c_bytes": 2 * GB, "plain": 3}
    assert isinstance(out["b_bytes"], int)


def test_hand_built_equals_file_units() -> None:
    canonical = Node(
        host_memory_bytes=16 * GIB,
        pinned_memory_bytes=4 * GIB,
        gpu_memory_bytes=(8 * GIB, 8 * GIB),
        host_memcpy=20e9,
        gpu_local=(800e9, 800e9),
        host_to_gpu=(12e9, 12e9),
        gpu_to_host=(10e9, 10e9),
        pinned_to_gpu=(25e9, 25e9),
        gpu_to_pinned=(24e9, 24e9),
        gpu_to_gpu=((0.0, 300e9), (300e9, 0.0)),
    )
    assert Node.from_units(**_node()) == canonical


def test_bandwidth_lookup(fake_topology: Topology) -> None:
    t = fake_topology
    assert t.bandwidth("cuda:1", "cuda:1") == 800 * GB  # same device: local copy rate
    assert t.bandwidth("cpu", "cpu") == t.bandwidth("cpu", "pinned") == 20 * GB
    assert t.bandwidth("cpu", "cuda:2") == 12 * GB
    assert t.bandwidth("cuda:2", "cpu") == 10 * GB
    assert t.bandwidth("pinned", "cuda:0") == t.bandwidth("cuda:0", "pinned") == 25 * GB
    assert t.bandwidth("cuda:0", "cuda:2") == 200 * GB
    assert t.bandwidth("node0/cuda:0", "cuda:1") == 400 * GB
    assert [d.kind for d in t.devices] == [DeviceKind.CPU, DeviceKind.PINNED] + [DeviceKind.GPU] * 4


def h200_vm(host_gather: float | None) -> Topology:
    """One H200 VM as profiled here (rounded): pageable host->GPU at a fifth of pinned->GPU."""
    return Topology(name="h200-vm", nodes=(Node(
        host_memory_bytes=120 * GIB, pinned_memory_bytes=60 * GIB, gpu_memory_bytes=(139 * GIB,),
        host_memcpy=18e9, host_gather=host_gather, gpu_local=(1.43e12,), host_to_gpu=(10.5e9,),
        gpu_to_host=(15.7e9,), pinned_to_gpu=(55e9,), gpu_to_pinned=(54e9,), gpu_to_gpu=((0.0,),),
    ),))


def test_deliveries_from_host_memory_add_the_gather_to_the_copy() -> None:
    t = h200_vm(host_gather=22e9)
    assert t.deliver_bandwidth("pinned", "cuda:0") == pytest.approx(1 / (1 / 22e9 + 1 / 55e9))
    assert t.deliver_bandwidth("cpu", "cuda:0") == pytest.approx(1 / (1 / 22e9 + 1 / 55e9))  # staged in pinned
    assert t.deliver_bandwidth("cpu", "cpu") == t.deliver_bandwidth("pinned", "cpu") == 22e9
    for src, dst in (("cuda:0", "cuda:0"), ("cuda:0", "cpu"), ("cuda:0", "pinned")):  # GPU rows: a copy
        assert t.deliver_bandwidth(src, dst) == t.bandwidth(src, dst)
    old = h200_vm(host_gather=None)  # topologies without a gather rate (files, hand-built) keep the copy rates
    for src in ("cpu", "pinned", "cuda:0"):
        for dst in ("cpu", "pinned", "cuda:0"):
            assert old.deliver_bandwidth(src, dst) == old.bandwidth(src, dst)


def test_a_gpu_learner_fed_from_host_memory_keeps_the_buffer_on_its_gpu_once_gathers_are_counted() -> None:
    from conduit.placement import PlacementKind, PlacementRequest, solve_placement

    request = PlacementRequest(actors="cpu", learners="cuda:0", capacity=100_000)
    # copy rates alone: pinned memory (an 18 GB/s memcpy in, a 55 GB/s DMA out) beats a 10.5 GB/s pageable write
    assert solve_placement(h200_vm(None), request, 8_000).placement.kind is PlacementKind.CPU_PINNED
    # with the gather before the DMA, the GPU wins, as it did measured (push + pull 0.79 ms vs 1.32 at dim 1,000)
    assert solve_placement(h200_vm(22e9), request, 8_000).placement.kind is PlacementKind.SINGLE_GPU


def test_cross_node_bandwidth_is_the_bottleneck() -> None:
    slow_host = Node.from_units(**_node(gpu_to_pinned_gb_per_s=[24, 6], pinned_to_gpu_gb_per_s=[25, 8]))
    t = Topology(name="two", nodes=(slow_host, slow_host), inter_node=12.5 * GB)
    assert t.bandwidth("node0/cuda:0", "node1/cuda:0") == 12.5 * GB
    assert t.bandwidth("node0/cuda:1", "node1/cuda:0") == 6 * GB  # GPU 1's host link is the bottleneck
    assert t.bandwidth("node0/cuda:0", "node1/cuda:1") == 8 * GB
    assert t.bandwidth("node1/cpu", "node0/pinned") == 12.5 * GB
    assert t.canonical_id("cuda:1") == "node0/cuda:1"  # a bare id means node 0


@pytest.mark.parametrize(
    ("change", "field", "expected"),
    [
        ({"host_to_gpu_gb_per_s": [12]}, "host_to_gpu", "expected 2 values"),
        ({"host_memory_gib": -1}, "nodes[0].host_memory_gib", "greater than 0 (received -1)"),
        ({"gpu_to_gpu_gb_per_s": [[None, 1]]}, "gpu_to_gpu", "expected a 2x2 matrix"),
        ({"gpu_to_gpu_gb_per_s": [[5, 1], [1, None]]}, "gpu_to_gpu[0][0]", "expected 0 or null on the diagonal"),
        ({"gpu_to_gpu_gb_per_s": [[None, 0], [1, None]]}, "gpu_to_gpu[0][1]", "expected a bandwidth > 0"),
        ({"pinned_memory_gib": None}, "pinned_to_gpu", "expected None"),
        ({"pinned_to_gpu_gb_per_s": None}, "pinned_to_gpu", "expected 2 values"),
        ({"gpu_memory_gib": [1, 2, 3]}, "gpu_memory_bytes", "expected 2 values"),
        ({"host_memcpy": 5.0}, "host_memcpy", "given twice"),
        ({"bogus_field": 1}, "bogus_field", "not a known key; valid keys: gpu_gather_gb_per_s, gpu_local_gb_per_s"),
        ({"host_memroy_gib": 1}, "host_memroy_gib", "did you mean 'host_memory_gib'?"),
        ({"gpus": -2}, "gpus", "expected a GPU count"),
    ],
)
def test_validation_names_the_field(change: dict[str, object], field: str, expected: str) -> None:
    with pytest.raises(PlacementError) as info:
        Topology.from_dict({"name": "bad", "nodes": [_node(**change)]})
    message = str(info.value)
    assert field in message and expected in message, message
    assert isinstance(info.value, ValueError)


def test_a_scalar_repeated_per_gpu_is_reported_once_in_the_files_units() -> None:
    with pytest.raises(PlacementError) as info:
        Topology.from_dict({"name": "bad", "nodes": [_node(gpu_memory_gib=-79)]})
    message = str(info.value)
    assert message.count("gpu_memory_gib") == 1 and "(received -79)" in message, message
    assert "bytes" not in message


def test_topology_level_validation() -> None:
    with pytest.raises(
        PlacementError, match="inter_node: expected a bandwidth for a topology with 2 nodes, received None"
    ):
        Topology.from_dict({"name": "two", "nodes": [_node(), _node()]})
    with pytest.raises(PlacementError, match="nodes: expected at least one node"):
        Topology(name="none", nodes=())
    with pytest.raises(PlacementError, match="name"):
        Topology.from_dict({"name": "", "nodes": [_node()]})


def test_unknown_device_lists_the_known_ones(fake_topology: Topology) -> None:
    with pytest.raises(PlacementError, match=r"expected one of cpu, pinned, cuda:0.*received 'cuda:9'"):
        fake_topology.bandwidth("cpu", "cuda:9")
    with pytest.raises(PlacementError, match="received 'node1/cpu'"):
        fake_topology.device("node1/cpu")


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(PlacementError, match=re.escape("expected a .json, .yaml or .yml extension, received '.toml'")):
        Topology.load(tmp_path / "t.toml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes: [ {host_memory_gib: 1, host_memcpy_gb_per_s: 0} ]\n")
    with pytest.raises(PlacementError, match=r"(?s)bad.yaml.*nodes\[0\]\.host_memcpy_gb_per_s: Input should be greater"):
        Topology.load(bad)
    listing = tmp_path / "list.json"
    listing.write_text(json.dumps([1, 2]))
    with pytest.raises(PlacementError, match="expected a mapping at the top level, received list"):
        Topology.load(listing)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(PlacementError, match="not valid JSON"):
        Topology.load(broken)
    with pytest.raises(PlacementError, match="cannot be read"):
        Topology.load(tmp_path / "missing.yaml")
    with pytest.raises(PlacementError, match="topology name: expected one of"):
        builtin_topology("dgx_h100")


def test_from_dict_is_to_dict_inverse(fake_topology: Topology) -> None:
    assert Topology.from_dict(fake_topology.to_dict()) == fake_topology
    with pytest.raises(PlacementError, match="nodes"):
        Topology.from_dict({"name": "x"})


def test_topology_is_frozen(fake_topology: Topology) -> None:
    with pytest.raises(ValidationError, match="frozen"):
        fake_topology.name = "other"  # type: ignore[misc]
