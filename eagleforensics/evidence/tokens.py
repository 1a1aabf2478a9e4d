"""Token alignment: which training rows correspond to which capture rows, and how many were compared.

With token ids on both sides the rows line up on the shared prefix (a causal model gives
identical states for identical prefixes; captures often hold only the prompt). Trailing
SpecForge padding (``input_ids == 0`` and ``loss_mask == 0``) is dropped first. Without ids
both sides are assumed to start at the first token, and ``detect_shift`` checks that
assumption by content (per-token norm profiles, which the first token's massive
activation makes distinctive).
"""
from __future__ import annotations

from dataclasses import dataclass

from typing import Any

import numpy as np

from ..arrays import as_array


@dataclass(frozen=True)
class TokenAlignment:
    """Training rows [train_start, train_start+length) pair with capture rows [capture_start, ...)."""

    train_start: int
    capture_start: int
    length: int
    method: str  # "ids-prefix", "position", "content-shift"
    train_tokens: int
    capture_tokens: int
    padding_dropped: int
    note: str

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def trailing_padding(input_ids: Any | None, loss_mask: Any | None) -> int:
    """Number of trailing rows that are padding (id 0 and loss mask 0); 0 without both arrays."""
    if input_ids is None or loss_mask is None:
        return 0
    pad = (as_array(input_ids) == 0) & (as_array(loss_mask) == 0)
    n = 0
    for flag in reversed(pad.tolist()):
        if not flag:
            break
        n += 1
    return n


def common_prefix(a: Any, b: Any) -> int:
    """Length of the longest common prefix of two 1-D id arrays."""
    a, b = as_array(a), as_array(b)
    n = min(int(a.shape[0]), int(b.shape[0]))
    diff = np.flatnonzero(a[:n] != b[:n])
    return n if diff.size == 0 else int(diff[0])


def align_tokens(
    train_ids: Any | None, train_len: int, padding: int,
    capture_ids: Any | None, capture_len: int,
) -> TokenAlignment:
    """Pair training rows with capture rows from ids when both sides have them, else by position."""
    usable = train_len - padding
    if train_ids is not None and capture_ids is not None:
        shared = common_prefix(train_ids[:usable], capture_ids)
        limit = min(usable, capture_len)
        if shared == limit:
            note = f"token ids agree on all {shared} shared tokens"
        elif shared == 0:
            note = "token ids differ from the first token on: these are different prompts"
        else:
            note = (f"token ids diverge at token {shared} (training id {int(train_ids[shared])}, capture id "
                    f"{int(capture_ids[shared])}); only the shared prefix is compared")
        return TokenAlignment(0, 0, shared, "ids-prefix", train_len, capture_len, padding, note)
    which = "training record" if train_ids is None else "capture"
    length = min(usable, capture_len)
    return TokenAlignment(0, 0, length, "position", train_len, capture_len, padding,
                          f"no token ids in the {which}: rows paired from the first token, checked by content")


def _log_profile(norms: Any) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.log(np.maximum(np.asarray(as_array(norms), dtype=np.float64), 1e-30))


def shift_correlations(train_norms: Any, capture_norms: Any, max_shift: int) -> dict[int, float]:
    """Pearson correlation of log per-token norms when training row t pairs with capture row t+d."""
    out: dict[int, float] = {}
    s, t = int(train_norms.shape[0]), int(capture_norms.shape[0])
    a_all, b_all = _log_profile(train_norms), _log_profile(capture_norms)
    for d in range(-max_shift, max_shift + 1):
        lo, hi = max(0, -d), min(s, t - d)
        if hi - lo < 4:
            continue
        a, b = a_all[lo:hi], b_all[lo + d:hi + d]
        ok = np.isfinite(a) & np.isfinite(b)
        a, b = a[ok], b[ok]
        if a.size < 4 or float(a.std()) == 0 or float(b.std()) == 0:
            continue
        out[d] = float(np.corrcoef(a, b)[0, 1])
    return out


def detect_shift(train_norms: Any, column_norms: list[Any], max_shift: int = 4) -> tuple[int, float, float]:
    """Best row shift by norm-profile correlation over all columns: (shift, its corr, corr at shift 0)."""
    best: dict[int, float] = {}
    for cn in column_norms:
        for d, c in shift_correlations(train_norms, cn, max_shift).items():
            if c == c and c > best.get(d, -2.0):
                best[d] = c
    if not best:
        return 0, float("nan"), float("nan")
    d = max(best, key=best.__getitem__)
    return d, best[d], best.get(0, float("nan"))
