#!/usr/bin/env bash
# Install into ./.venv (created if missing) and render the HTML reports for data_samples/:
# reports/align.html (the incident record, placed) and reports/wrong_fix.html (embedding included).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -c constraints.txt -e '.[report]'
eagleforensics report data_samples/record_layer_outputs.pt data_samples/capture.pt -o reports/align.html
# the wrong-fix record is miswired on purpose: exit 1 is its expected verdict
eagleforensics report data_samples/record_wrong_fix.pt data_samples/capture.pt -o reports/wrong_fix.html || [ $? -eq 1 ]
echo "open reports/align.html and reports/wrong_fix.html"
