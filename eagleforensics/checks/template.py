"""Chat template and thinking mode: were the records rendered as the server renders, and is the loss mask on the answer?

From the target's tokenizer files (``tokenizer.json``, the chat template) the check learns where an
answer starts and ends (``dataaudit.templates``) and reads every supervised run of every record:

* ``template-mismatch``: the answers follow another template's header (or none), or the served
  prompts (``--served-prompts``, ``--capture`` ids) carry another template or none at all (raw
  completions); SafeAILab/EAGLE#196, sgl-project/SpecForge#296;
* ``thinking-mismatch``: the records answer in another think mode (reasoning, an empty think
  block, no think block) than the served prompts ask for;
* ``loss-mask-shifted``: supervised runs start one token after (or before) the assistant header,
  so the first answer token is never supervised (sgl-project/SpecForge#885).
"""
from __future__ import annotations

from ..errors import printable
from ..dataaudit.audit import AuditSummary, TemplateFacts, shift_findings, template_findings
from .base import Artifacts, Check, CheckResult
from .registry import register


def run(art: Artifacts) -> CheckResult:
    """Read every record's supervised runs against the target's skeleton, then compare with the served side."""
    from ..scan.audit import served_summary

    audit = art.audit
    if audit.skeleton is None:
        return CheckResult(skipped=audit.skeleton_error or "no chat template")
    lines = art.audit_lines
    summary = AuditSummary.of(lines)
    if not sum(summary.starts.values()):
        return CheckResult(skipped="no record has input_ids and a loss_mask with supervised tokens")
    prompts = art.served_prompts if art.inputs.served_prompts is not None else None
    capture_ids = art.capture.input_ids if art.inputs.capture is not None else None
    sources = [s for s, given in ((f"--served-prompts {art.inputs.served_prompts}", prompts is not None),
                                  (f"--capture {art.inputs.capture}", capture_ids is not None)) if given]
    served = served_summary(audit, prompts, capture_ids, printable(" + ".join(sources)))
    findings = template_findings(summary, TemplateFacts.of(audit.skeleton), served) + shift_findings(summary)
    data = {"skeleton": audit.to_dict()["skeleton"], "records": summary.to_dict(),
            "served": None if served is None else served.to_dict(),
            "per_record": [{"path": line["path"], **(line.get("template") or {})} for line in lines]}
    starts = ", ".join(f"{k} {n}" for k, n in summary.starts.most_common())
    note = f"{sum(summary.starts.values())} supervised runs: {starts}" + (
        "" if served else "; no served side given (--served-prompts or --capture)")
    return CheckResult(tuple(findings), note, data)


CHECK = register(Check("template", "chat template, thinking mode and loss mask of the training records",
                       ("template-mismatch", "thinking-mismatch", "loss-mask-shifted"), ("train", "target"), run,
                       order=50))
