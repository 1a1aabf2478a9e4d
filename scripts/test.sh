#!/usr/bin/env bash
# Install into ./.venv (created if missing) with the pinned constraints, then run the tests.
# This is the README's test command and what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -c constraints.txt -e '.[test]'
python -m pytest -q "$@"
