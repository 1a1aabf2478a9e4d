"""Per-token sums behind every score, filled block by block on one device (CPU or CUDA).

A block is capture rows ``[r0, r0+L)`` of positions ``g0..g0+G`` as a float32 tensor laid out
``[L, G, H]``, so each token's G positions meet the same training rows ``[L, K, H]`` in one
batched matrix product (``bmm``) and no K x L x H temporary is ever built. What is kept per
token is tiny: squared norms, the dot products with each slot, and for post-norm slots the
two sums the gain-fitted RMSNorm needs (see ``match`` for how they become scores).

The gain fit needs every aligned token before any token can be scored, so the fitted sums
come in two steps: ``accumulate`` (or ``pass1(fit=True)``) sums the least-squares normal
equations, ``pass2`` scores each token against the fitted gain. Callers that hold a whole
position run both on it; the CPU path does so only for a few candidate positions.
"""
from __future__ import annotations

import threading

import torch

EPS = 1e-12  # as norms.unit_rms


class Sums:
    """Accumulators for K slots x P positions over T capture rows, Lw of them aligned from ``cs``."""

    def __init__(self, k: int, p: int, t: int, lw: int, cs: int, h: int, fit_idx: list[int], virt: list[int],
                 device: torch.device) -> None:
        self.k, self.p, self.t, self.lw, self.cs, self.h = k, p, t, lw, cs, h
        self.fit_idx, self.virt = fit_idx, virt  # slots fitted; position indices that get a fitted column
        self.device = device
        f32 = dict(dtype=torch.float32, device=device)
        self.xx = torch.full((p, t), float("nan"), **f32)  # squared norm of every capture row
        self.bad = torch.zeros((p, t), dtype=torch.bool, device=device)  # rows holding NaN/Inf
        self.dot = torch.full((lw, p, k), float("nan"), **f32)
        self.yy = torch.full((lw, k), float("nan"), **f32)
        self.y_ok = torch.zeros((lw, k), dtype=torch.bool, device=device)
        nf = len(fit_idx)
        self.num = torch.zeros((p, nf, h), **f32) if nf else None
        self.den = torch.zeros((p, h), **f32) if nf else None
        self.gain = torch.zeros((len(virt), nf, h), **f32) if nf and virt else None  # fitted per virtual column
        self.fdot = torch.full((lw, len(virt), nf), float("nan"), **f32)
        self.fpp = torch.full((lw, len(virt), nf), float("nan"), **f32)
        self.adj = None  # [P, T] float32 ndarray: each row . the same token's row one position below (compiled path)
        self._local = threading.local()

    def scratch(self, name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A reusable per-thread buffer: large temporaries allocated per block would page-fault afresh each time."""
        n = 1
        for d in shape:
            n *= d
        key = (name, dtype)
        buf = getattr(self._local, "bufs", None)
        if buf is None:
            buf = self._local.bufs = {}
        t = buf.get(key)
        if t is None or t.numel() < n:
            t = buf[key] = torch.empty(max(n, 1), dtype=dtype, device=self.device)
        return t[:n].view(shape)

    def prep_y(self, yb: torch.Tensor, w0: int) -> torch.Tensor:
        """Record norms and finiteness of training rows [w0, w0+L) given as [L, K, H] float32; zero bad rows."""
        yy = torch.linalg.vector_norm(yb, dim=-1).square_()
        ok = torch.isfinite(yy)
        if self.device.type != "cpu" or not bool(ok.all()):  # branch-free on a GPU: no host sync
            ok = torch.isfinite(yb).all(-1)
            yb.masked_fill_(~ok.unsqueeze(-1), 0.0)
            yy = torch.where(ok, yy, torch.zeros((), device=yy.device))
        self.yy[w0:w0 + yb.shape[0]] = yy
        self.y_ok[w0:w0 + yb.shape[0]] = ok
        return yb

    def _rows_xx(self, xb: torch.Tensor, g0: int, r0: int) -> torch.Tensor:
        """Squared norms of a block; NaN/Inf rows are recorded and zeroed in place."""
        xx = torch.linalg.vector_norm(xb, dim=-1).square_()  # [L, G]
        bad = ~torch.isfinite(xx)
        if self.device.type != "cpu" or bool(bad.any()):  # branch-free on a GPU: no host sync
            bad = ~torch.isfinite(xb).all(-1)  # exact: an overflowing square is not a bad row
            xb.masked_fill_(bad.unsqueeze(-1), 0.0)
            self.bad[g0:g0 + xb.shape[1], r0:r0 + xb.shape[0]] = bad.T
        self.xx[g0:g0 + xb.shape[1], r0:r0 + xb.shape[0]] = xx.T
        return xx

    def pass1(self, xb: torch.Tensor, g0: int, r0: int, yb: torch.Tensor | None, fit: bool = False) -> None:
        """Norms of a block; with ``yb`` (its aligned training rows, prepped) also the slot dot products.

        With ``fit`` the block is then turned into unit-RMS rows in place and the gain normal
        equations are accumulated (``accumulate``).
        """
        xx = self._rows_xx(xb, g0, r0)
        if yb is None:
            return
        w0, n, g = r0 - self.cs, xb.shape[0], xb.shape[1]
        self.dot[w0:w0 + n, g0:g0 + g] = torch.bmm(xb, yb.transpose(1, 2))
        if fit and self.num is not None:
            bad = self.bad[g0:g0 + g, r0:r0 + n].T
            xb.mul_(torch.rsqrt(torch.where(bad, 0.0, xx) / self.h + EPS).unsqueeze(-1))  # u = x / rms(x)
            self.accumulate(xb, g0, yb[:, self.fit_idx])

    def accumulate(self, u: torch.Tensor, g0: int, yf: torch.Tensor) -> None:
        """Gain normal equations from unit-RMS rows u [L, G, H] and fitted slots' rows yf [L, F, H]."""
        assert self.num is not None and self.den is not None
        g = u.shape[1]
        if self.device.type == "cpu" and u.shape[0] <= 16:
            for f in range(yf.shape[1]):
                for r in range(u.shape[0]):  # one fused multiply-add per token row, no [L, G, H] temporary
                    self.num[g0:g0 + g, f].addcmul_(u[r], yf[r, f])
            for r in range(u.shape[0]):
                self.den[g0:g0 + g].addcmul_(u[r], u[r])
            return
        tmp = self.scratch("acc", tuple(u.shape))
        for f in range(yf.shape[1]):
            self.num[g0:g0 + g, f] += torch.mul(u, yf[:, f].unsqueeze(1), out=tmp).sum(0)
        self.den[g0:g0 + g] += torch.mul(u, u, out=tmp).sum(0)

    def fit(self, js: list[int] | None = None) -> None:
        """Least-squares gains of virtual columns ``js`` (all by default): g = sum(u*y) / sum(u*u) per dimension."""
        if self.num is None or self.gain is None:
            return
        js = list(range(len(self.virt))) if js is None else js
        idx = torch.tensor([self.virt[j] for j in js], device=self.device)
        self.gain[js] = self.num[idx] / self.den[idx].clamp_min(EPS).unsqueeze(1)

    def unit(self, xb: torch.Tensor, gidx: list[int], r0: int) -> torch.Tensor:
        """Turn a re-read block of positions ``gidx`` into unit-RMS rows in place (bad rows zero)."""
        idx = torch.tensor(gidx, device=self.device)
        bad = self.bad[idx, r0:r0 + xb.shape[0]].T
        xx = self.xx[idx, r0:r0 + xb.shape[0]].T
        if self.device.type != "cpu" or bool(bad.any()):
            xb.masked_fill_(bad.unsqueeze(-1), 0.0)
        return xb.mul_(torch.rsqrt(torch.where(bad, 0.0, xx) / self.h + EPS).unsqueeze(-1))

    def pass2(self, u: torch.Tensor, j0: int, r0: int, yf: torch.Tensor) -> None:
        """Score unit-RMS rows of virtual columns j0.. against the fitted gains: sum(y*g*u), sum((g*u)^2).

        ``yf`` [L, F, H] holds the fitted slots' training rows only.
        """
        assert self.gain is not None
        w0, n, g = r0 - self.cs, u.shape[0], u.shape[1]
        for f in range(yf.shape[1]):
            pred = torch.mul(u, self.gain[j0:j0 + g, f].unsqueeze(0), out=self.scratch("pred", tuple(u.shape)))
            self.fpp[w0:w0 + n, j0:j0 + g, f] = torch.linalg.vector_norm(pred, dim=-1).square_()
            self.fdot[w0:w0 + n, j0:j0 + g, f] = torch.linalg.vecdot(pred, yf[:, f].unsqueeze(1))

    def results(self, direct_only: bool = False) -> dict[str, torch.Tensor]:
        """Scores and side metrics (CPU float64, per_token float32): direct [K, P], fitted [F, len(virt)]."""
        cs, lw = self.cs, self.lw
        x_ok = ~self.bad[:, cs:cs + lw].T  # [Lw, P]
        nx = self.xx[:, cs:cs + lw].T.clamp_min(0).sqrt()
        ny = self.yy.clamp_min(0).sqrt()  # [Lw, K]
        valid = self.y_ok.unsqueeze(1) & x_ok.unsqueeze(2)  # [Lw, P, K]
        sim = self.dot / (ny.unsqueeze(1) * nx.unsqueeze(2)).clamp_min(1e-30)
        direct = _cells(sim, valid, self.dot, nx.unsqueeze(2) ** 2, self.yy.unsqueeze(1), ny.unsqueeze(1), nx.unsqueeze(2))
        out = {f"direct_{k}": v for k, v in direct.items()}
        if direct_only:
            return out
        if self.fit_idx and self.virt:
            yy = self.yy[:, self.fit_idx].unsqueeze(1)  # [Lw, 1, F]
            valid = self.y_ok[:, self.fit_idx].unsqueeze(1) & x_ok[:, self.virt].unsqueeze(2)
            # a fitted column must also reproduce each token's norm: 2xy / (|x|^2 + |y|^2), not the cosine
            sim = 2 * self.fdot / (yy + self.fpp).clamp_min(1e-30)
            fitted = _cells(sim, valid, self.fdot, self.fpp, yy, yy.clamp_min(0).sqrt(), self.fpp.clamp_min(0).sqrt())
            out.update({f"fitted_{k}": v for k, v in fitted.items()})
        return out


def _cells(sim: torch.Tensor, valid: torch.Tensor, dot: torch.Tensor, xx: torch.Tensor, yy: torch.Tensor,
           ny: torch.Tensor, nx: torch.Tensor) -> dict[str, torch.Tensor]:
    """Reduce per-token [Lw, C, S] quantities to per-cell [S, C] metrics over the valid tokens."""
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    per_token = torch.where(valid, sim, torch.full_like(sim, float("nan"))).cpu()
    v = valid.cpu()
    count = v.sum(0).double()
    zero = torch.zeros((), dtype=torch.float64)

    def total(a: torch.Tensor) -> torch.Tensor:
        return torch.where(v, a.expand_as(sim).cpu().double(), zero).sum(0)

    empty = count == 0
    score = torch.nanmean(per_token.double(), dim=0)
    rel = 1 - 2 * total(dot) / (total(xx) + total(yy)).clamp_min(1e-300)
    ratio = total(ny / nx.clamp_min(1e-30)) / count.clamp_min(1)
    return {
        "score": torch.where(empty, nan, score).T, "rel_diff": torch.where(empty, nan, rel).T,
        "norm_ratio": torch.where(empty, nan, ratio).T, "tokens": count.T,
        "per_token": per_token.permute(2, 1, 0),  # [S, C, Lw]
    }
