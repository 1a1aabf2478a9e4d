"""Issue 13: hostile or unlucky inputs never touch an input, never expand without bound, always end in one line.

Each defect found by the attack on the released CLI has a test here (the catalogue rows of
docs/errors.md name them). The inputs are built by tests/hostile.py from the real samples;
scripts/hostile_inputs.py runs the same inputs as real processes and prints peak memory.
"""
from __future__ import annotations

import builtins
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from eagleforensics.errors import ForensicsError

from . import hostile
from .test_errors import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parent.parent
# the FIFO cases hang for ever on a reader that opens without checking, and the claims of issue 19 took
# gigabytes: run those in a process with a timeout, measuring its peak memory
IN_PROCESS = [b for b in hostile.BUILDERS if b.__name__ not in hostile.AS_PROCESS]
AS_PROCESS = [b for b in hostile.BUILDERS if b.__name__ in hostile.AS_PROCESS]
GIB = 1024**3
PEAKRSS = ROOT / "benchmarks" / "peakrss.py"


@pytest.mark.parametrize("build", IN_PROCESS, ids=[b.__name__ for b in IN_PROCESS])
def test_hostile_input_is_one_line_exit_2_and_inputs_unchanged(build, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    case = build(hostile.prepare(tmp_path))
    assert case.id in hostile.CATALOGUE_IDS
    before = hostile.fingerprint_of(case.watch)
    assert_one_line_error(*run_cli(*case.args), *case.expect)
    assert hostile.fingerprint_of(case.watch) == before  # bytes and mtime


@pytest.mark.parametrize("build", AS_PROCESS, ids=[b.__name__ for b in AS_PROCESS])
def test_hang_or_memory_case_is_one_line_in_bounded_time_and_memory(build, tmp_path: Path) -> None:
    """A FIFO is refused without blocking; a claimed size is refused before it is allocated (peak < 1 GiB)."""
    case = build(hostile.prepare(tmp_path))
    before = hostile.fingerprint_of(case.watch)
    code, out, err, peak = run_process(case.args, tmp_path, timeout=120)
    assert code == 2 and out == "", (code, err)
    assert err.count("\n") == 1 and err.startswith("eagleforensics: error: "), err
    assert all(e in err for e in case.expect), err
    assert peak < GIB, f"peak resident memory {peak / 2**20:.0f} MiB"
    assert hostile.fingerprint_of(case.watch) == before


def run_process(args: list[str], cwd: Path, timeout: float = 120, env: dict | None = None
                ) -> tuple[int, str, str, int]:
    """``python -m eagleforensics ARGS`` as a process: (exit code, stdout, stderr, its own peak resident bytes).

    Started through benchmarks/peakrss.py, a small parent: Linux carries the forking process's RSS high-water
    mark into the child's ``ru_maxrss``, so a child forked straight from pytest (over 1 GiB late in the suite)
    reported pytest's peak, not its own. Killed with its process group after ``timeout`` s (a hang fails)."""
    import tempfile

    cmd = [sys.executable, str(PEAKRSS), sys.executable, "-m", "eagleforensics", *map(str, args)]
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, cwd=cwd,
                                env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, start_new_session=True)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"no answer in {timeout:.0f} s: {args}")
        fo.seek(0)
        fe.seek(0)
        err, _, peak = fe.read().decode().rpartition("\npeak_rss_kib=")
        return proc.returncode, fo.read().decode(), err, int(peak) * 1024


def test_log_line_with_an_impossible_date_is_one_line(tmp_path: Path) -> None:
    """Found by scripts/fuzz.py: a flipped bit in a vLLM prefix made strptime raise (exit 3)."""
    src = (hostile.FIXTURES / "vllm_0.33.log").read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(src) if "SpecDecoding metrics" in line)
    src[at] = src[at].replace(src[at].split(" INFO ")[1][:5], "11-39", 1)
    log = tmp_path / "bad_date.log"
    log.write_text("".join(src))
    assert_one_line_error(*run_cli("logs", f"run={log}"), "bad_date.log", f"line {at + 1} is damaged")


# ---------------------------------------------------------------- printing: control characters escaped

def test_printable_escapes_every_control_character() -> None:
    from eagleforensics.errors import printable

    assert printable("a\x1b[2Jb\nc\rd\te\x7f\x9b\u2028\u202e") == "a\\x1b[2Jb\\nc\\rd\\te\\x7f\\x9b\\u2028\\u202e"
    assert printable("table\nrow\x1b", keep_newlines=True) == "table\nrow\\x1b"
    assert printable("plain ünïcode") == "plain ünïcode"


def test_key_names_with_escapes_cannot_forge_a_verdict_line(tmp_path: Path) -> None:
    case = hostile.escape_in_key_name(tmp_path)
    code, out, err = run_cli(*case.args)
    assert code in (0, 1), err
    assert "\x1b" not in out + err
    assert sum(line.startswith("VERDICT:") for line in out.splitlines()) == 1, out
    assert "h0\\x1b[2J\\nVERDICT: every slot placed" in out


def test_file_name_with_escapes_reaches_stdout_escaped(tmp_path: Path) -> None:
    rec = tmp_path / "rec\x1b]0;owned\x07\nVERDICT: fine.pt"
    rec.write_bytes(hostile.REC.read_bytes())
    code, out, err = run_cli("align", rec, hostile.CAP)
    assert code == 1, err  # the incident record: ACTION
    assert "\x1b" not in out and "\x07" not in out
    assert sum(line.startswith("VERDICT:") for line in out.splitlines()) == 1, out


# ---------------------------------------------------------------- outputs: atomic, disk full is one line

class _FullDisk:
    """A file object that takes ``room`` bytes, then fails as a full disk does (ENOSPC)."""

    def __init__(self, fh, room: int) -> None:
        self._fh, self._room = fh, room

    def write(self, data):  # type: ignore[no-untyped-def]
        if len(data) > self._room:
            self._fh.write(data[:self._room])
            self._room = 0
            self._fh.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= len(data)
        return self._fh.write(data)

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self._fh, name)

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc):  # type: ignore[no-untyped-def]
        self._fh.close()


def _disk_full_for(monkeypatch, match, room: int) -> None:
    """Make files opened for writing whose path satisfies ``match`` run out of space after ``room`` bytes."""
    real_open = builtins.open

    def fake_open(file, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        fh = real_open(file, mode, *args, **kwargs)
        if any(m in mode for m in "wa") and match(str(file)):
            return _FullDisk(fh, room)
        return fh

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr("io.open", fake_open)


def test_disk_full_while_writing_a_report_keeps_the_previous_report(tmp_path: Path, monkeypatch) -> None:
    """The notebook run is replaced by a recorded summary; the write itself is what fails."""
    import nbformat

    from eagleforensics.report import pipeline

    out = tmp_path / "reports" / "align.html"
    out.parent.mkdir()
    out.write_text("<html>the previous good report</html>")
    before = hostile.fingerprint_of([out])

    def fake_execute(notebook, work, parameters, cwd, **_):  # type: ignore[no-untyped-def]
        nb = nbformat.v4.new_notebook()
        cell = nbformat.v4.new_code_cell("")
        cell.outputs = [nbformat.v4.new_output("display_data", data={"text/plain": "x"}, metadata={
            pipeline.SUMMARY_KEY: {"schema": pipeline.SUMMARY_SCHEMA, "verdict": "ok", "exit_code": 0}})]
        nb.cells.append(cell)
        nbformat.write(nb, str(work))
        return nb

    monkeypatch.setattr(pipeline, "execute", fake_execute)
    monkeypatch.setattr(pipeline, "to_html", lambda nb, with_input=False: "<html>" + "x" * 100_000 + "</html>")
    _disk_full_for(monkeypatch, lambda p: p.startswith(str(out.parent)), room=4096)
    code, stdout, err = run_cli("report", hostile.REC, hostile.CAP, "-o", out)
    assert_one_line_error(code, stdout, err, "align.html", "no space left on the device")
    assert hostile.fingerprint_of([out]) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["align.html"]  # no temporary file left behind


def _dataset(root: Path, n: int) -> Path:
    for i in range(n):
        d = root / f"rows_{i // 4}"
        d.mkdir(parents=True, exist_ok=True)
        os.link(hostile.CKPT, d / f"data_{i}.ckpt") if i else (d / f"data_{i}.ckpt").write_bytes(hostile.CKPT.read_bytes())
    return root


def test_disk_full_during_scan_says_resume_continues(tmp_path: Path, monkeypatch) -> None:
    ds = _dataset(tmp_path / "ds", 8)
    out = tmp_path / "scan.jsonl"
    with monkeypatch.context() as m:
        _disk_full_for(m, lambda p: p == str(out), room=3000)
        code, stdout, err = run_cli("scan", ds, "-o", out, "--workers", "1")
    assert_one_line_error(code, stdout, err, "scan.jsonl", "no space left on the device", "--resume")
    code, stdout, err = run_cli("scan", ds, "-o", out, "--workers", "1", "--resume")
    assert code in (0, 1), err
    lines = out.read_text().splitlines()
    assert json.loads(lines[0])["eagleforensics_scan"] == 1
    assert sorted(json.loads(x)["path"] for x in lines[1:]) == sorted(
        str(p.relative_to(ds)) for p in ds.rglob("*.ckpt"))


def test_scan_resume_never_cuts_a_file_that_is_not_its_results(tmp_path: Path) -> None:
    """Today's code truncated the file to its last newline before reading its first line."""
    case = hostile.scan_resume_other_file(tmp_path)
    before = case.watch[0].read_bytes()
    assert_one_line_error(*run_cli(*case.args), *case.expect)
    assert case.watch[0].read_bytes() == before


# ---------------------------------------------------------------- memory budget from the cgroup

def test_memory_limit_comes_from_the_cgroup_when_there_is_one(tmp_path: Path, monkeypatch) -> None:
    from eagleforensics.io import guards, safeload

    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    monkeypatch.setattr(guards, "_CGROUP_FILES", (str(v2), str(v1)))
    host = guards.memory_limit()  # neither file exists: the machine's RAM
    v2.write_text("max\n")
    v1.write_text(f"{1 << 30}\n")  # v1 fallback
    assert guards.memory_limit() == min(host, 1 << 30)
    v2.write_text(f"{512 << 20}\n")
    assert guards.memory_limit() == min(host, 512 << 20)
    assert safeload.gunzip_limit() == min(host, 512 << 20) // 2
    v2.write_text("max\n")
    v1.write_text("9223372036854771712\n")  # what v1 says for "no limit"
    assert guards.memory_limit() == host


def test_outputs_inside_an_input_directory_via_a_hard_link_are_refused(tmp_path: Path) -> None:
    from eagleforensics.io.guards import check_not_input

    cap_dir = tmp_path / "sweep"
    cap_dir.mkdir()
    (cap_dir / "layer_0.pt").write_bytes(b"x")
    os.link(cap_dir / "layer_0.pt", tmp_path / "out.html")
    os.symlink(cap_dir / "layer_0.pt", tmp_path / "sym.html")
    for out in (tmp_path / "out.html", tmp_path / "sym.html", cap_dir / "new.html"):
        with pytest.raises(ForensicsError, match="input directory|inside"):
            check_not_input(out, [cap_dir])
    check_not_input(tmp_path / "fresh.html", [cap_dir, hostile.REC])  # an unrelated output passes


# ---------------------------------------------------------------- scan workers die with the scan

_POOL_SCRIPT = textwrap.dedent("""
    import sys, time
    from eagleforensics.scan.runner import make_pool
    pool = make_pool(2, None)
    futures = [pool.submit(time.sleep, 120) for _ in range(2)]
    print(" ".join(str(p.pid) for p in pool._processes.values()), flush=True)
    time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][:1] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_scan_workers_die_when_the_scan_is_killed(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _POOL_SCRIPT], stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 2
        time.sleep(4)  # the workers have started (their initializer ran)
        proc.kill()
        proc.wait(10)
        deadline = time.time() + 20
        while any(_alive(p) for p in pids) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in pids), "a worker outlived the killed scan"
    finally:
        proc.kill()
        for p in pids if "pids" in locals() else []:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_scan_workers_quietly(tmp_path: Path) -> None:
    """Ctrl-C reaches the whole process group: one line from the scan, exit 130, no worker traceback."""
    ds = _dataset(tmp_path / "ds", 200)
    proc = subprocess.Popen([sys.executable, "-m", "eagleforensics", "scan", str(ds), "--workers", "2", "-o",
                             str(tmp_path / "r.jsonl")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    children: list[int] = []
    try:
        deadline = time.time() + 60
        while len(children) < 2 and time.time() < deadline and proc.poll() is None:
            children = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == proc.pid]
            time.sleep(0.05)
        assert len(children) >= 2, "the scan started no workers"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "Traceback" not in err and err.count("\n") == 1 and "--resume" in err, err
        time.sleep(0.5)
        assert not any(_alive(p) for p in children), "a worker outlived the interrupted scan"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in children:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_an_interrupted_scan_leaves_no_pool_thread_for_the_exit_hook() -> None:
    """After ``stop_pool`` on an unfinished scan the pool's manager thread has ended and closed its wake-up pipe:
    the interpreter's exit hook then has nothing to write to (Python before gh-125451 raced a closing pipe and
    printed a "Bad file descriptor" traceback under the Ctrl-C line)."""
    from concurrent.futures import process as cf_process

    from eagleforensics.scan.runner import make_pool, stop_pool

    pool = make_pool(2, None)
    futures = [pool.submit(time.sleep, 120) for _ in range(4)]
    manager = pool._executor_manager_thread
    wakeup = cf_process._threads_wakeups[manager]
    assert manager.is_alive() and not wakeup._closed
    stop_pool(pool, finished=False)
    assert not manager.is_alive(), "the manager thread outlived stop_pool"
    assert wakeup._closed
    assert all(f.done() for f in futures)


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().split(") ")[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


# ---------------------------------------------------------------- issue 19: the shared parsers and bounds

def _depth(obj) -> int:  # type: ignore[no-untyped-def]
    if isinstance(obj, (list, dict)):
        kids = obj.values() if isinstance(obj, dict) else obj
        return 1 + max((_depth(k) for k in kids), default=0)
    return 0


def test_nesting_depth_is_exact_across_strings_escapes_and_chunks(monkeypatch) -> None:
    """The linear scan (issue 19: the regex was quadratic on \\" runs) gives a parser's exact depth."""
    import random

    from eagleforensics.io import guards

    rng = random.Random(0)

    def value(level: int):  # type: ignore[no-untyped-def]
        r = rng.random()
        if level > 6 or r < 0.3:
            return rng.choice(['a\\"[', "\\\\", "{x}", 1, None, '"]]"', '\\\\\\"[{'])
        if r < 0.65:
            return [value(level + 1) for _ in range(rng.randint(0, 3))]
        return {f"k[{i}\\": value(level + 1) for i in range(rng.randint(0, 3))}

    docs = [value(0) for _ in range(400)]
    for chunk in (1 << 20, 7, 1):  # the chunked scan carries its state across any boundary
        monkeypatch.setattr(guards, "_DEPTH_CHUNK", chunk)
        for doc in docs:
            text = json.dumps(doc).encode()
            assert guards.nesting_depth(text) == _depth(doc), text


def test_parse_json_turns_every_failure_into_one_line() -> None:
    from eagleforensics.io.guards import parse_json

    with pytest.raises(ForensicsError, match="not valid JSON .*digits"):
        parse_json(b'{"a": ' + b"9" * 5000 + b"}", "x.json", "config")
    with pytest.raises(ForensicsError, match="not UTF-8"):
        parse_json(b'{"a": "\xff"}', "x.json", "config")
    with pytest.raises(ForensicsError, match="nested 5000 levels"):
        parse_json(b"[" * 5000, "x.json", "config")
    with pytest.raises(json.JSONDecodeError):  # left to the caller, who names the format
        parse_json(b'{"a": ', "x.json", "config")


def test_claimed_numbers_are_whole_and_bounded() -> None:
    from eagleforensics.io.sizecheck import MAX_EMPTY_DIM, check_shape, claimed_int, key_number

    assert check_shape([2, 3], "t", "f") == [2, 3] and check_shape([0, MAX_EMPTY_DIM], "t", "f") == [0, MAX_EMPTY_DIM]
    for bad in ([1.5], [float("inf")], ["3"], [True], [-1], "3", None, [0, MAX_EMPTY_DIM + 1]):
        with pytest.raises(ForensicsError):
            check_shape(bad, "t", "f")
    assert claimed_int(7, "n", "f", lo=1, hi=7) == 7
    with pytest.raises(ForensicsError, match="between 1 and 7"):
        claimed_int(8, "n", "f", lo=1, hi=7)
    assert key_number("12", "layer_12", "f") == 12
    for text in ("111111111111", "9" * 5000):
        with pytest.raises(ForensicsError, match="claims position"):
            key_number(text, f"layer_{text}", "f")


def test_a_directory_holding_a_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    from eagleforensics.io.guards import check_regular_tree, open_regular_fd

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    check_regular_tree(tmp_path)
    os.mkfifo(tmp_path / "tokenizer.json")
    with pytest.raises(ForensicsError, match="tokenizer.json: is not a regular file"):
        check_regular_tree(tmp_path, "model directory")
    with pytest.raises(ForensicsError, match="is not a regular file"):
        open_regular_fd(tmp_path / "tokenizer.json")  # O_NONBLOCK: a FIFO with no writer does not block


def test_stored_bytes_is_a_hint_that_opens_nothing(tmp_path: Path) -> None:
    """The size ``align`` decides its kernel loading by: a file's size, a folder's files (not below), 0 for
    a FIFO (never opened: no writer, and it would block), a missing path, a NUL in the name, an object."""
    from eagleforensics.io.guards import stored_bytes

    (tmp_path / "a.bin").write_bytes(b"x" * 300)
    (tmp_path / "b.bin").write_bytes(b"x" * 50)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.bin").write_bytes(b"x" * 1000)
    os.mkfifo(tmp_path / "pipe")
    assert stored_bytes(tmp_path / "a.bin") == 300
    assert stored_bytes(str(tmp_path)) == 350
    assert stored_bytes(tmp_path / "pipe") == 0
    assert stored_bytes(tmp_path / "missing") == 0
    assert stored_bytes(str(tmp_path / "a\0.bin")) == 0
    assert stored_bytes(object()) == 0


def test_an_output_that_is_a_fifo_or_device_is_refused_before_anything_runs(tmp_path: Path, monkeypatch) -> None:
    """report -o FIFO: refused before the kernel starts (the atomic rename would have replaced it); the FIFO stays."""
    import stat as stat_mod

    from eagleforensics.report import pipeline

    fifo = tmp_path / "r.html"
    os.mkfifo(fifo)
    monkeypatch.setattr(pipeline, "execute", lambda *a, **k: pytest.fail("the notebook ran"))
    assert_one_line_error(*run_cli("report", hostile.REC, hostile.CAP, "-o", fifo), "r.html", "is not a regular file")
    assert stat_mod.S_ISFIFO(os.stat(fifo).st_mode)
