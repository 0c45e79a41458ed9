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
        inline = json.dumps(w["baseline"]["schedule"], sort_keys=True)
        assert set(verified) == set(expected) | {inline}  # the shortlist, and the inline baseline
        fastest = min(verified, key=verified.get)
        own = json.dumps(cands[0]["schedule"], sort_keys=True)
        plan = own if verified[own] <= verified[fastest] * 1.03 else fastest  # the model's minimum within 3%
        if verified[inline] <= verified[plan] * 1.03:  # a plan must beat inline by more than 3% (after any rematch)
            plan = inline
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


def test_the_measured_check_compares_only_two_schedules():
    from conduit.cli.profile import _measured_line

    measured = {
        "inline": {"t_iter_s": 0.047, "exposed_s": 0.0059},
        "chosen": {"t_iter_s": 0.041, "exposed_s": -0.0005},
        "rounds": 3,
    }
    same = _measured_line(measured, same=True)  # the plan is inline: one schedule, nothing to compare
    assert "%" not in same and "the plan is the inline schedule" in same and "47.000 ms" in same
    other = _measured_line(measured, same=False)
    assert "(-108% exposed latency; median of 3 interleaved runs)" in other
