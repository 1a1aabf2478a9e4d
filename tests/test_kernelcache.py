"""Kernels compiled once per machine, never waited for: the numpy path answers until a detached process has
filled numba's cache and marked it; the mark names the CPU and the source; the numpy path runs positions on
threads with the numbers of one thread (real forward passes)."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from eagleforensics.evidence import fused, kernelcache, match
from eagleforensics.io.capture import load_capture
from eagleforensics.io.sweep import write_capture

from .realdata import N, ROOT, _model, forward

START = kernelcache.start_compiling  # the real one (conftest refuses it in every other test)
needs_numba = pytest.mark.skipif(not fused.AVAILABLE, reason="numba is not installed")


@pytest.fixture
def marks(tmp_path, monkeypatch):
    """The mark's folder is a fresh one, nothing seen or started yet in this process."""
    monkeypatch.setenv(kernelcache.DIR_ENV, str(tmp_path / "marks"))
    monkeypatch.setattr(kernelcache, "start_compiling", START)
    monkeypatch.setattr(kernelcache, "_state", {})
    monkeypatch.setattr(fused, "_MODE", "auto")
    monkeypatch.setattr(fused, "AVAILABLE", True)
    monkeypatch.setattr(fused, "MIN_BYTES", 100)
    started: list[int] = []
    monkeypatch.setattr(kernelcache.subprocess, "Popen", lambda *a, **k: started.append(1))
    return started


def test_without_the_mark_the_numpy_path_answers_and_one_compile_starts(marks):
    assert not fused.wanted(100) and not fused.wanted(10**9)
    assert marks == [1]  # once per process, however often asked
    assert not fused.wanted(99) and fused.preload(10**9) is None
    kernelcache.mark_compiled()
    assert fused.wanted(100) and not fused.wanted(99)
    assert marks == [1]


def test_forcing_the_kernels_compiles_in_the_process_without_the_mark(marks, monkeypatch):
    monkeypatch.setattr(fused, "_MODE", "1")
    assert fused.wanted(100) and marks == []


def test_the_mark_names_the_cpu_the_source_and_the_folder_numba_uses(marks, monkeypatch, tmp_path):
    first = kernelcache.stamp()
    assert first.parent == tmp_path / "marks"
    monkeypatch.setattr(kernelcache, "_cpu", lambda: "model name : another CPU\nflags : avx2")
    assert kernelcache.stamp() != first  # numba's cached code is for one CPU: another one compiles again
    monkeypatch.setattr(kernelcache, "SOURCE", tmp_path / "fused.py")
    (tmp_path / "fused.py").write_text("x")
    moved = kernelcache.stamp()
    os.utime(tmp_path / "fused.py", ns=(1, 1))
    assert kernelcache.stamp() != moved  # an edited kernel source is compiled again, as numba does
    monkeypatch.delenv(kernelcache.DIR_ENV)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    assert kernelcache.folder() == tmp_path / "numba"
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    monkeypatch.setattr(kernelcache, "SOURCE", tmp_path / "ro" / "fused.py")  # a folder that cannot be made here
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(kernelcache.os, "access", lambda path, mode: False)
    assert kernelcache.folder() == tmp_path / "xdg" / "eagleforensics"  # numba's user-wide cache, beside it


def _compile(env: dict[str, str], tmp_path, timeout: int = 600) -> subprocess.CompletedProcess:
    code = "from eagleforensics.evidence.fused import compile_into_cache; compile_into_cache()"
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout)


@needs_numba
def test_the_detached_compile_fills_the_cache_with_every_kernel_and_then_marks_it(tmp_path):
    """The process ``start_compiling`` runs: every kernel ends in numba's cache, the mark is written, and a
    later process loads all of them from the cache (no compile) for the types a real align passes.
    While another holds the lock, a second one leaves at once and writes nothing."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), kernelcache.DIR_ENV: str(tmp_path)}
    env.pop("EAGLEFORENSICS_FUSED", None)
    lock = tmp_path / "eagleforensics-kernels.lock"
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        t0 = time.monotonic()
        res = _compile(env, tmp_path, timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        assert time.monotonic() - t0 < 60 and not list(tmp_path.glob("*.ok"))
    res = _compile(env, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(list(tmp_path.glob("eagleforensics-kernels-*.ok"))) == 1
    code = ("from eagleforensics.evidence import fused\nassert fused.wanted(fused.MIN_BYTES)\n"
            "fused._warm(every=True)\nk = fused._KERNELS\n"
            "for n in ('direct', 'fit_equations', 'fit_scores', 'max_abs', 'row_stats'):\n"
            "    d = getattr(k, n)\n"
            "    assert len(d.signatures) == 1 and d.stats.cache_misses == {}, (n, d.stats)\n"
            "    assert sum(d.stats.cache_hits.values()) == 1, (n, d.stats)\nprint('ok')")
    res = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and res.stdout.split()[-1] == "ok", res.stderr[-2000:]


def test_each_runs_on_threads_reports_in_order_and_raises_the_first_error(monkeypatch):
    """On threads when asked (in order here when not), reported in order, the first error raised."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    names: set[str] = set()
    seen: list[int] = []
    gate = threading.Barrier(2, timeout=30)

    def work(i: int) -> None:
        names.add(threading.current_thread().name)
        if i < 2:
            gate.wait()  # two items at once: they run on two threads
        time.sleep(0.01 * (5 - i))

    match.each(work, range(5), seen.append)
    assert seen == [0, 1, 2, 3, 4] and len(names) >= 2 and threading.current_thread().name not in names

    def fails(i: int) -> None:
        if i == 1:
            raise ValueError("position 1")

    with pytest.raises(ValueError, match="position 1"):
        match.each(fails, range(8))

    names.clear()
    order: list[int] = []
    match.each(lambda i: order.append(i) or names.add(threading.current_thread().name), range(5), threads=False)
    assert order == [0, 1, 2, 3, 4] and names == {threading.current_thread().name}


def test_the_numpy_path_gives_the_numbers_of_one_thread_on_any_number(tmp_path, monkeypatch):
    """A real sweep (bf16) and record slots, every fitted column and the candidate ones: scores on one
    thread and on four are equal bit for bit, and four threads did run."""
    monkeypatch.setattr(fused, "AVAILABLE", False)
    small = match.THREAD_BYTES
    monkeypatch.setattr(match, "THREAD_BYTES", 0)  # a test capture is far below the size that gets threads
    run = forward("qwen3")
    path = tmp_path / "cap.safetensors"
    write_capture(path, run.sweep, _model("qwen3", 0), dtype="bfloat16")
    cap = load_capture(path)
    slots = [run.p(p).to(torch.bfloat16).contiguous() for p in (2, N // 2 + 1, N - 2)] + [run.hs[N].contiguous()]
    threads: set[str] = set()
    real = match.Sums.pass1
    def pass1(self, *a, **k):  # noqa: ANN001, ANN202
        threads.add(threading.current_thread().name)
        time.sleep(0.02)  # tiny tasks: without a pause one worker can take them all before the others start
        return real(self, *a, **k)

    monkeypatch.setattr(match.Sums, "pass1", pass1)
    for fc in (None, match.FIT_CANDIDATES):
        got = {}
        for cpus in (1, 4):
            monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)), raising=False)
            threads.clear()
            got[cpus] = match.score_slots(slots, [False, False, False, True], cap.positions, cap, 3, 5, 20,
                                          fit_candidates=fc)
            assert len(threads) == 1 if cpus == 1 else len(threads) > 1, threads
        for name in ("score", "rel_diff", "max_abs", "norm_ratio", "per_token"):
            a, b = getattr(got[1], name), getattr(got[4], name)
            assert np.array_equal(a, b, equal_nan=True), (fc, name)
    monkeypatch.setattr(match, "THREAD_BYTES", small)  # as shipped: a capture this small stays in one thread
    threads.clear()
    match.score_slots(slots, [False, False, False, True], cap.positions, cap, 3, 5, 20)
    assert threads == {threading.current_thread().name}


def test_no_folder_for_the_mark_reads_as_not_compiled(marks, monkeypatch):
    """No home directory (``Path.home()`` raises) is no error for align: the numpy path answers."""
    monkeypatch.delenv(kernelcache.DIR_ENV)
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(kernelcache.os, "access", lambda path, mode: False)

    def no_home() -> None:
        raise RuntimeError("Could not determine home directory.")
    monkeypatch.setattr(kernelcache.Path, "home", staticmethod(no_home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert not kernelcache.ready() and not fused.wanted(10**9)
