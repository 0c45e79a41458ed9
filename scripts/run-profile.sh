#!/usr/bin/env bash
# Set up (if needed) and run the main job: profile this machine and print the plan Conduit chooses.
#   scripts/run-profile.sh [conduit profile options, e.g. --dim 5000 --json]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/conduit profile "$@"
