#!/usr/bin/env bash
# Install into ./.venv (created if missing) and render the HTML reports for data_samples/:
# reports/align.html (the incident record, placed) and reports/wrong_fix.html (embedding included).
set -euo pipefail
. "$(dirname "$0")/venv.sh" report
eagleforensics report data_samples/record_layer_outputs.pt data_samples/capture.pt -o reports/align.html
# the wrong-fix record is miswired on purpose: exit 1 is its expected verdict
eagleforensics report data_samples/record_wrong_fix.pt data_samples/capture.pt -o reports/wrong_fix.html || [ $? -eq 1 ]
echo "open reports/align.html and reports/wrong_fix.html"
