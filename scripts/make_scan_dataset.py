"""Write a SpecForge-layout dataset with planted faults (``eagleforensics.testing.scandata``), then check that a scan finds them.

    python scripts/make_scan_dataset.py OUT_DIR [--records 2000] [--no-check]

Writes OUT_DIR/data (the records) and OUT_DIR/reference.safetensors (a capture sweep of a
prompt with the records' opening tokens). Unless ``--no-check``, scans the dataset locally
(process pool) and on a Dask LocalCluster, with and without the reference, and prints the
time of each and whether the outliers are exactly the planted records.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from eagleforensics.testing.scandata import NEEDS_REFERENCE, make_dataset
from eagleforensics.scan.runner import scan


def _check(label: str, expected: set[str], **kwargs: object) -> bool:
    start = time.perf_counter()
    result = scan(**kwargs)  # type: ignore[arg-type]
    took = time.perf_counter() - start
    found = set(result.outliers)
    ok = found == expected
    extra, missed = sorted(found - expected), sorted(expected - found)
    print(f"{label:<34} {took:6.2f} s  {len(found)} outliers  {'EXACT' if ok else f'extra {extra} missed {missed}'}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()
    start = time.perf_counter()
    ds = make_dataset(args.out, args.records)
    print(f"wrote {len(ds.records)} records to {ds.root} in {time.perf_counter() - start:.2f} s; planted:")
    for path, kind in ds.planted.items():
        print(f"  {path}: {kind}")
    if args.no_check:
        return 0
    planted = set(ds.planted)
    without = {p for p, k in ds.planted.items() if k not in NEEDS_REFERENCE}
    ok = _check(f"local, {args.workers} processes", without, dataset=ds.root, workers=args.workers, progress=False)
    ok &= _check(f"local, {args.workers} processes, reference", planted, dataset=ds.root, workers=args.workers,
                 reference=ds.reference, progress=False)
    from distributed import LocalCluster

    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        ok &= _check("Dask LocalCluster, reference", planted, dataset=ds.root, scheduler=cluster.scheduler_address,
                     reference=ds.reference, progress=False)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
