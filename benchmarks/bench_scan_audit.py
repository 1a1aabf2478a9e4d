"""Scan a dataset with the training-data audit (``scan --target``): wall time, peak RSS, and whether memory stays flat.

    python benchmarks/bench_scan_audit.py [--records 2000] [--workers 2] [--agreement-tokens 128] [--dir D --keep]

Writes a chat target and ``--records`` SpecForge records with planted defects
(``testing.chat.make_audit_dataset``: answers the target generated, plus human text, another model's
answers, a loss mask one token late and a Llama-3-rendered record, 3 each), then runs
``eagleforensics scan DATA --target TARGET`` as a fresh process through ``peakrss.py`` (the largest
process of the scan, parent or worker) on the whole dataset and on its first quarter. Prints wall
seconds, records per second, peak RSS and the ratio of the two peaks (memory that grows with the
dataset would show as a ratio near 4), and whether the outlier records are exactly the planted ones.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def run_scan(data: Path, target: Path, out: Path, workers: int, tokens: int) -> tuple[float, int, dict]:
    cmd = [sys.executable, str(HERE / "peakrss.py"), sys.executable, "-m", "eagleforensics", "scan", str(data),
           "--target", str(target), "--workers", str(workers), "--agreement-tokens", str(tokens), "-o", str(out),
           "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"scan failed ({done.returncode}): {done.stderr[-2000:]}")
    rss = int(re.findall(r"peak_rss_kib=(\d+)", done.stderr)[-1])
    return wall, rss, json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--agreement-tokens", type=int, default=128)
    ap.add_argument("--dir", type=Path, default=None, help="where to write the dataset (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the dataset afterwards")
    args = ap.parse_args()
    import torch

    from eagleforensics.testing.chat import make_audit_dataset

    torch.set_num_threads(1)
    work = args.dir or Path(tempfile.mkdtemp(prefix="eagleforensics-bench-audit-"))
    try:
        t0 = time.perf_counter()
        data, target, planted = make_audit_dataset(work / "full", args.records)
        made = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
        print(f"dataset: {args.records} records, {size / 2**20:.1f} MiB, written in {made:.1f} s")
        quarter = work / "quarter"
        (quarter / "rows_0-2000").mkdir(parents=True, exist_ok=True)
        files = sorted((data / "rows_0-2000").glob("*.ckpt"), key=lambda p: int(p.stem.split("_")[1]))
        for f in files[:args.records // 4]:
            shutil.copy(f, quarter / "rows_0-2000" / f.name)
        rows = []
        for label, d, n in (("quarter", quarter, args.records // 4), ("full", data, args.records)):
            out = work / f"{label}.jsonl"
            out.unlink(missing_ok=True)
            wall, rss, obj = run_scan(d, target, out, args.workers, args.agreement_tokens)
            rows.append((label, n, wall, rss, obj))
            print(f"scan {label:8s} {n:6d} records  {wall:7.1f} s  {n / wall:7.1f} records/s  peak RSS {rss / 1024:7.1f} MiB")
        full = rows[-1][4]
        found = {o["path"] for o in full["outliers"]}
        td = full["training_data"]["summary"]
        print(f"peak RSS full / quarter: {rows[1][3] / rows[0][3]:.2f} (records x{args.records / (args.records // 4):.0f})")
        print(f"agreement histogram (records per 0.05 of greedy agreement): {td['agreement_histogram']['counts']}")
        print(f"outliers exactly the planted records: {found == set(planted)}"
              + ("" if found == set(planted) else f" (extra {sorted(found - set(planted))}, "
                                                  f"missed {sorted(set(planted) - found)})"))
        print(f"findings: {[f['code'] + ' ' + f['severity'] for f in full['training_data']['findings']]}")
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
