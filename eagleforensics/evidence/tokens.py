"""Token alignment: which training rows correspond to which capture rows, and how many were compared.

With token ids on both sides the rows line up on the shared prefix (a causal model gives
identical states for identical prefixes; captures often hold only the prompt). When the prefix
is shorter than the record's ids found as one contiguous run inside the capture's (several
requests flattened into one capture, a left-padded batch, a chat-template prefix on one side),
or the capture's inside the record's, that run is compared instead (``find_run``). Trailing
SpecForge padding (``input_ids == 0`` and ``loss_mask == 0``) is dropped first. Without ids
both sides are assumed to start at the first token; ``candidate_offsets`` proposes other row
offsets from the per-token norm profiles (the first token's massive activation makes them
distinctive), which the caller then scores by content.

Evidence counts distinct tokens, not rows: ``distinct_pairs`` keeps one row of each set of
rows that repeat the same (training row, capture row) pair, so a capture whose rows are all one
token's row is one token of evidence, however long.
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
    method: str  # "ids-prefix", "ids-run", "position", "content-shift"
    train_tokens: int
    capture_tokens: int
    padding_dropped: int
    note: str
    candidates: tuple[tuple[int, float], ...] = ()  # row offsets scored by content: (offset, score)

    @property
    def offset(self) -> int:
        """Capture row minus training row of every compared pair."""
        return self.capture_start - self.train_start

    @property
    def vouched(self) -> bool:
        """True when token ids on both sides say the paired rows are the same tokens."""
        return self.method in ("ids-prefix", "ids-run")

    @property
    def other_context(self) -> str:
        """In words, when ids show that the compared rows follow other tokens on the two sides (a run found after
        rows that differ: another system prompt, template or prefix on one side), else "". A causal model's state
        depends on every token before it, so such rows drift by context alone, whatever the weights or kernels."""
        if self.method != "ids-run" or not (self.train_start or self.capture_start):
            return ""
        return (f"the compared rows follow other tokens on the two sides (training rows 0..{self.train_start - 1} "
                f"and capture rows 0..{self.capture_start - 1} before the shared run differ"
                if self.train_start and self.capture_start else
                f"the compared rows follow {self.train_start or self.capture_start} tokens that only the "
                f"{'training record' if self.train_start else 'capture'} holds before the shared run") + \
            ": another system prompt, chat template or prefix on one side)"

    def to_dict(self) -> dict[str, object]:
        """The JSON ``tokens`` object: the fields above, ``offset`` and ``candidates`` as lists."""
        out = dict(self.__dict__)
        out["offset"] = self.offset
        out["candidates"] = [{"offset": d, "score": c} for d, c in self.candidates]
        return out


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


def find_run(a: Any, b: Any, min_len: int = 1, anchor: int = 8, max_cells: int = 50_000_000,
             skip_zero: bool = False) -> tuple[int, int, int, int]:
    """Longest contiguous run of equal ids: (start in a, start in b, length, offsets reaching that length).

    Anchored first: where a's opening ids occur in b and b's opening ids in a (one side holding
    the other after a prefix: flattened requests, left padding, a template). When neither
    anchor is found, every offset is tried while len(a) * len(b) <= ``max_cells``. Among equally
    long runs the one with the smallest |offset| wins (offset 0 first). ``skip_zero``: leave
    offset 0 out (its run from the first row is the shared prefix, judged by the caller).
    """
    a = np.asarray(as_array(a)).reshape(-1)
    b = np.asarray(as_array(b)).reshape(-1)
    if not a.size or not b.size:
        return 0, 0, 0, 0
    offsets = set()  # d: a[i] pairs with b[i + d]
    for x, y, sign in ((a, b, 1), (b, a, -1)):
        k = min(anchor, x.size, y.size)
        if k == 0:
            continue
        win = np.lib.stride_tricks.sliding_window_view(y, k)
        offsets |= {sign * int(j) for j in np.flatnonzero((win == x[:k]).all(axis=1))}
    offsets.add(0)
    if len(offsets) == 1 and a.size * b.size <= max_cells:
        offsets = set(range(-(a.size - 1), b.size))
    if skip_zero:
        offsets.discard(0)
    runs: dict[int, tuple[int, int]] = {}  # d -> (start in a, length)
    for d in offsets:
        lo, hi = max(0, -d), min(a.size, b.size - d)
        if hi - lo < max(1, min_len):
            continue
        length, start = _longest_true(a[lo:hi] == b[lo + d:hi + d])
        runs[d] = (lo + start, length)
    if not runs:
        return 0, 0, 0, 0
    top = max(length for _, length in runs.values())
    winners = sorted((abs(d), d) for d, (_, length) in runs.items() if length == top)
    d = winners[0][1]
    start, length = runs[d]
    return start, start + d, length, len(winners)


def _longest_true(eq: np.ndarray) -> tuple[int, int]:
    """(length, start) of the longest run of True in a bool array."""
    if not eq.size or not eq.any():
        return 0, 0
    x = np.concatenate(([0], eq.astype(np.int8), [0]))
    edges = np.flatnonzero(np.diff(x))
    starts, stops = edges[::2], edges[1::2]
    k = int(np.argmax(stops - starts))
    return int(stops[k] - starts[k]), int(starts[k])


def align_tokens(
    train_ids: Any | None, train_len: int, padding: int,
    capture_ids: Any | None, capture_len: int, min_tokens: int = 4,
) -> TokenAlignment:
    """Pair training rows with capture rows from ids when both sides have them, else by position.

    With ids: the shared prefix, unless a longer contiguous run of the record's ids sits elsewhere
    in the capture's (or the capture's in the record's): then that run, and the note says where.
    """
    usable = train_len - padding
    if train_ids is not None and capture_ids is not None:
        shared = common_prefix(train_ids[:usable], capture_ids)
        limit = min(usable, capture_len)
        if shared < limit:
            # a run at offset 0 after a divergence carries another context: only when the prefix is too short
            ts, cs, length, ties = find_run(train_ids[:usable], capture_ids, min_len=min_tokens,
                                            skip_zero=shared >= min_tokens)
            if length > shared and length >= min_tokens:
                where = (f"training rows {ts}..{ts + length - 1} are capture rows {cs}..{cs + length - 1} "
                         f"(offset {cs - ts:+d})")
                why = ("the record's ids sit inside the capture's (several requests flattened into one capture, "
                       "left padding, or a prefix such as a chat template on the capture's side)" if ts == 0 else
                       "the capture's ids sit inside the record's (a prefix on the record's side)" if cs == 0 else
                       "the two id lists share this run only (other tokens before it on both sides)")
                ctx = ("" if ts == 0 and cs == 0 else "; the rows before the run differ, so unless the capture "
                       "flattened separate requests its states there carry another context (expect drift)")
                more = f"; {ties} offsets give a run this long, the one nearest 0 is used" if ties > 1 else ""
                return TokenAlignment(ts, cs, length, "ids-run", train_len, capture_len, padding,
                                      f"token ids match as one run of {length}: {where}; {why}{ctx}{more}")
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


def candidate_offsets(train_norms: list[Any], column_norms: list[Any], max_shift: int, count: int | None = 4,
                      min_overlap: int = 8) -> list[tuple[int, float]]:
    """The ``count`` (None: all) row offsets d (training row t pairs with capture row t+d, |d| <=
    ``max_shift``) whose log per-token norm profiles correlate best, over every training and capture
    profile given: [(d, correlation)], best first. Pearson correlation over the overlap, from running
    sums and an FFT cross-correlation (O((S + T) log(S + T)) per pair of profiles)."""
    best: dict[int, float] = {}
    for tn in train_norms:
        a = _filled(_log_profile(tn))
        for cn in column_norms:
            b = _filled(_log_profile(cn))
            for d, c in _all_correlations(a, b, max_shift, min_overlap).items():
                if c > best.get(d, -2.0):
                    best[d] = c
    ranked = sorted(best.items(), key=lambda kv: (-kv[1], abs(kv[0])))
    return [(d, float(c)) for d, c in (ranked if count is None else ranked[:count])]


def _filled(x: np.ndarray) -> np.ndarray:
    """Non-finite entries replaced by the median of the finite ones (so they add no structure)."""
    ok = np.isfinite(x)
    if ok.all() or not ok.any():
        return np.where(ok, x, 0.0)
    return np.where(ok, x, float(np.median(x[ok])))


def _all_correlations(a: np.ndarray, b: np.ndarray, max_shift: int, min_overlap: int) -> dict[int, float]:
    """Pearson correlation of a[t] with b[t+d] for every d in [-max_shift, max_shift] with enough overlap."""
    s, t = a.size, b.size
    if not s or not t:
        return {}
    n_fft = 1 << int(np.ceil(np.log2(s + t)))
    full = np.fft.irfft(np.fft.rfft(b, n_fft) * np.conj(np.fft.rfft(a, n_fft)), n_fft)
    # sum over i of a[i] * b[i + d] sits at full[d] (d >= 0) and full[n_fft + d] (d < 0)
    cross = np.concatenate((full[n_fft - (s - 1):], full[:t])) if s > 1 else full[:t]
    ca, ca2 = np.concatenate(([0.0], np.cumsum(a))), np.concatenate(([0.0], np.cumsum(a * a)))
    cb, cb2 = np.concatenate(([0.0], np.cumsum(b))), np.concatenate(([0.0], np.cumsum(b * b)))
    out: dict[int, float] = {}
    for d in range(max(-max_shift, -(s - 1)), min(max_shift, t - 1) + 1):
        lo, hi = max(0, -d), min(s, t - d)
        n = hi - lo
        if n < min_overlap:
            continue
        sa, sa2 = ca[hi] - ca[lo], ca2[hi] - ca2[lo]
        sb, sb2 = cb[hi + d] - cb[lo + d], cb2[hi + d] - cb2[lo + d]
        sab = cross[d + s - 1]
        va, vb = n * sa2 - sa * sa, n * sb2 - sb * sb
        if va <= 1e-12 * max(1.0, n * sa2) or vb <= 1e-12 * max(1.0, n * sb2):
            continue
        out[d] = float((n * sab - sa * sb) / np.sqrt(va * vb))
    return out


def distinct_pairs(train_norms: Any, capture_norms: Any, rel: float = 1e-6) -> np.ndarray:
    """bool [L]: True for the first row of each distinct (training row, capture row) pair.

    Two rows count as the same state when their per-token norms agree within ``rel`` (a
    necessary condition of equal rows, so distinct rows are never merged unless their norms
    coincide on both sides); non-finite norms are always kept.
    """
    a = _groups(np.asarray(as_array(train_norms), dtype=np.float64), rel)
    b = _groups(np.asarray(as_array(capture_norms), dtype=np.float64), rel)
    n = min(a.size, b.size)
    key = a[:n] * (int(b[:n].max(initial=0)) + 1) + b[:n]
    keep = np.zeros(n, bool)
    _, first = np.unique(key, return_index=True)
    keep[first] = True
    return keep


def _groups(x: np.ndarray, rel: float) -> np.ndarray:
    """Group ids of values within ``rel`` of their sorted neighbour (chained); non-finite ones apart."""
    out = np.empty(x.size, np.int64)
    ok = np.isfinite(x)
    idx = np.flatnonzero(ok)
    order = idx[np.argsort(x[idx], kind="stable")]
    v = x[order]
    new = np.ones(v.size, bool)
    if v.size > 1:
        new[1:] = np.abs(np.diff(v)) > rel * np.maximum(np.abs(v[1:]), 1e-30)
    out[order] = np.cumsum(new) - 1
    bad = np.flatnonzero(~ok)
    out[bad] = (int(out[order].max()) + 1 if v.size else 0) + np.arange(bad.size)
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
