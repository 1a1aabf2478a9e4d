"""The scan's results file (one JSON line per record after a header line) and the ScanResult record.

The header names the dataset and the reference, so a scan is only ever continued with the
same inputs. Lines are appended as results come in; an interrupted write leaves at most one
half line at the end, which ``read_results`` drops. ``ScanResult`` is rebuilt from lines alone
(``build_result``), so a resumed scan and a single run give the same judgement.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ForensicsError
from .summary import compact

if TYPE_CHECKING:
    import pandas as pd

HEADER_KEY = "eagleforensics_scan"
FORMAT_VERSION = 1


def natural_key(rel: str) -> list[Any]:
    """Sort key that puts data_2 before data_10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", rel)]


# ---------------------------------------------------------------- results file

def make_header(root: Path, reference: str | None) -> dict[str, Any]:
    return {HEADER_KEY: FORMAT_VERSION, "dataset": str(root.resolve()),
            "reference": None if reference is None else str(Path(reference).resolve())}


def read_results(path: str | Path, *, repair: bool = False) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The header and the record lines of a results file, compacted (last line per path wins).

    A last line without its newline is what an interrupted write leaves: it is dropped
    (and cut off the file when ``repair``). Any other unreadable line is an error.
    """
    p = Path(path)
    raw = p.read_bytes()
    good_end = raw.rfind(b"\n") + 1
    if repair and good_end < len(raw):
        with p.open("r+b") as fh:
            fh.truncate(good_end)
    text = raw[:good_end].decode("utf-8", errors="replace")
    header: dict[str, Any] | None = None
    records: dict[str, dict[str, Any]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise ForensicsError(f"line {n} is not JSON: not a scan results file, or damaged", path=p) from None
        if header is None:
            if not isinstance(obj, dict) or HEADER_KEY not in obj:
                raise ForensicsError("not a scan results file (no header line)", path=p)
            header = obj
        elif isinstance(obj, dict) and "path" in obj:
            records[obj["path"]] = compact(obj)
    if header is None:
        raise ForensicsError("not a scan results file (empty)", path=p)
    return header, records


def open_results(output: Path, header: dict[str, Any], resume: bool) -> dict[str, dict[str, Any]] | None:
    """Records already in a results file written for the same dataset and reference; None for a new file."""
    if output.exists() and output.stat().st_size > 0:
        if not resume:
            raise ForensicsError("results file exists; pass --resume to continue that scan, or choose another -o",
                                 path=output)
        old, records = read_results(output, repair=True)
        for key in ("dataset", "reference"):
            if old.get(key) != header[key]:
                raise ForensicsError(f"results file was written for {key} {old.get(key)}, not {header[key]}; "
                                     "choose another -o", path=output)
        return records
    return None


def check_output(output: Path, root: Path) -> None:
    r, o = root.resolve(), output.resolve()
    if o == r or r in o.parents:
        raise ForensicsError("the results file would be written inside the dataset; choose -o elsewhere", path=output)
    if o.is_dir():
        raise ForensicsError("is a directory; -o takes a file name", path=output)


# ---------------------------------------------------------------- result

@dataclass
class ScanResult:
    """A scanned dataset: one line per record, the summary per slot and the outliers with reasons."""

    dataset: str
    reference: dict[str, Any] | None
    output: str | None
    lines: list[dict[str, Any]]
    scanned: int  # records inspected by this run
    resumed: int  # records taken from the results file
    outliers: dict[str, list[str]] = field(default_factory=dict)
    _slots: Any = None

    @property
    def slots(self) -> "pd.DataFrame":
        """One row per (record, slot): signature and reference evidence."""
        if self._slots is None:
            from .summary import slot_table

            self._slots = slot_table(self.lines)
        return self._slots

    @property
    def exit_code(self) -> int:
        """0: no outlier; 1: at least one."""
        return 1 if self.outliers else 0

    def summary(self) -> "pd.DataFrame":
        """One row per slot (see ``scan_summary.summary_table``)."""
        from .summary import summary_table

        return summary_table(self.slots, self.outliers)

    def records(self) -> "pd.DataFrame":
        """One row per record: format, tokens, padding, error, outlier flag."""
        import pandas as pd

        rows = [{"path": r["path"], "format": r.get("format"), "tokens": r.get("tokens"), "padding": r.get("padding"),
                 "hidden_size": r.get("hidden_size"), "error": r.get("error"), "outlier": r["path"] in self.outliers}
                for r in self.lines]
        return pd.DataFrame(rows, columns=["path", "format", "tokens", "padding", "hidden_size", "error", "outlier"])

    def outlier_table(self) -> "pd.DataFrame":
        """One row per outlier record: its path and its reasons joined by '; '."""
        import pandas as pd

        return pd.DataFrame([{"path": p, "reasons": "; ".join(r)} for p, r in self.outliers.items()],
                            columns=["path", "reasons"])

    def overview(self) -> dict[str, Any]:
        """Counts a headline needs: records, errors, outliers, formats, how many came from a resume."""
        from collections import Counter

        return {"dataset": self.dataset, "records": len(self.lines), "scanned": self.scanned, "resumed": self.resumed,
                "unreadable": sum(1 for r in self.lines if r.get("error")), "outliers": len(self.outliers),
                "formats": dict(Counter(r.get("format") for r in self.lines if r.get("format"))),
                "reference": None if self.reference is None else self.reference.get("path"), "output": self.output}

    def headline(self) -> str:
        """One sentence: how many records, how many outliers."""
        o = self.overview()
        tail = "no outliers" if not o["outliers"] else f"{o['outliers']} outlier records ({o['unreadable']} unreadable)"
        return f"Scanned {o['records']} records of {self.dataset}: {tail}."

    def to_dict(self) -> dict[str, Any]:
        """Overview, per-slot summary and every outlier with its reasons, JSON-ready."""
        table = self.summary()
        slots = [{k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
                 for row in table.astype(object).to_dict(orient="records")]
        return {"overview": self.overview(), "slots": slots,
                "outliers": [{"path": p, "reasons": r} for p, r in self.outliers.items()]}

    def to_text(self, max_outliers: int = 50) -> str:
        """Headline, per-slot summary and the first ``max_outliers`` outliers with reasons, for the terminal."""
        lines = [self.headline(), ""]
        table = self.summary()
        if not table.empty:
            lines += [table.to_string(index=False, na_rep="-", float_format=lambda v: f"{v:.3f}"), ""]
        if self.outliers:
            lines.append("outliers:")
            for path, reasons in list(self.outliers.items())[:max_outliers]:
                lines.append(f"  {path}")
                lines += [f"    - {r}" for r in reasons]
            if len(self.outliers) > max_outliers:
                lines.append(f"  ... and {len(self.outliers) - max_outliers} more (all of them with --json)")
        return "\n".join(lines).rstrip()


def build_result(dataset: str, reference: dict[str, Any] | None, output: str | None, lines: list[dict[str, Any]],
                 scanned: int, resumed: int) -> ScanResult:
    """Judge the lines (``scan_summary``) and wrap them in a ScanResult."""
    from .summary import find_outliers

    result = ScanResult(dataset, reference, output, [compact(line) for line in lines], scanned, resumed)
    result.outliers = find_outliers(result.lines, result.slots)
    return result


def load_results(path: str | Path) -> ScanResult:
    """Re-judge a finished (or partial) results file without reading the dataset again."""
    header, records = read_results(path)
    lines = [records[k] for k in sorted(records, key=natural_key)]
    ref = None if header.get("reference") is None else {"path": header["reference"]}
    return build_result(header["dataset"], ref, str(path), lines, 0, len(lines))
