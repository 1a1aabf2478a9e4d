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

import contextlib
import contextvars
import json
import math
import os
import stat
import zipfile
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

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
NOT_REGULAR = "is not a regular file (a device, pipe or socket); copy the data to a file"
_CGROUP_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


# ---------------------------------------------------------------- regular files only

def open_regular_fd(path: str | Path, what: str = "file") -> int:
    """A blocking read-only descriptor of ``path``; a FIFO, device, socket or directory is refused without blocking.

    Opened with ``O_NONBLOCK`` (so a FIFO with no writer cannot hang ``open``), judged on the
    opened descriptor (no window between the check and the open), then set back to blocking.
    """
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
            raise ForensicsError(NOT_REGULAR, path=p)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str | Path, what: str = "file") -> IO[bytes]:
    """Open ``path`` for reading in binary mode; a FIFO, device or socket is refused without blocking."""
    return os.fdopen(open_regular_fd(path, what), "rb")


def check_output_target(path: str | Path, what: str = "output") -> None:
    """Refuse to write ``path`` when it exists and is not a regular file.

    Opening a FIFO for writing blocks until a reader comes, and renaming a finished output onto
    a device (``-o /dev/null`` run as root) would replace the device by a file.
    """
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except OSError:
        return  # nothing there yet (or a dangling link: the write names what is wrong)
    if stat.S_ISDIR(mode):
        raise ForensicsError(f"is a directory; give the {what} a file name", path=p)
    if not stat.S_ISREG(mode):
        raise ForensicsError(f"is not a regular file (a device, pipe or socket): the {what} is written to files only",
                             path=p)


def check_regular_tree(directory: str | Path, what: str = "directory") -> None:
    """Refuse a directory holding a FIFO, device or socket, before a library that opens by name (transformers) reads it.

    Every entry of ``directory`` (symlinks followed, hidden ones included) must be a regular
    file or a directory; nothing is opened, so nothing can block. Only the top level is
    checked: a model directory's loaders read no subfolder.
    """
    root = Path(directory)
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise ForensicsError(f"cannot list the {what}: {exc.strerror or exc}", path=root) from None
    for entry in entries:
        try:
            mode = os.stat(entry.path).st_mode
        except OSError:
            continue  # a dangling link: whoever reads it says it is missing
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise ForensicsError(f"{NOT_REGULAR} (inside the {what})", path=entry.path)


def stored_bytes(path: Any) -> int:
    """Bytes on disk of an input: a regular file's size, or the sum over the regular files directly
    in a folder; 0 for anything else (a loaded object, a FIFO, a path that cannot be read). A hint
    for work sized before the input is read, never a check: nothing is opened."""
    if not isinstance(path, (str, Path)):
        return 0
    try:
        if os.path.isdir(path):
            with os.scandir(path) as entries:
                return sum(e.stat().st_size for e in entries if e.is_file())
        return os.stat(path).st_size if os.path.isfile(path) else 0
    except (OSError, ValueError):  # ValueError: a NUL in the name; the reader names that error
        return 0


def read_regular(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (a config, a header), refused when larger."""
    with open_regular(path, what) as fh:
        if os.fstat(fh.fileno()).st_size > limit:  # refused before anything is read
            raise ForensicsError(f"is larger than {human_bytes(limit)}: not a {what}", path=path)
        data = fh.read(limit + 1)  # a file growing meanwhile is still cut at the limit
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


_DECLARED: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar("inputs", default=())


@contextlib.contextmanager
def declared_inputs(items: Iterable[tuple[str, str]]) -> Iterator[None]:
    """While the block runs, every ``check_not_input`` (hence every writer) also refuses these ``(path, role)``:
    the CLI declares every path a command was given (``cli.common.run_guarded``), so no writer can forget one."""
    token = _DECLARED.set(tuple(items))
    try:
        yield
    finally:
        _DECLARED.reset(token)


def check_not_input(output: str | Path, inputs: Iterable[Any], what: str = "output") -> None:
    """Refuse ``output`` when it is one of ``inputs`` (or of the running command's declared inputs) or lies inside
    an input directory.

    Each input is a path or ``(path, role)``, the role naming it in the message ("the
    dataset"). Files are compared by (device, inode), so a hard link or a symlink to an input
    is caught as well as the same name. For an existing output with more than one link, the
    files of input directories are compared too (a hard link from outside into a capture directory).
    """
    inputs = [*inputs, *_DECLARED.get()]
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
    """Check every member's declared size and ratio before anything is decompressed; a name twice is refused.

    zipfile never returns more than a member's declared size and torch allocates a record at
    its declared size, so bounding the declaration bounds what is expanded.
    """
    total = 0
    seen: set[str] = set()
    for info in zf.infolist():
        if info.filename in seen:  # zipfile takes the last copy; torch's miniz a copy its binary search lands on
            raise ForensicsError(f"{where}zip archive holds member {info.filename[:120]!r} more than once: which copy "
                                 "a reader takes differs between readers (torch's depends on where the copies lie), "
                                 "so the file is ambiguous; refused", path=path)
        seen.add(info.filename)
        total += info.file_size
        if info.compress_type != zipfile.ZIP_STORED or info.file_size > info.compress_size:
            check_expansion(info.file_size, info.compress_size, path, f"{where}archive member {info.filename!r}")
    check_expansion(total, max(total, 1), path, f"{where}archive")  # the whole archive, by budget only


# ---------------------------------------------------------------- parsers with depth limits

_DEPTH_CHUNK = 1 << 20


def nesting_depth(data: bytes) -> int:
    """Deepest ``[``/``{`` nesting of JSON (or YAML flow) text, strings skipped: one linear numpy pass, no recursion.

    A quote opens or closes a string unless an odd run of backslashes precedes it; brackets
    count only outside strings. Exact for valid JSON and for every prefix a parser reads
    before it fails, so it bounds the parser's recursion. Read in 1 MiB chunks (state carried
    over), in time and memory linear in the input whatever the bytes (no regex backtracking).
    """
    return json_shape(data)[0]


def json_shape(data: bytes) -> tuple[int, int]:
    """(nesting depth, values) of JSON text in one linear pass (see ``nesting_depth``). Values counts every
    ``,``, ``[`` and ``{`` outside strings: at least the values a parser builds less one and at most twice them
    (keys aside), so a reply of a million empty objects is refused by its count before any of them is built."""
    depth = best = items = 0
    quotes = 0  # unescaped quotes seen so far (odd: inside a string)
    run = 0  # backslashes just before the chunk
    for at in range(0, len(data), _DEPTH_CHUNK):
        c = np.frombuffer(data, dtype=np.uint8, count=min(_DEPTH_CHUNK, len(data) - at), offset=at)
        idx = np.arange(c.size, dtype=np.int64)
        bs = c == 0x5C
        last = np.maximum.accumulate(np.where(bs, -1, idx))  # last non-backslash at or before i
        before = np.empty(c.size, dtype=np.int64)  # backslashes just before i
        before[0] = run
        prev = last[:-1]
        before[1:] = np.where(prev < 0, idx[1:] + run, idx[:-1] - prev)
        live = (c == 0x22) & (before % 2 == 0)
        seen = np.cumsum(live, dtype=np.int64)
        outside = (quotes + seen - live) % 2 == 0
        opens = (c == 0x5B) | (c == 0x7B)
        step = opens.astype(np.int64) - ((c == 0x5D) | (c == 0x7D))
        level = np.cumsum(np.where(outside, step, 0)) + depth
        best = max(best, int(level.max()))
        items += int(np.count_nonzero(outside & (opens | (c == 0x2C))))
        depth = int(level[-1])
        quotes += int(seen[-1])
        run = run + c.size if last[-1] < 0 else c.size - 1 - int(last[-1])
    return best, items


def parse_json(data: bytes | str, path: str | Path, what: str = "JSON", *, max_items: int | None = None,
               strict_numbers: bool = False) -> Any:
    """``json.loads`` that refuses nesting deeper than ``MAX_DEPTH`` instead of overflowing the stack.

    Every failure is a ``ForensicsError`` or a ``json.JSONDecodeError`` (which callers word
    for their format): a number past Python's digit limit, a recursion, are one line too.
    ``max_items`` refuses text holding more values (``json_shape``) before any is built;
    ``strict_numbers`` refuses what JSON itself does not allow and no server writes: ``NaN`` and
    ``Infinity``, a number that overflows to infinity, an integer past 64 bits (refused by its
    length before ``int()`` reads it, whatever ``sys.set_int_max_str_digits`` allows).
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    depth, items = json_shape(raw)
    if depth > MAX_DEPTH:
        raise ForensicsError(f"{what} is nested {depth} levels deep (at most {MAX_DEPTH}): corrupt or hostile",
                             path=path)
    if max_items is not None and items > max_items:
        raise ForensicsError(f"{what} holds {items:,} values (at most {max_items:,}): corrupt or hostile", path=path)
    hooks: dict[str, Any] = {"parse_constant": _no_constant, "parse_float": _finite_float,
                             "parse_int": _int64} if strict_numbers else {}
    try:  # UTF-8 only (JSON's own rule); json.loads would guess UTF-16/32 from the first bytes
        return json.loads(data if isinstance(data, str) else raw.decode("utf-8"), **hooks)
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise ForensicsError(f"{what} is nested too deeply: corrupt or hostile", path=path) from None
    except UnicodeDecodeError:
        raise ForensicsError(f"{what} is not UTF-8 text: corrupt", path=path) from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # an integer of more digits than int() converts (sys.get_int_max_str_digits)
        raise ForensicsError(f"{what} is not valid JSON ({' '.join(str(exc).split())[:100]}): corrupt or hostile",
                             path=path) from None


_INT64_DIGITS = 19  # 2**63 - 1 has 19 digits


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:24]}{'...' if len(text) > 24 else ''} is out of range")
    return value


def _int64(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > _INT64_DIGITS or not -(1 << 63) <= (value := int(text)) < (1 << 63):
        raise ValueError(f"an integer of {digits} digits is past 64 bits")
    return value


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
