#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite, the framework integrations and peers included.
#   scripts/run-tests.sh [pytest options]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh "test,rllib,bench,verl,srl"
exec .venv/bin/python -m pytest tests "$@"
