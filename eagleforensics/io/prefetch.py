"""Read ahead on background threads: the next blocks are read from disk while this one is reduced.

File reads (``os.preadv``) and torch kernels both release the GIL, so reader threads overlap
I/O with compute. Buffers come from a small fixed pool, so memory stays at a few blocks
whatever the sweep's length; an error in a reader is raised in the caller.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Generic, Iterable, Iterator, TypeVar

J = TypeVar("J")
B = TypeVar("B")
_DONE = object()


class Prefetch(Generic[J, B]):
    """Iterate ``(job, filled, buffer)`` where ``fill(job, buffer)`` ran on a reader thread, ahead of the caller.

    One reader keeps the jobs' order; several (``readers > 1``) yield them as they finish. The
    buffer behind an item goes back to the pool when the next item is asked for, so use (or
    copy) it before advancing; with ``hold=True`` the caller hands it back with ``release``.
    """

    def __init__(self, jobs: Iterable[J], buffers: list[B], fill: Callable[[J, B], Any], *, hold: bool = False,
                 readers: int = 1) -> None:
        self._fill, self._hold = fill, hold
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        jobs = list(jobs)
        for job in jobs:
            self._jobs.put(job)
        self._readers = max(1, min(readers, len(jobs)))
        for _ in range(self._readers):
            self._jobs.put(_DONE)
        self._free: queue.Queue[B] = queue.Queue()
        for b in buffers:
            self._free.put(b)
        self._out: queue.Queue[Any] = queue.Queue()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, name="eagleforensics-prefetch", daemon=True)
                         for _ in range(self._readers)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        try:
            while True:
                job = self._jobs.get()
                if job is _DONE:
                    break
                buf = self._free.get()
                if self._stop.is_set():
                    return
                self._out.put((job, self._fill(job, buf), buf))
            self._out.put(_DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            self._out.put(exc)

    def release(self, buf: B) -> None:
        """Give a held buffer back to the readers (with ``hold=True``)."""
        self._free.put(buf)

    def __iter__(self) -> Iterator[tuple[J, Any, B]]:
        held: list[B] = []
        finished = 0
        try:
            while finished < self._readers:
                item = self._out.get()
                if held and not self._hold:
                    self._free.put(held.pop())
                if item is _DONE:
                    finished += 1
                    continue
                if isinstance(item, BaseException):
                    raise item
                held = [item[2]]
                yield item
        finally:
            self._stop.set()
            for _ in self._threads:
                self._free.put(None)  # type: ignore[arg-type]  # wakes readers waiting for a buffer; they stop
