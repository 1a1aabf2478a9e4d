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


# A post-norm row is g * x / rms(x): divided by the gain g, every token's RMS is 1 (to the norm's eps and the
# storage dtype's rounding: 0.1-0.25% on real bf16 passes of tiny Llama / Qwen3 / DeepSeek-V3 models with random
# gains), whatever the rows' norms look like. Raw residual-stream rows are off by 92-98% there.
GAIN_RMS_TOL = 0.02  # |rms(y / g) - 1| of every finite row at most this: post-norm
GAIN_RAW_DEV = 0.1  # a row this far off (and no fit within GAIN_RMS_TOL): not normalised by that gain
FIT_ROWS_PER_DIM = 2  # the gain is fitted only from at least this many rows per dimension (else: undecided)
FIT_ROWS_MAX_PER_DIM = 4  # and from at most this many (the fit is decided well before)
FIT_MAX_DIM = 1024  # wider states (the fit holds 4H x H float64 values): only with the target's gain


def rms_after_gain(rows: Any, gain: Any) -> np.ndarray:
    """Per-token RMS of ``rows / gain`` (float64; NaN for non-finite rows): 1 for every post-norm row."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # garbage rows: made NaN below
        y = np.asarray(f32(as_array(rows)), dtype=np.float64)
        g = np.asarray(f32(as_array(gain)), dtype=np.float64).reshape(-1)
        r = np.sqrt(np.mean(np.square(y / g), axis=-1))
    r[~np.isfinite(y).all(axis=-1)] = np.nan
    return r


def fitted_rms_gain(rows: Any) -> tuple[np.ndarray, float] | None:
    """The per-dimension gain that makes every row's RMS 1 in the least-squares sense, and the RMS of what is
    left (1 - mean(y^2 / g^2) per row); None when there are too few finite rows to fit ``H`` gains, or ``H`` is
    over ``FIT_MAX_DIM``. Gains are NaN when some fitted 1/g^2 is not positive (no gain makes the rows unit-RMS).
    At most ``FIT_ROWS_MAX_PER_DIM * H`` rows are used (a float64 copy of at most 32 MiB); the fit is solved on
    the rows themselves (the normal equations square the condition number and lose the 1e-4 residual)."""
    y = as_array(rows)
    if y.ndim != 2 or y.shape[1] > FIT_MAX_DIM:
        return None
    h = int(y.shape[1])
    with np.errstate(invalid="ignore", over="ignore"):  # a garbage row's cast: not finite, left out below
        a = np.square(np.asarray(f32(y[: FIT_ROWS_MAX_PER_DIM * h]), dtype=np.float64)) / h
    a = a[np.isfinite(a).all(axis=-1)]
    if a.shape[0] < FIT_ROWS_PER_DIM * h:
        return None
    w = np.linalg.lstsq(a, np.ones(a.shape[0]), rcond=None)[0]  # w = 1 / g^2
    resid = float(np.sqrt(np.mean(np.square(a @ w - 1.0))))
    if not (w > 0).all():
        return np.full(h, np.nan), resid
    return 1.0 / np.sqrt(w), resid


def gain_kind(rows: Any, gain: Any | None = None) -> tuple[str, str]:
    """``post-norm``, ``raw`` or ``""`` for rows by the RMS-after-gain test, and why (a line for the finding).

    ``gain``: the final norm's weight (the target's); Gemma-style norms scale by ``1 + weight``, so that is
    tried too. Without it the gain is fitted from the rows themselves, which needs at least two rows per
    hidden dimension and states at most FIT_MAX_DIM wide; otherwise, without the gain: undecided."""
    if gain is not None:
        g = np.asarray(f32(as_array(gain)), dtype=np.float64).reshape(-1)
        if g.size != np.shape(as_array(rows))[-1]:
            return "", f"the final norm's weight has {g.size} entries, the rows {np.shape(as_array(rows))[-1]}"
        best = None
        for name, cand in (("the final norm's weight", g), ("1 + the final norm's weight", 1.0 + g)):
            if (cand == 0).any():
                continue
            dev = np.abs(rms_after_gain(rows, cand) - 1.0)
            dev = dev[np.isfinite(dev)]
            if dev.size < 2:
                return "", "too few finite rows"
            if best is None or float(dev.max()) < best[0]:
                best = (float(dev.max()), float(np.median(dev)), name)
        if best is None:
            return "", "the final norm's weight has a zero entry"
        worst, med, name = best
        if worst <= GAIN_RMS_TOL:
            return "post-norm", (f"divided by {name}, every row's RMS is 1 (within {worst:.1e}), as after the "
                                 "final norm")
        if med >= GAIN_RAW_DEV:
            return "raw", (f"divided by {name}, the rows' RMS is off 1 by {med:.0%} (median), which a normalised "
                           "state's is not")
        return "", f"divided by {name}, the rows' RMS is off 1 by up to {worst:.1e}: neither kind"
    fit = fitted_rms_gain(rows)
    if fit is None:
        wide = np.shape(as_array(rows))[-1] > FIT_MAX_DIM
        return "", ("no final norm weight given, and " + (f"states over {FIT_MAX_DIM} wide are not fitted (doctor "
                    "--target passes it)" if wide else "too few rows to fit one"))
    g, resid = fit
    if np.isfinite(g).all() and resid <= GAIN_RMS_TOL / 2:
        return "post-norm", (f"a per-dimension gain fitted to the rows makes every row's RMS 1 (residual "
                             f"{resid:.1e}), as after the final norm")
    if resid >= GAIN_RAW_DEV / 2:
        return "raw", (f"no per-dimension gain makes the rows' RMS 1 (residual {resid:.2f} after the best fit), "
                       "which a normalised state's is")
    return "", f"a fitted gain leaves residual {resid:.1e}: neither kind"
