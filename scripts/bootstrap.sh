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

pip_install() {  # quiet, minus the noise of index locations that do not exist on this machine, and minus
  # pip's report of the one conflict installed on purpose (verl's tensordict pin; see below)
  local log status=0
  log=$(mktemp)
  "$py" -m pip install -q "$@" >"$log" 2>&1 || status=$?
  grep -v -e "^WARNING: Location" -e "^ERROR: pip's dependency resolver does not currently take into account" \
    -e "^verl [0-9.]* requires tensordict" "$log" || true
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
# verl 0.9.1 pins tensordict<=0.10 where the bench extra's TorchRL needs 0.14: pip cannot resolve the two
# together. With both asked for, everything but verl goes in as usual; then verl and TransferQueue without
# their pins, and their other requirements with torch and tensordict held where they are (the adapter's tests
# pass on tensordict 0.14). Either extra alone resolves normally.
split_verl=""
case ",$wanted," in *",verl,"*) case ",$wanted," in *",bench,"*) split_verl=1 ;; esac ;; esac
if [ -n "$split_verl" ]; then
  target=".[$(printf '%s\n' ${wanted//,/ } | grep -vx verl | paste -sd, -)]"
fi
PYTHONWARNINGS="ignore:Editable installation" pip_install -e "$target"
if [ -n "$split_verl" ]; then
  read -r pinned others < <("$py" - <<'PY'
import tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["verl"]
pinned = [r for r in extra if r.split("=")[0].lower() in ("verl", "transferqueue")]
print(",".join(pinned), " ".join(r for r in extra if r not in pinned))
PY
)
  pip_install --no-deps ${pinned//,/ }
  held=$(mktemp)
  "$py" - >"$held" <<'PY'
import importlib.metadata as m
for d in ("torch", "tensordict"):
    print(f"{d}=={m.version(d)}")
PY
  reqs=$("$py" - <<'PY'
import importlib.metadata as m
from packaging.requirements import Requirement
out = []
for d in ("verl", "TransferQueue"):
    for r in m.requires(d) or []:
        req = Requirement(r)
        if req.marker is None and req.name.lower() not in ("torch", "tensordict"):
            out.append(str(req))
print(" ".join(sorted(set(out))))
PY
)
  # shellcheck disable=SC2086
  pip_install -c "$held" $reqs $others
  rm -f "$held"
fi
printf '%s\n%s\n' "$inputs" "$wanted" >"$stamp"
"$py" -c "import conduit, torch; print(f'bootstrap: conduit {conduit.__version__}, torch {torch.__version__}')"
