"""Scan a whole training dataset: every record inspected once, in parallel, resumably; outliers with reasons.

``scan(DATASET_DIR)`` finds the records (SpecForge ``rows_*/data_*.ckpt[.gz]``, speculators
``hs_*.safetensors``, ModelOpt ``*.pt``), inspects each (``scan_signature``: layout, NaN/Inf,
padding against the ids, per-slot norm signature; with a reference, ``scan_reference``), and
appends one JSON line per record to the results file as results come in. Records run in a
local process pool, or on an existing Dask cluster when ``scheduler`` is given (the workers
must see the dataset at the same path). A results file that already holds lines is
continued: records recorded there are skipped, a half-written last line is dropped. The
dataset-wide judgement (``scan_summary``) is made from the lines at the end.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from .. import process
from ..errors import ForensicsError
from ..io.atomic import is_fixable, write_error
from .results import (
    ScanResult,
    build_result,
    check_output,
    load_results,
    make_header,
    natural_key,
    open_results,
)
from .summary import compact

if TYPE_CHECKING:
    from .audit import TargetAudit
    from .reference import Reference

__all__ = ["scan", "find_records", "inspect_batch", "ScanResult", "load_results", "build_result"]

RECORD_SUFFIXES = (".ckpt", ".ckpt.gz", ".safetensors", ".pt")
CONNECT_TIMEOUT = "10s"  # to reach a Dask scheduler
STOP_WAIT_S = 10.0  # the most an interrupted scan waits for its pool's manager thread (see stop_pool)
IN_PROCESS_BELOW = 64  # fewer records than this: a pool costs more than it saves
DEFAULT_AGREEMENT_TOKENS = 128  # supervised tokens scored per record against the target (evenly spread)
_WORKER_REFERENCE: Any = None
_WORKER_AUDIT: Any = None


def find_records(root: str | Path, skipped: list[str] | None = None) -> list[str]:
    """Record files under ``root`` (recursively, hidden names skipped), relative, in natural order.

    With ``skipped`` (a list to fill), model directories inside (config.json beside weights: a drafter or target kept
    next to the data) are not searched, and their relative paths are added to it."""
    base = Path(root)
    if not base.exists():
        raise ForensicsError("no such dataset directory", path=base)
    if not base.is_dir():
        raise ForensicsError("is not a directory; scan takes the dataset's top directory", path=base)
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        if skipped is not None:
            from ..io.identify import is_model_dir

            models = [d for d in dirnames if is_model_dir(os.path.join(dirpath, d))]
            skipped += [os.path.relpath(os.path.join(dirpath, d), base) for d in models]
            dirnames[:] = [d for d in dirnames if d not in models]
        for name in filenames:
            if not name.startswith(".") and name.endswith(RECORD_SUFFIXES):
                found.append(os.path.relpath(os.path.join(dirpath, name), base))
    if not found:
        raise ForensicsError(f"no training records found (looked for {', '.join('*' + s for s in RECORD_SUFFIXES)})",
                             path=base)
    return sorted(found, key=natural_key)


# ---------------------------------------------------------------- execution

def inspect_batch(root: str, rels: list[str], reference: "Reference | None", allow_unsafe: bool = False,
                  audit: "TargetAudit | None" = None) -> list[dict[str, Any]]:
    """Inspect a batch of records (the unit of work shipped to a pool or Dask worker); with ``audit``, each line gets
    the training-data audit against the target (``audit``), its agreement scored in one lm_head pass per batch."""
    from .signature import inspect_file

    lines = [inspect_file(root, rel, reference, allow_unsafe, audit) for rel in rels]
    if audit is not None:
        from .audit import score_prepared

        prepared = [line.pop("_prepared") for line in lines if "_prepared" in line]
        by_path = {p.line["path"]: p for p in prepared}
        done = {a["path"]: a for a in score_prepared(prepared, audit)}
        for line in lines:
            if line["path"] in by_path:
                a = done[line["path"]]
                line["audit"] = {k: v for k, v in a.items() if k != "path"}
    return lines


def _die_with_parent(parent: int) -> None:
    """Make this worker die when the scan process dies, even by SIGKILL, and leave Ctrl-C to the parent.

    Linux: ``PR_SET_PDEATHSIG`` sends SIGKILL to the worker when its parent exits. Elsewhere a
    daemon thread polls the parent pid. SIGINT is ignored: the terminal sends Ctrl-C to the
    whole process group, and the parent alone reports it (one line) and stops the workers.
    """
    import signal
    import sys
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):  # pragma: no cover - no prctl: fall back to polling
            pass
    if os.getppid() != parent:  # the parent died before the line above ran
        os._exit(1)

    def watch() -> None:
        import time

        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="eagleforensics-parent-watch", daemon=True).start()


ONE_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # read by torch when it starts


def _init_worker(reference: "Reference | None", parent: int | None = None, audit: "TargetAudit | None" = None) -> None:
    global _WORKER_REFERENCE, _WORKER_AUDIT
    if parent is not None:
        _die_with_parent(parent)
    # one thread per worker, without importing torch here: a worker that reads .ckpt/.pt records
    # imports it later (to load them), and it starts with the thread count these say
    for var in ONE_THREAD_ENV:
        os.environ[var] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    _WORKER_REFERENCE = reference
    _WORKER_AUDIT = audit


def make_pool(workers: int, reference: "Reference | None", audit: "TargetAudit | None" = None) -> Any:
    """A process pool of fresh interpreters (spawn) whose workers die with this process and ignore Ctrl-C."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with process.safe_path_children():  # its queue's lock starts multiprocessing's resource tracker (python -c)
        return ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                                   initargs=(reference, os.getpid(), audit))


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """Block SIGINT in this thread while workers are started (a child keeps the mask it was started with).

    A Ctrl-C during that moment is delivered when the block ends, to this process only.
    """
    import signal
    import threading

    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def stop_pool(pool: Any, finished: bool) -> None:
    """Shut the pool down; when the scan did not finish (Ctrl-C, an error), kill the workers now.

    Without the kill, the interpreter's exit would wait for the batches they are running. After
    it, the pool's manager thread is waited for (it ends within milliseconds once its workers are
    dead): left running, it could close its wake-up pipe just as the interpreter's exit hook writes
    to it, and Python before CPython gh-125451's fix prints "Exception ignored ... Bad file
    descriptor" with a traceback under the command's one line (seen about once in 100 Ctrl-Cs on a
    busy machine).
    """
    manager = getattr(pool, "_executor_manager_thread", None)  # shutdown() drops the reference
    if not finished:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            try:
                proc.kill()
            except (OSError, ValueError, AttributeError):  # already gone
                pass
    pool.shutdown(wait=finished, cancel_futures=True)
    if not finished and manager is not None:
        manager.join(STOP_WAIT_S)  # bounded: were it stuck, the exit hook would wait for it anyway


@contextlib.contextmanager
def _torch_one_thread(rels: list[str]) -> Iterator[None]:
    """One torch thread while records are read in this process (per-record tensors are tiny, and a thread
    pool on a busy machine makes them 5x slower); torch is not imported for a dataset of safetensors alone."""
    torch = sys.modules.get("torch")
    if torch is None and any(not r.endswith(".safetensors") for r in rels):
        import torch  # the records are torch files: reading them imports it anyway
    if torch is None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _worker_batch(root: str, rels: list[str], allow_unsafe: bool) -> list[dict[str, Any]]:
    return inspect_batch(root, rels, _WORKER_REFERENCE, allow_unsafe, _WORKER_AUDIT)


def _batches(rels: list[str], workers: int) -> list[list[str]]:
    size = max(1, min(64, len(rels) // (workers * 8) or 1))
    return [rels[i:i + size] for i in range(0, len(rels), size)]


def _run_local(root: str, rels: list[str], reference: "Reference | None", workers: int,
               allow_unsafe: bool, audit: "TargetAudit | None" = None) -> Iterator[list[dict[str, Any]] | BaseException]:
    if workers <= 1 or len(rels) < IN_PROCESS_BELOW:
        with _torch_one_thread(rels):
            for batch in _batches(rels, 1):
                yield inspect_batch(root, batch, reference, allow_unsafe, audit)
        return
    from concurrent.futures import as_completed

    pool = make_pool(workers, reference, audit)
    finished = False
    try:
        # workers start inside submit(): they inherit SIGINT blocked, so never see Ctrl-C, and start with no
        # current folder on sys.path (their ``python -c`` would import a numpy.py from it before anything else)
        with _sigint_blocked(), process.safe_path_children():
            futures = [pool.submit(_worker_batch, root, b, allow_unsafe) for b in _batches(rels, workers)]
        for fut in as_completed(futures):
            exc = fut.exception()
            yield exc if exc is not None else fut.result()
        finished = True
    finally:  # on Ctrl-C or an error, return now: running batches are killed, queued ones dropped
        stop_pool(pool, finished)


def _run_dask(root: str, rels: list[str], reference: "Reference | None", scheduler: Any,
              allow_unsafe: bool, audit: "TargetAudit | None" = None) -> Iterator[list[dict[str, Any]] | BaseException]:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise ForensicsError("running on a Dask cluster needs dask.distributed: pip install 'eagleforensics[scan]'") from None
    own = not isinstance(scheduler, Client)
    if own:
        try:
            client = Client(scheduler, timeout=CONNECT_TIMEOUT, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            raise ForensicsError(f"cannot reach the Dask scheduler at {scheduler}: {' '.join(str(exc).split())[:160]}") from None
    else:
        client = scheduler
    futures: list[Any] = []
    try:
        workers = max(1, len(client.scheduler_info().get("workers", {})))
        ref = client.scatter(reference, broadcast=True) if reference is not None else None
        aud = client.scatter(audit, broadcast=True) if audit is not None else None
        futures = [client.submit(inspect_batch, root, b, ref, allow_unsafe, aud, pure=False)
                   for b in _batches(rels, workers)]
        for fut in as_completed(futures, loop=client.loop):
            exc = fut.exception()
            yield exc if exc is not None else fut.result()
    finally:
        if futures:
            client.cancel([f for f in futures if not f.done()])
        if own:
            client.close()


# ---------------------------------------------------------------- entry point

def _progress_bar(total: int, progress: bool | None) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="record", desc="scan", disable=None if progress is None else not progress,
                mininterval=0.5)


def _default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 16))


def _collect(source: Iterable[Any], total: int, out_path: Path | None, header: dict[str, Any] | None,
             progress: bool | None) -> tuple[dict[str, dict[str, Any]], list[BaseException]]:
    """Take batches as they finish: keep them, append them to the results file, move the bar.

    The file is opened on the first result (a scan that fails to start leaves none behind);
    ``header`` is written first when the file is new.
    """
    new: dict[str, dict[str, Any]] = {}
    failures: list[BaseException] = []
    bar = _progress_bar(total, progress)
    fh = None
    header_written = header is None
    try:
        for batch in source:
            if isinstance(batch, BaseException):
                failures.append(batch)
                continue
            for line in batch:
                new[line["path"]] = compact(line)  # the file keeps the full line
            try:
                if out_path is not None and fh is None:
                    out_path.parent.mkdir(parents=True, exist_ok=True)
                    fh = out_path.open("w" if header is not None else "a", encoding="utf-8")
                    if header is not None:
                        fh.write(json.dumps(header) + "\n")
                        fh.flush()
                    header_written = True
                if fh is not None:
                    fh.write("".join(json.dumps(line) + "\n" for line in batch))
                    fh.flush()
            except OSError as exc:
                if out_path is None or not is_fixable(exc):
                    raise
                if not header_written:  # a file without its whole header cannot be resumed: it is ours, remove it
                    _discard(fh, out_path)
                    fh = None
                raise _write_failed(exc, out_path, fresh=not header_written) from None
            bar.update(len(batch))
    finally:
        bar.close()
        if fh is not None:
            try:
                fh.close()
            except OSError:  # the buffered tail could not be written: the line it held is half, dropped on --resume
                pass
        close = getattr(source, "close", None)
        if close is not None:  # stop the workers now, not when the generator is collected
            close()
    return new, failures


def _discard(fh: Any, out_path: Path) -> None:
    for step in ((lambda: fh.close()) if fh is not None else (lambda: None), out_path.unlink):
        try:
            step()
        except OSError:
            pass


def _write_failed(exc: OSError, out_path: Path, fresh: bool) -> ForensicsError:
    """The one-line error for a results file that cannot be written, saying how to continue."""
    hint = ("the lines written so far are kept: run the same command with --resume to continue once there is room"
            if not fresh else "nothing was scanned into it yet: run the command again once there is room")
    return write_error(exc, out_path, hint)


def scan(
    dataset: str | Path, *, reference: "str | Path | Reference | None" = None, output: str | Path | None = None,
    resume: bool = False, workers: int | None = None, scheduler: Any = None, progress: bool | None = None,
    allow_unsafe: bool = False, convention: str = "hf", target: "str | Path | TargetAudit | None" = None,
    served_prompts: str | Path | None = None, served_len: int | None = None,
    agreement_tokens: int = DEFAULT_AGREEMENT_TOKENS,
) -> ScanResult:
    """Inspect every record of ``dataset`` and judge them together (see the module docstring).

    ``output``: the JSONL results file (``None`` keeps results in memory only); ``resume``
    continues it. ``workers``: local processes (default: CPU count); ``scheduler``: a Dask
    scheduler address or ``distributed.Client`` to run on instead. ``progress``: a tqdm bar
    (``None``: only on a terminal). The local pool starts fresh interpreters (``spawn``, safe
    after torch has started threads), so a script that calls this with ``workers > 1`` needs
    the usual ``if __name__ == "__main__":`` guard.

    ``target`` (a target model directory): audit the training data against it (``scan.audit``): per
    record the target agreement of up to ``agreement_tokens`` supervised tokens and the chat-template
    reading of every supervised run; over the dataset the agreement histogram, the skeleton table and
    the findings, with ``served_prompts`` (a JSONL of served requests) and ``served_len`` for the
    served side.
    """
    from .audit import TargetAudit, audit_context
    from .reference import Reference, load_reference

    root = Path(dataset)
    rels = find_records(root)
    if workers is not None and workers < 1:
        raise ForensicsError(f"workers must be at least 1, got {workers}")
    ref = reference if isinstance(reference, Reference) or reference is None else load_reference(
        reference, convention=convention, allow_unsafe=allow_unsafe)
    if ref is not None:  # a reference kept inside the dataset directory is not a record
        rels = [r for r in rels if (root / r).resolve() != Path(ref.path).resolve()]
        if not rels:
            raise ForensicsError("holds no training records besides the reference capture", path=root)
    if agreement_tokens < 1:
        raise ForensicsError(f"agreement tokens must be at least 1, got {agreement_tokens}")
    audit = target if isinstance(target, TargetAudit) or target is None else TargetAudit.load(
        target, max_tokens=agreement_tokens)
    context = None if audit is None else audit_context(audit, served_prompts, served_len)
    header = make_header(root, None if ref is None else ref.path, None if audit is None else audit.path, context)
    done: dict[str, dict[str, Any]] = {}
    out_path = None if output is None else Path(output)
    fresh = False
    if out_path is not None:
        check_output(out_path, root, None if ref is None else ref.path)
        found = open_results(out_path, header, resume)
        fresh, done = found is None, found or {}
    todo = [r for r in rels if r not in done]
    source: Iterable[Any] = (
        _run_dask(str(root.resolve()), todo, ref, scheduler, allow_unsafe, audit) if scheduler is not None
        else _run_local(str(root.resolve()), todo, ref, workers or _default_workers(), allow_unsafe, audit)) if todo else []
    new, failures = _collect(source, len(todo), out_path, None if not fresh else header, progress)
    missing = [r for r in todo if r not in new]
    if missing:
        first = failures[0] if failures else "no result"
        where = f"; the lines so far are in {out_path}: run again with --resume" if out_path else ""
        raise ForensicsError(f"{len(missing)} records were not scanned (a worker failed: "
                             f"{type(first).__name__}: {' '.join(str(first).split())[:160]}){where}")
    lines = [new[r] if r in new else done[r] for r in rels]
    return build_result(str(root), None if ref is None else ref.to_dict(), None if out_path is None else str(out_path),
                        lines, len(new), len(rels) - len(new), context)
