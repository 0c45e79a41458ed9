#!/usr/bin/env bash
# Set up .venv for Conduit: torch first (a CPU build where there is no GPU, the
# normal CUDA build where there is one), then the package with the given extras.
#   scripts/bootstrap.sh            # the package
#   scripts/bootstrap.sh test,bench # with extras
# Idempotent: a re-run installs nothing (and checks nothing over the network) when the packaging files
# and the extras asked for are what the last install was made from (.venv/.conduit-bootstrap records it).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"
py=.venv/bin/python
stamp=.venv/.conduit-bootstrap
inputs=$(cat pyproject.toml setup.py conduit/_native.c | sha256sum | cut -d' ' -f1)

installed_extras=""
if [ -x "$py" ] && [ -f "$stamp" ] && [ "$(head -n1 "$stamp")" = "$inputs" ]; then
  installed_extras=$(sed -n 2p "$stamp")
  up_to_date=1
  for e in ${extras//,/ }; do
    case ",$installed_extras," in *",$e,"*) ;; *) up_to_date="" ;; esac
  done
  if [ -n "$up_to_date" ]; then
    exit 0
  fi
fi

pip_install() {  # quiet, minus the noise of index locations that do not exist on this machine
  local log status=0
  log=$(mktemp)
  "$py" -m pip install -q "$@" >"$log" 2>&1 || status=$?
  grep -v "^WARNING: Location" "$log" || true
  rm -f "$log"
  return "$status"
}

if [ ! -x "$py" ]; then
  "$python" -m venv .venv
  pip_install --upgrade pip >/dev/null || true
fi

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

wanted=$(printf '%s\n' ${installed_extras//,/ } ${extras//,/ } | sort -u | paste -sd, -)
target="."
if [ -n "$wanted" ]; then target=".[${wanted}]"; fi
# setuptools warns on every editable install of a package-dir layout (STYLE.md's) that a folder named like the
# package may shadow it on sys.path: here that folder *is* the package, so the warning has nothing to say
PYTHONWARNINGS="ignore:Editable installation" pip_install -e "$target"
printf '%s\n%s\n' "$inputs" "$wanted" >"$stamp"
"$py" -c "import conduit, torch; print(f'bootstrap: conduit {conduit.__version__}, torch {torch.__version__}')"
