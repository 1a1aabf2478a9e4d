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
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..positions import Position
from .confidence import Choice, Thresholds, choose
from .fingerprint import Fingerprint, projection
from .match import ScoreMatrix
from .norms import EPS, unit_rms

if TYPE_CHECKING:
    from .findings import Finding

Z = 2.0
MIN_PROBES = 4


def score_fingerprint(slots: list[torch.Tensor], fit: list[bool], fp: Fingerprint, train_start: int,
                      capture_start: int, length: int) -> ScoreMatrix:
    """The ScoreMatrix of ``match.score_slots``, estimated from a fingerprint; ``error`` holds standard errors."""
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
    ys = [s[ts:ts + lw].float() for s in slots]
    ny = torch.stack([torch.linalg.vector_norm(y, dim=-1) for y in ys]) if k else torch.zeros(0, lw)
    y_ok = torch.isfinite(ny) & (ny > 0)
    ysk = torch.stack([_unit(y @ r) for y in ys]) if k else torch.zeros(0, lw, fp.k)  # [K, Lw, k]
    for pos in positions:
        nx = fp.norms[pos][cs:cs + lw]
        sk = _unit(fp.sketches[pos][cs:cs + lw].float())
        valid = y_ok & (torch.isfinite(nx) & (nx > 0)).unsqueeze(0)
        cos = torch.einsum("ktd,td->kt", torch.nan_to_num(ysk), torch.nan_to_num(sk)).clamp(-1, 1)
        sig = (1 - cos.square()).clamp_min(0) / math.sqrt(fp.k)
        _store(out, tokens, per_token, col[pos], list(range(k)), cos, sig, valid, ny, nx.unsqueeze(0).expand_as(ny))
    probes = [q for q in fp.probe_tokens if cs <= q < cs + lw]
    for pos in virt:
        for i in fit_idx:
            _fitted(out, tokens, per_token, col[Position(pos.p, True)], i, fp.probes[pos], fp.probe_tokens,
                    probes, slots[i], ts, cs)
    bad = {p: int(fp.stats.get(p, {}).get("nonfinite_rows") or 0) for p in positions}
    return ScoreMatrix(columns, out["score"], out["rel_diff"], out["max_abs"], out["norm_ratio"], tokens, per_token,
                       {p: fp.norms[p].numpy() for p in positions}, bad, error=out["error"], device="fingerprint")


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1e-30)


def _store(out: dict[str, np.ndarray], tokens: np.ndarray, per_token: np.ndarray, j: int, rows: list[int],
           sim: torch.Tensor, sig: torch.Tensor, valid: torch.Tensor, ny: torch.Tensor, nx: torch.Tensor) -> None:
    """Per-cell mean, error, norm ratio and rel_diff from per-token [S, L] estimates."""
    v = valid.double()
    n = v.sum(-1)
    empty = n == 0
    mean = lambda a: torch.where(empty, float("nan"), (torch.nan_to_num(a.double()) * v).sum(-1) / n.clamp_min(1))
    dot = sim.double() * ny.double() * nx.double()
    rel = 1 - 2 * (torch.nan_to_num(dot) * v).sum(-1) / (torch.nan_to_num(nx.double() ** 2 + ny.double() ** 2) * v).sum(-1).clamp_min(1e-300)
    out["score"][rows, j] = mean(sim).numpy()
    out["error"][rows, j] = mean(sig).numpy()
    out["norm_ratio"][rows, j] = mean(ny / nx.clamp_min(1e-30)).numpy()
    out["rel_diff"][rows, j] = torch.where(empty, float("nan"), rel).numpy()
    tokens[rows, j] = n.numpy()
    per_token[rows, j, :] = torch.where(valid, sim.float(), float("nan")).numpy()


def _fitted(out: dict[str, np.ndarray], tokens: np.ndarray, per_token: np.ndarray, j: int, i: int,
            probe_rows: torch.Tensor, stored: list[int], probes: list[int], slot: torch.Tensor, ts: int,
            cs: int) -> None:
    """Cross-fitted gain on the probe tokens: fit on half, score 2xy/(|x|^2+|y|^2) on the other half.

    ``probe_rows[n]`` is capture row ``stored[n]``; ``probes`` are those inside the aligned window.
    """
    index = {q: n for n, q in enumerate(stored)}
    xs = torch.stack([probe_rows[index[q]] for q in probes]).float() if probes else torch.zeros(0)
    ys = torch.stack([slot[ts + q - cs] for q in probes]).float() if probes else torch.zeros(0)
    ok = [n for n in range(len(probes)) if bool(torch.isfinite(xs[n]).all()) and bool(torch.isfinite(ys[n]).all())]
    if len(ok) < MIN_PROBES:
        return  # cannot tell: too few probe tokens in the aligned window
    halves = (ok[0::2], ok[1::2])
    u = unit_rms(xs)
    sims: dict[int, tuple[float, float, float, float]] = {}
    for fit_on, test_on in (halves, halves[::-1]):
        gain = (ys[fit_on] * u[fit_on]).sum(0) / u[fit_on].square().sum(0).clamp_min(EPS)
        pred = gain * u[test_on]
        for row, n in enumerate(test_on):
            d = float((ys[n] * pred[row]).sum())
            yy, pp = float(ys[n].square().sum()), float(pred[row].square().sum())
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
