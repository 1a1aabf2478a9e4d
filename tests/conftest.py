"""Session fixtures over the real forward passes in ``tests/realdata.py``."""
from __future__ import annotations

from pathlib import Path

import pytest

from .realdata import SAMPLES, Run, forward


@pytest.fixture(scope="session")
def llama() -> Run:
    return forward("llama")


@pytest.fixture(scope="session")
def samples() -> Path:
    return SAMPLES
