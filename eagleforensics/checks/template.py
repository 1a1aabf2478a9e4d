"""Chat template and thinking mode: were the records rendered as the server renders, and is the loss mask on the answer?

From the target's tokenizer files (``tokenizer.json``, the chat template) the check learns where an
answer starts and ends (``dataaudit.templates``) and reads every supervised run of every record:

* ``template-mismatch``: the answers follow another template's header (or none), or the served
  prompts (``--served-prompts``, ``--capture`` ids) carry another template or none at all (raw
  completions), or a record and the capture hold one conversation after other beginnings (another
  system prompt); SafeAILab/EAGLE#196, sgl-project/SpecForge#296;
* ``thinking-mismatch``: the records answer in another think mode (reasoning, an empty think
  block, no think block) than the served prompts ask for;
* ``loss-mask-shifted``: supervised runs start one token after (or before) the assistant header,
  so the first answer token is never supervised (sgl-project/SpecForge#885).
"""
from __future__ import annotations

from typing import Any

from ..errors import printable
from ..dataaudit.audit import TEMPLATE_SOURCE, AuditSummary, TemplateFacts, shift_findings, template_findings
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register

SHARED_RUN = 16  # the same conversation: at least this many ids shared as one run after beginnings that differ
MAX_RECORDS = 64  # records compared with the capture's ids (one run search each)
SHOW_CHARS = 90  # of each differing beginning, decoded


def _shown(tok: Any, ids: Any) -> str:
    """The first ``SHOW_CHARS`` characters of ``ids`` decoded (or the ids themselves without a tokenizer)."""
    text = tok.decode([int(t) for t in ids]) if tok is not None else " ".join(str(int(t)) for t in ids[:24])
    return printable(text if len(text) <= SHOW_CHARS else text[:SHOW_CHARS] + "...")


def prefix_mismatch(art: Artifacts) -> Finding | None:
    """``template-mismatch`` from token ids: a record and the capture hold one conversation (a long shared run of
    ids) after beginnings that differ, i.e. the record was rendered with another system prompt or template than the
    served request. The skeleton check cannot see this: both sides put the answer after the same header."""
    from ..evidence.tokens import align_tokens, trailing_padding

    if art.inputs.capture is None or art.capture.input_ids is None:
        return None
    cap = art.capture.input_ids
    best = None
    for rec in art.records[:MAX_RECORDS]:
        if rec.input_ids is None:
            continue
        pad = trailing_padding(rec.input_ids, rec.loss_mask)
        tok = align_tokens(rec.input_ids, len(rec.input_ids), pad, cap, len(cap), min_tokens=SHARED_RUN)
        if tok.other_context and tok.length >= SHARED_RUN and (best is None or tok.length > best[1].length):
            best = (rec, tok)
    if best is None:
        return None
    rec, tok = best
    decoder = art.audit.tokenizer
    ts, cs = tok.train_start, tok.capture_start
    mine = f"its first {ts} tokens ({_shown(decoder, rec.input_ids[:ts])!r})" if ts else "nothing"
    theirs = f"the capture's first {cs} ({_shown(decoder, cap[:cs])!r})" if cs else "nothing in the capture"
    return Finding(
        "template-mismatch", "warning",
        f"{printable(rec.path)} and the capture hold the same {tok.length} tokens after different beginnings: "
        f"{mine} where the served request has {theirs}. The records were rendered with another system prompt or "
        "chat template than the server's, so the drafter learned the states of another context (the wiring row's "
        "drift on these rows is this context, not the weights).",
        fix="Render the training conversations exactly as the server does (the same chat template and default system "
            "prompt: what the served request's ids start with), regenerate the hidden states, and retrain.",
        source=TEMPLATE_SOURCE, impact="high")


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
    prefix = prefix_mismatch(art)
    if prefix is not None and not any(f.code == prefix.code and f.severity != "info" for f in findings):
        findings.append(prefix)
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
