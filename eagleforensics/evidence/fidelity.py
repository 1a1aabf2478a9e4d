"""How close a matched slot is to the capture's state: ``copy``, ``drift`` or ``different``, and why.

Read from the per-token score pattern of the matched column:

* ``copy``: every token within the dtype's rounding (and the norms agree);
* ``drift``: the same state through other kernels, weights or routing. The cause is named
  from the shape of the residual: a few tokens far off while the rest agree to 0.999+
  (MoE routers picked other experts for those tokens), every row a little off (quantised
  weights, other attention kernels or dtypes), or rows that are garbage (zeros, random,
  non-finite: corrupted or written from another state);
* ``different``: not the same state at all: the typical token is farther from this
  position than the capture's neighbouring layers are from each other, or every row is off
  while the norms differ by more than ``DRIFT_NORM_LIMIT`` (drift does not rescale a state).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("copy", "drift", "different")
AGREE_GAP = 1e-3  # "the rest agree to 0.999+"
GARBAGE = 0.5  # a row scoring below this is not a drifted copy of anything
DRIFT_STEP_FRACTION = 0.5  # drift may move the typical token by at most half the layer step (docs/calibration.md)
DRIFT_NORM_LIMIT = 2.0  # a uniformly drifted copy keeps its norm within this factor (docs/calibration.md)


@dataclass(frozen=True)
class Fidelity:
    """Fidelity of one slot's best column; ``text`` says it in words for findings and tables."""

    kind: str  # copy / drift / different ("" when nothing was compared)
    cause: str  # "" / routing / uniform / corrupted / scale (drift); "" / norms (different)
    differing: int  # tokens beyond 0.999 (or the copy bar, if stricter)
    tokens: int
    typical_gap: float  # 1 - median per-token score
    text: str


def judge_fidelity(per: np.ndarray, copy_gap: float, norm_ratio: float, norm_tol: float, step: float,
                   nonfinite: int = 0) -> Fidelity:
    """Classify one column's per-token scores (NaN = not compared) against the slot (see module doc)."""
    s = per[np.isfinite(per)].astype(np.float64)
    n = int(s.size)
    if not n:
        return Fidelity("", "", 0, 0, float("nan"), "nothing compared")
    med = float(np.median(s))
    gap = max(1.0 - med, 0.0)
    agree = max(10 * copy_gap, AGREE_GAP)
    low = s < 1.0 - agree
    k = int(low.sum())
    bad = nonfinite
    step_gap = 1.0 - step if step == step else float("nan")
    if med < GARBAGE or (step_gap == step_gap and gap > DRIFT_STEP_FRACTION * step_gap and gap > agree):
        why = (f"typical token scores {med:.4f}" + (f", farther than the capture's neighbouring layers are "
                                                      f"from each other (cosine {step:.4f})" if step == step else ""))
        return Fidelity("different", "", k, n, gap, f"different: {why}")
    norms_off = norm_ratio == norm_ratio and abs(norm_ratio - 1.0) > norm_tol
    if gap <= copy_gap and not k and not bad and not norms_off:
        return Fidelity("copy", "", 0, n, gap, f"copy: every token within {copy_gap:.0e} of a perfect score")
    if k and (k + bad) * 2 <= n + bad and bool((s[low] < GARBAGE).all()):
        return Fidelity("drift", "corrupted", k + bad, n + bad, gap,
                        f"{k + bad} of {n + bad} rows are garbage (score below {GARBAGE}"
                        f"{', or NaN/Inf' if bad else ''}), the rest agree to {1 - agree:.3f}+: those rows are "
                        "corrupted or were written from another state")
    if k and gap <= agree:
        return Fidelity("drift", "routing", k, n, gap,
                        f"{k} of {n} tokens differ (down to {float(s.min()):.4f}), the rest agree to "
                        f"{1 - agree:.3f}+: consistent with MoE routing differences (other experts for those "
                        "tokens), a context that differs for those tokens (an extra BOS or template token), or "
                        "rows edited after capture")
    if gap <= copy_gap and norms_off:
        return Fidelity("drift", "scale", k, n, gap,
                        f"directions agree to the dtype's rounding but norms differ by {abs(norm_ratio - 1):.1%}: "
                        "a rescaled state")
    if norm_ratio == norm_ratio and not 1.0 / DRIFT_NORM_LIMIT <= norm_ratio <= DRIFT_NORM_LIMIT:
        # quantised weights or other kernels move a state a little in every direction, its size included;
        # a post-norm slot against a raw column (or a column whose neighbours are garbage, so the step
        # looks huge) points roughly the same way at many times the norm
        return Fidelity("different", "norms", k, n, gap,
                        f"different: typical token scores {med:.4f} with the slot's norms {norm_ratio:.3g}x the "
                        f"capture's (a drifted copy keeps its norm within {DRIFT_NORM_LIMIT:g}x)")
    return Fidelity("drift", "uniform", k, n, gap,
                    f"every row drifts by about {gap:.1e} (median per-token score {med:.6f}; {k} of {n} tokens "
                    f"below {1 - agree:.3f}): consistent with quantised weights or other kernels / dtypes")
