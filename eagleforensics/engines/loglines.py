"""Server log lines, read safely: a plain or gzipped file as bounded text lines (each line capped, the
decompression bounded, binary files refused). ``logs`` parses these lines into runs and ``serverargs`` finds
the arguments line in them; this module owns the reading, so neither imports the other for it.
"""
from __future__ import annotations

import gzip
import io
import os
import zlib
from pathlib import Path
from typing import IO, Iterator

from ..errors import ForensicsError
from ..io.guards import check_expansion, open_regular

_BINARY_PROBE = 64 * 1024
MAX_LINE = 1024 * 1024


class _BoundedLines:
    """Lines of a (possibly gzipped) byte stream, each at most ``MAX_LINE`` bytes, decompression bounded.

    A line longer than the cap, or a gzip stream that expands past the budget or ratio of
    ``io.guards.check_expansion``, is a ForensicsError naming the file and the line.
    """

    def __init__(self, raw: IO[bytes], path: Path, packed: int, gzipped: bool) -> None:
        self._raw, self._path, self._packed, self._gzipped = raw, path, packed, gzipped
        self._read, self._number = 0, 0

    def __iter__(self) -> Iterator[str]:
        while True:
            line = self._raw.readline(MAX_LINE + 1)
            if not line:
                return
            self._number += 1
            self._read += len(line)
            if len(line) > MAX_LINE and not line.endswith(b"\n"):
                raise ForensicsError(f"line {self._number} is longer than {MAX_LINE // 1024} KiB: not a server log "
                                     "(or a damaged one)", path=self._path)
            if self._gzipped:
                check_expansion(self._read, self._packed, self._path, "gzip stream")
            yield line.decode("utf-8", errors="replace")

    def __enter__(self) -> "_BoundedLines":
        return self

    def __exit__(self, *exc: object) -> None:
        self._raw.close()


def open_text(path: Path) -> _BoundedLines:
    """Open a (possibly gzipped) log as bounded text lines; ForensicsError naming the file if missing, binary or not a file."""
    if not path.exists() and not path.is_symlink():
        raise ForensicsError("no such log file", path=path)
    if path.is_dir():
        raise ForensicsError("is a directory, expected a server log file", path=path)
    fh = open_regular(path, "server log file")
    try:
        packed = os.fstat(fh.fileno()).st_size
        gzipped = fh.read(2) == b"\x1f\x8b"
        fh.seek(0)
        raw: IO[bytes] = gzip.GzipFile(fileobj=fh, mode="rb") if gzipped else fh
        head = raw.read(_BINARY_PROBE)
        raw.seek(0)
    except (OSError, EOFError) as exc:
        fh.close()
        raise ForensicsError(f"cannot read log file: {getattr(exc, 'strerror', None) or exc}", path=path) from None
    if b"\x00" in head:
        fh.close()
        raise ForensicsError("binary file, expected a text server log", path=path)
    return _BoundedLines(_Closing(raw, fh), path, packed, gzipped)


class _Closing(io.RawIOBase):
    """A reader that closes both the gzip layer and the file under it."""

    def __init__(self, raw: IO[bytes], fh: IO[bytes]) -> None:
        self._raw, self._fh = raw, fh

    def readline(self, size: int | None = -1) -> bytes:  # type: ignore[override]
        return self._raw.readline(-1 if size is None else size)

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            self._fh.close()


def read_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a plain or gzipped log, with the same checks and errors as ``parse_log``."""
    p = Path(path)
    number = 0
    with open_text(p) as fh:
        try:
            for number, line in enumerate(fh, start=1):
                yield number, line
        except (OSError, EOFError, zlib.error) as exc:
            raise ForensicsError(f"cannot read log file past line {number}: {exc}", path=p) from None
