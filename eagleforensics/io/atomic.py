"""Write an output all at once or not at all: a temporary file beside it, renamed into place.

A reader never sees a half-written report and a failed write (disk full, no permission)
leaves the previous file as it was. Errors the user can fix become one ``ForensicsError``
naming the path and what to do.
"""
from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import IO, Callable, Iterator

from ..errors import ForensicsError
from .guards import check_not_input, check_output_target

# errno -> what the user can do about it
_FIXABLE = {
    errno.ENOSPC: "no space left on the device: free some space or write elsewhere",
    errno.EDQUOT: "disk quota exceeded: free some space or write elsewhere",
    errno.EFBIG: "file too large for this file system: write elsewhere",
    errno.EACCES: "permission denied: choose a folder you can write to",
    errno.EPERM: "operation not permitted: choose a folder you can write to",
    errno.EROFS: "read-only file system: choose a folder you can write to",
}


def write_error(exc: OSError, path: str | Path, hint: str = "") -> ForensicsError:
    """A one-line ForensicsError for a failed write; ``hint`` is appended (e.g. how to continue)."""
    reason = _FIXABLE.get(exc.errno or -1) or f"cannot write: {exc.strerror or exc}"
    return ForensicsError(f"{reason}{'; ' + hint if hint else ''}", path=path)


def is_fixable(exc: OSError) -> bool:
    """True for the write errors that are the user's to fix (space, quota, permissions), not a bug."""
    return exc.errno in _FIXABLE


@contextlib.contextmanager
def atomic_path(path: str | Path, hint: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds it is renamed onto ``path``.

    On any failure the temporary file is removed and ``path`` is left as it was; an
    ``OSError`` (ENOSPC, EACCES, ...) becomes a ForensicsError naming ``path``.
    """
    target = Path(path)
    check_output_target(target)  # never renamed onto a device or pipe
    check_not_input(target, ())  # nor onto, or into, anything the running command reads
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name[:80]}.", suffix=".part", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        raise write_error(exc, target, hint) from None
    tmp = Path(tmp_name)
    try:
        yield tmp
        _fsync(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except OSError as exc:
        raise write_error(exc, target, hint) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def write_atomic(path: str | Path, write: Callable[[IO[bytes]], object], hint: str = "") -> Path:
    """Write ``path`` through ``write(fh)`` on a binary file handle, atomically (see ``atomic_path``)."""
    with atomic_path(path, hint) as tmp, open(tmp, "wb") as fh:
        write(fh)
    return Path(path)


def write_bytes_atomic(path: str | Path, data: bytes, hint: str = "") -> Path:
    """``Path.write_bytes``, atomically."""
    return write_atomic(path, lambda fh: fh.write(data), hint)


def _fsync(p: Path) -> None:
    with open(p, "rb+") as fh:
        os.fsync(fh.fileno())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
