"""The one exception type of eagleforensics: bad input the user can fix.

Every message names the file (or parameter) and what is wrong, on one line, so the
CLI can print it as-is and exit with code 2.
"""
from __future__ import annotations

from pathlib import Path


class ForensicsError(Exception):
    """Bad input: a file, key, shape or option the user gave cannot be used."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | Path | None = None) -> None:
        self.path = None if path is None else str(path)
        self.detail = " ".join(str(message).split())  # always one line
        super().__init__(f"{self.path}: {self.detail}" if self.path else self.detail)
