"""Per-token sums behind every score, kept in host memory (numpy) whatever device computed them.

A block is capture rows ``[r0, r0+L)`` of one position as a float32 array ``[L, H]``; its
aligned training rows are ``[L, K, H]``. What is kept per token is tiny: squared norms, the dot
products with each slot, and for post-norm slots the two sums the gain-fitted RMSNorm needs
(see ``match`` for how they become scores). The compiled kernels (``fused``) and the GPU path
(``gpu``) fill the same arrays; ``results`` turns them into scores.

The gain fit needs every aligned token before any token can be scored, so the fitted sums
come in two steps: ``accumulate`` (or ``pass1(fit=True)``) sums the least-squares normal
equations, ``pass2`` scores each token against the fitted gain.
"""
from __future__ import annotations

from typing import Any

import numpy as np

EPS = 1e-12  # as norms.unit_rms


class Sums:
    """Accumulators for K slots x P positions over T capture rows, Lw of them aligned from ``cs``."""

    def __init__(self, k: int, p: int, t: int, lw: int, cs: int, h: int, fit_idx: list[int], virt: list[int]) -> None:
        self.k, self.p, self.t, self.lw, self.cs, self.h = k, p, t, lw, cs, h
        self.fit_idx, self.virt = fit_idx, virt  # slots fitted; position indices that get a fitted column
        self.xx = np.full((p, t), np.nan, np.float32)  # squared norm of every capture row
        self.bad = np.zeros((p, t), bool)  # rows holding NaN/Inf
        self.dot = np.full((lw, p, k), np.nan, np.float32)
        self.yy = np.full((lw, k), np.nan, np.float32)
        self.y_ok = np.zeros((lw, k), bool)
        nf = len(fit_idx)
        self.num = np.zeros((p, nf, h), np.float32) if nf else None
        self.den = np.zeros((p, h), np.float32) if nf else None
        self.gain = np.zeros((len(virt), nf, h), np.float32) if nf and virt else None  # per virtual column
        self.fdot = np.full((lw, len(virt), nf), np.nan, np.float32)
        self.fpp = np.full((lw, len(virt), nf), np.nan, np.float32)
        self.adj: np.ndarray | None = None  # [P, T]: each row . the same token's row one position below (compiled path)
        self._direct: dict[str, np.ndarray] | None = None  # ``results``' direct part, once the direct sums are complete
        # compiled path: what the passes kept for max |diff| (``fused.Plan``; per fitted column (j, f), per token)
        self.plan: Any = None
        self.fitted_max: dict[tuple[int, int], np.ndarray] = {}

    def prep_y(self, yb: np.ndarray, w0: int) -> np.ndarray:
        """Record norms and finiteness of training rows [w0, w0+L) given as [L, K, H] float32; zero bad rows."""
        with np.errstate(over="ignore", invalid="ignore"):
            yy = np.einsum("lkh,lkh->lk", yb, yb)
        ok = np.isfinite(yy)
        if not ok.all():
            ok = np.isfinite(yb).all(-1)  # exact: an overflowing square is not a bad row
            yb[~ok] = 0.0
            yy = np.where(ok, yy, np.float32(0.0))
        self.yy[w0:w0 + yb.shape[0]] = yy
        self.y_ok[w0:w0 + yb.shape[0]] = ok
        return yb

    def _rows_xx(self, x: np.ndarray, g: int, r0: int) -> np.ndarray:
        """Squared norms of a block [L, H] of position g; NaN/Inf rows are recorded and zeroed in place."""
        with np.errstate(over="ignore", invalid="ignore"):
            xx = np.einsum("lh,lh->l", x, x)
        bad = ~np.isfinite(xx)
        if bad.any():
            bad = ~np.isfinite(x).all(-1)
            x[bad] = 0.0
            self.bad[g, r0:r0 + x.shape[0]] = bad
        self.xx[g, r0:r0 + x.shape[0]] = xx
        return xx

    def pass1(self, x: np.ndarray, g: int, r0: int, y: np.ndarray | None, fit: bool = False) -> None:
        """Norms of a block [L, H] of position g; with ``y`` (its aligned training rows [L, K, H],
        prepped) also the slot dot products. With ``fit`` the block is then turned into unit-RMS
        rows in place and the gain normal equations are accumulated."""
        self._rows_xx(x, g, r0)
        if y is None:
            return
        w0, n = r0 - self.cs, x.shape[0]
        self.dot[w0:w0 + n, g] = np.einsum("lh,lkh->lk", x, y)
        if fit and self.num is not None:
            self.accumulate(self.unit(x, g, r0), g, y[:, self.fit_idx])

    def accumulate(self, u: np.ndarray, g: int, yf: np.ndarray) -> None:
        """Gain normal equations of position g from unit-RMS rows u [L, H] and fitted slots' rows yf [L, F, H]."""
        assert self.num is not None and self.den is not None
        self.num[g] += np.einsum("lh,lfh->fh", u, yf)
        self.den[g] += np.einsum("lh,lh->h", u, u)

    def fit(self, js: list[int] | None = None) -> None:
        """Least-squares gains of virtual columns ``js`` (all by default): g = sum(u*y) / sum(u*u) per dimension."""
        if self.num is None or self.den is None or self.gain is None:
            return
        js = list(range(len(self.virt))) if js is None else js
        idx = [self.virt[j] for j in js]
        self.gain[js] = self.num[idx] / np.maximum(self.den[idx], np.float32(EPS))[:, None, :]

    def unit(self, x: np.ndarray, g: int, r0: int) -> np.ndarray:
        """Turn a block [L, H] of position g into unit-RMS rows in place (bad rows zero)."""
        n = x.shape[0]
        bad = self.bad[g, r0:r0 + n]
        if bad.any():
            x[bad] = 0.0
        xx = np.where(bad, np.float32(0.0), self.xx[g, r0:r0 + n])
        x *= (np.float32(1.0) / np.sqrt(xx / np.float32(self.h) + np.float32(EPS)))[:, None]
        return x

    def pass2(self, u: np.ndarray, j: int, r0: int, yf: np.ndarray) -> None:
        """Score unit-RMS rows u [L, H] of virtual column j against its fitted gains: sum(y*g*u), sum((g*u)^2).

        ``yf`` [L, F, H] holds the fitted slots' training rows only.
        """
        assert self.gain is not None
        w0, n = r0 - self.cs, u.shape[0]
        for f in range(yf.shape[1]):
            pred = u * self.gain[j, f]
            self.fpp[w0:w0 + n, j, f] = np.einsum("lh,lh->l", pred, pred)
            self.fdot[w0:w0 + n, j, f] = np.einsum("lh,lh->l", pred, yf[:, f])

    def preview_score(self, n: int) -> np.ndarray:
        """Mean per-token cosine [K, P] over the first ``n`` aligned tokens alone (their direct sums filled):
        a guess of ``results``' direct score, to choose what the full pass computes besides (``fused.Plan``)."""
        cs = self.cs
        x_ok = ~self.bad[:, cs:cs + n].T
        nx = np.sqrt(np.maximum(self.xx[:, cs:cs + n].T, 0))
        ny = np.sqrt(np.maximum(self.yy[:n], 0))
        valid = self.y_ok[:n, None, :] & x_ok[:, :, None]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            sim = self.dot[:n] / np.maximum(ny[:, None, :] * nx[:, :, None], np.float32(1e-30))
            total = np.where(valid, sim, 0.0).sum(0, dtype=np.float64)
            return (total / valid.sum(0)).T

    def results(self, direct_only: bool = False) -> dict[str, np.ndarray]:
        """Scores and side metrics (float64, per_token float32): direct [K, P], fitted [F, len(virt)].

        The direct part is computed once, the first time it is asked for (the direct sums must be complete
        by then: every caller asks after the pass over the capture)."""
        if self._direct is None:
            cs, lw = self.cs, self.lw
            x_ok = ~self.bad[:, cs:cs + lw].T  # [Lw, P]
            nx = np.sqrt(np.maximum(self.xx[:, cs:cs + lw].T, 0))
            ny = np.sqrt(np.maximum(self.yy, 0))  # [Lw, K]
            valid = self.y_ok[:, None, :] & x_ok[:, :, None]  # [Lw, P, K]
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                sim = self.dot / np.maximum(ny[:, None, :] * nx[:, :, None], np.float32(1e-30))
            direct = _cells(sim, valid, self.dot, (nx ** 2)[:, :, None], self.yy[:, None, :], ny[:, None, :],
                            nx[:, :, None])
            self._direct = {f"direct_{k}": v for k, v in direct.items()}
        out = dict(self._direct)
        if direct_only:
            return out
        if self.fit_idx and self.virt:
            x_ok = ~self.bad[:, self.cs:self.cs + self.lw].T  # [Lw, P]
            yy = self.yy[:, self.fit_idx][:, None, :]  # [Lw, 1, F]
            valid = self.y_ok[:, self.fit_idx][:, None, :] & x_ok[:, self.virt][:, :, None]
            # a fitted column must also reproduce each token's norm: 2xy / (|x|^2 + |y|^2), not the cosine
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                sim = 2 * self.fdot / np.maximum(yy + self.fpp, np.float32(1e-30))
            fitted = _cells(sim, valid, self.fdot, self.fpp, yy, np.sqrt(np.maximum(yy, 0)),
                            np.sqrt(np.maximum(self.fpp, 0)))
            out.update({f"fitted_{k}": v for k, v in fitted.items()})
        return out


def _cells(sim: np.ndarray, valid: np.ndarray, dot: np.ndarray, xx: np.ndarray, yy: np.ndarray,
           ny: np.ndarray, nx: np.ndarray) -> dict[str, np.ndarray]:
    """Reduce per-token [Lw, C, S] quantities to per-cell [S, C] metrics over the valid tokens.

    Every float64 total goes through one scratch array (filled, masked, summed over tokens in order):
    the same numbers as summing fresh masked copies, without a new [Lw, C, S] array per total."""
    invalid = ~valid
    per_token = np.where(valid, sim, np.float32(np.nan)).astype(np.float32)
    count = valid.sum(0).astype(np.float64)
    scratch = np.empty(sim.shape, np.float64)

    def total(a: np.ndarray) -> np.ndarray:
        np.copyto(scratch, a, casting="unsafe")
        scratch[invalid] = 0.0
        return scratch.sum(0)

    empty = count == 0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        np.copyto(scratch, per_token, casting="unsafe")  # nanmean, as numpy computes it: NaN -> 0, sum, / count
        nan = np.isnan(scratch)
        scratch[nan] = 0.0
        score = scratch.sum(0) / (~nan).sum(0, dtype=np.intp)
        rel = 1 - 2 * total(dot) / np.maximum(total(xx) + total(yy), 1e-300)
        ratio = total(ny / np.maximum(nx, np.float32(1e-30))) / np.maximum(count, 1)
    return {
        "score": np.where(empty, np.nan, score).T, "rel_diff": np.where(empty, np.nan, rel).T,
        "norm_ratio": np.where(empty, np.nan, ratio).T, "tokens": count.T,
        "per_token": per_token.transpose(2, 1, 0),  # [S, C, Lw]
    }
