"""Limits on what a user's file may make us do: open only regular files, never write over an input, bound every expansion.

One place for each guard, so every reader and writer applies the same rule:

* ``open_regular``: open without blocking (a FIFO would hang ``open``), then refuse anything
  that is not a regular file (FIFO, device, socket), judged on the opened descriptor.
* ``check_not_input``: an output path is none of the inputs, compared by device and inode
  (hard links, symlinks) and never inside an input directory.
* ``memory_limit``: this process's memory budget, the smaller of the machine's RAM and the
  container's cgroup limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``).
* ``check_expansion``: a decompressed size (declared or reached so far) within the budget and
  within ``MAX_RATIO`` of the compressed size (zip members, gzip streams, archives in archives).
* ``parse_json`` / ``load_yaml``: parsers with a nesting-depth limit, and YAML with aliases
  bounded by the size they expand to (a "billion laughs" file is refused before it is built).
"""
from __future__ import annotations

import json
import os
import re
import stat
import zipfile
from pathlib import Path
from typing import IO, Any, Iterable

import numpy as np

from ..errors import ForensicsError
from .sizecheck import human_bytes

# Deeper nesting than this is no config, header or fingerprint any tool writes.
MAX_DEPTH = 64
# Decompressed bytes per compressed byte past which an archive member is taken for a bomb.
# Hidden states compress about 1.1:1 and even a record that is mostly zero padding stays near
# 100:1; deflate cannot exceed ~1032:1. Small outputs (under RATIO_FLOOR) are never refused.
MAX_RATIO = 200
RATIO_FLOOR = 64 * 1024 * 1024
# A YAML document may expand its aliases to at most this many nodes.
MAX_YAML_NODES = 100_000
_CGROUP_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


# ---------------------------------------------------------------- regular files only

def open_regular(path: str | Path, what: str = "file") -> IO[bytes]:
    """Open ``path`` for reading in binary mode; a FIFO, device or socket is refused without blocking."""
    p = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise ForensicsError(f"no such {what}", path=p) from None
    except IsADirectoryError:
        raise ForensicsError(f"is a directory, expected a {what}", path=p) from None
    except PermissionError:
        raise ForensicsError("cannot be read: permission denied", path=p) from None
    except OSError as exc:
        raise ForensicsError(f"cannot open: {exc.strerror or exc}", path=p) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ForensicsError(f"is a directory, expected a {what}", path=p)
        if not stat.S_ISREG(mode):
            raise ForensicsError("is not a regular file (a device, pipe or socket); copy the data to a file", path=p)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_regular(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (a config, a header), refused when larger."""
    with open_regular(path, what) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ForensicsError(f"is larger than {human_bytes(limit)}: not a {what}", path=path)
    return data


# ---------------------------------------------------------------- outputs never touch inputs

def _identity(p: Path) -> tuple[int, int] | None:
    try:
        st = p.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_not_input(output: str | Path, inputs: Iterable[Any], what: str = "output") -> None:
    """Refuse ``output`` when it is one of ``inputs`` or lies inside an input directory.

    Each input is a path or ``(path, role)``, the role naming it in the message ("the
    dataset"). Files are compared by (device, inode), so a hard link or a symlink to an input
    is caught as well as the same name. For an existing output with more than one link, the
    files of input directories are compared too (a hard link from outside into a capture directory).
    """
    out = Path(output).expanduser()
    real = Path(os.path.realpath(out))
    out_id = _identity(out)
    parent_id = _identity(real.parent)
    dirs: list[Path] = []
    for item in inputs:
        item, role = item if isinstance(item, tuple) else (item, "")
        if item is None:
            continue
        p = Path(item).expanduser()
        ident = _identity(p)
        if ident is None:
            continue
        if p.is_dir():
            dirs.append(p)
            rp = Path(os.path.realpath(p))
            if real == rp or rp in real.parents or ident == parent_id or ident == out_id:
                raise ForensicsError(f"the {what} would be written inside {role or 'an input directory'} {p}; "
                                     "choose a path outside it", path=out)
        elif ident == out_id:
            raise ForensicsError(f"the {what} would overwrite {role or 'an input file'} {p} (the same file, compared by "
                                 "device and inode: a hard link or symlink counts); choose another name", path=out)
    if out_id is None or not dirs:
        return
    try:
        links = out.stat().st_nlink
    except OSError:
        return
    if links < 2:
        return
    for d in dirs:  # the output is a hard link: is its other name inside an input directory?
        for dirpath, _, files in os.walk(d):
            for name in files:
                if _identity(Path(dirpath) / name) == out_id:
                    raise ForensicsError(f"the {what} is {Path(dirpath) / name}, a file inside the "
                                         "input directory (a hard link to it); choose another name", path=out)


# ---------------------------------------------------------------- memory and expansion bounds

def _cgroup_limit() -> int | None:
    for name in _CGROUP_FILES:
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):  # v1 writes a huge number for "no limit", v2 writes "max"
            return int(text)
    return None


def memory_limit() -> int:
    """Bytes this process may use: the machine's RAM, or the container's cgroup limit when smaller."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        phys = 16 * 1024**3
    cg = _cgroup_limit()
    return min(phys, cg) if cg else phys


def expansion_limit() -> int:
    """The most one decompressed file or archive member may take: half the memory budget."""
    return memory_limit() // 2


def check_expansion(size: int, packed: int, path: str | Path, what: str, limit: int | None = None) -> None:
    """Refuse ``size`` decompressed bytes from ``packed`` compressed ones past the budget or ``MAX_RATIO``."""
    cap = expansion_limit() if limit is None else limit
    if size > cap:
        raise ForensicsError(f"{what} expands to {human_bytes(size)}, past {human_bytes(cap)} (half the memory "
                             "this process may use): refusing what looks like a decompression bomb", path=path)
    if size > RATIO_FLOOR and size > MAX_RATIO * max(packed, 1):
        raise ForensicsError(f"{what} expands {size // max(packed, 1)}:1 ({human_bytes(packed)} to "
                             f"{human_bytes(size)}), past {MAX_RATIO}:1: refusing what looks like a "
                             "decompression bomb", path=path)


def check_zip_members(zf: zipfile.ZipFile, path: str | Path, where: str = "") -> None:
    """Check every member's declared size and ratio before anything is decompressed.

    zipfile never returns more than a member's declared size and torch allocates a record at
    its declared size, so bounding the declaration bounds what is expanded.
    """
    total = 0
    for info in zf.infolist():
        total += info.file_size
        if info.compress_type != zipfile.ZIP_STORED or info.file_size > info.compress_size:
            check_expansion(info.file_size, info.compress_size, path, f"{where}archive member {info.filename!r}")
    check_expansion(total, max(total, 1), path, f"{where}archive")  # the whole archive, by budget only


# ---------------------------------------------------------------- parsers with depth limits

_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


def nesting_depth(data: bytes) -> int:
    """Deepest ``[``/``{`` nesting of JSON (or YAML flow) text, strings skipped; numpy, no recursion."""
    bare = _JSON_STRING.sub(b'""', data)
    arr = np.frombuffer(bare, dtype=np.uint8)
    step = (np.isin(arr, (0x5B, 0x7B)).astype(np.int32) - np.isin(arr, (0x5D, 0x7D)).astype(np.int32))
    return int(np.cumsum(step).max(initial=0)) if step.size else 0


def parse_json(data: bytes | str, path: str | Path, what: str = "JSON") -> Any:
    """``json.loads`` that refuses nesting deeper than ``MAX_DEPTH`` instead of overflowing the stack."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    depth = nesting_depth(raw)
    if depth > MAX_DEPTH:
        raise ForensicsError(f"{what} is nested {depth} levels deep (at most {MAX_DEPTH}): corrupt or hostile",
                             path=path)
    try:  # UTF-8 only (JSON's own rule); json.loads would guess UTF-16/32 from the first bytes
        return json.loads(data if isinstance(data, str) else raw.decode("utf-8"))
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise ForensicsError(f"{what} is nested too deeply: corrupt or hostile", path=path) from None


def load_yaml(text: str, path: str | Path) -> Any:
    """``yaml.safe_load`` with a depth limit and aliases bounded by what they expand to (``MAX_YAML_NODES``)."""
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ForensicsError("reading a YAML file needs pyyaml: pip install pyyaml", path=path) from exc
    try:
        loader = yaml.SafeLoader(text)  # the reader refuses control characters here already
    except yaml.YAMLError as exc:
        raise ForensicsError(f"bad YAML: {str(exc).splitlines()[0]}", path=path) from None
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ForensicsError(f"YAML is nested too deeply (at most {MAX_DEPTH} levels): corrupt or hostile",
                                 path=path) from None
        except yaml.YAMLError as exc:
            raise ForensicsError(f"bad YAML: {str(exc).splitlines()[0]}", path=path) from None
        if node is None:
            return None
        _check_yaml_size(node, path)
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as exc:
            raise ForensicsError(f"bad YAML: {str(exc).splitlines()[0]}", path=path) from None
    finally:
        loader.dispose()


def _check_yaml_size(root: Any, path: str | Path) -> None:
    """Count the values the document holds once every alias is expanded, without expanding any.

    An iterative depth-first walk over the composed node graph (an alias is a shared node):
    the path length is the nesting depth, a node met again on its own path is a recursive alias.
    """
    import yaml

    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        node, i = stack[-1]
        kids = _children(node, yaml)
        if i == 0:
            on_path.add(id(node))
            if len(stack) > MAX_DEPTH:
                raise ForensicsError(f"YAML is nested more than {MAX_DEPTH} levels deep: corrupt or hostile", path=path)
        if i < len(kids):
            stack[-1] = (node, i + 1)
            child = kids[i]
            if id(child) in on_path:
                raise ForensicsError("YAML holds a recursive alias (a value that contains itself)", path=path)
            if id(child) not in sizes:
                stack.append((child, 0))
            continue
        stack.pop()
        on_path.discard(id(node))
        sizes[id(node)] = min(1 + sum(sizes[id(c)] for c in kids), MAX_YAML_NODES + 1)
    if sizes[id(root)] > MAX_YAML_NODES:
        raise ForensicsError(f"YAML expands to more than {MAX_YAML_NODES} values through its aliases (&anchor/*alias): "
                             "refusing what looks like an alias bomb", path=path)


def _children(node: Any, yaml: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    return []
