#!/usr/bin/env bash
# Install into ./.venv (created if missing) with the pinned constraints, then start JupyterLab on
# working copies of the notebooks in notebooks/work/ (git-ignored, made on first run, never
# overwritten): run and save them freely, the tracked templates in notebooks/ stay without outputs.
# Extra arguments go to JupyterLab (e.g. --port 8899 --no-browser, or --allow-root in a container).
set -euo pipefail
. "$(dirname "$0")/venv.sh" lab
exec python -m eagleforensics.report.lab "$@"
