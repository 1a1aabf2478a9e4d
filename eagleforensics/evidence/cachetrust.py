"""Whether a cache folder may be trusted with code: ssh's rule for its key folders, and pip's for its cache.

numba's cache is code: its index and every compiled entry are read back with ``pickle.loads``, so whoever
can write the folder runs code in every process that loads from it. A folder is trusted only if it and
every folder above it, up to ``/``, is owned by this user or by root and nobody else may write it (no
group or world write bit; an ancestor may be world-writable only with the sticky bit, as ``/tmp`` is:
others can add entries there but not replace ours). Each step is read with ``lstat``: a symbolic link
counts as its owner made it and is followed by checking the folder it resolves to in the same way.
A folder not made yet is judged by its nearest ancestor; it is checked again once it exists.
"""
from __future__ import annotations

import os
import stat


def _step(path: str, st: os.stat_result, leaf: bool) -> str | None:
    """Why one step of the path cannot be trusted, or None."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"{path} is owned by another user (uid {st.st_uid})"
    if stat.S_ISLNK(st.st_mode):
        return None  # its owner made it; where it points is checked on the resolved path
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022 and (leaf or not mode & stat.S_ISVTX):
        who = "anyone" if mode & 0o002 else "its group"
        return f"{path} can be written by {who} (mode {mode:04o})"
    return None


def _chain(path: str) -> str | None:
    """Why ``path`` (absolute) or a folder above it cannot be trusted, read without following links."""
    leaf = True
    while True:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None  # not made yet: what can write where it will be made is what counts
        except OSError as exc:
            return f"{path} cannot be checked ({exc.strerror or exc})"
        if st is not None:
            why = _step(path, st, leaf)
            if why is not None:
                return why
        leaf = False
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def distrust(folder: str | os.PathLike[str] | None) -> str | None:
    """None when ``folder`` may hold code this process loads; else why not, one phrase naming the folder."""
    if not folder:
        return "no cache folder was named"
    lexical = os.path.abspath(folder)
    why = _chain(lexical)
    if why is None:
        resolved = os.path.realpath(lexical)
        if resolved != lexical:
            why = _chain(resolved)
    return why
