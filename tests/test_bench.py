"""The benchmark machinery, on tiny sizes: result structure, ratios and targets, missing peers, CLI JSON.

Nothing here asserts a timing: the numbers are whatever a tiny run measures;
the tests check what is reported and how.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import typer
from conduit.cli.main import app
from typer.testing import CliRunner

from benchmarks import peers as peers_mod
from benchmarks.loop_results import ConfigResult, SyntheticResult, SyntheticSettings, WorkloadResult, workloads
from benchmarks.micro import CaseResult, DimResult, MicroResult, MicroSettings, capacity_for, run_micro
from benchmarks.peers import MicroData, Missing, Op, Role, Sampling, load_peer
from benchmarks.peers_conduit import SharedStorage, micro_spec
from benchmarks.report import (
    MEMORY_BOUND_QUESTION,
    PEERS_QUESTION,
    micro_json,
    micro_ratios,
    micro_tables,
    micro_targets,
    to_markdown,
)
from benchmarks.report_loop import LOOP_QUESTION, loop_json, loop_tables, loop_targets
from benchmarks.timing import Stat, interleaved
from conduit.core import Mode, Policy, Schedule
from conduit.scheduling.model import Prediction
from conduit.scheduling.workload import CostKind, SyntheticWorkload, bracketed_exposed

TINY = MicroSettings(
    dims=(8,),
    capacity=1024,
    chunk=64,
    batch=32,
    repeats=2,
    block_s=1e-4,
    granularities=(1, 2),
    peers=("conduit", "torch", "numpy"),
)


class Ghost:  # a peer whose constructor fails although it imports
    def __init__(self, data: MicroData) -> None:
        raise RuntimeError("no accelerator for this peer")


@pytest.fixture
def ghost_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(peers_mod.PEERS, "absent", ("absentlib", "conduit_no_such_module:Peer"))
    monkeypatch.setitem(peers_mod.PEERS, "broken", ("brokenlib", f"{__name__}:Ghost"))


@pytest.fixture(scope="module")
def tiny_result() -> MicroResult:
    return run_micro(TINY)


# -- timing -----------------------------------------------------------------------
def test_interleaved_shuffles_neighbours_and_keeps_one_sample_per_repeat() -> None:
    order: list[str] = []
    cases = {name: (lambda n, name=name: order.append(name)) for name in "abcdef"}
    stats = interleaved(cases, 1, repeats=12, warmup=0)
    assert all(len(s.samples) == 12 for s in stats.values())
    repeats = [order[i : i + 6] for i in range(0, len(order), 6)]
    assert all(sorted(r) == list("abcdef") for r in repeats)  # every case once per repeat
    # no case always follows the same neighbour (a rotation would: the slow-neighbour bias)
    before = {name: {r[r.index(name) - 1] for r in repeats if r.index(name) > 0} for name in "abcdef"}
    assert all(len(prev) > 1 for prev in before.values())
    again: list[str] = []
    interleaved({n: (lambda k, n=n: again.append(n)) for n in "abcdef"}, 1, repeats=12, warmup=0)
    assert again == order  # seeded: the same order every run


def test_interleaved_rejects_zero_repeats() -> None:
    with pytest.raises(ValueError, match="repeats"):
        interleaved({"a": lambda n: None}, 1, repeats=0)


# -- micro ------------------------------------------------------------------------
def test_micro_result_has_every_role_and_byte_count(tiny_result: MicroResult) -> None:
    (d,) = tiny_result.dims
    assert d.capacity == 1024 and d.capacity_note is None
    bpt = 2 * 8 * 4 + 8 + 4 + 1
    assert d.bytes_per_transition == bpt
    for op, role in (
        (Op.INGEST, Role.CONDUIT),
        (Op.INGEST, Role.SLICE_COPY),
        (Op.INGEST, Role.NUMPY),
        (Op.DELIVER, Role.CONDUIT),
        (Op.DELIVER, Role.CONDUIT_GATHER),
        (Op.DELIVER, Role.CONDUIT_POOLED),
        (Op.DELIVER, Role.INDEX_SELECT),
        (Op.DELIVER, Role.INDEX_SELECT_SAME),
        (Op.DELIVER, Role.MEMCPY),
        (Op.DELIVER, Role.NUMPY),
    ):
        case = d.find(op, role)
        assert case is not None, (op, role)
        assert case.bytes_per_op == (64 if op is Op.INGEST else 32) * bpt
        assert len(case.stat.samples) == TINY.repeats and case.seconds > 0
    assert d.find(Op.DELIVER, Role.CONDUIT, Sampling.PRIORITIZED) is not None
    variants = {c.name for c in d.cases if c.role is Role.CONDUIT_VARIANT}
    assert "Conduit pull (overlap g=2)" in variants and "Conduit push (inline g=2)" in variants
    assert d.best_conduit(Op.DELIVER) is not None


def test_micro_json_carries_ratios_targets_and_missing(tiny_result: MicroResult) -> None:
    doc = json.loads(json.dumps(micro_json(tiny_result)))
    (d,) = doc["dims"]
    assert d["ratios"]["pull/index_select"] > 0
    assert d["ratios"]["torchrl/pull"] is None  # not asked for: no number, no invented one
    assert {t["question"] for t in doc["targets"]} == {MEMORY_BOUND_QUESTION, PEERS_QUESTION}
    assert doc["machine"]["nproc"] >= 1 and doc["machine"]["torch"]
    # the result's own records carry what was measured; the ratios and targets are the report's
    plain = json.loads(json.dumps(tiny_result.to_json()))
    assert "targets" not in plain and "ratios" not in plain["dims"][0]
    assert {k: v for k, v in d.items() if k != "ratios"} == plain["dims"][0]


def test_one_transition_chunks_are_timed_on_a_ring_filled_in_bulk() -> None:
    """``--chunk 1`` (a loop adding every environment step): the fill still writes 256 rows a call."""
    data = MicroData(8, 600, chunk=1)
    assert data.fill_chunks == 3 and data.fill_chunk(2)["obs"].shape == (256, 8)
    assert data.fill_chunk(2)["obs"][:, 0].tolist() == [float(i) for i in range(512, 768)]  # every row unique
    assert data.chunks[0]["obs"].shape == (1, 8)
    assert MicroData(8, 100).fill_chunk(0)["done"].shape == (100,)  # never more than the storage holds
    result = run_micro(MicroSettings(**{**TINY.__dict__, "chunk": 1, "granularities": (1,), "overlap": False}))
    (d,) = result.dims
    bpt = 2 * 8 * 4 + 8 + 4 + 1
    for role in (Role.CONDUIT, Role.SLICE_COPY, Role.NUMPY):
        case = d.find(Op.INGEST, role)
        assert case is not None and case.bytes_per_op == bpt and case.seconds > 0, role
    assert "extend by 1 transition (" in "".join(to_markdown(t) for t in micro_tables(result))


def test_a_missing_peer_is_reported_with_the_reason(ghost_peers: None) -> None:
    result = run_micro(MicroSettings(**{**TINY.__dict__, "peers": ("torch", "absent", "broken")}))
    missing = {m.name: m for m in result.dims[0].missing}
    assert "not installed" in missing["absent"].reason and '".[bench]" (in a clone of Conduit)' in missing["absent"].reason
    assert "no accelerator" in missing["broken"].reason
    text = "".join(to_markdown(t) for t in micro_tables(result))
    assert "missing: absent" in text and "missing: broken" in text


def test_load_peer_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown peer"):
        load_peer("nope", MicroData(4, 16))


def test_capacity_shrinks_to_the_memory_budget_and_says_so() -> None:
    cap, note = capacity_for(5000, MicroSettings(memory_gib=1.0))
    assert cap < 100_000 and note is not None and "1 GiB" in note
    assert capacity_for(128, MicroSettings()) == (100_000, None)


def test_shared_storage_hands_out_one_ring_and_rejects_another_layout() -> None:
    shared = SharedStorage()
    first, second = shared.create(micro_spec(4), 32), shared.create(micro_spec(4), 32)
    assert first.ring is second.ring is shared.storage
    with pytest.raises(ValueError):
        shared.create(micro_spec(5), 32)
    first.close()
    first.close()  # idempotent: one handle, one release
    assert shared.storage is not None  # the other runtime still reads the ring
    second.close()
    assert shared.storage is None


def _case(name: str, op: Op, role: Role, seconds: float, sampling: Sampling | None = None) -> CaseResult:
    sampling = sampling or (Sampling.UNIFORM if op is Op.DELIVER else Sampling.NONE)
    return CaseResult(name, "x", op, role, sampling, Stat((seconds,)), 1000, 1)


def test_ratios_and_verdicts_follow_the_targets() -> None:
    d = DimResult(
        1000,
        10,
        None,
        8013,
        cases=[
            _case("pull", Op.DELIVER, Role.CONDUIT, 1.0),
            _case("gather", Op.DELIVER, Role.CONDUIT_GATHER, 0.9),
            _case("isel", Op.DELIVER, Role.INDEX_SELECT, 0.9),
            _case("isel same", Op.DELIVER, Role.INDEX_SELECT_SAME, 0.8),
            _case("memcpy", Op.DELIVER, Role.MEMCPY, 0.5),
            _case("trl", Op.DELIVER, Role.TORCHRL, 3.0),
            _case("trl pf", Op.DELIVER, Role.TORCHRL_PREFETCH, 1.5),
            _case("cpprb", Op.DELIVER, Role.CPPRB, 1.2),
            _case("push", Op.INGEST, Role.CONDUIT, 1.0),
            _case("slice", Op.INGEST, Role.SLICE_COPY, 0.5),
            _case("extend", Op.INGEST, Role.TORCHRL, 2.5),
        ],
    )
    r = micro_ratios(d)
    assert r["pull/index_select"] == pytest.approx(1 / 0.9)
    assert r["pull/index_select_same_storage"] == pytest.approx(1 / 0.8)  # the baseline on Conduit's own ring
    assert r["gather_op/index_select_same_storage"] == pytest.approx(0.9 / 0.8)
    assert r["torchrl_best/pull"] == pytest.approx(1.5)  # against TorchRL's faster variant
    assert r["pull/memcpy"] == pytest.approx(2.0)
    targets = micro_targets(MicroResult(TINY, {}, [d]))
    verdicts = {t.detail: t.met for t in targets}
    assert verdicts == {
        "pull/index_select": True,
        "gather_op/index_select": True,
        "push/slice_copy": False,
        "torchrl_best/pull": False,
        "cpprb/pull": True,
        "pull/memcpy": False,
        "torchrl_extend/push": True,
    }
    questions = {t.detail: t.question for t in targets}
    assert {k for k, q in questions.items() if q == MEMORY_BOUND_QUESTION} == {
        "pull/index_select",
        "gather_op/index_select",
        "push/slice_copy",
        "pull/memcpy",
    }
    assert {k for k, q in questions.items() if q == PEERS_QUESTION} == {"torchrl_best/pull", "cpprb/pull", "torchrl_extend/push"}


# -- synthetic ----------------------------------------------------------------------
def test_workloads_sweep_policies_costs_dims_and_batches() -> None:
    ws = workloads(SyntheticSettings(dims=(128, 1000), batch_sizes=(32, 512)))
    off = [w for w in ws if w.policy is Policy.OFF_POLICY]
    on = [w for w in ws if w.policy is Policy.ON_POLICY]
    assert len(off) == 2 * 2 * 2 and len(on) == 2 * 2  # on-policy ignores the batch size
    assert {w.cost for w in ws} == {CostKind.COMPUTE, CostKind.SLEEP}


def _workload_result(policy: Policy, dim: int, inline: float, auto: float) -> WorkloadResult:
    w = SyntheticWorkload(policy=policy, dim=dim)
    one = Mode(False, 1)
    sched = Schedule(one, one)
    res = WorkloadResult(w, 0.002, 0.008, Prediction(0.0, 0.0, 0.0, 0.0, sched))
    res.configs = [
        ConfigResult("inline (RLlib-style)", "inline", "cpu", sched, 0.01 + inline, inline, 0.0),
        ConfigResult("Conduit auto", "auto", "cpu", sched, 0.01 + auto, auto, 1 - auto / inline),
        ConfigResult("GEAR-style (pinned CPU)", "gear", "pinned", sched, unavailable="needs CUDA"),
    ]
    return res


def test_exposed_latency_of_a_run_uses_the_alone_costs_measured_around_it() -> None:
    # the host slows down from the second run on: the alone costs around each run say so, and no run is charged
    runs = [("inline", 0.0110), ("auto", 0.0155), ("inline", 0.0162)]
    alone = [0.0100, 0.0100, 0.0150, 0.0150]
    exposed = bracketed_exposed(runs, alone)
    assert exposed["inline"] == pytest.approx([0.0010, 0.0012])
    assert exposed["auto"] == pytest.approx([0.0030])
    with pytest.raises(ValueError, match="2 runs need 3 alone measurements"):
        bracketed_exposed(runs[:2], alone[:2])


def test_loop_targets_need_a_70_percent_cut_off_policy_and_report_on_policy() -> None:
    result = SyntheticResult(
        SyntheticSettings(),
        {},
        [
            _workload_result(Policy.OFF_POLICY, 1000, 0.004, 0.001),
            _workload_result(Policy.OFF_POLICY, 5000, 0.004, 0.002),
            _workload_result(Policy.ON_POLICY, 1000, 0.004, 0.0001),
        ],
    )
    t = loop_targets(result)
    assert [x.met for x in t] == [True, False, None]
    assert {x.question for x in t} == {LOOP_QUESTION}
    assert [x["met"] for x in loop_json(result)["targets"]] == [True, False, None]
    assert t[2].verdict == "reported" and t[2].value == pytest.approx(0.975)
    text = "".join(to_markdown(tb) for tb in loop_tables(result))
    assert "unavailable" in text and "needs CUDA" in text


def test_a_burn_that_strayed_from_its_target_is_noted_under_its_table() -> None:
    on_target = _workload_result(Policy.OFF_POLICY, 1000, 0.004, 0.001)
    slow_host = _workload_result(Policy.OFF_POLICY, 5000, 0.004, 0.001)
    slow_host.t_rollout = 0.0026  # the 2 ms rollout burn measured 2.6 ms alone
    sleeping = _workload_result(Policy.OFF_POLICY, 1000, 0.004, 0.001)
    sleeping.workload = sleeping.workload.with_(cost=CostKind.SLEEP)
    sleeping.t_rollout = 0.003  # a sleep is no calibrated burn: never noted
    tables = loop_tables(SyntheticResult(SyntheticSettings(), {}, [on_target, slow_host, sleeping]))
    compute, sleep = tables[0], tables[1]
    strayed = [n for n in compute.notes if "strayed" in n]
    assert len(strayed) == 1 and "dim 5,000, batch 512: 2.60 ms for 2.00" in strayed[0]
    assert "dim 1,000" not in strayed[0]
    assert not any("strayed" in n for n in sleep.notes)


# -- CLI ----------------------------------------------------------------------------
MICRO_ARGS = [
    "bench",
    "micro",
    "--dims",
    "8",
    "--capacity",
    "512",
    "--repeats",
    "1",
    "--block-ms",
    "0.1",
    "--granularities",
    "1",
    "--no-overlap",
    "--peers",
    "torch,numpy,conduit,absent",
    "--json",
]


def test_cli_micro_writes_json_to_stdout(ghost_peers: None) -> None:
    result = CliRunner().invoke(app, MICRO_ARGS)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (d,) = doc["dims"]
    assert {c["library"] for c in d["cases"]} >= {"torch", "numpy", "conduit", "memcpy"}
    assert [m["name"] for m in d["missing"]] == ["absent"]
    assert doc["settings"]["threads"] == 1


def test_cli_micro_chunk_sets_the_ingestion_call_size() -> None:
    args = list(MICRO_ARGS)
    args[args.index("torch,numpy,conduit,absent")] = "torch,conduit"
    result = CliRunner().invoke(app, [*args, "--chunk", "1"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["settings"]["chunk"] == 1
    push = next(c for c in doc["dims"][0]["cases"] if c["name"] == "Conduit push (inline g=1)")
    assert push["bytes_per_op"] == 2 * 8 * 4 + 8 + 4 + 1  # one transition
    assert CliRunner().invoke(app, ["bench", "micro", "--chunk", "0"]).exit_code != 0


def test_cli_rejects_unknown_peers_and_bad_dims() -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["bench", "micro", "--peers", "reverb"]).exit_code != 0
    assert runner.invoke(app, ["bench", "micro", "--dims", "a,b"]).exit_code != 0
    assert runner.invoke(app, ["bench", "synthetic", "--policy", "sideways"]).exit_code != 0


def test_plot_without_matplotlib_fails_clearly(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from benchmarks.plot import MissingExtra, require_matplotlib

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtra, match=r"\.\[bench\]\" \(in a clone"):
        require_matplotlib()
    result = CliRunner().invoke(app, ["bench", "micro", "--plot", str(tmp_path / "x.png")])
    assert result.exit_code != 0 and "matplotlib" in result.output


def test_plot_writes_a_png(tiny_result: MicroResult, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks.plot import plot_micro

    path = plot_micro(tiny_result, tmp_path / "micro.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_synthetic_json_on_a_tiny_loop() -> None:
    args = [
        "bench",
        "synthetic",
        "--dims",
        "16",
        "--batch-sizes",
        "32",
        "--unit-size",
        "32",
        "--capacity",
        "512",
        "--policy",
        "off",
        "--cost",
        "sleep",
        "--rollout-ms",
        "0.2",
        "--update-ms",
        "0.5",
        "--iterations",
        "2",
        "--warmup",
        "1",
        "--repeats",
        "1",
        "--g-max",
        "2",
        "--json",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (w,) = doc["workloads"]
    kinds = {c["kind"]: c for c in w["configs"]}
    assert {"inline", "reverb", "gear", "overlap", "auto"} <= set(kinds)
    assert kinds["inline"]["reduction_vs_inline"] == pytest.approx(0.0)
    assert kinds["auto"]["t_iter_s"] > 0 and kinds["auto"]["schedule"] is not None
    assert (kinds["gear"]["unavailable"] is None) == doc["machine"]["cuda"]
    assert doc["targets"] and doc["targets"][0]["question"] == LOOP_QUESTION
    # each run's exposed latency can be recomputed from the run order and the alone costs measured around it
    assert len(w["alone_s"]) == len(w["run_order"]) + 1
    i = w["run_order"].index(kinds["inline"]["name"])
    recomputed = kinds["inline"]["samples_s"][0] - (w["alone_s"][i] + w["alone_s"][i + 1]) / 2
    assert kinds["inline"]["exposed_samples_s"][0] == pytest.approx(recomputed)


def test_markdown_document_has_both_sections(tiny_result: MicroResult) -> None:
    from benchmarks.document import markdown_document

    synthetic = SyntheticResult(
        SyntheticSettings(),
        {"placements": ["cpu"]},
        [
            _workload_result(Policy.OFF_POLICY, 1000, 0.004, 0.001),
        ],
    )
    text = markdown_document(tiny_result, synthetic)
    assert text.index("## Micro-benchmarks") < text.index("## Synthetic loop")
    assert "Machine: " in text and "| Conduit pull (inline g=1) |" in text and "placements on this machine: cpu" in text
    # the targets' tables name the question each row answers, never a tracker's issue number
    assert "| question | target | criterion |" in text and "| question | criterion | workload |" in text
    for question in (MEMORY_BOUND_QUESTION, PEERS_QUESTION, LOOP_QUESTION):
        assert f"| {question} |" in text
    assert "| #" not in text and "issue" not in text.lower()


def test_missing_is_json_friendly() -> None:
    assert Missing("a", "b", "c").to_json() == {"name": "a", "library": "b", "reason": "c"}


def test_the_one_command_behind_benchmarks_md_names_commands_that_exist() -> None:
    """scripts/bench-all.sh reproduces every table of BENCHMARKS.md: it must parse, and every script and example
    it runs must exist and be the ones BENCHMARKS.md lists for its RLlib tables."""
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = root / "scripts" / "bench-all.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    runs = re.findall(r"^\s*rllib (\S+\.py)(.*)$", script.read_text(), flags=re.M)
    assert len(runs) >= 5
    listed = (root / "BENCHMARKS.md").read_text()
    for path, args in runs:
        assert (root / path).is_file(), path
        assert f"python {path}{args}".rstrip() in listed or f"{path}{args}".rstrip() in listed, (path, args)


def test_tables_print_schedules_verbatim_in_the_terminal():
    """A schedule reads "ingestion[overlap g=1]": rich must not take the brackets for a style and drop them."""
    from rich.console import Console

    from benchmarks.cli import _render
    from benchmarks.report import TableData

    console = Console(record=True, width=200)
    cell = "ingestion[overlap g=1] delivery[inline g=2] (0.79)"
    _render(console, TableData("t", ["configuration", "dim 1,000"], [["Conduit's schedule", cell]], ["[note] kept"]))
    text = console.export_text()
    assert cell in text and "[note] kept" in text


def test_a_workload_recalibrates_the_compute_burn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The burn is measured again per workload: a calibration from a slower stretch of the host would burn
    other than the workload's cost for the rest of the sweep."""
    from conduit.scheduling.workload import Burner

    Burner(CostKind.COMPUTE)
    monkeypatch.setitem(Burner._calibration, 256, 1.0)  # as if one matmul had taken a second
    Burner(CostKind.COMPUTE)
    assert Burner._calibration[256] == 1.0  # a new burner keeps the process's calibration
    Burner.recalibrate()
    assert 0 < Burner._calibration[256] < 0.1



@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only answer; scripts/gpu-checks.sh runs the check on GPUs")
def test_the_gpu_scripts_parse_and_say_there_is_nothing_to_check_without_cuda() -> None:
    """CI has no GPU: the device check must at least import, parse its arguments and exit 0 where CUDA is absent
    (on a GPU machine scripts/gpu-checks.sh runs it for real)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    subprocess.run(["bash", "-n", str(root / "scripts" / "gpu-checks.sh")], check=True)
    done = subprocess.run(
        [sys.executable, str(root / "scripts" / "gpu_check.py"), "--dims", "8", "16"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "no CUDA device on this machine" in done.stdout


# -- `conduit bench` where the harness is, and where it is not -------------------------
ROOT = Path(__file__).resolve().parents[1]

ABSENT_INVOCATIONS = [
    ["bench"],
    ["bench", "--help"],
    ["bench", "micro", "--dims", "8", "--json"],
    ["bench", "validate", "--g-max", "2", "--no-such-option"],
]


def _python(code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT.resolve()]
    if kept:  # the checkout stays off the path; packages a machine supplies through PYTHONPATH stay on it
        env["PYTHONPATH"] = os.pathsep.join(kept)
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env
    )


def _conduit(bench: typer.Typer) -> typer.Typer:
    """``conduit`` with this ``bench`` (what cli/main.py assembles)."""
    from conduit.cli.main import app as main

    root = typer.Typer()
    for command in main.registered_commands:
        root.registered_commands.append(command)
    root.add_typer(bench, name="bench")
    return root


def test_bench_without_the_harness_says_where_it_is_and_exits_1(tmp_path, monkeypatch) -> None:
    """A wheel's view: `import benchmarks` fails, no checkout lies beside the package; every invocation (bare,
    --help, a command, a command with a bad option) says where the harness is."""
    from conduit.cli import harness

    monkeypatch.setitem(sys.modules, "benchmarks", None)  # the harness cannot be imported from anywhere
    monkeypatch.setitem(sys.modules, "benchmarks.cli", None)
    monkeypatch.setattr(harness, "CHECKOUT", tmp_path / "site-packages")  # and no checkout beside the package
    assert harness.load_harness() is None
    conduit_app = _conduit(harness._make_app())
    for args in ABSENT_INVOCATIONS:
        result = CliRunner().invoke(conduit_app, args, prog_name="conduit")
        assert result.exit_code == 1, (args, result.output)
        assert "benchmark harness (benchmarks/) ships with the source, not the wheel" in result.output, args
        assert 'pip install -e ".[bench]"' in result.output and "python -m benchmarks" in result.output, args
        assert result.exception is None or isinstance(result.exception, SystemExit), args


def test_a_harness_that_fails_to_import_leaves_the_other_commands_working(monkeypatch) -> None:
    from conduit.cli import harness

    monkeypatch.delitem(sys.modules, "benchmarks.cli", raising=False)
    monkeypatch.setitem(sys.modules, "benchmarks.report", None)  # the harness is there, a module of it is not
    conduit_app = _conduit(harness._make_app())  # builds a stand-in instead of raising
    result = CliRunner().invoke(conduit_app, ["bench", "micro", "--dims", "8"], prog_name="conduit")
    assert result.exit_code == 1, result.output
    assert "the benchmark harness (benchmarks/) failed to import" in result.output
    assert "benchmarks.report" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(conduit_app, ["plan", "--help"], prog_name="conduit")
    assert result.exit_code == 0 and "Usage: conduit plan" in result.output, result.output


def test_bench_finds_the_harness_in_the_checkout_beside_the_package(tmp_path) -> None:
    """An editable install from a clone: `benchmarks` is not on sys.path (the console script's folder is, and
    TorchRL installs a namespace package of that name), yet `conduit bench` finds the clone's harness."""
    code = f"""
import sys
sys.path[:] = [p for p in sys.path if p not in ("", {str(ROOT)!r})]
import conduit.cli.harness as bench
found = bench.app  # built on first access: finds the checkout's harness and puts the checkout on sys.path
import benchmarks
import benchmarks.cli
assert found is benchmarks.cli.app, found
print(benchmarks.__file__)
print(sorted(c.name for c in bench.app.registered_commands))
"""
    done = _python(code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    where, commands = done.stdout.splitlines()
    assert where == str(ROOT / "benchmarks" / "__init__.py")
    assert commands == str(["all", "micro", "summary", "synthetic", "validate"])


def test_python_m_benchmarks_runs_the_bench_commands(monkeypatch, capsys) -> None:
    import runpy

    monkeypatch.setattr(sys, "argv", ["python -m benchmarks", "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("benchmarks", run_name="__main__")  # what `python -m benchmarks --help` runs
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "python -m benchmarks" in out
    for command in ("micro", "synthetic", "validate", "all", "summary"):
        assert command in out


# -- the summary page (`conduit bench summary`) -----------------------------------------------------------------------
SUMMARY_QUESTIONS = ("Delivery and ingestion", "Ratios and targets", "The synthetic loop", "The cost model")


def _sections(text: str) -> dict[str, str]:
    parts = text.split("\n### ")[1:]
    return {p.split("\n", 1)[0]: p for p in parts}


def _row(section: str, label: str) -> list[str]:
    line = next(ln for ln in section.splitlines() if ln.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split(" | ")]


def _summary_synthetic() -> SyntheticResult:
    from dataclasses import replace

    spread = _workload_result(Policy.OFF_POLICY, 1000, 0.004, 0.001)
    spread.configs = [
        replace(c, exposed_samples=(c.exposed * 0.8, c.exposed, c.exposed * 1.5)) if c.exposed else c
        for c in spread.configs
    ]
    machine = {"nproc": 2, "cpu_model": "test CPU", "torch": torch.__version__, "load_avg": [0.5], "cuda": False}
    return SyntheticResult(
        SyntheticSettings(repeats=3), machine, [spread, _workload_result(Policy.ON_POLICY, 5000, 0.004, 0.002)]
    )


def _summary_validation() -> dict:
    from benchmarks.cli import validation_settings

    one, two = Mode(False, 1), Mode(True, 2)
    best, auto = Schedule(two, one).to_json(), Schedule(one, one).to_json()
    dims = [
        {"dim": 1000, "configs": 16, "best_schedule": best, "best_t_iter_s": 0.010, "auto_schedule": auto,
         "auto_t_iter_s": 0.0105, "auto_vs_best": 1.05},
    ]
    return {"pearson_r": 0.953, "mape_pct": 8.14, "dimensions": dims, "settings": validation_settings({}, [1000], 3)}


@pytest.fixture(scope="module")
def summary_doc(tiny_result: MicroResult) -> dict:
    """What `conduit bench all --json` prints, for the tiny run (and a hand-made loop and validation)."""
    doc = {"micro": micro_json(tiny_result), "synthetic": loop_json(_summary_synthetic()), "validation": None}
    doc["validation"] = _summary_validation()
    return json.loads(json.dumps(doc, default=str))


def test_fmt_spread_reads_median_and_range_in_the_median_unit() -> None:
    from benchmarks.summary import fmt_ms, fmt_spread, fmt_time

    assert fmt_spread({"median_s": 97e-6, "samples_s": [91e-6, 97e-6, 130e-6]}) == "97 µs [91–130]"
    assert fmt_spread({"median_s": 4.24e-6, "samples_s": [4.1e-6, 5.0e-6]}) == "4.2 µs [4.1–5.0]"
    assert fmt_spread({"median_s": 1.234e-3, "samples_s": [1.2e-3, 1.31e-3]}) == "1.23 ms [1.20–1.31]"
    assert fmt_spread({"median_s": 0.95e-3, "samples_s": [0.9e-3, 1.2e-3]}) == "950 µs [900–1,200]"
    assert fmt_spread({"median_s": 97e-6, "samples_s": [97e-6]}) == "97 µs"  # one repeat: no spread to show
    assert fmt_spread(None) == "–" and fmt_time(None) == "–" and fmt_time(0.0123) == "12.3 ms"
    assert fmt_ms(0.00412, [0.0039, 0.0045, 0.0041]) == "4.12 [3.90–4.50]" and fmt_ms(0.004) == "4.00"


def test_summary_has_one_table_per_question_with_spreads_and_dashes(summary_doc: dict, tiny_result: MicroResult):
    from benchmarks.document import machine_line
    from benchmarks.summary import fmt_spread, summary_markdown

    text = summary_markdown(summary_doc)
    sections = _sections(text)
    assert list(sections) == list(SUMMARY_QUESTIONS)
    for title, body in sections.items():
        assert sum(ln.startswith("|---") for ln in body.splitlines()) == 1, title  # one table each
        caption = body.split("\n")[2]
        assert caption.startswith("_") and ("repeats" in caption or "rounds" in caption), caption
        assert "capacity" in caption and "batch" in caption, caption  # the run's settings
        assert "Machine: " in body, title
    delivery = sections["Delivery and ingestion"]
    assert machine_line(tiny_result) in delivery  # the same words as the long tables' machine line
    assert "over 2 interleaved repeats" in delivery and "capacity 1,024" in delivery and "batch of 32" in delivery
    (d,) = tiny_result.dims
    push = d.find(Op.INGEST, Role.CONDUIT)
    assert push is not None
    assert _row(delivery, "Conduit push (inline g=1)") == ["Conduit push (inline g=1)", fmt_spread(push.stat.to_json())]
    spread = re.compile(r"^[\d.,]+ (µs|ms) \[[\d.,]+–[\d.,]+\]$")
    for label in ("torch slice copy", "Conduit pull (inline g=1)", "torch index_select(out=) (the plain ring)",
                  "memcpy (same bytes)", "Conduit pull prioritized"):
        assert spread.match(_row(delivery, label)[1]), label
    for label in ("TorchRL sample (its faster variant)", "cpprb sample", "cpprb sample prioritized"):
        assert _row(delivery, label)[1] == "–", label  # not asked for in the tiny run: a dash, no invented figure
    assert len(text.splitlines()) < 250


def test_summary_verdicts_are_the_harness_targets(summary_doc: dict, tiny_result: MicroResult) -> None:
    from benchmarks.summary import summary_markdown

    ratios = _sections(summary_markdown(summary_doc))["Ratios and targets"]
    targets = micro_targets(tiny_result)
    assert len({t.detail for t in targets}) == 7
    for t in targets:
        row = next(ln for ln in ratios.splitlines() if f"| {t.detail} {'≤' if t.at_most else '≥'} " in ln)
        cell = row.strip("|").split(" | ")[-1].strip()
        if t.value is None:
            assert cell == "–", t.detail
        else:
            assert cell == f"{t.value:.2f} {'met' if t.met else '**missed**'}", t.detail
    assert "for reference only" in ratios  # the tiny run's chunks and batches are not the targets' shape


def test_summary_of_the_loop_and_the_cost_model(summary_doc: dict) -> None:
    from benchmarks.summary import summary_markdown

    sections = _sections(summary_markdown(summary_doc))
    loop = sections["The synthetic loop"]
    off = _row(loop, "off-policy (DQN-like)")
    assert off[2:] == ["1,000", "inline g=1 / inline g=1", "4.00 [3.20–6.00]", "1.00 [0.80–1.50]", "75% met"]
    on = _row(loop, "on-policy (PPO-like)")
    assert on[4:] == ["4.00", "2.00", "50%"]  # no per-repeat exposed times in this record: medians, and a note
    assert "medians only" in loop and "over 3 interleaved repeats" in loop and "capacity 20,000" in loop
    model = sections["The cost model"]
    assert "**Pearson r = 0.953, MAPE = 8.1%** over 16 configurations" in model
    assert _row(model, "1,000") == [
        "1,000", "16", "10.00 (overlap g=2 / inline g=1)", "10.50 (inline g=1 / inline g=1)", "1.050"
    ]
    assert "3 interleaved sweep rounds" in model and "batch 512" in model


def test_summary_renders_one_command_s_own_json_and_rejects_others(summary_doc: dict) -> None:
    from benchmarks.summary import summary_markdown

    assert list(_sections(summary_markdown(summary_doc["micro"]))) == list(SUMMARY_QUESTIONS[:2])
    assert list(_sections(summary_markdown(summary_doc["synthetic"]))) == ["The synthetic loop"]
    with pytest.raises(ValueError, match="not a benchmark document"):
        summary_markdown({"rows": []})


def test_cli_summary_round_trips_a_saved_json(summary_doc: dict, tmp_path: Path) -> None:
    from benchmarks.summary import summary_markdown

    saved = tmp_path / "bench-all.json"
    saved.write_text(json.dumps(summary_doc, indent=2))
    runner = CliRunner()
    done = runner.invoke(app, ["bench", "summary", str(saved)])
    assert done.exit_code == 0, done.output
    assert done.stdout == summary_markdown(summary_doc)
    out = tmp_path / "page" / "summary.md"
    done = runner.invoke(app, ["bench", "summary", str(saved), "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert out.read_text() == summary_markdown(summary_doc) and "## Summary" not in done.stdout
    (tmp_path / "broken.json").write_text("{not json")
    assert runner.invoke(app, ["bench", "summary", str(tmp_path / "broken.json")]).exit_code != 0
    assert runner.invoke(app, ["bench", "summary", str(tmp_path / "absent.json")]).exit_code != 0


def test_bench_all_save_json_writes_the_json_document_and_prints_the_tables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_result: MicroResult, summary_doc: dict
) -> None:
    """`conduit bench all --save-json F` (here on the tiny results): F holds what --json prints, the console the
    tables, and `conduit bench summary F` renders it."""
    from benchmarks import cli

    synthetic = _summary_synthetic()
    validation = {k: v for k, v in _summary_validation().items() if k != "settings"}
    monkeypatch.setattr(cli, "run_micro_cli", lambda *a: tiny_result)
    monkeypatch.setattr(cli, "run_synthetic_cli", lambda *a: synthetic)
    monkeypatch.setattr(cli, "run_validation", lambda *a: json.loads(json.dumps(validation)))
    saved = tmp_path / "out" / "bench-all.json"
    runner = CliRunner()
    done = runner.invoke(app, ["bench", "all", "--save-json", str(saved)])
    assert done.exit_code == 0, done.output
    unwrapped = done.stdout.replace("\n", "")  # the console wraps long lines, a long temporary path among them
    assert "Targets" in done.stdout and "bench-all.json" in unwrapped  # the tables still print
    printed = runner.invoke(app, ["bench", "all", "--json"])
    assert printed.exit_code == 0, printed.output
    doc = json.loads(saved.read_text())
    assert doc == json.loads(printed.stdout)
    assert doc["validation"]["settings"] == cli.validation_settings({}, cli.VALIDATION_DIMS, cli.VALIDATION_G_MAX)
    assert doc["micro"] == summary_doc["micro"] and doc["synthetic"] == summary_doc["synthetic"]
    page = runner.invoke(app, ["bench", "summary", str(saved)])
    assert page.exit_code == 0, page.output
    assert list(_sections(page.stdout)) == list(SUMMARY_QUESTIONS)


def test_bench_all_sh_starts_its_output_with_the_summary_of_the_saved_json() -> None:
    script = (ROOT / "scripts" / "bench-all.sh").read_text()
    run = script.index('bench all --markdown "$part" --plot-dir "$figures" --save-json "$results"')
    summary = script.index('bench summary "$results" >>"$out"')
    assert run < summary < script.index('cat "$part" >>"$out"')
    assert 'results="$figures/bench-all.json"' in script and 'figures="$(dirname "$out")"' in script
    assert "--only-rllib) conduit_part=0" in script and "--no-rllib) rllib_part=0" in script


def test_summary_names_a_missing_peer_and_its_reason(ghost_peers: None) -> None:
    from benchmarks.summary import summary_markdown

    result = run_micro(MicroSettings(**{**TINY.__dict__, "peers": ("torch", "absent"), "granularities": (1,)}))
    delivery = _sections(summary_markdown(json.loads(json.dumps(micro_json(result)))))["Delivery and ingestion"]
    assert _row(delivery, "Conduit pull (inline g=1)")[1] == "–"  # Conduit not asked for: no figure
    assert _row(delivery, "torch index_select(out=) (the plain ring)")[1] != "–"
    assert "_–: not measured in this run" in delivery and "_missing: absent — " in delivery
