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

numba loads its cache with ``pickle.loads``: the cache is code. It is used only where ``cachetrust`` trusts
both folders (the mark's, and the one numba keeps the code in): owned by this user or root, and nobody
else may write them or a folder above them. Otherwise the mark is ignored, no compile starts, the numpy
path answers (with ``EAGLEFORENSICS_FUSED=1`` too), and one line on stderr says which folder and why;
``fused`` checks the folder numba really chose again before a kernel is first called, and compiles that
kernel in memory if it fails. The compiling process runs isolated (``process.isolated_python``, from ``/``).
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

from .. import process
from . import cachetrust

SOURCE = Path(__file__).resolve().with_name("fused.py")  # the kernels' source: numba keys its cache on it
DIR_ENV = "EAGLEFORENSICS_KERNEL_DIR"
COMPILE_LIMIT_S = 900  # the compiling process ends itself past this (a compile takes 20-60 s)
NUMBA_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fused.py")  # as numba names it (unresolved)
_state: dict[str, bool] = {}  # "ready": the mark was seen; "started": this process started the compile
_told: list[str] = []  # why the cache was not used, once said on stderr


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


def _in_tree(source: Path) -> Path | None:
    """``__pycache__`` beside ``source`` where it can be made and written (numba's in-tree cache), else None."""
    in_tree = source.parent / "__pycache__"
    if in_tree.is_dir() and os.access(in_tree, os.W_OK) or not in_tree.exists() and os.access(source.parent, os.W_OK):
        return in_tree
    return None


def folder() -> Path:
    """Where the mark goes: where numba puts the code (see the module's docstring), or ``DIR_ENV``."""
    for chosen in (os.environ.get(DIR_ENV), os.environ.get("NUMBA_CACHE_DIR")):
        if chosen:
            return Path(chosen)
    return _in_tree(SOURCE) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagleforensics"


def numba_folder() -> Path:
    """The folder numba keeps the kernels' code in, as numba 0.68's ``numba.core.caching`` picks it (the first
    locator whose folder can be made and written): ``NUMBA_CACHE_DIR`` / (the source folder's name and a
    SHA-1 of its path); else ``__pycache__`` beside the source; else the user-wide cache's ``numba`` / the same."""
    src = os.path.dirname(NUMBA_SOURCE)
    sub = f"{os.path.basename(src)}_{hashlib.sha1(src.encode()).hexdigest()}"  # get_suitable_cache_subpath
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"]) / sub
    in_tree = _in_tree(Path(NUMBA_SOURCE))
    if in_tree is not None:
        return in_tree
    base = "~/Library/Caches" if sys.platform == "darwin" else os.environ.get("XDG_CACHE_HOME", "~/.cache")
    return Path(os.path.expanduser(base)) / "numba" / sub  # numba's appdirs.user_cache_dir("numba")


def distrust() -> str | None:
    """Why the kernel cache must not be loaded (``cachetrust``: the mark's folder, then numba's), or None."""
    try:
        places = dict.fromkeys((folder(), numba_folder()))
    except RuntimeError:  # Path.home() with no HOME and no passwd entry
        return "no home folder to keep it in"
    for where in places:
        why = cachetrust.distrust(where)
        if why:
            return why
    return None


def refuse(why: str, instead: str) -> None:
    """Say once per process, on stderr, that the cache is not used and why."""
    if not _told:
        _told.append(why)
        print(f"eagleforensics: the compiled-kernel cache is not used: {why}; {instead}", file=sys.stderr)


def stamp() -> Path:
    """The mark's path for this machine, install and source."""
    return folder() / f"eagleforensics-kernels-{key()}.ok"


def ready() -> bool:
    """Whether the kernels were compiled into the cache for this machine (seen once, remembered). No folder
    for the mark (no home directory, say) reads as not compiled: the numpy path answers."""
    if not _state.get("ready"):
        try:
            why = distrust()
            if why:  # a mark or code planted in a folder others can write: never loaded
                refuse(why, "the numpy path answers")
                return False
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
    try:
        if distrust():
            return False  # nothing is compiled into a folder whose contents cannot be trusted
        # isolated and started in "/": nothing in the user's folder (a numpy.py, numba's .numba_config.yaml)
        # or in PYTHONPATH is imported or read; the folders it is told of are absolute
        env = dict(os.environ)
        for name in (DIR_ENV, "NUMBA_CACHE_DIR"):
            if env.get(name):
                env[name] = os.path.abspath(env[name])
        code = "from eagleforensics.evidence.fused import compile_into_cache; compile_into_cache()"
        subprocess.Popen(process.isolated_python(code), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, env=env, cwd="/")
    except (OSError, RuntimeError):
        return False  # no process could start (or no home folder): the numpy path keeps answering
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
