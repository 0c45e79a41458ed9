"""`conduit profile` end to end with typer's CliRunner (tiny workloads)."""

from __future__ import annotations

import json

from conduit.cli.main import app
from typer.testing import CliRunner

TINY = ["--dim", "16", "--unit-size", "32", "--batch-size", "32", "--capacity", "2048", "--rollout-ms", "0.2", "--update-ms", "0.5"]


def test_profile_json_reports_costs_candidates_and_a_feasible_plan():
    result = CliRunner().invoke(app, ["profile", "--json", "--no-check", *TINY])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {w["workload"]["policy"] for w in doc["workloads"]} == {"off_policy", "on_policy"}
    for w in doc["workloads"]:
        costs = w["costs"]
        assert costs["t_rollout_s"] > 0 and costs["t_update_s"] > 0
        assert costs["t_ing_s"] and costs["t_del_s"]
        cands = w["candidates"]
        assert cands == sorted(cands, key=lambda c: c["t_iter_s"])
        assert w["model_choice"]["schedule"] == cands[0]["schedule"]
        verified = {json.dumps(v["schedule"], sort_keys=True): v["t_iter_s"] for v in w["verified"]}
        expected, families = [], set()
        for k, c in enumerate(cands):  # the model's three best, then its best of each other overlap family
            family = (c["schedule"]["ingestion"]["overlap"], c["schedule"]["delivery"]["overlap"])
            if k < 3 or family not in families:
                expected.append(json.dumps(c["schedule"], sort_keys=True))
                families.add(family)
        assert set(verified) == set(expected)  # the shortlist
        fastest = min(verified, key=verified.get)
        own = json.dumps(cands[0]["schedule"], sort_keys=True)
        plan = own if verified[own] <= verified[fastest] * 1.03 else fastest  # the model's minimum within 3%
        assert json.dumps(w["chosen"]["schedule"], sort_keys=True) == plan
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
    for text in ("Profiled costs", "Candidate schedules", "Plan:", "Measured:"):
        assert text in result.output


def test_profile_rejects_an_unknown_policy():
    result = CliRunner().invoke(app, ["profile", "--policy", "sideways"])
    assert result.exit_code != 0


def test_the_measured_check_reads_no_percentage_into_two_runs_of_one_schedule():
    from conduit.cli.profile import _measured_line

    measured = {"inline": {"t_iter_s": 0.047, "exposed_s": 0.0059}, "chosen": {"t_iter_s": 0.041, "exposed_s": -0.0005}}
    same = _measured_line(measured, same=True)
    assert "%" not in same and "two runs of it" in same and "run-to-run noise" in same
    other = _measured_line(measured, same=False)
    assert "(-108% exposed latency)" in other
