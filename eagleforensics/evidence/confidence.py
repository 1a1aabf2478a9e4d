"""When a best match counts as a fact: dtype-aware thresholds and the score-floor choice of position.

For a capture whose rows can be read, identity is decided from evidence measured on the
data itself (``identity``; the bars it uses, ``copy_gap`` and the rest, live in
``Thresholds`` here). The score-floor rule below still decides for fingerprint estimates
(``fpmatch``), where no per-token scores exist. Under it a slot is placed only when all of
these hold (otherwise: "no confident match"):

* enough aligned tokens were compared (``min_tokens``);
* the best per-token cosine clears ``min_score`` for the less precise of the two sides
  (an exact bf16 copy scores about 1 - 1e-5; neighbouring layers of real models can sit
  at 0.99+, so the bar is close to 1);
* the runner-up at a *different* position is clearly worse: its distance from a perfect
  score is at least ``ratio`` times the winner's, and the margin is at least ``min_margin``;
* the per-token norm ratio is within ``norm_tol`` of 1 (a neighbouring layer usually
  differs in norm, the same state does not).

The bars are deliberately strict. Engine kernels drift from HF in deep layers; when a
real match is rejected for that, the reason says so and ``--min-score`` lowers the bar.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..arrays import dtype_name
from ..positions import Position

MIN_TOKENS = 4


@dataclass(frozen=True)
class Thresholds:
    """The bars a best match must clear to be reported as a fact."""

    min_score: float
    min_margin: float
    norm_tol: float
    ratio: float = 4.0
    min_tokens: int = MIN_TOKENS
    dtype: str = "float32"
    copy_gap: float = 1e-7  # identity/fidelity: 1 - score within which a match is a copy at this dtype's rounding
    paired_alpha: float = 1e-3  # identity: one-sided level of the bound on best minus runner-up (sign test)
    step_ratio: float = 2.0  # identity: the layer step must be this many times the match's distance from 1
    min_votes: float = 0.5  # identity: share of tokens whose own best is the slot's best position

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


_BY_DTYPE = {
    "float64": Thresholds(0.9999, 0.0005, 0.005, dtype="float64", copy_gap=1e-7),
    "float32": Thresholds(0.9999, 0.0005, 0.005, dtype="float32", copy_gap=1e-7),
    "float16": Thresholds(0.999, 0.001, 0.01, dtype="float16", copy_gap=1e-6),
    "bfloat16": Thresholds(0.998, 0.002, 0.02, dtype="bfloat16", copy_gap=1e-5),
}
_PRECISION = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}  # significand bits


def thresholds(*dtypes: Any, min_score: float | None = None, min_margin: float | None = None) -> Thresholds:
    """Bars for the least precise of ``dtypes`` (numpy, ml_dtypes or torch dtypes, or their names;
    unknown floats count as bf16), with optional overrides."""
    worst = min((dtype_name(d) for d in dtypes), key=lambda n: _PRECISION.get(n, 0))
    t = _BY_DTYPE.get(worst, _BY_DTYPE["bfloat16"])
    if min_score is not None:  # a user's bar also says how far from 1 still counts as a copy
        t = replace(t, min_score=min_score, copy_gap=max(t.copy_gap, 1.0 - min_score))
    if min_margin is not None:
        t = replace(t, min_margin=min_margin)
    return t


@dataclass(frozen=True)
class Choice:
    """The best column for one slot, the runner-up at a different position, and the verdict."""

    best: Position | None
    score: float
    runner_up: Position | None
    runner_score: float
    margin: float
    confident: bool
    reason: str


def choose(scores: np.ndarray, norm_ratios: np.ndarray, columns: list[Position], tokens: float,
           bar: Thresholds) -> Choice:
    """Pick the best column for one slot and say whether it clears every bar (see module doc)."""
    finite = [(float(s), float(r), c) for s, r, c in zip(scores, norm_ratios, columns) if s == s]
    if not finite:
        return Choice(None, float("nan"), None, float("nan"), float("nan"), False, "nothing to compare")
    finite.sort(key=lambda t: -t[0])
    best_s, best_ratio, best = finite[0]
    rival = next(((s, c) for s, _, c in finite[1:] if c.p != best.p), (float("nan"), None))
    margin = best_s - rival[0] if rival[1] is not None else math.inf
    runner_gap = 1 - rival[0] if rival[1] is not None else math.inf
    if tokens < bar.min_tokens:
        reason = f"only {int(tokens)} tokens compared (need {bar.min_tokens})"
    elif best_s < bar.min_score:
        reason = f"best score {best_s:.4f} is below {bar.min_score} ({bar.dtype})"
    elif not margin >= bar.min_margin:
        reason = f"margin {margin:.4f} to {rival[1].label if rival[1] else '-'} is below {bar.min_margin}"
    elif not runner_gap >= bar.ratio * (1 - best_s):
        reason = (f"runner-up {rival[1].label if rival[1] else '-'} ({rival[0]:.4f}) is not clearly worse "
                  f"than the best ({best_s:.4f})")
    elif best_ratio == best_ratio and abs(best_ratio - 1) > bar.norm_tol:
        reason = f"norms differ by {abs(best_ratio - 1):.1%} (allowed {bar.norm_tol:.1%})"
    else:
        reason = ""
    return Choice(best, best_s, rival[1], rival[0], margin if math.isfinite(margin) else float("nan"),
                  reason == "", reason)
