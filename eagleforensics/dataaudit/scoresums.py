"""The per-token agreement figures from the running sums of one pass over the target's vocabulary.

Both passes (``agreement``'s numpy blocks and ``agreement_torch``'s device blocks) keep the same sums: the
running max ``m``, the centred moments ``s0, s1, s2``, the count of ids rated above the next one, and per
temperature the sums ``st`` (all ids) and ``sa`` (ids above the next one). This closes them into the
figures ``TokenScores`` holds, once for both passes.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def finish_scores(m: np.ndarray, centre: np.ndarray, s0: np.ndarray, s1: np.ndarray, s2: np.ndarray,
                  above: np.ndarray, st: np.ndarray, sa: np.ndarray, ztrue: np.ndarray, nxt: np.ndarray, out: Any,
                  inv_t: np.ndarray) -> None:
    """Write log p, entropy, variance, rank, agreement and the per-temperature figures into ``out`` (a
    ``TokenScores``) from the sums; ``inv_t`` holds 1 / temperature."""
    lse = m + np.log(s0)
    mean = centre + s1 / s0
    out.logp[:] = ztrue - lse
    out.entropy[:] = np.maximum(lse - mean, 0.0)
    out.var[:] = np.maximum(s2 / s0 - (s1 / s0) ** 2, 0.0)
    out.rank[:] = above
    out.agree[:] = above == 0
    lse_t = m[:, None] * inv_t[None, :] + np.log(st)  # log sum exp(z / T)
    out.loglik_t[:] = ztrue[:, None] * inv_t[None, :] - lse_t
    out.top1_t[:] = np.exp(np.minimum(m[:, None] * inv_t[None, :] - lse_t, 0.0))
    # U from the token's own logit, not a generator: the same token gets the same PIT in any batch
    u = np.modf(np.abs(ztrue) * 7919.0 + nxt * 0.6180339887)[0][:, None]
    out.pit_t[:] = np.clip(sa / st + u * np.exp(out.loglik_t), 0.0, 1.0 - 1e-12)
