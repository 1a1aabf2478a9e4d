"""Scores estimated from a capture fingerprint, with their standard errors, and a choice that respects them.

Direct columns: the per-token cosine is estimated by the cosine of the two tokens' sketches
(same +-1/sqrt(k) projection on both sides). For unit vectors at cosine c the sketch cosine
behaves like a correlation coefficient over k samples, with standard error about
(1 - c^2) / sqrt(k): nearly exact for the matching layer (c ~ 1), about +-0.006 per token for
a neighbour at c = 0.98 with k = 64. A cell's error is taken as the *mean* of its tokens'
errors, i.e. as if every token erred the same way (the projection is shared), never as if
they averaged out.

Fitted post-norm columns cannot come from sketches (a per-dimension gain does not commute
with a projection). They are estimated on the fingerprint's probe tokens, which it stores in
full: the gain is fitted on half of the probes and scored on the other half, then the halves
swap (cross-fitting, so a column cannot score well by fitting its own tokens). The error is
the standard error of that mean. With fewer than ``MIN_PROBES`` probe tokens in the aligned
window the fitted columns are left out ("cannot tell").

``choose_estimated`` calls a match confident only if it still clears every bar when its own
score is lowered, and every other column's raised, by ``Z`` standard errors.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..arrays import as_array, f32
from ..positions import Position
from .confidence import Choice, Thresholds, choose
from .fingerprint import Fingerprint, projection
from .match import ScoreMatrix
from .norms import EPS, unit_rms

if TYPE_CHECKING:
    from .findings import Finding

Z = 2.0
MIN_PROBES = 4


def score_fingerprint(slots: list[Any], fit: list[bool], fp: Fingerprint, train_start: int,
                      capture_start: int, length: int) -> ScoreMatrix:
    """The ScoreMatrix of ``match.score_slots``, estimated from a fingerprint; ``error`` holds standard errors.

    ``slots`` are [S, H] torch tensors or ndarrays (any float dtype); everything is computed in numpy.
    """
    slots = [as_array(s) for s in slots]
    positions = fp.positions
    have = set(positions)
    fit_idx = [i for i, f in enumerate(fit) if f]
    virt = [p for p in positions if fit_idx and not p.normed and Position(p.p, True) not in have]
    columns = sorted(have | {Position(p.p, True) for p in virt})
    col = {c: j for j, c in enumerate(columns)}
    k, lw, ts, cs = len(slots), max(int(length), 0), train_start, capture_start
    shape = (k, len(columns))
    out = {name: np.full(shape, np.nan) for name in ("score", "rel_diff", "max_abs", "norm_ratio", "error")}
    tokens = np.zeros(shape)
    per_token = np.full((k, len(columns), lw), np.nan, dtype=np.float32)
    r = projection(fp.hidden_size, fp.k, fp.seed)
    ys = [f32(s[ts:ts + lw]) for s in slots]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ny = np.stack([_norm(y) for y in ys]) if k else np.zeros((0, lw), np.float32)
        y_ok = np.isfinite(ny) & (ny > 0)
        ysk = np.stack([_unit(y @ r) for y in ys]) if k else np.zeros((0, lw, fp.k), np.float32)  # [K, Lw, k]
        for pos in positions:
            nx = as_array(fp.norms[pos])[cs:cs + lw]
            sk = _unit(f32(as_array(fp.sketches[pos])[cs:cs + lw]))
            valid = y_ok & (np.isfinite(nx) & (nx > 0))[None]
            cos = np.clip(np.einsum("ktd,td->kt", np.nan_to_num(ysk), np.nan_to_num(sk)), -1, 1)
            sig = np.maximum(1 - cos * cos, 0) / np.float32(math.sqrt(fp.k))
            _store(out, tokens, per_token, col[pos], list(range(k)), cos, sig, valid, ny,
                   np.broadcast_to(nx[None], ny.shape))
    probes = [q for q in fp.probe_tokens if cs <= q < cs + lw]
    for pos in virt:
        for i in fit_idx:
            _fitted(out, tokens, per_token, col[Position(pos.p, True)], i, fp.probes[pos], fp.probe_tokens,
                    probes, slots[i], ts, cs)
    bad = {p: int(fp.stats.get(p, {}).get("nonfinite_rows") or 0) for p in positions}
    return ScoreMatrix(columns, out["score"], out["rel_diff"], out["max_abs"], out["norm_ratio"], tokens, per_token,
                       {p: as_array(fp.norms[p]) for p in positions}, bad, error=out["error"], device="fingerprint")


def _norm(x: np.ndarray) -> np.ndarray:
    """Per-row L2 norms of a float32 [.., D] array, in float32."""
    return np.sqrt(np.einsum("...d,...d->...", x, x))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(_norm(x), np.float32(1e-30))[..., None]


def _store(out: dict[str, np.ndarray], tokens: np.ndarray, per_token: np.ndarray, j: int, rows: list[int],
           sim: np.ndarray, sig: np.ndarray, valid: np.ndarray, ny: np.ndarray, nx: np.ndarray) -> None:
    """Per-cell mean, error, norm ratio and rel_diff from per-token [S, L] estimates (sums in float64)."""
    v = valid.astype(np.float64)
    n = v.sum(-1)
    empty = n == 0

    def mean(a: np.ndarray) -> np.ndarray:
        return np.where(empty, np.nan, (np.nan_to_num(a.astype(np.float64)) * v).sum(-1) / np.maximum(n, 1))

    nx64, ny64 = nx.astype(np.float64), ny.astype(np.float64)
    dot = sim.astype(np.float64) * ny64 * nx64
    rel = 1 - 2 * (np.nan_to_num(dot) * v).sum(-1) / np.maximum((np.nan_to_num(nx64 ** 2 + ny64 ** 2) * v).sum(-1), 1e-300)
    out["score"][rows, j] = mean(sim)
    out["error"][rows, j] = mean(sig)
    out["norm_ratio"][rows, j] = mean(ny / np.maximum(nx, np.float32(1e-30)))
    out["rel_diff"][rows, j] = np.where(empty, np.nan, rel)
    tokens[rows, j] = n
    per_token[rows, j, :] = np.where(valid, sim.astype(np.float32), np.float32(np.nan))


def _fitted(out: dict[str, np.ndarray], tokens: np.ndarray, per_token: np.ndarray, j: int, i: int,
            probe_rows: Any, stored: list[int], probes: list[int], slot: np.ndarray, ts: int,
            cs: int) -> None:
    """Cross-fitted gain on the probe tokens: fit on half, score 2xy/(|x|^2+|y|^2) on the other half.

    ``probe_rows[n]`` is capture row ``stored[n]``; ``probes`` are those inside the aligned window.
    """
    index = {q: n for n, q in enumerate(stored)}
    probe_rows = as_array(probe_rows)
    xs = f32(np.stack([probe_rows[index[q]] for q in probes])) if probes else np.zeros(0, np.float32)
    ys = f32(np.stack([slot[ts + q - cs] for q in probes])) if probes else np.zeros(0, np.float32)
    ok = [n for n in range(len(probes)) if bool(np.isfinite(xs[n]).all()) and bool(np.isfinite(ys[n]).all())]
    if len(ok) < MIN_PROBES:
        return  # cannot tell: too few probe tokens in the aligned window
    halves = (ok[0::2], ok[1::2])
    u = unit_rms(xs)
    sims: dict[int, tuple[float, float, float, float]] = {}
    for fit_on, test_on in (halves, halves[::-1]):
        gain = (ys[fit_on] * u[fit_on]).sum(0) / np.maximum(np.square(u[fit_on]).sum(0), np.float32(EPS))
        pred = gain * u[test_on]
        for row, n in enumerate(test_on):
            d = float((ys[n] * pred[row]).sum())
            yy, pp = float(np.square(ys[n]).sum()), float(np.square(pred[row]).sum())
            sims[n] = (2 * d / max(yy + pp, 1e-30), d, yy, pp)
    vals = np.array([sims[n][0] for n in ok])
    out["score"][i, j] = float(vals.mean())
    out["error"][i, j] = float(vals.std(ddof=1) / math.sqrt(len(vals))) if len(vals) > 1 else float("nan")
    out["norm_ratio"][i, j] = float(np.mean([math.sqrt(sims[n][2]) / max(math.sqrt(sims[n][3]), 1e-30) for n in ok]))
    tot = sum(sims[n][2] + sims[n][3] for n in ok)
    out["rel_diff"][i, j] = 1 - 2 * sum(sims[n][1] for n in ok) / max(tot, 1e-300)
    tokens[i, j] = len(ok)
    for n in ok:
        per_token[i, j, probes[n] - cs] = sims[n][0]


def choose_estimated(scores: np.ndarray, norm_ratios: np.ndarray, columns: list[Position], tokens: float,
                     bar: Thresholds, errors: np.ndarray) -> Choice:
    """``confidence.choose`` on estimates: confident only if still so with scores moved ``Z`` errors against it."""
    c = choose(scores, norm_ratios, columns, tokens, bar)
    if not c.confident or c.best is None:
        return c
    err = np.nan_to_num(np.asarray(errors, dtype=float), nan=0.0)
    best = columns.index(c.best)
    moved = np.where(np.isnan(scores), scores, np.minimum(scores + Z * err, 1.0))
    moved[best] = scores[best] - Z * err[best]
    c2 = choose(moved, norm_ratios, columns, tokens, bar)
    if c2.confident and c2.best == c.best:
        return c
    why = c2.reason if c2.best == c.best else f"{c2.best.label if c2.best else '-'} could be best"
    return replace(c, confident=False,
                   reason=f"within the fingerprint's estimation error ({why}; scores moved by {Z:g} standard "
                          f"errors, up to {float(err[np.isfinite(scores)].max()):.4f})")


def estimate_finding(fp: Fingerprint, sm: ScoreMatrix) -> Finding:
    """The note every fingerprint alignment carries: scores are estimates, and how much wider the bar is."""
    from .findings import Finding

    err = sm.error if sm.error is not None else np.zeros(0)
    worst = float(np.nanmax(err)) if np.isfinite(err).any() else float("nan")
    fitted = any(c.normed and c not in fp.norms for c in sm.columns)
    cannot = fitted and not np.isfinite(sm.score[:, [j for j, c in enumerate(sm.columns)
                                                     if c.normed and c not in fp.norms]]).any()
    return Finding("fingerprint-estimate", "info",
                   f"the capture is a fingerprint ({fp.k}-dim sketch of every token, {len(fp.probe_tokens)} probe "
                   f"tokens): scores are estimates, and a match counts only if it still clears every bar with its "
                   f"score lowered and every rival's raised by {Z:g} standard errors (largest here {worst:.4f}). "
                   "Fitted post-norm columns come from the probe tokens (gain fitted on half, scored on the other)"
                   + ("; too few probe tokens in the aligned window, so no fitted column: cannot tell a post-norm "
                      "final from a raw one without the real post-norm state" if cannot else "")
                   + ". max |diff| needs the full capture.")
