"""The arithmetic of ``probe``: ratio estimates with standard errors, degenerate output, where two outputs part.

Torch-free and free of any I/O: the pipeline feeds it the numbers the server replied with.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

# Fewer verify rounds than this and an accept length is not called: at L ~ 2 the SE of one round's
# accepted drafts is ~1, so 200 rounds give an SE near 0.07 before prompt-to-prompt spread.
MIN_ROUNDS = 200
# At least this many requests (or counter windows) for a standard error across them.
MIN_UNITS = 2
# A drafter whose accept length stays below this accepts (almost) nothing.
NOTHING = 1.05
REPEAT_SHARE = 0.5  # the commonest 4-gram covers more than this share of a long output
REPEAT_MIN_TOKENS = 32
_UNREADABLE = re.compile("[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f]")  # replacement and control characters


def ratio(y: Sequence[float], x: Sequence[float]) -> tuple[float, float]:
    """sum(y) / sum(x) with the ratio estimator's standard error across the units (NaN SE below two units)."""
    n = len(y)
    sx = sum(x)
    if n == 0 or sx <= 0:
        return math.nan, math.nan
    r = sum(y) / sx
    if n < MIN_UNITS:
        return r, math.nan
    mx = sx / n
    e = [yi - r * xi for yi, xi in zip(y, x)]
    return r, math.sqrt(sum(v * v for v in e) / (n * (n - 1))) / mx


def per_position(histograms: Sequence[Sequence[int]]) -> tuple[float, ...] | None:
    """Acceptance at draft position 1..k from per-request histograms of accepted drafts per verify pass.

    ``h[j]`` counts the verify passes that accepted exactly j drafts (SGLang's
    ``spec_correct_drafts_histogram``); position i is accepted in every pass that accepted at least i.
    """
    usable = [list(h) for h in histograms if h and len(h) > 1]
    if not usable:
        return None
    width = max(len(h) for h in usable)
    total = [0] * width
    for h in usable:
        for j, v in enumerate(h):
            total[j] += int(v)
    passes = sum(total)
    if passes <= 0:
        return None
    reach, tail = [], 0  # suffix sums, from the last position back: linear in the width
    for count in reversed(total[1:]):
        tail += count
        reach.append(tail / passes)
    return tuple(reversed(reach))


def degenerate(tokens: Sequence[object], completion_tokens: int, finish: str | None, text: str) -> str | None:
    """Why an output is not plausible text (empty, stopped at once, one n-gram repeated), or None.

    ``tokens`` are the output's token ids where the server gives them, else its words.
    """
    if completion_tokens <= 0 or not text.strip():
        return "empty output"
    if completion_tokens <= 1 and finish == "stop":
        return "stopped after one token"
    if len(tokens) >= REPEAT_MIN_TOKENS:
        grams = Counter(tuple(tokens[i:i + 4]) for i in range(len(tokens) - 3))
        gram, count = grams.most_common(1)[0]
        if 4 * count / len(tokens) > REPEAT_SHARE and len(set(tokens)) <= max(8, len(tokens) // 8):
            return f"one 4-token sequence repeated {count} times ({4 * count / len(tokens):.0%} of the output)"
    if text and len(_UNREADABLE.findall(text)) > 0.2 * len(text):
        return "mostly undecodable or control characters"
    return None


def chain_reach(length: float, steps: int) -> tuple[float, ...] | None:
    """Reach@1..k of a chain that accepts each next draft with one probability q, fitted so that
    1 + sum q^j = ``length`` (for an SE where the engine gives no per-position counts); None when impossible."""
    target = length - 1.0
    if not (math.isfinite(target) and steps >= 1 and 0.0 <= target <= steps):
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** j for j in range(1, steps + 1)) < target:
            lo = mid
        else:
            hi = mid
    q = (lo + hi) / 2
    return tuple(q ** j for j in range(1, steps + 1))


def first_difference(a: Sequence[object], b: Sequence[object]) -> int | None:
    """Index of the first element where ``a`` and ``b`` differ (the shorter one's length if one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
