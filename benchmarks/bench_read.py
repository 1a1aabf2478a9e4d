"""How fast a compiled two-thread pass can read a file already in the page cache: by ``pread`` into a
small per-thread buffer (what align's kernels do) or from a memory map (no copy, but pages are
mapped by faults: a 2 MB page-cache folio at once, 4 KB ones a few at a time), beside ``cat``.
Each mode sums every 16-bit value (as integers), so the arithmetic is the same and small; the
ratios say which way of reading leaves the most time for the real work.

    python benchmarks/bench_read.py                      # a 1 GiB file of random bytes in a temp folder
    python benchmarks/bench_read.py --file /tmp/efbench/kimi-k2-T2048.safetensors --repeat 9

Needs numba (the dev install has it). A map is built afresh for every run, as a fresh align
process would build it; the pread buffers are allocated once per run, as the kernels' are.
"""
from __future__ import annotations

import argparse
import mmap
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

BLOCK_BYTES = 4 * 7168 * 2  # four Kimi-K2 rows of bf16: one read of one position in ``direct``


def _kernels() -> tuple[Callable[..., float], Callable[..., float]]:
    """(by_pread, by_map): the same sum over a file's uint16 values, two threads, blocks dealt alternately."""
    import numba
    from numba import types as nt

    pread = nt.ExternalFunction("pread", nt.intp(nt.intc, nt.uintp, nt.uintp, nt.int64))
    units = BLOCK_BYTES // 2

    @numba.njit(parallel=True, nogil=True, fastmath=True)
    def by_pread(fd: int, nblocks: int, bufs: np.ndarray) -> float:
        tot = np.zeros(2)
        short = np.zeros(2, np.int64)
        for w in numba.prange(2):  # no early return: a loop with two exits would not run in parallel
            buf = bufs[w]
            s = 0.0
            for i in range(w, nblocks, 2):
                if pread(fd, buf.ctypes.data, BLOCK_BYTES, i * BLOCK_BYTES) != BLOCK_BYTES:
                    short[w] = 1
                for j in range(units):
                    s += buf[j]
            tot[w] = s
        return -1.0 if short.any() else tot.sum()

    @numba.njit(parallel=True, nogil=True, fastmath=True)
    def by_map(a: np.ndarray, nblocks: int) -> float:
        tot = np.zeros(2)
        for w in numba.prange(2):
            s = 0.0
            for i in range(w, nblocks, 2):
                # a slice, so the index is a plain loop counter: ``a[o + j]`` keeps numba's negative-index
                # fix-up, which turned the loads into per-lane gathers (the map then measured 2.5-3x slower)
                b = a[i * units:(i + 1) * units]
                for j in range(units):
                    s += b[j]
            tot[w] = s
        return tot.sum()

    return by_pread, by_map


def _timed(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", type=Path, default=None, help="a large file to read (default: 1 GiB of random bytes)")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ef-bench-read-") as tmp:
        path = args.file
        if path is None:
            path = Path(tmp) / "data.bin"
            with open(path, "wb") as out:
                for _ in range(16):
                    out.write(np.random.default_rng().integers(0, 1 << 16, 1 << 25, dtype=np.uint16).tobytes())
        size = path.stat().st_size
        nblocks = size // BLOCK_BYTES
        nbytes = nblocks * BLOCK_BYTES
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # into the page cache
        cat = _timed(lambda: subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True), args.repeat)
        by_pread, by_map = _kernels()
        fd = os.open(path, os.O_RDONLY)
        try:
            def pread_run() -> None:
                bufs = np.zeros((2, BLOCK_BYTES // 2), np.uint16)
                if by_pread(fd, nblocks, bufs) < 0:
                    raise SystemExit(f"{path}: a read came back short")

            def map_run(flags: int = 0) -> None:
                with mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | flags, prot=mmap.PROT_READ) as m:
                    a = np.frombuffer(m, np.uint16)
                    by_map(a, nblocks)
                    del a

            by_pread(fd, 2, np.zeros((2, BLOCK_BYTES // 2), np.uint16))  # compile both before timing
            map_run()
            rows = [("cat", cat, size), ("pread, 2 threads", _timed(pread_run, args.repeat), nbytes),
                    ("mmap, 2 threads", _timed(map_run, args.repeat), nbytes)]
            if hasattr(mmap, "MAP_POPULATE"):
                rows.append(("mmap + MAP_POPULATE", _timed(lambda: map_run(mmap.MAP_POPULATE), args.repeat), nbytes))
        finally:
            os.close(fd)
    cat_rate = size / min(cat)
    print(f"{path.name}: {size / 1e9:.2f} GB in the page cache, reads of {BLOCK_BYTES} bytes, best / median of {args.repeat}")
    print(f"{'':24s}{'best s':>9s}{'median s':>10s}{'GB/s':>8s}{'/ cat':>8s}")
    for name, times, n in rows:
        rate = n / min(times)
        print(f"{name:24s}{min(times):9.3f}{statistics.median(times):10.3f}{rate / 1e9:8.2f}{rate / cat_rate:7.2f}x")
    print(f"load average {'/'.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
