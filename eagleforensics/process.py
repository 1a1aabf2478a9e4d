"""What kind of process the library runs in: a command line's one short command, or a long-lived host
(a notebook, a test run, a server). Set by the CLI; read where the two want different trade-offs."""
from __future__ import annotations

import os
import sys

SHORT_LIVED = False  # True in an ``eagleforensics`` command (``cli.run``, the program's entry point)
HUGEPAGE_ENV = "NUMPY_MADVISE_HUGEPAGE"  # numpy's own switch, read when numpy is imported


def mark_short_lived() -> None:
    """This process runs one command and exits: process-wide settings that would burden a host are fine."""
    global SHORT_LIVED
    SHORT_LIVED = True
    small_pages_for_arrays()


def small_pages_for_arrays() -> None:
    """Stop numpy asking the kernel for huge pages for large arrays, unless the user chose (``HUGEPAGE_ENV``).

    numpy marks every array over 4 MB ``MADV_HUGEPAGE``. On this project's VMs the first touch of a
    fresh huge page now and then waits: a 117 MB array took 0.08-0.21 s to fill in 2 of 12 fresh
    processes and 0.009-0.027 s in the others (``/proc/vmstat`` counted no compaction or reclaim
    meanwhile), where small pages took a steady 0.05 s. align's T=2048 record read lands on its
    critical path only when it waits, so the tail is what counts: paired T=2048 - T=512 runs took
    0.148 s (IQR 0.131-0.163) with small pages and 0.183 s (0.135-0.328) with huge ones, best runs
    equal (``docs/benchmarks.md``, 2026-12-02). Process-wide, hence only in a short command (and
    its child processes, through the environment); a host process can set ``NUMPY_MADVISE_HUGEPAGE=0``."""
    if HUGEPAGE_ENV in os.environ:
        return
    os.environ[HUGEPAGE_ENV] = "0"  # numpy imported later reads it; so do child processes
    if "numpy" in sys.modules:  # already imported: numpy's setter, where this numpy has it
        try:
            from numpy._core import multiarray
        except ImportError:  # numpy 1.x
            from numpy.core import multiarray  # type: ignore[no-redef]
        switch = getattr(multiarray, "_set_madvise_hugepage", None)
        if switch is not None:
            switch(False)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one, else the machine's count):
    how many threads a numpy loop that releases the GIL can keep busy."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
