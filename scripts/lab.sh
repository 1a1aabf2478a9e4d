#!/usr/bin/env bash
# Install into ./.venv (created if missing) with the pinned constraints, then start JupyterLab on
# working copies of the notebooks in notebooks/work/ (git-ignored, made on first run, never
# overwritten): run and save them freely, the tracked templates in notebooks/ stay without outputs.
# Extra arguments go to JupyterLab (e.g. --port 8899 --no-browser). As root (a container), JupyterLab
# refuses to start without --allow-root: it is added, and said.
set -euo pipefail
. "$(dirname "$0")/venv.sh" lab
if [ "$(id -u)" -eq 0 ] && [[ " $* " != *" --allow-root "* ]]; then
    echo "lab.sh: running as root (a container?): starting JupyterLab with --allow-root" >&2
    set -- --allow-root "$@"
fi
exec python -m eagleforensics.report.lab "$@"
