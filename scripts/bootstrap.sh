#!/usr/bin/env bash
# Set up .venv for Conduit: torch first (a CPU build where there is no GPU, the
# normal CUDA build where there is one), then the package with the given extras.
#   scripts/bootstrap.sh            # the package
#   scripts/bootstrap.sh test,bench # with extras
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
py=.venv/bin/python
pip_install() {  # quiet, minus the noise of index locations that do not exist on this machine
  local log status=0
  log=$(mktemp)
  "$py" -m pip install -q "$@" >"$log" 2>&1 || status=$?
  grep -v "^WARNING: Location" "$log" || true
  rm -f "$log"
  return "$status"
}
pip_install --upgrade pip >/dev/null || true

if ! "$py" -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "bootstrap: GPU found, installing torch (CUDA build)"
    pip_install "torch>=2.2"
  else
    # Without a GPU an unpinned torch resolves to a multi-GB CUDA build; take the CPU build.
    # (Elsewhere, point PIP_EXTRA_INDEX_URL at https://download.pytorch.org/whl/cpu to get it.)
    echo "bootstrap: no GPU, installing torch ${CONDUIT_TORCH_VERSION:-2.13.0} (CPU build)"
    pip_install "torch==${CONDUIT_TORCH_VERSION:-2.13.0}"
  fi
fi

target="."
if [ -n "$extras" ]; then target=".[${extras}]"; fi
pip_install -e "$target"
"$py" -c "import conduit, torch; print(f'bootstrap: conduit {conduit.__version__}, torch {torch.__version__}')"
