"""`conduit profile` end to end with typer's CliRunner (tiny workloads)."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
import torch
from conduit.cli.main import app
from typer.testing import CliRunner

from conduit.samplers import sumtree
from conduit.scheduling.noise import Spread, beats, noise
from conduit.storage import streaming

TINY = ["--dim", "16", "--unit-size", "32", "--batch-size", "32", "--capacity", "2048", "--rollout-ms", "0.2", "--update-ms", "0.5"]


def _coarseness(schedule: dict) -> Fraction:
    """Units and batches grouped beyond one per path, from the JSON alone."""
    g = [Fraction(schedule[path]["granularity"]) for path in ("ingestion", "delivery")]
    return sum((x - 1 for x in g if x >= 1), Fraction(0))


def test_profile_json_reports_costs_candidates_and_a_feasible_plan():
    result = CliRunner().invoke(app, ["profile", "--json", "--no-check", *TINY])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["machine"]["native_sumtree"] is sumtree.NATIVE  # which sum-tree prioritized replay runs on
    assert doc["machine"]["streaming_writes"] is streaming.AVAILABLE
    assert {w["workload"]["policy"] for w in doc["workloads"]} == {"off_policy", "on_policy"}
    for w in doc["workloads"]:
        costs = w["costs"]
        assert costs["t_rollout_s"] > 0 and costs["t_update_s"] > 0
        assert costs["t_ing_s"] and costs["t_del_s"]
        cands = w["candidates"]
        assert cands == sorted(cands, key=lambda c: c["t_iter_s"])
        placement = w["placement"]  # Alg. 1 on the live topology: without a GPU, host memory for a CPU learner
        assert placement["chosen"] == w["plan"]["placement"]
        if torch.cuda.is_available():  # the learner takes the GPU; Alg. 1 picks among GPU, pinned and pageable
            assert placement["learner"] == "cuda:0"
        else:
            assert placement["learner"] == "cpu" and placement["chosen"] == "cpu_pageable(cpu)"
        assert not {"chosen", "kept"} & set(w)  # one answer: ``plan``; the choices behind it are named as such
        rows = w["workload"]["capacity"] if w["workload"]["policy"] == "off_policy" else 2 * (32 * 4 + 32)
        assert placement["rows"] == rows
        assert w["model_choice"]["schedule"] == cands[0]["schedule"]
        verified = {json.dumps(v["schedule"], sort_keys=True): v["t_iter_s"] for v in w["verified"]}
        key = [json.dumps(c["schedule"], sort_keys=True) for c in cands]
        expected, families = key[:3], {}
        for k, c in zip(key, cands):  # the model's three best, then each overlap family's best and finest
            family = (c["schedule"]["ingestion"]["overlap"], c["schedule"]["delivery"]["overlap"])
            families.setdefault(family, []).append((k, c["schedule"]))
        for members in families.values():
            expected.append(members[0][0])
            expected.append(min(members, key=lambda m: _coarseness(m[1]))[0])
        inline = json.dumps(w["baseline"]["schedule"], sort_keys=True)
        cut = any("time budget ran out" in n for n in w["notes"])  # a busy host: the budget stops the shortlist
        assert set(verified) <= set(expected) | {inline}
        assert cut or set(verified) == set(expected) | {inline}  # the shortlist, and the inline baseline
        if not cut:  # the profiler's rules under a cut budget are tested on a virtual clock (test_profile_decisions)
            runs = {json.dumps(v["schedule"], sort_keys=True): Spread(v["t_iter_s"], v["low_s"], v["high_s"]) for v in w["verified"]}
            # the documented rule, from the JSON alone (after any rematch): a schedule counts only where it beats
            # inline by more than the runs' noise (inline always counts), so a finer one that does not never hides
            # a coarser one that does; of those, the ties of the fastest within the noise; the finest of them,
            # then inline, then the model's order
            counted = [(k, c["schedule"]) for k, c in zip(key, cands)
                       if k in runs and (k == inline or beats(runs[k], runs[inline], 0.03))]
            fastest = min(runs[k].median for k, _ in counted)
            best = next(k for k, _ in counted if runs[k].median == fastest)
            tied = [(k, m) for k, m in counted if runs[k].median - fastest <= noise(runs[k], runs[best], 0.03)]
            plan = min(tied, key=lambda t: (_coarseness(t[1]), t[1]["ingestion"]["overlap"] or t[1]["delivery"]["overlap"]))[0]
            assert json.dumps(w["verified_choice"]["schedule"], sort_keys=True) == plan
            kept = inline if w["check"].get("outcome") == "inline" else plan
            assert json.dumps(w["plan"]["schedule"], sort_keys=True) == kept
        for v in w["verified"]:  # every measured time carries its spread, and none is negative
            assert 0 <= v["low_s"] <= v["t_iter_s"] <= v["high_s"] and v["runs"] >= 1
        if w["workload"]["policy"] == "on_policy":
            for c in cands:
                for path in ("ingestion", "delivery"):
                    mode = c["schedule"][path]
                    assert (not mode["overlap"] and mode["granularity"] == "1") or (
                        mode["overlap"] and mode["granularity"] != "1"
                    )


def test_profile_prints_tables_and_a_plan():
    result = CliRunner().invoke(app, ["profile", "--policy", "off", *TINY])
    assert result.exit_code == 0, result.output
    for text in ("Profiled costs", "Candidate schedules", "Plan:", "Measured:", "prioritized sum-tree: "):
        assert text in result.output


def test_on_a_gpu_machine_the_profile_names_the_placement_a_gpu_learner_gets(monkeypatch):
    """The placement line comes from Alg. 1 on the live topology (here a hand-built one GPU machine)."""
    import conduit.cli.profile as profile_module

    from conduit.placement import Node, Topology

    gpu = Topology(name="one-gpu", nodes=(Node(
        host_memory_bytes=64 << 30, pinned_memory_bytes=32 << 30, gpu_memory_bytes=(80 << 30,), host_memcpy=18e9,
        host_gather=22e9, gpu_local=(1.4e12,), host_to_gpu=(10.5e9,), gpu_to_host=(15e9,), pinned_to_gpu=(55e9,),
        gpu_to_pinned=(54e9,), gpu_to_gpu=((0.0,),),
    ),))
    monkeypatch.setattr(profile_module, "_topology", lambda deadline: gpu)
    result = CliRunner().invoke(app, ["profile", "--policy", "off", "--no-check", *TINY])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "Plan: placement single_gpu(cuda:0)" in text
    assert "learner on cuda:0: single_gpu(cuda:0)" in text and "next cpu_pageable(cpu)" in text
    assert "The loop above ran in host memory with a CPU learner" in text


def test_profile_rejects_an_unknown_policy():
    result = CliRunner().invoke(app, ["profile", "--policy", "sideways"])
    assert result.exit_code != 0


@pytest.mark.parametrize("args", [["--policy", "off", "--capacity", "10", "--batch-size", "512"],
                                  ["--policy", "on", "--minibatches", "4", "--unit-size", "2",
                                   "--units-per-iteration", "1"]])
def test_a_workload_the_config_refuses_is_the_users_mistake_said_before_profiling(args):
    result = CliRunner().invoke(app, ["profile", *args, "--json", "--budget", "5"])
    assert result.exit_code == 2 and "error: invalid ConduitConfig" in result.output, result.output
    assert "Traceback" not in result.output and "machine" not in result.output


def test_the_measured_check_compares_only_two_schedules():
    from conduit.cli.profile_report import measured_line as _measured_line

    measured = {
        "inline": {"t_iter_s": 0.047, "exposed_s": 0.0059, "low_s": 0.046, "high_s": 0.049},
        "chosen": {"t_iter_s": 0.041, "exposed_s": 0.0, "low_s": 0.040, "high_s": 0.042},
        "rounds": 3,
    }
    same = _measured_line(measured, same=True)  # the plan is inline: one schedule, nothing to compare
    assert "%" not in same and "the plan is the inline schedule" in same and "47.000 [46.000–49.000] ms" in same
    other = _measured_line(measured, same=False)
    assert "(-100% exposed latency; median of 3 interleaved runs)" in other and "kept" not in other
    measured["outcome"] = "inline"
    assert "kept: inline" in _measured_line(measured, same=False)
    assert "speed moved" not in other


def test_the_measured_check_says_when_the_machine_changed_speed_since_the_profile():
    from conduit.cli.profile_report import measured_line as _measured_line

    measured = {
        "inline": {"t_iter_s": 0.0607, "exposed_s": 0.005},
        "chosen": {"t_iter_s": 0.0607, "exposed_s": 0.005},
        "t_alone_s": 0.0556,
        "profiled_alone_s": 0.0374,
        "rounds": 3,
    }
    line = _measured_line(measured, same=True)
    assert "speed moved" in line and "37.400 ms" in line and "55.600 ms" in line
    measured["profiled_alone_s"] = 0.052  # within 15%: the usual jitter, no note
    assert "speed moved" not in _measured_line(measured, same=True)


def test_the_check_times_rollout_and_update_alone_in_its_own_rounds():
    """Exposed latency is T_iter minus the costs alone measured beside it, not the costs profiled a minute before:
    on this host that drift once printed an exposed latency of -11.9 ms."""
    result = CliRunner().invoke(app, ["profile", "--json", "--policy", "off", *TINY])
    assert result.exit_code == 0, result.output
    (w,) = json.loads(result.stdout)["workloads"]
    m = w["check"]
    assert m["t_alone_s"] > 0 and m["rounds"] == 3
    for name in ("inline", "chosen"):  # never below zero: a run faster than the costs alone is noise, not a gain
        assert abs(m[name]["exposed_s"] - max(0.0, m[name]["t_iter_s"] - m["t_alone_s"])) < 1e-12


def test_interleaved_runs_between_after_every_round():
    from conduit.scheduling import profiler
    from tests.profiling_fakes import FakeSource

    log: list[str] = []

    def loop(schedule):
        log.append(schedule)
        return 0.01 * len(log)

    source = FakeSource(loop, lambda: (1e-3, 1e-3))
    spreads = profiler.interleaved(source, ["a", "b"], 3, 1, 0, between=lambda: log.append("|"))
    assert log == ["a", "b", "|", "b", "a", "|", "a", "b", "|"]  # alternating order, `between` closing each round
    assert set(spreads) == {"a", "b"} and all(v.runs == 3 for v in spreads.values())
    assert spreads["a"].low <= spreads["a"].median <= spreads["a"].high


def test_verification_judges_each_run_against_the_costs_alone_around_it():
    """The host slows down halfway through the rounds (rollout + update alone 10 -> 15 ms), by more than the
    schedules differ: raw medians rank the slower schedule first (more of its runs fell in the slow half); runs
    judged against rollout + update timed alone right before and after them do not."""
    from conduit.scheduling import profiler
    from tests.profiling_fakes import FakeSource

    excess = {"inline": 1.5, "overlap": 0.3}  # ms each schedule adds to rollout + update
    runs: list[str] = []
    alones: list[int] = []

    def speed(tick: int) -> float:  # one tick per run or alone timing: run k at 2k + 1, the timings around it
        return 10.0 if tick <= 10 else 15.0  # at 2k and 2k + 2

    def loop(schedule):
        runs.append(schedule)
        return (speed(2 * len(runs) - 1) + excess[schedule]) * 1e-3

    def alone():
        alones.append(len(runs))
        t = speed(2 * (len(alones) - 1)) * 1e-3
        return 0.2 * t, 0.8 * t

    args = (FakeSource(loop, alone), ["inline", "overlap"], 5, 1, 0)
    raw = {s: v.median for s, v in profiler.interleaved(*args).items()}
    assert raw["inline"] < raw["overlap"]  # 11.5 against 15.3 ms: what the slowdown makes of raw times
    runs.clear()
    judged = {s: v.median for s, v in profiler.interleaved(*args, bracket_repeats=3, level=0.01).items()}
    assert alones == list(range(11))  # before the first run, then after each
    assert judged == pytest.approx({"inline": 0.0115, "overlap": 0.0103})
