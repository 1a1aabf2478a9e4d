"""One torch thread for a module of tiny-model tests: small matrices on a shared 2-core machine spend more time in
OpenMP's waits than in the work. Import ``one_thread`` into a test module to apply it to every test there."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
