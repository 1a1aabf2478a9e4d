"""Norm-based evidence that needs no weights: post-norm signatures, RMSNorm gain fits, norm profiles.

After RMSNorm every token's vector is ``g * x / rms(x)``, so per-token norms are nearly
constant (their coefficient of variation is small), while residual-stream states vary
widely from token to token, most of all the first token with its massive activations
(shared/reference/conventions.md, "A post-norm state has a signature").
"""
from __future__ import annotations

import torch

from .fused import row_stats

POST_NORM_CV = 0.1  # per-token norm variation below this looks post-norm
EPS = 1e-12


def token_norms(x: torch.Tensor) -> torch.Tensor:
    """Per-token L2 norms of a [T, H] tensor, in float32 (NaN rows stay NaN).

    Narrow dtypes are accumulated in float32 without a float32 copy of the tensor: for a
    multi-GB bf16 record that copy alone page-faults for seconds.
    """
    stats = row_stats(x)  # the compiled kernel: one pass, float64 sums
    if stats is not None:
        return stats[0]
    if x.is_floating_point() and x.element_size() < 4:
        return torch.linalg.vector_norm(x, dim=-1, dtype=torch.float32)
    return torch.linalg.vector_norm(x.float(), dim=-1)


def nonfinite_rows(x: torch.Tensor) -> torch.Tensor:
    """Which rows of a [T, H] tensor hold NaN or Inf (bool [T])."""
    stats = row_stats(x)
    if stats is not None:
        return stats[1]
    return ~torch.isfinite(x.abs().amax(-1))  # amax is ~10x faster than isfinite().all() on bf16


def norm_cv(norms: torch.Tensor) -> float:
    """Coefficient of variation of per-token norms over the finite entries (NaN if fewer than 2)."""
    n = norms[torch.isfinite(norms)].double()
    if n.numel() < 2 or float(n.mean()) <= 0:
        return float("nan")
    return float(n.std() / n.mean())


def looks_post_norm(norms: torch.Tensor) -> bool:
    """True when per-token norms are nearly constant, the mark of a post-RMSNorm state."""
    cv = norm_cv(norms)
    return cv == cv and cv < POST_NORM_CV


def unit_rms(x: torch.Tensor) -> torch.Tensor:
    """``x / rms(x)`` per token: what RMSNorm computes before applying its gain."""
    return x / x.pow(2).mean(-1, keepdim=True).add(EPS).sqrt()


def fit_gain(targets: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
    """Least-squares per-dimension gain g so that targets ~ g * unit_rms(raw); shapes [K,L,H], [L,H] -> [K,H]."""
    u = unit_rms(raw)
    num = torch.einsum("klh,lh->kh", targets, u)
    den = u.pow(2).sum(0).clamp_min(EPS)
    return num / den
