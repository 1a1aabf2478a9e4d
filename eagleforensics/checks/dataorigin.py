"""Was the training data written by this target? The target's agreement with the records' supervised tokens.

``data-not-from-target`` (warning): scored from each record's own final state through the target's
final norm and lm_head (``evidence.agreement``): greedy agreement, mean log-probability, share outside
the top 5, and the surprise against the target's own samples, which decides (README "Target
agreement", calibrated by ``scripts/calibrate_agreement.py``). Answers written by people, another
model or the base model before a fine-tune train a drafter that accepts far less than its training
accuracy promises (sgl-project/SpecForge#533: 98% in training, 10% served).
"""
from __future__ import annotations

from ..evidence.dataaudit import AuditSummary, origin_findings
from .base import Artifacts, Check, CheckResult
from .registry import register


def run(art: Artifacts) -> CheckResult:
    """Score up to ``TargetAudit.max_tokens`` supervised tokens of each record and judge them together and one by one."""
    audit = art.audit
    if audit.head is None:
        return CheckResult(skipped=f"the target's lm_head cannot be read: {audit.head_error}")
    lines = art.audit_lines
    summary = AuditSummary.of(lines)
    if not summary.agreement.tokens:
        reasons = ", ".join(f"{k} ({n})" for k, n in summary.agreement_skipped.items()) or "no supervised tokens"
        return CheckResult(skipped=f"no record could be scored: {reasons}")
    keep = ("tokens", "agreement", "mean_logprob", "top5_miss", "surprise", "z", "fitted_temperature",
            "expected_agreement", "shape_chi2", "near_tie", "reasons", "verdict")
    figures = {k: v for k, v in summary.agreement.to_dict().items() if k in keep}
    data = {"agreement": figures, "origin_verdict": summary.origin_verdict, "final_state": dict(summary.final_kinds),
            "records": [{"path": line["path"], **{k: v for k, v in (line.get("agreement") or {}).items() if k in keep},
                         "final_kind": line.get("final_kind"), "skipped": line.get("agreement_skipped")}
                        for line in lines]}
    a = summary.agreement
    note = (f"{a.tokens:,} supervised tokens of {len(summary.per_record)} records: agreement {a.agreement:.1%}, "
            f"surprise {a.mean_surprise:+.2f} nats/token")
    return CheckResult(tuple(origin_findings(summary)), note, data)


CHECK = register(Check("data-origin", "training answers written by this target (agreement with its lm_head)",
                       ("data-not-from-target",), ("train", "target"), run, order=60))
