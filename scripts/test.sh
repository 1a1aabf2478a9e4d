#!/usr/bin/env bash
# Install into ./.venv (created if missing) with the pinned constraints, then run the tests.
# This is the README's test command and what .ci/run calls.
set -euo pipefail
. "$(dirname "$0")/venv.sh" test
python -m pytest -q "$@"
