"""Session fixtures over the real forward passes in ``tests/realdata.py``."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from eagleforensics.evidence import kernelcache

from .realdata import SAMPLES, Run, forward

# Every notebook run in the suite stops a cell after this many seconds, well inside pytest-timeout's 600 s
# per test (pyproject.toml), so a hung kernel fails with the report's own line instead of a killed test:
# the reports read it from EAGLEFORENSICS_CELL_TIMEOUT (report.pipeline), direct papermill calls pass it.
NOTEBOOK_CELL_TIMEOUT = 240
os.environ.setdefault("EAGLEFORENSICS_CELL_TIMEOUT", str(NOTEBOOK_CELL_TIMEOUT))


@pytest.hookimpl(trylast=True)  # after pytest's own configure has made its temporary folders (mode 0o700)
def pytest_configure(config: pytest.Config) -> None:
    """A test run's compiled kernels and their mark go to a private temporary folder, never into the
    checkout's eagleforensics/evidence/__pycache__: set before anything imports numba (read at its import),
    inherited by every child process. A folder the caller named is kept."""
    folder = config._tmp_path_factory.mktemp("kernel-cache", numbered=False)  # type: ignore[attr-defined]
    os.environ.setdefault("NUMBA_CACHE_DIR", str(folder / "numba"))
    os.environ.setdefault(kernelcache.DIR_ENV, str(folder / "marks"))


@pytest.fixture(scope="session")
def llama() -> Run:
    return forward("llama")


@pytest.fixture(scope="session")
def samples() -> Path:
    return SAMPLES


@pytest.fixture(autouse=True)
def no_background_compile(monkeypatch):
    """No test starts numba's detached compile by chance (a large input in auto mode): it would outlive the
    test and load the machine. A test that means the kernels forces them (``fused._MODE = "1"``);
    ``tests/test_kernelcache.py`` puts the real function back where it tests it."""
    def refuse() -> bool:
        raise AssertionError("a test started the kernels' detached compile: force the kernels or mark the cache")
    monkeypatch.setattr(kernelcache, "start_compiling", refuse)
