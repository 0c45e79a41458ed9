"""The benchmark machinery, on tiny sizes: result structure, ratios and targets, missing peers, CLI JSON.

Nothing here asserts a timing: the numbers are whatever a tiny run measures;
the tests check what is reported and how.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
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
    assert "not installed" in missing["absent"].reason and "conduit-edp[bench]" in missing["absent"].reason
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
    with pytest.raises(MissingExtra, match=r"conduit-edp\[bench\]"):
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

#: a wheel's view: `import benchmarks` fails, and no checkout lies beside the installed package
ABSENT = """
import sys
import conduit

conduit.__file__ = {fake!r}  # cli/harness.py looks for the checkout beside the package: here, an empty folder
sys.modules["benchmarks"] = None  # and the harness cannot be imported from anywhere
from conduit.cli import harness as bench
from conduit.cli.main import app

assert bench.load_harness() is None and "benchmarks.cli" not in sys.modules
app(sys.argv[1:], prog_name="conduit")
"""


def _python(code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env
    )


@pytest.mark.parametrize(
    "args",
    [
        ["bench"],
        ["bench", "--help"],
        ["bench", "micro", "--dims", "8", "--json"],
        ["bench", "validate", "--g-max", "2", "--no-such-option"],
    ],
    ids=["bare", "help", "micro", "validate"],
)
def test_bench_without_the_harness_says_where_it_is_and_exits_1(tmp_path, args: list[str]) -> None:
    fake = tmp_path / "site-packages" / "conduit" / "__init__.py"
    done = _python(ABSENT.format(fake=str(fake)), *args, cwd=tmp_path)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "benchmark harness (benchmarks/) ships with the source, not the wheel" in done.stderr
    assert 'pip install -e ".[bench]"' in done.stderr and "python -m benchmarks" in done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr


def test_a_harness_that_fails_to_import_leaves_the_other_commands_working(tmp_path) -> None:
    code = """
import sys
sys.modules["benchmarks.report"] = None  # the harness is there, but one of its modules cannot be imported
from conduit.cli.main import app
app(sys.argv[1:], prog_name="conduit")
"""
    done = _python(code, "bench", "micro", "--dims", "8", cwd=ROOT)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "the benchmark harness (benchmarks/) failed to import" in done.stderr and "benchmarks.report" in done.stderr
    assert "Traceback" not in done.stderr
    done = _python(code, "plan", "--help", cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_bench_finds_the_harness_in_the_checkout_beside_the_package(tmp_path) -> None:
    """An editable install from a clone: `benchmarks` is not on sys.path (the console script's folder is, and
    TorchRL installs a namespace package of that name), yet `conduit bench` finds the clone's harness."""
    code = f"""
import sys
sys.path[:] = [p for p in sys.path if p not in ("", {str(ROOT)!r})]
import conduit.cli.harness as bench
import benchmarks
import benchmarks.cli
assert bench.app is benchmarks.cli.app, bench.app
print(benchmarks.__file__)
print(sorted(c.name for c in bench.app.registered_commands))
"""
    done = _python(code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    where, commands = done.stdout.splitlines()
    assert where == str(ROOT / "benchmarks" / "__init__.py")
    assert commands == str(["all", "micro", "synthetic", "validate"])


def test_import_conduit_imports_neither_the_cli_nor_the_harness() -> None:
    done = _python(
        "import sys, conduit; print(sorted(m for m in sys.modules if m.split('.')[0] == 'benchmarks' "
        "or m.startswith('conduit.cli')))",
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_python_m_benchmarks_runs_the_bench_commands() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "python -m benchmarks" in done.stdout
    for command in ("micro", "synthetic", "validate", "all"):
        assert command in done.stdout
