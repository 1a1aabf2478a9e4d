"""How a command ends on a signal: SIGTERM unwinds like Ctrl-C, and cleanup is not cut short by a second signal.

Python turns SIGINT (Ctrl-C) into ``KeyboardInterrupt``, so every ``with`` and ``finally`` on the
way out runs: temporary files beside an output are removed, a report's work folder and its
kernel go. SIGTERM's default action ends the process on the spot and leaves all of that behind.
``signals_unwind`` makes SIGTERM raise ``Terminated`` (a ``KeyboardInterrupt``) instead, so the
same cleanup runs; ``signals_held`` holds both signals while cleanup itself runs, and delivers
one that arrived once it is done. From the moment either signal arrives, log records are dropped:
a stopped command prints its one line, not what the libraries log while they unwind (papermill's
"Kernel died while waiting for execute reply.", asyncio's "Task exception was never retrieved"),
nor the warning Python gives at exit for a coroutine the signal left unawaited (papermill's
``run_sync`` makes a cell's coroutine before it starts the loop that would await it).
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
import warnings
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


def _quiet() -> None:
    """Drop log records, and the never-awaited warning, from here on: the command is ending and prints its own
    one line."""
    logging.disable(logging.CRITICAL)
    warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited", category=RuntimeWarning)


def _raise_terminated(signum: int, frame: Any) -> None:
    _quiet()
    raise Terminated()


def _raise_interrupted(signum: int, frame: Any) -> None:
    _quiet()
    raise KeyboardInterrupt()


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``Terminated`` and SIGINT ``KeyboardInterrupt`` in the main thread,
    both silencing the libraries' logs first (a signal set to be ignored, or handled by someone else, stays so)."""
    if not _main_thread():
        yield
        return
    handlers = {}
    for name, handler, default in (("SIGTERM", _raise_terminated, signal.SIG_DFL),
                                   ("SIGINT", _raise_interrupted, signal.default_int_handler)):
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) in (default, None):
            handlers[sig] = handler
    previous = {sig: signal.getsignal(sig) for sig in handlers}
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


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
