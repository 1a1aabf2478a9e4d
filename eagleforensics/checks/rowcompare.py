"""Row-by-row comparison of a drafter's weight matrix with the target's, and the signature of a fresh random init.

A drafter's ``embed_tokens`` is meant to be the target's (EAGLE-3 trainers copy and freeze it); a
speculators head is the target's ``lm_head`` at the draft ids. Sampled rows tell a copy (cosine ~1
row by row) from a fresh init (cosine ~0, and entries that look i.i.d.: row norms all near
``std*sqrt(H)`` with the small spread a sum of H squares has, every column with the same spread)
and from another model's trained matrix (cosine ~0 or partial, rows and columns as uneven as
trained weights are). Only the sampled rows are read (``io.modeldir.ModelDir.rows``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..arrays import f32

SAMPLE_ROWS = 512
COPY_COS = 0.98  # median row cosine at or above this: a copy (bf16 rounding keeps it above 0.999)
FRESH_COS = 0.2  # |median cosine| below this: unrelated rows
# i.i.d. bounds, as multiples of the spread an i.i.d. Gaussian matrix of that size shows (generous: a
# trained matrix misses them by far, e.g. row-norm CV 0.2-0.5 against 1/sqrt(2H) ~ 0.01 at H = 4096)
ROW_CV_SLACK = 3.0
COL_SPREAD = 0.5  # every column's std within this fraction of the median column std
KNOWN_INIT_STDS = (0.02, 1.0)  # transformers' initializer_range default; torch nn.Embedding's N(0, 1)


def sample_rows(n_rows: int, k: int = SAMPLE_ROWS, seed: int = 0) -> np.ndarray:
    """Up to ``k`` row ids of ``n_rows``, seeded, sorted (all of them when there are fewer)."""
    if n_rows <= k:
        return np.arange(n_rows)
    return np.sort(np.random.default_rng(seed).choice(n_rows, size=k, replace=False))


@dataclass(frozen=True)
class RowComparison:
    """How the drafter's sampled rows relate to the target's same rows."""

    rows: int
    median_cos: float
    p10_cos: float
    median_norm_ratio: float  # drafter row norm / target row norm

    @property
    def copy(self) -> bool:
        return self.median_cos >= COPY_COS

    def to_dict(self) -> dict[str, float]:
        return {"rows": self.rows, "median_cos": round(self.median_cos, 4), "p10_cos": round(self.p10_cos, 4),
                "median_norm_ratio": round(self.median_norm_ratio, 4)}


def compare_rows(own: np.ndarray, ref: np.ndarray) -> RowComparison:
    """Cosine and norm ratio of each row of ``own`` against the same row of ``ref`` ([k, H] each)."""
    a, b = f32(own).astype(np.float64), f32(ref).astype(np.float64)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    ok = (na > 0) & (nb > 0)
    cos = np.where(ok, (a * b).sum(1) / np.where(ok, na * nb, 1.0), 0.0)
    ratio = np.where(nb > 0, na / np.where(nb > 0, nb, 1.0), np.nan)
    return RowComparison(int(a.shape[0]), float(np.median(cos)), float(np.percentile(cos, 10)),
                         float(np.nanmedian(ratio)) if np.isfinite(ratio).any() else float("nan"))


@dataclass(frozen=True)
class InitSignature:
    """Whether a matrix's sampled rows look like a fresh i.i.d. random init, with the figures that say so."""

    fresh: bool
    std: float
    row_norm_cv: float
    row_norm_cv_iid: float  # what i.i.d. entries give: 1/sqrt(2H)
    column_spread: float  # min and max column std over the median, the farther from 1
    known_std: float | None  # the init std it matches within 10%, if any
    why: str

    def to_dict(self) -> dict[str, object]:
        return {"fresh": self.fresh, "std": round(self.std, 6), "row_norm_cv": round(self.row_norm_cv, 4),
                "row_norm_cv_iid": round(self.row_norm_cv_iid, 4), "column_spread": round(self.column_spread, 4),
                "known_std": self.known_std}


def init_signature(rows: np.ndarray, init_stds: tuple[float, ...] = KNOWN_INIT_STDS) -> InitSignature:
    """Test ``rows`` [k, H] for i.i.d. entries: even row norms and even column spreads (a trained matrix has neither)."""
    x = f32(rows).astype(np.float64)
    k, h = x.shape
    std = float(x.std())
    norms = np.linalg.norm(x, axis=1)
    cv = float(norms.std() / norms.mean()) if norms.mean() > 0 else float("inf")
    cv_iid = 1.0 / math.sqrt(2 * h)
    col = x.std(axis=0)
    med = float(np.median(col))
    spread = float(max(med / max(col.min(), 1e-30), col.max() / max(med, 1e-30))) if med > 0 else float("inf")
    col_limit = 1.0 / (1.0 - COL_SPREAD) if k >= 64 else float("inf")
    known = next((s for s in init_stds if s > 0 and abs(std / s - 1.0) < 0.1), None)
    reasons = []
    if cv > ROW_CV_SLACK * cv_iid + 0.01:
        reasons.append(f"row norms vary by {cv:.3f} (i.i.d. entries give {cv_iid:.3f})")
    if spread > col_limit:
        reasons.append(f"column spreads differ by up to {spread:.1f}x")
    fresh = not reasons and std > 0
    why = "; ".join(reasons) if reasons else (f"entries look i.i.d. (std {std:.4g}, row-norm CV {cv:.3f} against "
                                              f"{cv_iid:.3f} for i.i.d.)")
    return InitSignature(fresh, std, cv, cv_iid, spread, known, why)
