"""Dataset shape: how many records and supervised tokens, how long they are, against the served context.

``train-shorter-than-served`` (warning): the server accepts longer contexts than any training record
holds, so the drafter never saw those positions and acceptance falls with context length
(vllm-project/speculators#684: accept length 2.3 at 2k, 1.08 at 20k).
"""
from __future__ import annotations

from ..dataaudit.audit import AuditSummary, length_findings, shape_line
from .base import Artifacts, Check, CheckResult
from .registry import register


def run(art: Artifacts) -> CheckResult:
    """Records, supervised tokens and length percentiles; with a served length, the comparison."""
    lines = art.audit_lines if art.available("target") else [
        {"path": p, "shape": shape_line(r)} for p, r in zip(art.record_paths, art.records)]
    summary = AuditSummary.of(lines)
    pc = summary.percentiles()
    data = {"records": summary.records, "supervised_tokens": summary.supervised, "length": pc,
            "records_without_loss_mask": summary.no_mask, "served_len": art.served_len}
    note = (f"{summary.records} records, {summary.supervised:,} supervised tokens; length p50 {pc['p50']}, "
            f"p95 {pc['p95']}, max {pc['max']}" + ("" if art.served_len else "; served length unknown (--served-len)"))
    return CheckResult(tuple(length_findings(summary, art.served_len)), note, data)


CHECK = register(Check("data-shape", "training records: count, supervised tokens, lengths against the served context",
                       ("train-shorter-than-served",), ("train",), run, order=70))
