"""Was the training data written by this target? The target's agreement with the records' supervised tokens.

``data-not-from-target`` (warning): scored from each record's own final state through the target's
final norm and lm_head (``dataaudit.agreement``): greedy agreement, mean log-probability, share outside
the top 5, and the surprise against the target's own samples, which decides (README "Target
agreement", calibrated by ``scripts/calibrate_agreement.py``). Answers written by people, another
model or the base model before a fine-tune train a drafter that accepts far less than its training
accuracy promises (sgl-project/SpecForge#533: 98% in training, 10% served).
"""
from __future__ import annotations

import math

from ..dataaudit.audit import AuditSummary, origin_findings
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
    findings = tuple(origin_findings(summary))
    flat = flat_target(a.mean_entropy, getattr(audit.head, "vocab", None))
    if flat and not any(f.severity in ("error", "warning") for f in findings):
        note += f"; cannot tell where they came from: {flat}"
        data["flat_target"] = True
    return CheckResult(findings, note, data)


FLAT_SHARE = 0.8  # a mean entropy above this share of ln(V): the target is near uniform on these tokens


def flat_target(mean_entropy: float | None, vocab: int | None) -> str:
    """Why the origin tests cannot tell (the target is near uniform here, so its own samples look like any other
    text), or '' when the target is sharp enough to judge."""
    if mean_entropy is None or not vocab or vocab < 2:
        return ""
    top = math.log(vocab)
    if mean_entropy < FLAT_SHARE * top:
        return ""
    return (f"the target is flat on these tokens (mean entropy {mean_entropy:.2f} nats, {mean_entropy / top:.0%} of the "
            f"{top:.2f} of a uniform choice among its {vocab:,} tokens), so its own samples look like any other text "
            "and low agreement says nothing")


CHECK = register(Check("data-origin", "training answers written by this target (agreement with its lm_head)",
                       ("data-not-from-target",), ("train", "target"), run, order=60))
