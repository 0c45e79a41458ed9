#!/usr/bin/env bash
# Every GPU check in one go, on a machine whose python3 already has a CUDA build of torch:
#   scripts/gpu-checks.sh [LOGDIR]
# 1. installs Conduit (editable, no dependencies fetched: torch stays the machine's own; wheels in .whl/, if
#    that folder exists, are installed first, for machines without a package index) and builds conduit._native;
# 2. the CUDA tests (pytest -m gpu), then scripts/gpu_check.py (live topology, a GPU -> pinned migration in the
#    real runtime with every record checked, gather bandwidth onto the GPU, push/pull per placement, the delivery
#    stream's overlap, the GPU targets), then scripts/planner_sweep.py (Alg. 1's choice for dims 128-20,000 at
#    capacity 10^6 next to the measured time of every candidate placement), then `conduit profile`;
# 3. with SUITE=1, the whole suite on this machine (with CUDA present, every default that looks for a GPU takes
#    one), minus the Ray integration tests when Ray is absent (not part of the 6-minute default).
# Each step's log goes to LOGDIR (default gpu-logs/), and the figures to one LOGDIR/gpu-checks.json, with the
# verdict line "planner choice = fastest measured candidate at every dim: yes/no"; a step that fails does not
# stop the next; the exit status is the number of failed steps. Without CUDA it says so and exits 0.
# SKIP="profile sweep" leaves steps out; GPU_TESTS_S, GPU_CHECK_S, SWEEP_S, PROFILE_S and SUITE_S bound each
# step's seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG="${1:-gpu-logs}"
mkdir -p "$LOG"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1

step() {  # step NAME TIMEOUT_S COMMAND...: run, log, report
    local name=$1 limit=$2
    shift 2
    case " ${SKIP:-} " in *" $name "*) echo "== $name: skipped (SKIP)"; return 0 ;; esac
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" >"$LOG/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc $rc in $((SECONDS - t0)) s"
    tail -n "${TAIL:-15}" "$LOG/$name.log"
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
    return 0
}
failed=0

if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu-checks: no CUDA device here (or no CUDA build of torch): nothing to check; exit 0"
    exit 0
fi
step install 300 "$PY" -m pip install --no-build-isolation --no-deps --no-index -e .
"$PY" -c "import torch, conduit, conduit._native; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

step gpu-tests "${GPU_TESTS_S:-240}" "$PY" -m pytest -q -m gpu -p no:cacheprovider tests
step gpu-check "${GPU_CHECK_S:-180}" "$PY" scripts/gpu_check.py --json "$LOG/gpu_check.json"
step sweep "${SWEEP_S:-120}" "$PY" scripts/planner_sweep.py --json "$LOG/planner_sweep.json"
# the JSON alone into profile.json (its progress lines go to the step's log)
step profile "${PROFILE_S:-100}" bash -c '"$0" -m conduit.cli.main profile --budget 80 --json >"$1"' "$PY" \
    "$LOG/profile.json"
if [ "${SUITE:-0}" = 1 ]; then
    ignore=()
    "$PY" -c "import ray" 2>/dev/null || ignore=(--ignore=tests/integrations)
    xdist=()
    "$PY" -c "import xdist" 2>/dev/null && xdist=(-n "${WORKERS:-8}")
    step suite "${SUITE_S:-300}" "$PY" -m pytest -q -p no:cacheprovider "${xdist[@]}" "${ignore[@]}" tests
fi
"$PY" - "$LOG" <<'PY'
import json, pathlib, sys
log = pathlib.Path(sys.argv[1])
doc = {}
for name in ("gpu_check", "planner_sweep", "profile"):
    try:
        doc[name] = json.loads((log / f"{name}.json").read_text())
    except (OSError, ValueError) as exc:
        doc[name] = {"missing": str(exc)}
doc["verdict"] = doc["planner_sweep"].get("verdict", "planner choice = fastest measured candidate at every dim: no")
(log / "gpu-checks.json").write_text(json.dumps(doc, indent=2, default=str))
print(doc["verdict"])
PY
echo "== $failed step(s) failed"
exit "$failed"
