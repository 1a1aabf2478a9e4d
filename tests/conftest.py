"""Session fixtures over the real forward passes in ``tests/realdata.py``."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from .realdata import SAMPLES, Run, forward

# Every notebook run in the suite stops a cell after this many seconds, well inside pytest-timeout's 600 s
# per test (pyproject.toml), so a hung kernel fails with the report's own line instead of a killed test:
# the reports read it from EAGLEFORENSICS_CELL_TIMEOUT (report.pipeline), direct papermill calls pass it.
NOTEBOOK_CELL_TIMEOUT = 240
os.environ.setdefault("EAGLEFORENSICS_CELL_TIMEOUT", str(NOTEBOOK_CELL_TIMEOUT))


@pytest.fixture(scope="session")
def llama() -> Run:
    return forward("llama")


@pytest.fixture(scope="session")
def samples() -> Path:
    return SAMPLES
