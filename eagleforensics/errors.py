"""The one exception type of eagleforensics: bad input the user can fix.

Every message names the file (or parameter) and what is wrong, on one line, so the
CLI can print it as-is and exit with code 2.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path


class ForensicsError(Exception):
    """Bad input: a file, key, shape or option the user gave cannot be used."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | Path | None = None) -> None:
        self.path = None if path is None else str(path)
        self.detail = " ".join(str(message).split())  # always one line
        super().__init__(f"{self.path}: {self.detail}" if self.path else self.detail)


# What the OS says about a path it refuses (a name too long, no permission, a loop of links): the user's to fix.
_PATH_ERRNOS = {errno.ENAMETOOLONG, errno.EACCES, errno.EPERM, errno.ELOOP, errno.ENOTDIR, errno.ENOENT,
                errno.EISDIR, errno.EROFS, errno.ENXIO, errno.ENODEV, errno.EIO}


def path_error(exc: BaseException) -> ForensicsError | None:
    """The one-line ForensicsError for an OSError the OS raised about a named path (exit 2), or None for others.

    ``Path.exists()`` and friends raise for a name too long or a folder without permission
    instead of answering False; whichever call met the path first, the user reads one line
    naming it, never an internal error.
    """
    if isinstance(exc, OSError) and exc.filename is not None and exc.errno in _PATH_ERRNOS:
        name = exc.filename if isinstance(exc.filename, str) else os.fsdecode(exc.filename)
        shown = name if len(name) <= 200 else name[:200] + "..."
        return ForensicsError(f"cannot be used: {exc.strerror or exc}", path=shown)
    return None


# Characters that move the cursor, recolour the terminal or break a line: C0/C1 controls, DEL,
# the Unicode line/paragraph separators and the bidirectional overrides that reorder text.
_UNSAFE = {c for c in range(0x20)} | {0x7F} | set(range(0x80, 0xA0)) | {0x2028, 0x2029} | set(
    range(0x202A, 0x202F)) | set(range(0x2066, 0x206A))
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: object, *, keep_newlines: bool = False) -> str:
    """``text`` safe for a terminal: every control character escaped (``\\x1b``, ``\\n``), so one line stays one.

    Everything printed that a user or a file controls (paths, tensor key names, labels) goes
    through here. ``keep_newlines`` leaves the line breaks of text the program built itself
    (a table) and escapes every other control character.
    """
    s = str(text)
    if not any(ord(ch) in _UNSAFE for ch in s):
        return s
    out = []
    for ch in s:
        if ord(ch) not in _UNSAFE or (keep_newlines and ch == "\n"):
            out.append(ch)
        elif ch in _NAMED:
            out.append(_NAMED[ch])
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out)
