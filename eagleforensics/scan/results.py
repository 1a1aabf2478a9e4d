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

from ..errors import ForensicsError, printable
from ..io.guards import check_not_input, check_output_target, open_regular, parse_json
from .summary import compact

if TYPE_CHECKING:
    import pandas as pd

HEADER_KEY = "eagleforensics_scan"
FORMAT_VERSION = 1
MAX_HEADER_LINE = 1024 * 1024  # the header line is a few hundred bytes


def natural_key(rel: str) -> list[Any]:
    """Sort key that puts data_2 before data_10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", rel)]


# ---------------------------------------------------------------- results file

def make_header(root: Path, reference: str | None) -> dict[str, Any]:
    return {HEADER_KEY: FORMAT_VERSION, "dataset": str(root.resolve()),
            "reference": None if reference is None else str(Path(reference).resolve())}


def _read_header(fh: Any, p: Path) -> dict[str, Any]:
    """The first line of a results file, parsed and checked before anything else is read."""
    first = fh.readline(MAX_HEADER_LINE + 1)
    if not first:
        raise ForensicsError("not a scan results file (empty)", path=p)
    if len(first) > MAX_HEADER_LINE or not first.endswith(b"\n"):
        raise ForensicsError("not a scan results file (no header line)", path=p)
    try:
        obj = parse_json(first, p, "results file header")
    except (json.JSONDecodeError, UnicodeDecodeError):
        obj = None
    if not isinstance(obj, dict) or HEADER_KEY not in obj:
        raise ForensicsError("not a scan results file (no header line)", path=p)
    return obj


def read_results(path: str | Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], int]:
    """The header, the record lines (compacted: last line per path wins) and the size of a half last line.

    The header line is checked first, so nothing else of a file that is not a results file is
    read. A last line without its newline is what an interrupted write leaves: it is dropped
    here (``repair_tail`` cuts it off, once the file is known to be the right one). Any other
    unreadable line is an error.
    """
    p = Path(path)
    with open_regular(p, "scan results file") as fh:
        header = _read_header(fh, p)
        rest = fh.read()
    good = rest.rfind(b"\n") + 1
    records: dict[str, dict[str, Any]] = {}
    for n, line in enumerate(rest[:good].decode("utf-8", errors="replace").splitlines(), 2):
        if not line.strip():
            continue
        try:
            obj = parse_json(line, p, f"line {n}")
        except json.JSONDecodeError:
            raise ForensicsError(f"line {n} is not JSON: not a scan results file, or damaged", path=p) from None
        if isinstance(obj, dict) and isinstance(obj.get("path"), str):
            records[obj["path"]] = compact(obj)
    return header, records, len(rest) - good


def repair_tail(path: Path, half: int) -> None:
    """Cut a half-written last line (``half`` bytes) off a results file already verified as the right one."""
    if half:
        size = path.stat().st_size
        with path.open("r+b") as fh:
            fh.truncate(size - half)


def open_results(output: Path, header: dict[str, Any], resume: bool) -> dict[str, dict[str, Any]] | None:
    """Records already in a results file written for the same dataset and reference; None for a new file.

    The file is verified (header line, dataset, reference) before anything in it is changed.
    """
    check_output_target(output, "results file")  # a FIFO would block the first write for ever
    if output.exists() and output.stat().st_size > 0:
        if not resume:
            raise ForensicsError("results file exists; pass --resume to continue that scan, or choose another -o",
                                 path=output)
        old, records, half = read_results(output)
        for key in ("dataset", "reference"):
            if old.get(key) != header[key]:
                raise ForensicsError(f"results file was written for {key} {old.get(key)}, not {header[key]}; "
                                     "choose another -o", path=output)
        repair_tail(output, half)
        return records
    return None


def check_output(output: Path, root: Path, reference: str | Path | None = None) -> None:
    """The results file is no input: not inside the dataset, not the reference (by device+inode), not a directory."""
    if output.resolve().is_dir():
        raise ForensicsError("is a directory; -o takes a file name", path=output)
    check_not_input(output, [(root, "the dataset"), (reference, "the reference capture")], "results file")


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
        return f"Scanned {o['records']} records of {printable(self.dataset)}: {tail}."

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
                lines.append(f"  {printable(path)}")  # names found in the dataset: one line each, escaped
                lines += [f"    - {printable(r)}" for r in reasons]
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
    header, records, _ = read_results(path)
    lines = [records[k] for k in sorted(records, key=natural_key)]
    ref = None if header.get("reference") is None else {"path": header["reference"]}
    return build_result(header["dataset"], ref, str(path), lines, 0, len(lines))
