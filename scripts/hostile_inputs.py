"""Run every hostile input of issues 13 and 19 as a real CLI process: its stderr line, exit code, peak memory, inputs kept.

    python scripts/hostile_inputs.py [--timeout 60] [--limit-gib 0]

Builds each input (tests/hostile.py) in a temporary folder, runs ``python -m eagleforensics``
on it under ``/usr/bin/time`` (peak resident memory of the process and its children),
then checks the watched input files kept their bytes and mtime, that no process the
run started is still alive and that its private TMPDIR is empty again (``left``). ``--limit-gib`` runs each command under ``ulimit -v`` (to try
the inputs against an older checkout without exhausting the machine). Exit 1 if any case
breaks the rule: one line on stderr, exit 2, inputs unchanged, nothing left running, < 1 GiB.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hostile import BUILDERS, fingerprint_of, prepare  # noqa: E402

GIB = 1024**3


def _descendants_alive(marker: str) -> list[str]:
    """Processes whose command line carries ``marker`` (each run's own temp folder)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines()[1:] if marker in line and "ps -eo" not in line]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--limit-gib", type=float, default=0.0)
    ap.add_argument("--only", default=None, help="run only builders whose name contains this")
    ap.add_argument("--code", type=Path, default=ROOT, help="checkout whose eagleforensics runs (default: this one)")
    args = ap.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory(prefix="ef-hostile-") as tmp:
        for build in BUILDERS:
            if args.only and args.only not in build.__name__:
                continue
            d = prepare(Path(tmp) / build.__name__)
            case = build(d)
            before = fingerprint_of(case.watch)
            tmpdir = d / "TMPDIR"
            tmpdir.mkdir(exist_ok=True)
            cmd = [sys.executable, "-m", "eagleforensics", *case.args]
            shell = " ".join(shlex.quote(c) for c in ["/usr/bin/time", "-f", "PEAK_KB=%M", *cmd])
            if args.limit_gib:
                shell = f"ulimit -v {int(args.limit_gib * 1024 * 1024)}; {shell}"
            try:
                proc = subprocess.run(["bash", "-c", shell], capture_output=True, cwd=d, timeout=args.timeout,
                                      env={**os.environ, "PYTHONPATH": str(args.code), "TMPDIR": str(tmpdir)},
                                      start_new_session=True)
                err = proc.stderr.decode("utf-8", "replace")
                peak = next((int(x.split("=")[1]) for x in err.splitlines() if x.startswith("PEAK_KB=")), -1)
                lines = [x for x in err.splitlines() if not x.startswith("PEAK_KB=") and "Command exited" not in x
                         and "Command terminated" not in x]
                code = proc.returncode
            except subprocess.TimeoutExpired:
                for line in _descendants_alive(str(d)):  # this case's own processes, by pid
                    try:
                        os.kill(int(line.split()[0]), 9)
                    except (OSError, ValueError):
                        pass
                import time

                time.sleep(1.0)
                lines, code, peak = [f"(no answer in {args.timeout:.0f} s: hang)"], "timeout", -1
            alive = _descendants_alive(str(d))
            changed = [p for p, v in before.items() if not Path(p).exists() or fingerprint_of([Path(p)])[p] != v]
            left = list(tmpdir.iterdir())
            ok = (code == 2 and len(lines) == 1 and lines[0].startswith("eagleforensics: error: ")
                  and all(e in lines[0] for e in case.expect) and not changed and not alive and not left
                  and 0 <= peak < GIB // 1024)
            bad += not ok
            shown = lines[0] if len(lines) == 1 else f"{len(lines)} lines: " + " | ".join(lines[-3:])
            print(f"{'ok  ' if ok else 'FAIL'} {build.__name__:<26} exit={code} peak={peak / 1024:.0f} MiB "
                  f"changed={len(changed)} alive={len(alive)} left={len(left)}\n     {shown[:400]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
