# Sourced by scripts/test.sh and scripts/report.sh: enter ./.venv (created if missing) and install
# this checkout with the pinned constraints and the extras named in $1 (e.g. "test" or "report").
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -c constraints.txt -e ".[$1]"
