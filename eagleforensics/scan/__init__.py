"""scan: check a whole training dataset record by record.

Record signatures, the reference a dataset is checked against, the resumable results file, the
summary, and the runner that ties them together (locally or on Dask). Imports ``evidence``,
``io`` and the bottom (``errors``, ``positions``, ``results``).
"""
from __future__ import annotations

from .runner import ScanResult, scan

__all__ = ["ScanResult", "scan"]
