#!/usr/bin/env bash
# Install into ./.venv (created if missing) and render the HTML reports for data_samples/, one per
# verdict level: reports/align.html (the incident record: ACTION, the ids each engine needs),
# reports/wrong_fix.html (embedding included: PROBLEM) and reports/default.html (SpecForge record
# at the engines' default layers: OK). Exit 1 is the expected verdict of the first two.
set -euo pipefail
. "$(dirname "$0")/venv.sh" report
report() {  # report RECORD OUT EXPECTED_EXIT
    local rc=0
    eagleforensics report "data_samples/$1" data_samples/capture.pt -o "reports/$2" || rc=$?
    if [ "$rc" -ne "$3" ]; then echo "reports/$2: exit $rc, expected $3" >&2; exit 1; fi
    echo
}
report record_layer_outputs.pt align.html 1
report record_wrong_fix.pt wrong_fix.html 1
report data_0.ckpt default.html 0
echo "open reports/align.html, reports/wrong_fix.html and reports/default.html"
