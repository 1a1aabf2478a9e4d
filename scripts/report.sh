#!/usr/bin/env bash
# Install into ./.venv (created if missing) and render the HTML reports for data_samples/:
# reports/doctor.html, the front door: `doctor` on the sample drafter with a planted defect (a random
# embedding, served by vLLM), with the samples' training record, capture and a server log (PROBLEM);
# and one align report per verdict level: reports/align.html (the incident record: ACTION, the ids
# each engine needs), reports/wrong_fix.html (embedding included: PROBLEM) and reports/default.html
# (SpecForge record at the engines' default layers: OK). Exit 1 is the expected verdict of all but the last.
set -euo pipefail
. "$(dirname "$0")/venv.sh" report
check() {  # check OUT EXPECTED_EXIT RC
    if [ "$3" -ne "$2" ]; then echo "reports/$1: exit $3, expected $2" >&2; exit 1; fi
    echo
}
mkdir -p reports/planted
args=reports/planted/doctor.args  # the planted case is written again only when what makes it changed
if [ ! -s "$args" ] || [ -n "$(find data_samples scripts/plant_defects.py eagleforensics/testing -newer "$args" -print -quit)" ]; then
    python scripts/plant_defects.py reports/planted --example --no-run >"$args.tmp"
    mv "$args.tmp" "$args"
fi
mapfile -t doctor_args <"$args"
rc=0; eagleforensics doctor "${doctor_args[@]}" --report reports/doctor.html || rc=$?
check doctor.html 1 "$rc"
report() {  # report RECORD OUT EXPECTED_EXIT
    local rc=0
    eagleforensics report "data_samples/$1" data_samples/capture.pt -o "reports/$2" || rc=$?
    check "$2" "$3" "$rc"
}
report record_layer_outputs.pt align.html 1
report record_wrong_fix.pt wrong_fix.html 1
report data_0.ckpt default.html 0
echo "open reports/doctor.html first, then reports/align.html, reports/wrong_fix.html and reports/default.html"
