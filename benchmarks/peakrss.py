"""Run a command from a small parent and print the child's own peak RSS on the last stderr line.

Linux carries a parent's RSS high-water mark into a forked child's ``ru_maxrss`` (exec keeps
it), so a child started straight from the benchmark process, which holds torch and the
synthetic sweeps, would report the benchmark's memory instead of its own. Started from this
tiny interpreter instead, the figure is the child's (or this wrapper's ~10 MiB, whichever is larger).

    python benchmarks/peakrss.py CMD [ARGS...]   # stderr ends with "peak_rss_kib=N"
"""
from __future__ import annotations

import os
import subprocess
import sys

proc = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(proc.pid, 0)
sys.stderr.write(f"\npeak_rss_kib={usage.ru_maxrss}\n")
sys.exit(os.waitstatus_to_exitcode(status))
