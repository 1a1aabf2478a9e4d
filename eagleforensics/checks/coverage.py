"""Vocabulary coverage: a target token outside the draft vocabulary can never be accepted, so coverage caps acceptance.

``vocab-coverage``: the share of the target's next tokens, on the training records and on the
capture, that fall inside the draft vocabulary the map means (``t2d``'s ids, else ``arange + d2t``;
a broken map is the vocab-map row's finding, not this one's). Step-1 acceptance can be at most that
share. Flagged (warning) below ``CEILING_WARN`` when measured on the target's own greedy tokens
(``--target``), and surely so (the 95% Wilson upper bound of the share is below it: a few tokens
do not make a finding): no drafter accepts well under such a cap. Between that and ``CEILING_INFO`` the
ceiling is stated (info): it binds only when the drafter otherwise reaches it, which the replay row
measures. Measured on the ids alone it is a proxy, reported as info. Sources: a vocabulary
pruned on a narrow corpus loses a language or domain (sgl-project/SpecForge#765,
MiaAI-Lab/Qwen3.8-Flash-Next-Single-DGX-Spark#43; docs/causes.md rows 5 and 19).
"""
from __future__ import annotations

import math

import numpy as np

from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .nexttokens import NextTokens, capture_tokens, record_tokens
from .registry import register
from .vocabmap import diagnosis

CEILING_WARN = 0.50  # at most half the target's tokens draftable: a cause whatever the drafter (EAGLE-3 reaches 0.7+)
CEILING_INFO = 0.90  # below this the ceiling is stated (info): whether it binds depends on the drafter's acc@1
SOURCE = "sgl-project/SpecForge#765, MiaAI-Lab/Qwen3.8-Flash-Next-Single-DGX-Spark#43 (docs/causes.md rows 5, 19)"


def upper_bound(share: float, n: int, z: float = 1.96) -> float:
    """The Wilson score interval's upper end (95%) for a share measured on ``n`` tokens."""
    if n <= 0:
        return 1.0
    centre = share + z * z / (2 * n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n))
    return min(1.0, (centre + half) / (1 + z * z / n))


def share_inside(tokens: np.ndarray, vocab_ids: np.ndarray) -> float:
    """The share of ``tokens`` that are in ``vocab_ids``."""
    return float(np.isin(tokens, vocab_ids).mean()) if tokens.size else float("nan")


def run(art: Artifacts) -> CheckResult:
    """Measure coverage on each source given; flag the lowest one measured on the target's own tokens."""
    vm, dx = diagnosis(art)
    n = vm.draft_vocab_size
    if dx.kind == "full":
        return CheckResult((), "no reduced vocabulary: every target token can be drafted", {"draft_vocab_size": n})
    if dx.intended is None:
        return CheckResult((), "the draft vocabulary cannot be told (no usable d2t and no t2d: see the vocab-map row)",
                           {"draft_vocab_size": n})
    sources: list[NextTokens] = []
    if art.available("train"):
        got = record_tokens(art)
        if got is not None:
            sources.append(got)
    if art.available("capture"):
        got = capture_tokens(art)
        if got is not None:
            sources.append(got)
    if not sources:
        return CheckResult((), "no next tokens to measure (records without input_ids, a capture without ids)", {})
    rows = {s.source: {"share": share_inside(s.tokens, dx.intended), "tokens": int(s.tokens.size), "how": s.how,
                       "exact": s.exact} for s in sources}
    data = {"draft_vocab_size": n, "vocabulary": dx.intended_how, "sources": rows}
    single = {"records": "record", "capture": "capture"}
    parts = [f"{r['share']:.0%} of {r['tokens']} {single.get(name, name)} tokens "
             f"({'target greedy' if r['exact'] else 'own ids'})"
             for name, r in rows.items()]
    note = f"the {n}-token draft vocabulary ({dx.intended_how}) holds " + "; ".join(parts)
    exact = {k: r for k, r in rows.items() if r["exact"]}
    pool = exact or rows
    name, worst = min(pool.items(), key=lambda kv: kv[1]["share"])
    share = worst["share"]
    findings: list[Finding] = []
    fix = ("Rebuild the draft vocabulary from text like the served traffic (the target's own outputs), keep byte-level "
           "and special tokens, or raise draft_vocab_size; then retrain the head.")
    if exact and upper_bound(share, worst["tokens"]) < CEILING_WARN:
        findings.append(Finding(
            "vocab-coverage", "warning",
            f"only {share:.0%} of the target's next tokens on the {name} ({worst['tokens']} tokens, {worst['how']}) "
            f"are inside the {n}-token draft vocabulary: the drafter can never propose the rest, so step-1 acceptance "
            f"there is at most {share:.2f}.", fix=fix, source=SOURCE, impact="high"))
    elif exact and share < CEILING_INFO:
        findings.append(Finding(
            "vocab-coverage", "info",
            f"{share:.0%} of the target's next tokens on the {name} ({worst['tokens']} tokens) are inside the {n}-token "
            f"draft vocabulary: step-1 acceptance there is at most {share:.2f}, a cap that costs acceptance only when "
            "the drafter comes close to it (the replay row measures acc@1).", source=SOURCE, impact="low"))
    elif not exact and share < CEILING_INFO:
        findings.append(Finding(
            "vocab-coverage", "info",
            f"{share:.0%} of the {name}'s own next ids are inside the draft vocabulary; that is the ceiling only when "
            "the text is the target's own greedy output (pass --target to measure the target's choices).",
            source=SOURCE, impact="low"))
    return CheckResult(tuple(findings), note, data)


CHECK = register(Check("vocab-coverage", "draft vocabulary coverage of the target's next tokens (a ceiling)",
                       ("vocab-coverage",), ("drafter", "train|capture"), run, order=30))
