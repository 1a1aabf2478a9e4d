"""Norm-based evidence that needs no weights: post-norm signatures, RMSNorm gain fits, norm profiles.

After RMSNorm every token's vector is ``g * x / rms(x)``, so per-token norms are nearly
constant (their coefficient of variation is small), while residual-stream states vary
widely from token to token, most of all the first token with its massive activations
(docs/conventions.md, "A post-norm state has a signature").
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..arrays import BF16, as_array, f32
from .fused import row_stats

POST_NORM_CV = 0.1  # per-token norm variation below this looks post-norm
EPS = 1e-12
ROW_BLOCK = 1 << 20  # values widened to float32 at once on the numpy path (bounded temporaries)


def row_summaries(xs: list[Any]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``row_summary`` of each array, the path chosen once by their total size: a record's slots
    (each under the kernels' threshold at a large model's T=2048, together over it) are read by the
    compiled kernel, 5x faster than numpy there, and one record never mixes the two paths."""
    total = sum(int(as_array(x).nbytes) for x in xs)
    return [row_summary(x, total) for x in xs]


def row_summary(x: Any, job_bytes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(per-token L2 norms float32, per-token NaN/Inf flags) of a [T, H] array in one pass.

    Large inputs (``job_bytes``, else the array's size) go through the compiled kernel (float64
    totals, no float32 copy of the array); small ones through numpy a block of rows at a time
    (float32, as before), each block widened into the same two buffers (fresh memory costs a page
    fault per page on a microVM).
    """
    x = as_array(x)
    stats = row_stats(x, job_bytes)
    if stats is not None:
        return stats
    t, h = int(x.shape[0]), int(x.shape[-1])
    norms = np.empty(t, np.float32)
    bad = np.zeros(t, bool)
    step = max(1, ROW_BLOCK // max(1, h))
    buf = np.empty((min(step, t), h), np.float32)
    for a in range(0, t, step):
        rows = x[a:a + step]
        block = buf[:rows.shape[0]]
        if rows.dtype == np.float32:  # read as it is (as ``arrays.f32``)
            block = rows
        elif rows.dtype == BF16:  # bf16 is the top half of a float32
            np.left_shift(rows.view(np.uint16), 16, out=block.view(np.uint32), dtype=np.uint32)
        else:
            np.copyto(block, rows, casting="unsafe")
        with np.errstate(over="ignore", invalid="ignore"):
            sq = np.einsum("th,th->t", block, block, dtype=np.float32)
        norms[a:a + step] = np.sqrt(sq)
        maybe = np.flatnonzero(~np.isfinite(sq))  # a NaN/Inf value makes the sum so; so does overflow: look
        if maybe.size:
            bad[a + maybe] = ~np.isfinite(block[maybe]).all(-1)
    return norms, bad


def token_norms(x: Any) -> np.ndarray:
    """Per-token L2 norms of a [T, H] array, in float32 (NaN rows stay NaN)."""
    return row_summary(x)[0]


def nonfinite_rows(x: Any) -> np.ndarray:
    """Which rows of a [T, H] array hold NaN or Inf (bool [T])."""
    return row_summary(x)[1]


def norm_cv(norms: Any) -> float:
    """Coefficient of variation of per-token norms over the finite entries (NaN if fewer than 2)."""
    n = np.asarray(as_array(norms), dtype=np.float64)
    n = n[np.isfinite(n)]
    if n.size < 2 or float(n.mean()) <= 0:
        return float("nan")
    return float(n.std(ddof=1) / n.mean())


def looks_post_norm(norms: Any) -> bool:
    """True when per-token norms are nearly constant, the mark of a post-RMSNorm state."""
    cv = norm_cv(norms)
    return cv == cv and cv < POST_NORM_CV


def unit_rms(x: Any) -> np.ndarray:
    """``x / rms(x)`` per token (float32): what RMSNorm computes before applying its gain."""
    x = f32(as_array(x))
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(EPS))


def fit_gain(targets: Any, raw: Any) -> np.ndarray:
    """Least-squares per-dimension gain g so that targets ~ g * unit_rms(raw); shapes [K,L,H], [L,H] -> [K,H]."""
    u = unit_rms(raw)
    num = np.einsum("klh,lh->kh", f32(as_array(targets)), u)
    den = np.maximum((u * u).sum(0), np.float32(EPS))
    return num / den
