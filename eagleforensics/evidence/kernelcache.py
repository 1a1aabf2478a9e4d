"""Whether this machine already holds the compiled kernels (``fused``), and compiling them once, elsewhere.

numba compiles the kernels the first time a process needs them (30-40 s on a 16-core host) and keeps
the machine code in its cache, keyed by the source file and the CPU. A command that met an empty
cache used to wait for that compile. Instead the first process that wants the kernels and finds no
mark of them starts one detached process that compiles them into numba's cache and then writes a
mark (``stamp``); meanwhile, and until the mark exists, the numpy path answers (the same cells, equal
within float32 rounding). Every later process on that machine loads the cached code in ~0.5 s.

The mark lives where numba keeps the code: under ``NUMBA_CACHE_DIR`` when it is set, else next to the
package (``eagleforensics/evidence/__pycache__``) when that can be written, else in the user's cache
folder (``$XDG_CACHE_HOME/eagleforensics``, by default ``~/.cache/eagleforensics``). Its name holds a
hash of what makes numba's cached code valid: the kernels' source file, numba's install, Python and
the CPU (model and flags). ``EAGLEFORENSICS_FUSED=1`` skips the mark and compiles in the process, as
before; ``EAGLEFORENSICS_KERNEL_DIR`` names another folder for the mark.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().with_name("fused.py")  # the kernels' source: numba keys its cache on it
DIR_ENV = "EAGLEFORENSICS_KERNEL_DIR"
COMPILE_LIMIT_S = 900  # the compiling process ends itself past this (a compile takes 20-60 s)
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
_state: dict[str, bool] = {}  # "ready": the mark was seen; "started": this process started the compile


def _cpu() -> str:
    """The CPU as numba's cache tells CPUs apart: its model and feature flags (``/proc/cpuinfo``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            head = fh.read(1 << 16).split("\n\n", 1)[0]
        keep = [line for line in head.splitlines() if line.split(":")[0].strip() in ("model name", "flags")]
        if keep:
            return "\n".join(keep)
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _stat(path: str | Path | None) -> str:
    try:
        st = os.stat(path) if path else None
    except OSError:
        st = None
    return f"{path}:{st.st_size}:{st.st_mtime_ns}" if st else f"{path}:-"


def key() -> str:
    """A hash of everything numba's cached code depends on here (the mark's name carries it)."""
    spec = importlib.util.find_spec("numba")
    parts = [sys.version, _stat(SOURCE), _stat(spec.origin if spec else None), _cpu(),
             os.environ.get("NUMBA_CPU_NAME", ""), os.environ.get("NUMBA_CPU_FEATURES", "")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def folder() -> Path:
    """Where the mark goes: where numba puts the code (see the module's docstring), or ``DIR_ENV``."""
    for chosen in (os.environ.get(DIR_ENV), os.environ.get("NUMBA_CACHE_DIR")):
        if chosen:
            return Path(chosen)
    in_tree = SOURCE.parent / "__pycache__"
    if in_tree.is_dir() and os.access(in_tree, os.W_OK) or not in_tree.exists() and os.access(SOURCE.parent, os.W_OK):
        return in_tree
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagleforensics"


def stamp() -> Path:
    """The mark's path for this machine, install and source."""
    return folder() / f"eagleforensics-kernels-{key()}.ok"


def ready() -> bool:
    """Whether the kernels were compiled into the cache for this machine (seen once, remembered). No folder
    for the mark (no home directory, say) reads as not compiled: the numpy path answers."""
    if not _state.get("ready"):
        try:
            _state["ready"] = stamp().is_file()
        except (OSError, RuntimeError):  # RuntimeError: Path.home() with no HOME and no passwd entry
            return False
    return _state["ready"]


def start_compiling() -> bool:
    """Start, once per process, a detached process that compiles the kernels into numba's cache and then
    writes the mark (``compile_into_cache``). Returns whether one was started. It runs at low priority
    in its own session with no terminal: it never holds up or outlives the user's command in any way
    the user must handle, and it ends by itself after ``COMPILE_LIMIT_S``."""
    if _state.get("started"):
        return False
    _state["started"] = True
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_PACKAGE_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    code = "from eagleforensics.evidence.fused import compile_into_cache; compile_into_cache()"
    try:
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, env=env)
    except OSError:
        return False  # no process could start: the numpy path keeps answering
    return True


def mark_compiled() -> None:
    """Write the mark (atomically: a reader sees it whole or not at all)."""
    path = stamp()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kernels-")
    with os.fdopen(fd, "w") as fh:
        fh.write(f"compiled for {_cpu().splitlines()[0]}\n")
    os.replace(tmp, path)
    _state["ready"] = True
