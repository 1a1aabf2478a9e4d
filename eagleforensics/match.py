"""Score every training slot against every capture position, reading each position once.

The main score is the per-token cosine averaged over aligned tokens: one cosine over the
flattened tensor would be dominated by the first token's massive activations and make
every middle layer look the same. Beside it the SGLang comparator's
``rel_diff = 1 - 2*sum(x*y) / sum(x^2 + y^2)`` (float64), the max absolute error and the
mean per-token norm ratio (training / capture) are kept for every cell.

Slots that may be post-norm (the final state) are also scored against a *virtual*
post-norm version of each raw position: an RMSNorm whose per-dimension gain is fitted by
least squares, so a post-norm final can be placed even when the capture has no post-norm
state, and a final taken one layer early shows up as such. Those fitted cells are scored
with the per-token ``2xy / (|x|^2 + |y|^2)`` instead of the cosine: with H free gains and a
scale-blind cosine, any raw state would fit its own normed version perfectly; requiring the
per-token norms to match too keeps raw and post-norm apart.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
import torch

from .norms import fit_gain, token_norms, unit_rms
from .positions import Position

CHUNK_TOKENS = 256
@dataclass
class ScoreMatrix:
    """Scores and side metrics, slots x columns; NaN where a cell was not computed."""

    columns: list[Position]
    score: np.ndarray
    rel_diff: np.ndarray
    max_abs: np.ndarray
    norm_ratio: np.ndarray
    tokens_used: np.ndarray
    per_token: np.ndarray  # slots x columns x aligned tokens (float32)
    column_norms: dict[Position, np.ndarray] = field(default_factory=dict)  # full-length per-token norms
    nonfinite_capture: dict[Position, int] = field(default_factory=dict)


class _Cell:
    """Running sums for a group of slots against one column."""

    def __init__(self, k: int, length: int, scale_aware: bool = False) -> None:
        self.scale_aware = scale_aware
        self.dot = torch.zeros(k, dtype=torch.float64)
        self.xx = torch.zeros(k, dtype=torch.float64)
        self.yy = torch.zeros(k, dtype=torch.float64)
        self.max_abs = torch.zeros(k, dtype=torch.float64)
        self.ratio = torch.zeros(k, dtype=torch.float64)
        self.count = torch.zeros(k, dtype=torch.float64)
        self.cos = torch.full((k, length), float("nan"), dtype=torch.float32)

    def add(self, start: int, y: torch.Tensor, x: torch.Tensor, valid: torch.Tensor) -> None:
        """Accumulate one chunk: y [K,L,H] training rows, x [L,H] or [K,L,H] capture rows, valid [K,L]."""
        xb = x.expand_as(y)
        dot = (y * xb).sum(-1)
        ny = torch.linalg.vector_norm(y, dim=-1)
        nx = torch.linalg.vector_norm(xb, dim=-1)
        # a fitted column must also reproduce each token's norm: 2xy/(|x|^2+|y|^2) instead of the cosine
        sim = 2 * dot / (ny * ny + nx * nx).clamp_min(1e-30) if self.scale_aware else dot / (ny * nx).clamp_min(1e-30)
        self.cos[:, start:start + y.shape[1]] = torch.where(valid, sim, float("nan"))
        zero = torch.zeros((), dtype=y.dtype)
        self.dot += torch.where(valid, dot, zero).sum(1).double()
        self.xx += torch.where(valid, nx * nx, zero).sum(1).double()
        self.yy += torch.where(valid, ny * ny, zero).sum(1).double()
        worst = (y - xb).abs().amax(-1)
        self.max_abs = torch.maximum(self.max_abs, torch.where(valid, worst, zero).amax(1).double())
        self.ratio += torch.where(valid, ny / nx.clamp_min(1e-30), zero).sum(1).double()
        self.count += valid.sum(1).double()

    def finish(self) -> dict[str, np.ndarray]:
        c = self.count.clamp_min(1)
        score = torch.nanmean(self.cos.double(), dim=1)
        rel = 1 - 2 * self.dot / (self.xx + self.yy).clamp_min(1e-300)
        empty = self.count == 0
        nan = torch.tensor(float("nan"), dtype=torch.float64)
        return {
            "score": torch.where(empty, nan, score).numpy(),
            "rel_diff": torch.where(empty, nan, rel).numpy(),
            "max_abs": torch.where(empty, nan, self.max_abs).numpy(),
            "norm_ratio": torch.where(empty, nan, self.ratio / c).numpy(),
            "tokens": self.count.numpy(),
            "cos": self.cos.numpy(),
        }


def score_slots(
    slots: list[torch.Tensor], fit: list[bool], positions: Iterable[Position],
    read: Callable[[Position], torch.Tensor], train_start: int, capture_start: int, length: int,
    progress: Callable[[Position], None] | None = None,
) -> ScoreMatrix:
    """Compare aligned rows of each slot [S,H] with each capture position, one position in memory at a time.

    ``fit[i]`` asks for slot i to be scored also against the gain-fitted post-norm version of
    every raw position (virtual columns ``Position(p, normed=True)``).
    """
    positions = sorted(positions)
    have = set(positions)
    fit_idx = [i for i, f in enumerate(fit) if f]
    virtual = [Position(p.p, True) for p in positions if not p.normed and Position(p.p, True) not in have] if fit_idx else []
    columns = sorted(set(positions) | set(virtual))
    col_index = {c: j for j, c in enumerate(columns)}
    k = len(slots)
    shape = (k, len(columns))
    out = {name: np.full(shape, np.nan) for name in ("score", "rel_diff", "max_abs", "norm_ratio")}
    tokens = np.zeros(shape)
    per_token = np.full((k, len(columns), max(length, 0)), np.nan, dtype=np.float32)
    y_all = torch.stack([s[train_start:train_start + length].float() for s in slots]) if k else torch.zeros(0)
    y_ok = torch.isfinite(y_all).all(-1) if k else torch.zeros(0, dtype=torch.bool)
    y_all = torch.where(y_ok.unsqueeze(-1), y_all, 0.0)
    col_norms: dict[Position, np.ndarray] = {}
    bad_cols: dict[Position, int] = {}

    def store(j: int, rows: list[int], res: dict[str, np.ndarray]) -> None:
        for name in out:
            out[name][rows, j] = res[name]
        tokens[rows, j] = res["tokens"]
        per_token[rows, j, :] = res["cos"]

    for pos in positions:
        full = read(pos)
        norms = token_norms(full)
        col_norms[pos] = norms.numpy()
        bad_cols[pos] = int((~torch.isfinite(full).all(-1)).sum())
        x_all = full[capture_start:capture_start + length]
        direct = _Cell(k, length)
        x_ok_all = torch.isfinite(x_all).all(-1)
        for a in range(0, length, CHUNK_TOKENS):
            x = x_all[a:a + CHUNK_TOKENS].float()
            ok = x_ok_all[a:a + CHUNK_TOKENS]
            x = torch.where(ok.unsqueeze(-1), x, 0.0)
            direct.add(a, y_all[:, a:a + CHUNK_TOKENS], x, y_ok[:, a:a + CHUNK_TOKENS] & ok)
        store(col_index[pos], list(range(k)), direct.finish())
        if fit_idx and not pos.normed:
            _score_fitted(pos, x_all, x_ok_all, y_all[fit_idx], y_ok[fit_idx], fit_idx, col_index, store, length)
        if progress is not None:
            progress(pos)
        del full, x_all
    return ScoreMatrix(columns, out["score"], out["rel_diff"], out["max_abs"], out["norm_ratio"], tokens,
                       per_token, col_norms, bad_cols)


def _score_fitted(pos: Position, x_all: torch.Tensor, x_ok: torch.Tensor, y: torch.Tensor, y_ok: torch.Tensor,
                  fit_idx: list[int], col_index: dict[Position, int], store: Callable[..., None], length: int) -> None:
    """Score slots against the gain-fitted RMSNorm of one raw column (its virtual post-norm column)."""
    target = Position(pos.p, True)
    if target not in col_index:
        return
    x = torch.where(x_ok.unsqueeze(-1), x_all.float(), 0.0)
    ok = y_ok & x_ok
    gains = fit_gain(torch.where(ok.unsqueeze(-1), y, 0.0), torch.where(x_ok.unsqueeze(-1), x, 0.0))
    cell = _Cell(len(fit_idx), length, scale_aware=True)
    u = unit_rms(x)
    for a in range(0, length, CHUNK_TOKENS):
        pred = gains[:, None, :] * u[a:a + CHUNK_TOKENS][None]
        cell.add(a, y[:, a:a + CHUNK_TOKENS], pred, ok[:, a:a + CHUNK_TOKENS])
    store(col_index[target], fit_idx, cell.finish())
