"""How a command ends on a signal: SIGTERM unwinds like Ctrl-C, and cleanup is not cut short by a second signal.

Python turns SIGINT (Ctrl-C) into ``KeyboardInterrupt``, so every ``with`` and ``finally`` on the
way out runs: temporary files beside an output are removed, a report's work folder and its
kernel go. SIGTERM's default action ends the process on the spot and leaves all of that behind.
``sigterm_unwinds`` makes SIGTERM raise ``Terminated`` (a ``KeyboardInterrupt``) instead, so the
same cleanup runs; ``signals_held`` holds both signals while cleanup itself runs, and delivers
one that arrived once it is done.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

INTERRUPTED_EXIT = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
TERMINATED_EXIT = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so the command unwinds as on Ctrl-C (exit 143)."""


def exit_code(exc: BaseException) -> int:
    """143 for SIGTERM, 130 for Ctrl-C."""
    return TERMINATED_EXIT if isinstance(exc, Terminated) else INTERRUPTED_EXIT


def what(exc: BaseException) -> str:
    """``terminated`` (SIGTERM) or ``interrupted`` (Ctrl-C), for the one line a command prints."""
    return "terminated" if isinstance(exc, Terminated) else "interrupted"


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``Terminated`` in the main thread (a SIGTERM set to be ignored stays so)."""
    if not _main_thread() or not hasattr(signal, "SIGTERM"):
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM in this thread while the block (cleanup) runs; one that arrives is delivered after it."""
    if not hasattr(signal, "pthread_sigmask") or not _main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
