"""Issue 19: a report leaves nothing behind on any way out, redacts by resolved path, and its page reads back safely.

* SIGTERM or Ctrl-C while the kernel runs: one line, exit 143 / 130, no work folder, no kernel
  connection file, no kernel process left, no kernel noise on the terminal.
* ``--redact-paths`` with inputs given as ``../dir/file`` and through a symlinked folder: no
  directory in the page, its embedded JSON, its command line, or the kept (or failed) notebook.
* ``read_report`` on a hostile page: linear time, one ForensicsError, never a hang on a FIFO.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import pytest

from eagleforensics.errors import ForensicsError
from eagleforensics.interrupts import Terminated, signals_unwind
from eagleforensics.report import pipeline
from eagleforensics.report.provenance import EMBED_ID, EMBED_SCHEMA, read_report

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data_samples"
OPEN = f'<script type="application/json" id="{EMBED_ID}">'


# ---------------------------------------------------------------- every way out removes the work folder and kernel

def _kernels_using(folder: Path) -> list[int]:
    """Pids of live processes whose command line names ``folder`` (the kernel is started with -f <connection file>)."""
    out = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                args = fh.read().decode(errors="replace")
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().split(") ")[-1][:1]
        except OSError:
            continue
        if str(folder) in args and state not in ("Z", "X"):
            out.append(int(pid))
    return out


def _connection_files(tmp: Path) -> list[Path]:
    return [p for p in tmp.rglob("*.json")]


def _cells_done(tmp: Path, n: int = 3) -> bool:
    """Whether papermill has recorded ``n`` finished cells in the executed notebook of the work folder
    (the next ones align and plot: the kernel is busy, and an interrupt then made it log errors on our stderr)."""
    for nb in tmp.rglob("*.ipynb"):
        try:
            if nb.read_text(errors="replace").count('"status": "completed"') >= n:
                return True
        except OSError:
            pass
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_report_stopped_while_the_kernel_runs_leaves_nothing(how: str, tmp_path: Path) -> None:
    tmp, runtime = tmp_path / "tmp", tmp_path / "runtime"
    tmp.mkdir()
    runtime.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "JUPYTER_RUNTIME_DIR": str(runtime), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "eagleforensics", "report", str(SAMPLES / "record_layer_outputs.pt"),
                             str(SAMPLES / "capture.pt"), "-o", str(tmp_path / "r.html")], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline, done = time.time() + 120, False
        while not done and time.time() < deadline and proc.poll() is None:
            done = _cells_done(tmp)  # read once a round: papermill rewrites the notebook, so a second read may
            time.sleep(0.05)  # catch it half-written; stop it mid-run: the kernel is busy with the next cells
        if proc.poll() is not None:  # it ended before it could be stopped: say how, not "never ran"
            out, err = proc.communicate()
            pytest.fail(f"report ended (exit {proc.returncode}) before 3 cells were recorded: {err[-2000:]}")
        assert done, "the notebook never ran a cell"
        assert _connection_files(tmp), "no kernel connection file in the work folder while the kernel runs"
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == (143 if how == "SIGTERM" else 130), err
    assert err == ("eagleforensics: terminated\n" if how == "SIGTERM" else "eagleforensics: interrupted\n"), err
    assert sorted(tmp.iterdir()) == [] and sorted(runtime.iterdir()) == []  # no work folder, no connection file
    assert not (tmp_path / "r.html").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runtime", "tmp"]  # no half-written output beside it
    time.sleep(0.5)
    assert _kernels_using(tmp) == []


_NOISY = textwrap.dedent("""
    import sys
    from pathlib import Path
    import nbformat
    from eagleforensics.report import pipeline
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import os\\nos.write(2, b'[IPKernelApp] ERROR | what a kernel says on its own stderr\\\\n')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    d = Path(sys.argv[1])
    nbformat.write(nb, str(d / "noisy.ipynb"))
    pipeline.execute(d / "noisy.ipynb", d / "out.ipynb", {}, cwd=d)
""")


def test_the_kernels_own_output_never_reaches_the_terminal(tmp_path: Path) -> None:
    """ipykernel writes to its process's stderr ("Parent appears to have exited", errors on an interrupt): kernel.log."""
    proc = subprocess.run([sys.executable, "-c", _NOISY, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "IPKernelApp" not in proc.stderr, proc.stderr


def test_a_kernel_that_outlives_the_run_is_killed(tmp_path: Path) -> None:
    """A way out papermill does not see (an interrupt while the kernel starts): work_folder kills the kernel itself."""
    from eagleforensics.report.kernel import kernel_manager_class, work_folder

    with pytest.raises(KeyboardInterrupt):
        with work_folder(prefix="ef-test-") as folder:
            km = kernel_manager_class(folder)(kernel_name=pipeline.KERNEL_NAME)
            asyncio.run(km.start_kernel(cwd=str(folder.path)))
            pid = km.provisioner.process.pid
            assert (folder.path / "kernel.json").exists()  # the connection file lives in the work folder
            raise KeyboardInterrupt
    assert not folder.path.exists()
    time.sleep(0.3)
    assert not Path(f"/proc/{pid}").exists() or open(f"/proc/{pid}/stat").read().split(") ")[-1][:1] in "ZX"


# ---------------------------------------------------------------- --redact-paths by resolved path, everywhere

def _secret_layout(tmp_path: Path) -> tuple[Path, Path]:
    """cwd/ and a secret folder beside it: the record reached as ../secret-dir/..., the capture through a link."""
    secret = tmp_path / "secret-dir" / "hidden-sub"
    secret.mkdir(parents=True)
    for name in ("record_layer_outputs.pt", "capture.pt"):
        (secret / name).write_bytes((SAMPLES / name).read_bytes())
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "linked").symlink_to(secret, target_is_directory=True)
    return cwd, secret


def _leaks(text: str, tmp_path: Path) -> list[str]:
    return [w for w in ("secret-dir", "hidden-sub", "linked/", str(tmp_path), str(ROOT)) if w in text]


def test_redacted_report_and_kept_notebook_name_no_directory(tmp_path: Path) -> None:
    cwd, _ = _secret_layout(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "eagleforensics", "report",
                           "../secret-dir/hidden-sub/record_layer_outputs.pt", "linked/capture.pt", "-o", "r.html",
                           "--redact-paths", "--keep-notebook"], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 1, proc.stderr  # ACTION: the sample's verdict
    page = (cwd / "r.html").read_text(encoding="utf-8")
    kept = (cwd / "r.ipynb").read_text(encoding="utf-8")
    assert _leaks(page, tmp_path) == [] and _leaks(kept, tmp_path) == []
    doc = read_report(cwd / "r.html")
    assert doc["provenance"]["command"].startswith("eagleforensics report record_layer_outputs.pt capture.pt ")
    assert [i["path"] for i in doc["provenance"]["inputs"]] == ["record_layer_outputs.pt", "capture.pt"]
    assert doc["summary"]["parameters"]["shard"] == "record_layer_outputs.pt"
    nb = nbformat.reads(kept, as_version=4)  # still a valid notebook, its summary readable
    assert pipeline.read_summary(nb)["parameters"]["capture"] == "capture.pt"


def test_failed_notebook_is_written_redacted(tmp_path: Path, monkeypatch) -> None:
    """The error way out: the failed notebook is kept, redacted; the work folder and connection file are gone."""
    import tempfile

    cwd, secret = _secret_layout(tmp_path)
    monkeypatch.chdir(cwd)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    crash = tmp_path / "crash.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("shard = capture = None"),
                                         nbformat.v4.new_code_cell("print(shard, capture)\nraise RuntimeError(shard)")])
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(crash))
    with pytest.raises(pipeline.NotebookFailed):
        pipeline.build_report("../secret-dir/hidden-sub/record_layer_outputs.pt", "linked/capture.pt", "r.html",
                              notebook=crash, redact_paths=True)
    assert sorted(tmp.iterdir()) == []  # no work folder, no kernel connection file
    failed = (cwd / "r.failed.ipynb").read_text(encoding="utf-8")
    assert "record_layer_outputs.pt capture.pt" in failed  # the printed parameters, by name
    assert _leaks(failed, tmp_path) == [], _leaks(failed, tmp_path)


# ---------------------------------------------------------------- read_report on hostile pages

_READ = textwrap.dedent("""
    import json, sys
    from eagleforensics.errors import ForensicsError
    from eagleforensics.report.provenance import read_report
    try:
        read_report(sys.argv[1])
        print("read")
    except ForensicsError as exc:
        print("error:", exc)
""")


def _read_in_process(page: Path, timeout: float = 60) -> str:
    """read_report in a child process (a hang or a quadratic scan must fail the test, not stall the suite)."""
    proc = subprocess.run([sys.executable, "-c", _READ, str(page)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("kind", ["many-openings", "deep", "digits", "fifo", "not-utf8", "unclosed"])
def test_read_report_on_a_hostile_page_is_one_error(kind: str, tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    if kind == "many-openings":  # every opening tag scanned to the end of the page: quadratic
        page.write_text(OPEN * 200_000)
    elif kind == "deep":
        page.write_text(OPEN + "[" * 100_000 + "]" * 100_000 + "</script>")
    elif kind == "digits":  # json.loads raised ValueError past Python's 4300-digit limit
        page.write_text(OPEN + '{"schema": "' + EMBED_SCHEMA + '", "x": ' + "9" * 5000 + "}</script>")
    elif kind == "fifo":
        os.mkfifo(page)
    elif kind == "not-utf8":
        page.write_bytes(OPEN.encode() + b'{"schema": "\xff"}</script>')
    else:
        page.write_text("<html>" + OPEN + '{"schema": "' + EMBED_SCHEMA + '"')
    said = _read_in_process(page)
    assert said.startswith("error: ") and "page.html" in said and "\n" not in said, said


def test_read_report_reads_the_last_embedded_element(tmp_path: Path) -> None:
    """The page's own text may hold the tag (a hostile output); the element insert_embedded wrote is the last one."""
    from eagleforensics.report.provenance import insert_embedded

    page = insert_embedded("<html><body><pre>" + OPEN + '{"schema": "x"}</script></pre></body></html>',
                           {"summary": {"verdict": "OK: <b>&</b>"}, "provenance": {}})
    (tmp_path / "r.html").write_text(page)
    assert read_report(tmp_path / "r.html")["summary"]["verdict"] == "OK: <b>&</b>"
    with pytest.raises(ForensicsError, match="no embedded"):
        (tmp_path / "none.html").write_text("<html></html>")
        read_report(tmp_path / "none.html")
    assert json.loads(json.dumps(read_report(tmp_path / "r.html")))  # plain JSON back


@pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="needs POSIX signals")
@pytest.mark.parametrize("sig, exc", [("SIGINT", KeyboardInterrupt), ("SIGTERM", Terminated)])
def test_a_stopped_command_drops_what_the_libraries_log_while_they_unwind(sig: str, exc: type, caplog) -> None:
    """Under load, papermill logged "Kernel died while waiting for execute reply." (and asyncio "Task exception was
    never retrieved") between the signal and the command's one line: from the signal on, log records are dropped."""
    import logging

    stray = logging.getLogger("papermill")
    try:
        with pytest.raises(exc):
            with signals_unwind():
                os.kill(os.getpid(), getattr(signal, sig))
                time.sleep(1)  # the handler raises in the main thread before this returns
        stray.error("Kernel died while waiting for execute reply.")
        assert "Kernel died" not in caplog.text
    finally:
        logging.disable(logging.NOTSET)
    stray.error("logged again once the command is over")
    assert "logged again" in caplog.text


@pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="needs POSIX signals")
@pytest.mark.parametrize("sig, line, code", [("SIGINT", "interrupted", 130), ("SIGTERM", "terminated", 143)])
def test_a_stopped_command_says_nothing_of_the_coroutine_it_abandoned(sig: str, line: str, code: int,
                                                                      tmp_path: Path) -> None:
    """CI caught it once under load: papermill's run_sync makes the cell's coroutine, then starts the loop; a Ctrl-C
    between the two left "coroutine 'NotebookClient.async_execute_cell' was never awaited" (a RuntimeWarning, two
    lines) after the command's one line. The window is made certain here: the coroutine is made, then the signal."""
    script = textwrap.dedent(f"""
        import os, signal, time
        from eagleforensics.cli.common import run_guarded

        async def async_execute_cell():
            return None

        def command():
            pending = async_execute_cell()  # made, never awaited: the signal comes first
            os.kill(os.getpid(), signal.{sig})
            time.sleep(5)

        run_guarded(command)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (proc.returncode, proc.stderr) == (code, f"eagleforensics: {line}\n")
