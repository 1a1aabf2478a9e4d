"""Files the user did not write never run (issue 40), as real processes: modules planted in the folder a
command runs from (``numpy.py``, ``packaging/``, ``eagleforensics.py``) are not imported by any process the
project starts, and a kernel cache in a folder others can write (numba reads it with ``pickle.loads``) is
not loaded, with one line saying why; whatever the command and the cache's state."""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from eagleforensics.evidence import fused, kernelcache

from .realdata import ROOT, SAMPLES

needs_numba = pytest.mark.skipif(importlib.util.find_spec("numba") is None or os.name != "posix",
                                 reason="numba is not installed")
RECORD = SAMPLES / "record_layer_outputs.safetensors"
CAPTURE = SAMPLES / "capture_sweep.safetensors"
TAG = "EAGLEFORENSICS_TEST_TAG"  # marks every process a test here starts, the detached ones included
KERNELS = ("_direct", "_fit_equations", "_fit_scores", "_max_abs", "_row_stats")
REFUSED = "the compiled-kernel cache is not used"


def _plant(folder: Path, sentinel: Path) -> None:
    """Modules a process started in ``folder`` would import from there: each writes its name to ``sentinel``."""
    for name, path in (("numpy", folder / "numpy.py"), ("packaging", folder / "packaging" / "__init__.py"),
                       ("eagleforensics", folder / "eagleforensics.py")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"open({str(sentinel)!r}, 'a').write({name!r} + '\\n')\nraise ImportError({name!r})\n")


@pytest.fixture(scope="module")
def big_capture(tmp_path_factory) -> Path:
    """The sample capture (a real forward pass) repeated along the tokens to just over ``fused.MIN_BYTES``
    (64 MiB): the size from which align wants the compiled kernels (and, with no mark, starts the compile)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(CAPTURE), "pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    row = sum(v[0].numel() * v.element_size() for k, v in tensors.items() if k != "input_ids")
    reps = fused.MIN_BYTES // (row * len(tensors["input_ids"])) + 1
    tiled = {k: v.repeat(reps) if v.ndim == 1 else v.repeat(reps, 1) for k, v in tensors.items()}
    path = tmp_path_factory.mktemp("big") / "capture.safetensors"
    save_file(tiled, str(path), metadata=meta)
    assert path.stat().st_size > fused.MIN_BYTES
    return path


def _tagged() -> list[int]:
    """Processes started by this module's current test (found by the tag in their environment)."""
    want = f"{TAG}={os.environ[TAG]}".encode() if TAG in os.environ else None
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and want is not None:
            try:
                if want in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.fixture
def tagged(monkeypatch):
    """A tag for this test's processes; on the way out every one still running is killed."""
    monkeypatch.setenv(TAG, uuid.uuid4().hex)
    yield
    for pid in _tagged():
        try:
            os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _cli(args: list[str], cwd: Path, env: dict[str, str], tmp: Path) -> subprocess.CompletedProcess:
    """The installed ``eagleforensics`` command as it runs (its script's folder on ``sys.path``, not the current
    one), on this checkout, from ``cwd``."""
    launcher = tmp / "bin" / "eagleforensics"
    launcher.parent.mkdir(exist_ok=True)
    launcher.write_text("import sys\nfrom eagleforensics.cli import run\nif __name__ == '__main__':\n    sys.exit(run())\n")
    base = {k: v for k, v in os.environ.items() if k not in ("EAGLEFORENSICS_FUSED", "PYTHONSAFEPATH")}
    return subprocess.run([sys.executable, str(launcher), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**base, "PYTHONPATH": str(ROOT), **env})


def _numba_imported(pid: int) -> bool:
    """Whether process ``pid`` has loaded numba's compiler (llvmlite): past every import a planted module could take."""
    try:
        return "llvmlite" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@needs_numba
@pytest.mark.parametrize("state", ["empty", "marked"])
def test_modules_planted_in_the_working_folder_never_run(tmp_path, big_capture, tagged, state):
    """align on a capture past 64 MiB from a folder holding numpy.py, packaging/ and eagleforensics.py: with no
    mark the detached compile starts, isolated, and gets as far as numba without importing any of them
    (it is then stopped); with a mark the kernels load in the command itself. Nothing planted runs."""
    sentinel = tmp_path / "ran"
    work = tmp_path / "downloaded-dataset"
    _plant(work, sentinel)
    marks = tmp_path / "marks"
    marks.mkdir(mode=0o700)
    env = {kernelcache.DIR_ENV: str(marks)}
    if state == "empty":
        env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba")  # nothing compiled yet: the detached compile starts
    else:  # the mark says the kernels are in numba's cache: this process loads them (or compiles them)
        env["NUMBA_CACHE_DIR"] = os.environ.get("NUMBA_CACHE_DIR") or str(tmp_path / "numba")
        old = os.environ.get("NUMBA_CACHE_DIR")
        os.environ["NUMBA_CACHE_DIR"] = env["NUMBA_CACHE_DIR"]
        try:
            os.environ[kernelcache.DIR_ENV] = str(marks)
            kernelcache.stamp().write_text("compiled\n")
        finally:
            os.environ.pop(kernelcache.DIR_ENV)
            if old is None:
                os.environ.pop("NUMBA_CACHE_DIR")
            else:
                os.environ["NUMBA_CACHE_DIR"] = old
    res = _cli(["align", str(RECORD), str(big_capture), "--json"], work, env, tmp_path)
    assert res.returncode in (0, 1), res.stderr[-2000:]
    assert REFUSED not in res.stderr
    if state == "empty":
        seen = False
        deadline = time.monotonic() + 120  # the detached child: until it has imported numba, or ended
        while time.monotonic() < deadline and not sentinel.exists():
            alive = _tagged()
            seen = seen or bool(alive)
            if not alive or all(_numba_imported(p) for p in alive):
                break
            time.sleep(0.2)
        assert seen or sentinel.exists(), "no detached compile started"
    assert not sentinel.exists(), sentinel.read_text()


def _plant_cache(cache: Path, sentinel: Path) -> None:
    """numba's index for every kernel (unpickling it writes ``sentinel``) and the mark, in ``cache`` as
    ``NUMBA_CACHE_DIR``: what another user who can write that folder would leave there."""
    class Payload:
        def __reduce__(self):
            return exec, (f"open({str(sentinel)!r}, 'a').write('pickle\\n')",)

    saved = os.environ.get("NUMBA_CACHE_DIR"), os.environ.pop(kernelcache.DIR_ENV, None)
    os.environ["NUMBA_CACHE_DIR"] = str(cache)
    try:
        mark = kernelcache.stamp()
    finally:
        os.environ.pop("NUMBA_CACHE_DIR")
        if saved[0] is not None:
            os.environ["NUMBA_CACHE_DIR"] = saved[0]
        if saved[1] is not None:
            os.environ[kernelcache.DIR_ENV] = saved[1]
    src = os.path.dirname(os.path.abspath(fused.__file__))  # numba's folder for this source (caching.py, 0.68)
    code = cache / f"{os.path.basename(src)}_{hashlib.sha1(src.encode()).hexdigest()}"
    code.mkdir(parents=True)
    version = importlib.metadata.version("numba")
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"
    for name in KERNELS:
        line = getattr(fused, name).__code__.co_firstlineno
        (code / f"fused.{name}-{line}.{tag}.nbi").write_bytes(pickle.dumps(version) + pickle.dumps(Payload()))
    mark.write_text("compiled\n")


@needs_numba
@pytest.mark.parametrize("how", ["world", "group", "other-user"])
def test_a_cache_others_can_write_is_never_loaded(tmp_path, big_capture, tagged, how):
    """A planted index and mark in a NUMBA_CACHE_DIR of mode 0777 (0770; another user's, even for root): a
    large align (the mark read), a forced small one and doctor (the kernels compiled here) answer from the
    numpy path, nothing planted runs, no compile starts, and each says once, naming the folder, why."""
    sentinel = tmp_path / "ran"
    cache = tmp_path / f"cache-{how}"
    cache.mkdir()
    _plant_cache(cache, sentinel)
    if how == "other-user":
        if os.geteuid() != 0:
            pytest.skip("giving a folder to another user needs root")
        for path in [cache, *cache.rglob("*")]:
            os.lchown(path, 4242, 4242)
    elif how == "world":
        cache.chmod(0o777)
    else:
        cache.chmod(0o770)
    env = {"NUMBA_CACHE_DIR": str(cache)}
    forced = {**env, "EAGLEFORENSICS_FUSED": "1"}
    runs = [(["align", str(RECORD), str(big_capture), "--json"], env),
            (["align", str(RECORD), str(CAPTURE), "--json"], forced)]
    if how == "world":
        runs.append((["doctor", "--train", str(RECORD), "--capture", str(CAPTURE), "--json"], forced))
    for args, extra in runs:
        res = _cli(args, tmp_path, extra, tmp_path)
        assert res.returncode in (0, 1), (args, res.stderr[-2000:])
        said = [line for line in res.stderr.splitlines() if REFUSED in line]
        assert len(said) == 1 and str(cache) in said[0], (args, res.stderr[-2000:])
        assert not sentinel.exists(), (args, sentinel.read_text())
    assert not _tagged(), "a compile was started for a cache that is not trusted"


def test_a_report_kernel_imports_nothing_from_its_folder_or_pythonpath(tmp_path, monkeypatch):
    """The report's kernel, started in a folder holding numpy.py, packaging/ and eagleforensics.py, with
    another such folder first in PYTHONPATH: its cells import the real numpy and this checkout's package."""
    import nbformat

    from eagleforensics.report import pipeline

    sentinel = tmp_path / "ran"
    here, path = tmp_path / "cwd", tmp_path / "pythonpath"
    _plant(here, sentinel)
    _plant(path, sentinel)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(path), str(ROOT)]))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell(
        "import numpy, packaging, eagleforensics\nprint(numpy.__file__, eagleforensics.__file__)")])
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(tmp_path / "nb.ipynb"))
    done = pipeline.execute(tmp_path / "nb.ipynb", tmp_path / "out.ipynb", {"x": 2}, cwd=here)
    printed = done.cells[-1].outputs[0]["text"].split()
    assert not sentinel.exists(), sentinel.read_text()
    assert printed[1] == str(ROOT / "eagleforensics" / "__init__.py") and str(tmp_path) not in printed[0]


def test_scan_workers_import_nothing_from_the_folder_it_runs_in(tmp_path, tagged):
    """scan with two worker processes, run from a dataset folder that holds a ``multiprocessing/`` package
    (what each spawned worker's ``python -c`` imports first) and the usual planted modules: none runs."""
    sentinel = tmp_path / "ran"
    ds = tmp_path / "dataset"
    for i in range(80):  # past the size below which scan stays in one process
        d = ds / f"rows_{i // 8}"
        d.mkdir(parents=True, exist_ok=True)
        os.link(SAMPLES / "data_0.ckpt", d / f"data_{i}.ckpt")
    _plant(ds, sentinel)
    (ds / "multiprocessing").mkdir()
    (ds / "multiprocessing" / "__init__.py").write_text(
        f"open({str(sentinel)!r}, 'a').write('multiprocessing\\n')\nraise ImportError('multiprocessing')\n")
    res = _cli(["scan", str(ds), "--workers", "2", "-o", str(tmp_path / "scan.jsonl")], ds, {}, tmp_path)
    assert not sentinel.exists(), sentinel.read_text()
    assert res.returncode in (0, 1) and (tmp_path / "scan.jsonl").stat().st_size > 0, res.stderr[-2000:]


def test_the_trust_rule_follows_links_and_allows_only_sticky_shared_ancestors(tmp_path):
    """A private folder under /tmp (world-writable, sticky) is trusted; a link of ours to a 0777 folder, a
    folder inside one, and /tmp itself as the cache folder are not."""
    from eagleforensics.evidence.cachetrust import distrust

    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    (tmp_path / "link").symlink_to(loose)
    assert str(tmp_path).startswith("/tmp/") or os.stat("/tmp").st_mode & 0o1000  # pytest's folder is under a sticky one
    assert distrust(mine) is None and distrust(mine / "not-made-yet") is None
    assert "can be written by anyone (mode 0777)" in (distrust(tmp_path / "link") or "")
    assert str(loose) in (distrust(loose / "inner") or "")
    assert distrust("/tmp") is not None


@needs_numba
def test_the_folder_checked_is_the_one_numba_loads_from(tmp_path):
    """``kernelcache.numba_folder`` names the folder numba 0.68 caches fused.py's kernels in: with
    NUMBA_CACHE_DIR, and in the in-tree/user-wide fallback (read from a declared kernel's cache)."""
    code = ("import os\nfrom eagleforensics.evidence import fused, kernelcache\nimport numba\n"
            "k = numba.njit(cache=True)(fused._row_stats)\n"
            "print(k._cache.cache_path == str(kernelcache.numba_folder()), k._cache.cache_path)")
    for extra in ({"NUMBA_CACHE_DIR": str(tmp_path / "numba")}, {"NUMBA_CACHE_DIR": "", "XDG_CACHE_HOME": str(tmp_path)}):
        env = {k: v for k, v in os.environ.items() if k not in ("EAGLEFORENSICS_FUSED",)}
        res = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT), **extra}, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and res.stdout.split()[0] == "True", (extra, res.stdout, res.stderr[-1500:])


@needs_numba
def test_a_numba_config_in_the_working_folder_cannot_move_the_cache(tmp_path):
    """numba reads .numba_config.yaml from the current folder: one planted there naming a cache folder of mode
    0777 (and classes to import) is not obeyed; the kernels are declared with the folder kernelcache checked."""
    pytest.importorskip("yaml")
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    work = tmp_path / "work"
    work.mkdir()
    (work / ".numba_config.yaml").write_text(f"cache_dir: {loose}\ncache_locator_classes: planted.Locator\n")
    (work / "planted.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('x')\n")
    code = ("import sys\nsys.path.insert(1, '.')\nfrom eagleforensics.evidence import fused, kernelcache\n"
            "k = fused.kernels()\n"
            "print(k.row_stats._cache.cache_path)\nprint(kernelcache.numba_folder())")
    env = {k: v for k, v in os.environ.items() if k not in ("EAGLEFORENSICS_FUSED", "NUMBA_CACHE_DIR",
                                                          "NUMBA_CACHE_LOCATOR_CLASSES")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    res = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT)}, cwd=work,
                         capture_output=True, text=True, timeout=120)
    assert not (tmp_path / "ran").exists()
    assert str(loose) not in res.stdout and res.returncode == 0, (res.stdout, res.stderr[-1500:])
    used, checked = res.stdout.split()
    assert used == checked
