#!/usr/bin/env bash
# Install into ./.venv (created if missing) with the pinned constraints, then run the tests.
# This is the README's test command and what .ci/run calls.
# The suite runs on every core (pytest-xdist, at most 4 workers: each holds about 2 GiB), a test file per
# worker so module fixtures are made once; EAGLEFORENSICS_TEST_WORKERS or a later -n overrides (-n 0: one process).
set -euo pipefail
. "$(dirname "$0")/venv.sh" test
workers="${EAGLEFORENSICS_TEST_WORKERS:-$(python -c 'import os; n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(); print(max(1, min(4, n or 1)))')}"
python -m pytest -q -n "$workers" --dist loadfile "$@"
