"""One rendered report as the tests see it: exit code, printed output, the HTML, the executed notebook."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagleforensics.report import pipeline as report


@dataclass(frozen=True)
class ReportRun:
    """A report run; ``summary`` is what the executed notebook recorded under ``schema``."""

    exit_code: int
    output: str
    html: Path
    notebook: Path
    schema: str = report.SUMMARY_SCHEMA

    @property
    def text(self) -> str:
        return self.html.read_text(encoding="utf-8")

    @property
    def summary(self) -> dict[str, Any]:
        return report.read_summary(self.notebook, self.schema)
