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

    from ..dataaudit.audit import AuditSummary
    from ..results import Finding

HEADER_KEY = "eagleforensics_scan"
FORMAT_VERSION = 1
MAX_HEADER_LINE = 1024 * 1024  # the header line is a few hundred bytes


def natural_key(rel: str) -> list[Any]:
    """Sort key that puts data_2 before data_10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", rel)]


# ---------------------------------------------------------------- results file

def make_header(root: Path, reference: str | None, target: str | None = None,
                audit: dict[str, Any] | None = None) -> dict[str, Any]:
    """The first line: the dataset, the reference and (for the training-data audit) the target and its context."""
    header = {HEADER_KEY: FORMAT_VERSION, "dataset": str(root.resolve()),
              "reference": None if reference is None else str(Path(reference).resolve())}
    if target is not None:
        header["target"] = str(Path(target).resolve())
        header["audit"] = audit
    return header


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
        records[obj["path"] if isinstance(obj, dict) else ""] = _checked_line(obj, n, p)
    return header, records, len(rest) - good


def _checked_line(obj: Any, n: int, path: Path) -> dict[str, Any]:
    """A record line compacted, its fields of the types the scanner writes; anything else is one line naming the
    file and the line (a hand-edited or foreign file must not reach the judgement as a traceback)."""
    def bad(what: str) -> ForensicsError:
        return ForensicsError(f"line {n} is not a scan record ({what}): not a scan results file, or damaged",
                              path=path)

    def number(x: Any) -> bool:
        return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))

    def text(x: Any) -> bool:
        return x is None or isinstance(x, str)

    if not isinstance(obj, dict):
        raise bad(f"a JSON {type(obj).__name__}, not an object")
    if not isinstance(obj.get("path"), str) or not obj["path"]:
        raise bad("no 'path'")
    if not isinstance(obj.get("slots") or [], list) or not all(isinstance(x, dict) for x in obj.get("slots") or []):
        raise bad("'slots' is not a list of objects")
    try:
        line = compact(obj)
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
        raise bad(f"{type(exc).__name__}: {' '.join(str(exc).split())[:80]}") from None
    for key in ("tokens", "padding", "hidden_size", "prefix_tokens"):
        v = line.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise bad(f"'{key}' is {str(v)[:40]!r}, not a count")
    if not all(text(line.get(k)) for k in ("error", "format")) or not all(isinstance(i, str) for i in line["issues"]):
        raise bad("'error', 'format' or 'issues' is not text")
    for s in line["slots"]:
        if not (isinstance(s.name, str) and text(s.role) and text(s.dtype) and text(s.resembles)
                and text(s.prefix_position) and all(number(x) for x in (s.log_norm, s.norm_cv, s.first_excess))
                and (s.post_norm is None or isinstance(s.post_norm, bool))):
            raise bad(f"slot {str(s.name)[:40]!r} has a field of the wrong type")
    return line


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
        for key in ("dataset", "reference", "target"):
            if old.get(key) != header.get(key):
                raise ForensicsError(f"results file was written for {key} {old.get(key)}, not {header.get(key)}; "
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
    audit: dict[str, Any] | None = None  # the training-data audit's context (target, template, served side)
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
        """0: no outlier and no flagged training-data finding; 1: at least one."""
        flagged = any(f.severity in ("error", "warning") for f in self.audit_findings())
        return 1 if self.outliers or flagged else 0

    def audit_summary(self) -> "AuditSummary | None":
        """The training-data audit over every record (None when the scan had no target)."""
        if self.audit is None:
            return None
        from ..dataaudit.audit import AuditSummary

        return AuditSummary.of(self.lines)

    def audit_findings(self) -> list["Finding"]:
        """``data-not-from-target``, ``template-mismatch``, ``thinking-mismatch``, ``loss-mask-shifted`` and
        ``train-shorter-than-served`` over the dataset (empty without a target)."""
        s = self.audit_summary()
        if s is None or self.audit is None:
            return []
        from ..dataaudit import audit as da

        out = da.origin_findings(s) + da.shift_findings(s) + da.length_findings(s, self.audit.get("served_len"))
        if self.audit.get("template"):
            served = self.audit.get("served")
            out += da.template_findings(s, da.TemplateFacts.from_dict(self.audit["template"]),
                                        None if not served else da.ServedSummary.from_dict(served))
        order = {"error": 0, "warning": 1, "info": 2}
        return sorted(out, key=lambda f: order.get(f.severity, 3))

    def training_data(self) -> dict[str, Any] | None:
        """The audit's JSON: the context, the summary (counts, percentiles, histograms) and the findings."""
        s = self.audit_summary()
        if s is None:
            return None
        return {"context": self.audit, "summary": s.to_dict(), "findings": [f.to_dict() for f in self.audit_findings()]}

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
        out = {"overview": self.overview(), "slots": slots,
               "outliers": [{"path": p, "reasons": r} for p, r in self.outliers.items()]}
        if self.audit is not None:
            out["training_data"] = self.training_data()
        return out

    def _audit_text(self) -> str:
        """The training-data section of the terminal output: figures, skeleton table, findings."""
        from ..dataaudit.audit import fmt_float

        s = self.audit_summary()
        ctx = self.audit or {}
        assert s is not None
        pc = s.percentiles()
        out = [f"training data against the target {printable(ctx.get('target'))}:",
               f"  {s.records} records, {s.supervised:,} supervised tokens; length p50 {pc['p50']}, p95 {pc['p95']}, "
               f"max {pc['max']}" + (f"; served length {ctx['served_len']:,}" if ctx.get("served_len") else "")]
        a = s.agreement
        if a.tokens:
            out.append(f"  agreement with the target over {a.tokens:,} tokens of {len(s.per_record)} records: greedy "
                       f"{fmt_float(a.agreement)}, mean log p {fmt_float(a.mean_logprob, '.2f')}, outside top 5 "
                       f"{fmt_float(a.top5_miss)}, surprise {fmt_float(a.mean_surprise, '+.3f')} nats/token "
                       f"(z {fmt_float(a.z, '.1f')}); {len(s.flagged_records())} records not from the target")
            hist = s.agreement_histogram(bins=10)
            out.append("  records by greedy agreement: " + "  ".join(
                f"{lo:.1f}-{hi:.1f}:{n}" for lo, hi, n in zip(hist["edges"], hist["edges"][1:], hist["counts"])))
        elif ctx.get("head_error"):
            out.append(f"  agreement not computed: {printable(ctx['head_error'])}")
        if s.skeletons:
            out.append("  answers follow (last supervised run of each record):")
            out += [f"    {n:7d}  {printable(k)}" for k, n in s.skeletons.most_common(8)]
        elif ctx.get("skeleton_error"):
            out.append(f"  template not checked: {printable(ctx['skeleton_error'])}")
        if s.states:
            out.append("  answer states: " + ", ".join(f"{k} {n}" for k, n in s.states.most_common()))
        for f in self.audit_findings():
            out.append(f"  [{f.severity}] {f.code}: {printable(f.message)}")
            if f.fix and f.severity in ("error", "warning"):
                out.append(f"      fix: {printable(f.fix)}")
        return "\n".join(out)

    def to_text(self, max_outliers: int = 50) -> str:
        """Headline, per-slot summary and the first ``max_outliers`` outliers with reasons, for the terminal."""
        lines = [self.headline(), ""]
        table = self.summary()
        if not table.empty:
            lines += [table.to_string(index=False, na_rep="-", float_format=lambda v: f"{v:.3f}"), ""]
        if self.audit is not None:
            lines += [self._audit_text(), ""]
        if self.outliers:
            lines.append("outliers:")
            for path, reasons in list(self.outliers.items())[:max_outliers]:
                lines.append(f"  {printable(path)}")  # names found in the dataset: one line each, escaped
                lines += [f"    - {printable(r)}" for r in reasons]
            if len(self.outliers) > max_outliers:
                lines.append(f"  ... and {len(self.outliers) - max_outliers} more (all of them with --json)")
        return "\n".join(lines).rstrip()


def build_result(dataset: str, reference: dict[str, Any] | None, output: str | None, lines: list[dict[str, Any]],
                 scanned: int, resumed: int, audit: dict[str, Any] | None = None) -> ScanResult:
    """Judge the lines (``scan_summary``) and wrap them in a ScanResult."""
    from .summary import find_outliers

    result = ScanResult(dataset, reference, output, [compact(line) for line in lines], scanned, resumed, audit=audit)
    result.outliers = find_outliers(result.lines, result.slots)
    return result


def load_results(path: str | Path) -> ScanResult:
    """Re-judge a finished (or partial) results file without reading the dataset again."""
    header, records, _ = read_results(path)
    lines = [records[k] for k in sorted(records, key=natural_key)]
    ref = None if header.get("reference") is None else {"path": header["reference"]}
    audit = header.get("audit") if isinstance(header.get("audit"), dict) else None
    return build_result(header["dataset"], ref, str(path), lines, 0, len(lines), audit)
