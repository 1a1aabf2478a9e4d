"""What kind of process the library runs in: a command line's one short command, or a long-lived host
(a notebook, a test run, a server). Set by the CLI; read where the two want different trade-offs."""
from __future__ import annotations

import contextlib
import os
import site
import sys
from typing import Iterator

SHORT_LIVED = False  # True in an ``eagleforensics`` command (``cli.run``, the program's entry point)
HUGEPAGE_ENV = "NUMPY_MADVISE_HUGEPAGE"  # numpy's own switch, read when numpy is imported
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder holding eagleforensics/


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


def isolated_python(code: str) -> list[str]:
    """The command line of a child Python that runs ``code`` isolated from the folder it starts in and from
    the variables that choose what Python imports: ``-I`` (no current directory or script folder on
    ``sys.path``, no ``PYTHON*`` variables, no user site-packages), then the folder holding this very
    ``eagleforensics`` first on ``sys.path`` (unless it is there already, as site-packages is), and the
    user site-packages after the standard library where this process imports from it. So the child
    imports the same package as this process (a checkout, a worktree, an editable or a normal install)
    and nothing a downloaded dataset or a cloned repository holds."""
    first = [PACKAGE_PARENT]
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else ""
    later = [user] if user and user in sys.path else []
    boot = f"import sys; sys.path[:0] = [p for p in {first!r} if p not in sys.path]; "
    if later:  # where site would have put it: before the first site-packages
        boot += (f"sys.path[next((i for i, p in enumerate(sys.path) if p.endswith(('site-packages', "
                 f"'dist-packages'))), len(sys.path)):0] = {later!r}; ")
    return [sys.executable, "-I", "-c", boot + code]


@contextlib.contextmanager
def safe_path_children() -> Iterator[None]:
    """While open, Python processes started from here put neither their current directory nor their
    script's folder on ``sys.path`` (``PYTHONSAFEPATH``, Python 3.11 and later): for the children that
    ``multiprocessing`` starts with ``python -c`` (spawned workers, its resource tracker), whose command
    line cannot take ``-I``. They take ``sys.path`` from this process once they start."""
    if os.environ.get("PYTHONSAFEPATH"):
        yield
        return
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        yield
    finally:
        os.environ.pop("PYTHONSAFEPATH", None)
