"""Which position a slot holds, judged from evidence measured on this capture, not from a fixed floor.

The old rule (``confidence.choose``) asked for an absolute score (bf16: 0.998). A served
model never reproduces training data bit for bit: MoE routers pick other experts for a few
tokens, quantised weights and other kernels move every row a little. So identity is decided
from four measurements on the data itself (calibrated in docs/calibration.md):

* **robust score**: the median per-token score of each column; a few flipped rows move it
  neither up nor down, so they can neither unplace a slot nor place a wrong one;
* **votes**: the share of tokens whose own best column sits at the slot's best position;
* **paired bound**: best minus runner-up over the *same* tokens, as a distribution-free
  lower confidence bound on the typical (median) difference; above zero means separable;
* **layer step**: how far apart the capture's own neighbouring positions are at that
  depth (median per-token cosine of p with p-1 and p+1). A match must sit much closer
  to its position than the neighbours sit to each other; where neighbours are closer
  than the data can resolve (a layer whose write is tiny) the answer is "ambiguous
  between p and q", naming both.

A neighbour that is not in the capture cannot be ruled out except by a copy: then only a
copy-level match (within the dtype's rounding) is confident, anything else is "best among
the captured positions". How close the matched state is (copy / drift / different) is
``fidelity``'s question.

Three more answers come from the data:

* **between**: a state saved inside a decoder layer (after attention, before the MLP: the
  fused add-norm's ``residual``) sits at no position. Its deviation from the best position
  points at the neighbour: per token, with unit vectors b (best), o (neighbour), s (slot), the
  projection of s onto the segment b -> o is ``(gap_b + step - gap_o) / (2 step)`` (gaps = 1 -
  cosine, step = the capture's own 1 - cos(b, o)). A drifted copy of b moves in no particular
  direction (median fraction <= 0.08 for INT4 weights, 0 for MoE routing or other kernels); a
  mid-layer state sits a fair part of the way (``BETWEEN_MIN``), so it is "between pK and pK+1";
* **position-unknown**: the best column's label does not count (``evidence.labels``: a list
  index, a label the content contradicts, a p0 the content cannot confirm), so a match, even a
  copy, gives no position;
* evidence counts **distinct tokens**: rows that repeat the same (slot row, capture row) pair
  (``tokens.distinct_pairs``) count once, so identical rows cannot buy votes or a paired bound.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from ..arrays import as_array, f32
from ..positions import Position
from .fidelity import Fidelity, judge_fidelity
from .steps import lower_median

MIN_VOTES = 0.5  # share of tokens that must vote for the best position
PAIRED_ALPHA = 1e-3  # one-sided level of the bound on the median paired difference (docs/calibration.md)
STEP_RATIO = 2.0  # the layer step must be at least this many times the match's distance from 1 (docs/calibration.md)
FIT_COPY_GAP = 1e-4  # a fitted column competes with a real post-norm one only this close to a copy
RESOLUTION_FLOOR = 1e-7  # float32 rounding: neighbours closer than this are one state
MIN_SCORE_ANY = 0.5  # below this robust score no column resembles the slot at all
BETWEEN_MIN = 0.15  # median fraction of the step toward the neighbour from which a state sits between two positions
VERDICTS = ("confident", "ambiguous", "best-among-captured", "between", "position-unknown", "rows-unverified", "none")


@dataclass(frozen=True)
class Identity:
    """The identity answer for one slot and the numbers it rests on (NaN where not measured)."""

    verdict: str  # one of VERDICTS
    best: Position | None
    other: Position | None  # the position it is ambiguous with, else the runner-up
    robust: float  # median per-token score at ``best``
    runner_robust: float
    votes: float  # share of tokens voting for best.p
    paired_mean: float  # mean per-token (best - runner-up)
    paired_bound: float  # lower confidence bound of that mean
    step: float  # capture's own cosine of best.p with its closest captured neighbour (median per token)
    step_to: int | None  # that neighbour
    missing: tuple[int, ...]  # neighbours of best.p that the capture does not hold
    reason: str  # why not confident ("" when confident)
    fidelity: Fidelity
    distinct: int = -1  # distinct tokens the answer rests on (-1: not counted)
    between: float = float("nan")  # median fraction of the step from ``best`` toward its neighbour ``other``

    @property
    def confident(self) -> bool:
        return self.verdict == "confident"


def _robust(row: np.ndarray) -> float:
    v = row[np.isfinite(row)]
    return float(np.median(v)) if v.size else float("nan")


def _robust_rows(per_token: np.ndarray) -> np.ndarray:
    """``_robust`` of every row (float64 [columns]): the rows finite throughout in one ``np.median`` call,
    the same order statistics a row at a time gives, without a call per column (4 slots x 60+ columns,
    twice each, at every align)."""
    out = np.full(per_token.shape[0], np.nan)
    whole = np.isfinite(per_token).all(axis=1) & (per_token.shape[1] > 0)  # no tokens: NaN, as ``_robust``
    if whole.any():
        out[whole] = np.median(per_token[whole], axis=1)
    for j in np.flatnonzero(~whole):
        out[j] = _robust(per_token[j])
    return out


def eligible_columns(columns: list[Position], real: set[Position], robust: np.ndarray, copy_gap: float) -> list[bool]:
    """Columns that may be chosen. A fitted post-norm column competes with a real one only at copy level.

    A fitted column's H free gains absorb drift that a captured column cannot, so under drift a
    fitted column one layer early can beat the capture's real post-norm state by the fit's
    freedom alone; a copy-level fit (a final taken one layer early, through the model's own
    norm) is still found.
    """
    has_real_normed = any(c.normed for c in real)
    bar = 1.0 - max(10 * copy_gap, FIT_COPY_GAP)
    return [c in real or not has_real_normed or bool(robust[j] >= bar) for j, c in enumerate(columns)]


def paired(a: np.ndarray, b: np.ndarray, alpha: float = PAIRED_ALPHA) -> tuple[float, float]:
    """Mean of a - b over tokens finite in both, and a distribution-free lower bound on its median.

    Per-token differences are skewed (a few tokens, the first above all, carry most of a
    layer's change), which makes a normal-theory bound on the mean useless on exact copies;
    the sign-test bound (the k-th smallest difference, k from Binomial(n, 1/2) at ``alpha``)
    holds whatever their shape. Fewer than 10 tokens cannot reach ``alpha``: then every
    token must prefer ``a`` (k = 1).
    """
    ok = np.isfinite(a) & np.isfinite(b)
    d = np.sort(a[ok].astype(np.float64) - b[ok].astype(np.float64))
    if d.size < 2:
        return float("nan"), float("nan")
    return float(d.mean()), float(d[_sign_rank(d.size, alpha) - 1])


@functools.lru_cache(maxsize=256)
def _sign_rank(n: int, alpha: float) -> int:
    """Largest k >= 1 with P(Binomial(n, 1/2) <= k - 1) <= alpha (1 when none).

    Each term C(n, k) / 2**n is taken in log space: 2.0 ** n overflows a float from n = 1024
    tokens on, and the exact big-integer terms would cost O(n) digits each. Cached: the loop runs
    ~n/2 times, and every slot's paired test asks for the same n.
    """
    k, tail = 0, 0.0
    log_norm = math.lgamma(n + 1) - n * math.log(2.0)
    while k < n:
        tail += math.exp(log_norm - math.lgamma(k + 1) - math.lgamma(n - k + 1))
        if tail > alpha:
            break
        k += 1
    return max(k, 1)


def judge(per_token: np.ndarray, columns: list[Position], real: set[Position], norm_ratio: np.ndarray,
          tokens: int, min_tokens: int, copy_gap: float, norm_tol: float, num_layers: int,
          step_of: Callable[[int, int], float] | None, alpha: float = PAIRED_ALPHA, step_ratio: float = STEP_RATIO,
          min_votes: float = MIN_VOTES, extra_bad: int = 0, unknown: frozenset[Position] = frozenset(),
          distinct: Callable[[Position], np.ndarray | None] | None = None,
          damaged: frozenset[Position] = frozenset()) -> Identity:
    """Decide one slot's identity from its per-token scores [columns, tokens] (see module doc).

    ``real``: the columns the capture holds (others are fitted). ``step_of(p, q)``: the
    capture's median per-token cosine between raw positions p and q (None: unknown, e.g. a
    fingerprint). ``copy_gap``: 1 - score within which a match is a copy at the dtype's rounding.
    ``unknown``: stored columns whose labels do not count (``evidence.labels``); a fitted column
    of such a position does not count either. ``distinct(pos)``: which compared tokens are
    distinct against column ``pos`` (bool mask; None or all True: every one). ``damaged``: stored
    columns with non-finite rows; as neighbours they count as not captured, since a corrupted
    neighbour's layer step says nothing about how far apart real neighbours sit.
    """
    args = (columns, real, norm_ratio, tokens, min_tokens, copy_gap, norm_tol, num_layers, step_of, alpha,
            step_ratio, min_votes, extra_bad, unknown, damaged)
    first = _judge(per_token, *args)
    keep = distinct(first.best) if distinct is not None and first.best is not None else None
    if keep is None or keep.all():
        return replace(first, distinct=_finite_tokens(per_token, columns, first.best))
    sub = per_token[:, keep]
    kept = _finite_tokens(sub, columns, first.best)
    out = _judge(sub, columns, real, norm_ratio, min(tokens, kept), *args[4:])
    note = f"{kept} distinct of {_finite_tokens(per_token, columns, first.best)} compared tokens"
    return replace(out, distinct=kept, reason=f"{out.reason} ({note})" if out.reason else "")


def _finite_tokens(per_token: np.ndarray, columns: list[Position], best: Position | None) -> int:
    """Tokens with a finite score at ``best`` (0 when there is none)."""
    if best is None:
        return 0
    return int(np.isfinite(per_token[columns.index(best)]).sum())


def _judge(per_token: np.ndarray, columns: list[Position], real: set[Position], norm_ratio: np.ndarray,
           tokens: int, min_tokens: int, copy_gap: float, norm_tol: float, num_layers: int,
           step_of: Callable[[int, int], float] | None, alpha: float, step_ratio: float,
           min_votes: float, extra_bad: int, unknown: frozenset[Position],
           damaged: frozenset[Position] = frozenset()) -> Identity:
    """``judge`` on one set of tokens."""
    robust = _robust_rows(per_token)
    ok = eligible_columns(columns, real, robust, copy_gap)
    robust = np.where(ok, robust, np.nan)
    nothing = Fidelity("", "", 0, 0, float("nan"), "nothing compared")
    if not np.isfinite(robust).any():
        return Identity("none", None, None, *(float("nan"),) * 6, None, (), "nothing to compare", nothing)
    order = [int(j) for j in np.argsort(-np.where(np.isfinite(robust), robust, -np.inf), kind="stable")
             if np.isfinite(robust[j])]
    jb = order[0]
    best = columns[jb]
    jr = next((j for j in order[1:] if columns[j].p != best.p), None)
    runner = columns[jr] if jr is not None else None
    rb = float(robust[jb])
    rr = float(robust[jr]) if jr is not None else float("nan")
    votes = _votes(per_token, columns, ok, best.p)
    pm, pb = paired(per_token[jb], per_token[jr], alpha) if jr is not None else (float("nan"), float("nan"))
    unlabelled = best in unknown or Position(best.p) in unknown and best not in real
    step, step_to, missing = _neighbours(best, columns, real - unknown - damaged, num_layers,
                                         None if unlabelled else step_of)
    fid = judge_fidelity(per_token[jb], copy_gap, norm_ratio[jb], norm_tol, step, extra_bad)
    gap = max(1.0 - rb, 0.0)
    resolution = max(gap, RESOLUTION_FLOOR)  # neighbours closer than this cannot be told apart
    other = runner

    def make(verdict: str, reason: str, other: Position | None = other) -> Identity:
        return Identity(verdict, best, other, rb, rr, votes, pm, pb, step, step_to, tuple(missing), reason, fid)

    if tokens < min_tokens:
        few = Fidelity("", "", 0, int(tokens), float("nan"), f"only {int(tokens)} tokens compared")
        return Identity("none", best, other, rb, rr, votes, pm, pb, step, step_to, tuple(missing),
                        f"only {int(tokens)} tokens compared (need {min_tokens})", few)
    if rb < MIN_SCORE_ANY or fid.kind == "different":
        return make("none", f"no captured position holds this state: best {best.label} scores {rb:.4f}"
                    + (f", with the slot's norms {float(norm_ratio[jb]):.3g}x the capture's (a drifted copy keeps "
                       "its norm)" if fid.cause == "norms" else
                       f", farther from it than neighbouring layers are from each other (step {step:.4f})"
                       if fid.kind == "different" and step == step else ""))
    if unlabelled:
        return make("position-unknown", f"matches the capture entry read as {best.label} ({fid.kind or 'compared'}, "
                    f"robust score {rb:.4f}), but that reading does not give a position (see the capture's label "
                    "findings), so neither does the match")
    if missing and fid.kind != "copy":
        where = " / ".join(f"p{q}" + (" (captured with non-finite rows)" if Position(q) in damaged else "")
                           for q in missing)
        return make("best-among-captured", f"best among the captured positions; {where} "
                    f"{'was' if len(missing) == 1 else 'were'} not captured whole and could fit better "
                    f"(the match, {rb:.4f}, is not a copy)")
    if step == step and (1.0 - step) < step_ratio * resolution:
        q = Position(step_to) if step_to is not None else runner
        return make("ambiguous", f"ambiguous between {best.label} and {q.label if q else '-'}: the capture's "
                    f"neighbouring positions sit at cosine {step:.6f}, closer than this match resolves "
                    f"({rb:.6f})", other=q)
    frac, near = _between(per_token, columns, jb, best, real - unknown - damaged, step_of) if fid.kind != "copy" else (
        float("nan"), None)
    if frac == frac and frac >= BETWEEN_MIN and near is not None:
        lo, hi = sorted((best, near))
        out = make("between", f"between {lo.label} and {hi.label}: {frac:.0%} of the capture's layer step from "
                   f"{best.label} toward {near.label} (a drifted copy moves in no particular direction), as a state "
                   "saved inside a decoder layer is (after attention, before the MLP: a fused add-norm's residual); "
                   "no engine id captures it", other=near)
        return replace(out, between=frac)
    if runner is not None and not pb > 0:
        return replace(make("ambiguous", f"ambiguous between {best.label} and {runner.label}: best minus runner-up "
                            f"over the same tokens averages {pm:+.2e}, but its lower confidence bound is {pb:+.2e} "
                            "(not above 0)"), between=frac)
    if votes < min_votes:
        return replace(make("ambiguous", f"only {votes:.0%} of tokens vote for {best.label}"), between=frac)
    return replace(make("confident", ""), between=frac)


def unverified_rows(ident: Identity, method: str) -> Identity:
    """``ident`` of a final-state slot downgraded: the rows were paired by ``method``, no ids vouch
    for them and no raw slot confirms them, so a match may be of other tokens' states."""
    how = {"position": "from the first row on", "content-shift": "at a row offset found by content"}.get(method, method)
    return replace(ident, verdict="rows-unverified", reason=(
        f"{ident.best.label if ident.best else '-'} matches ({ident.fidelity.kind or 'compared'}, robust score "
        f"{ident.robust:.4f}), but the rows were paired {how} without token ids on both sides and no aux slot is "
        "placed on them: post-norm states of different tokens look alike, so this is not evidence of a position"))


def _between(per_token: np.ndarray, columns: list[Position], jb: int, best: Position, raw: set[Position],
             step_of: Callable[[int, int], float] | None) -> tuple[float, Position | None]:
    """Median fraction of the capture's step from ``best`` toward its closer captured raw neighbour, and that
    neighbour: per token ``(gap_b + step - gap_o) / (2 step)`` with gaps = 1 - score (see module doc).

    NaN when ``best`` is post-norm, a neighbour is not captured or the step is unknown."""
    if best.normed or step_of is None or best not in raw:
        return float("nan"), None
    cand = [(float(np.nanmedian(per_token[columns.index(Position(q))])), q) for q in (best.p - 1, best.p + 1)
            if Position(q) in raw and Position(q) in columns and np.isfinite(per_token[columns.index(Position(q))]).any()]
    if not cand:
        return float("nan"), None
    _, q = max(cand)
    step = 1.0 - float(step_of(best.p, q))
    if not step > RESOLUTION_FLOOR:
        return float("nan"), None
    gb = 1.0 - per_token[jb].astype(np.float64)
    go = 1.0 - per_token[columns.index(Position(q))].astype(np.float64)
    u = (gb + step - go) / (2.0 * step)
    u = u[np.isfinite(u)]
    return (float(np.median(u)) if u.size else float("nan")), Position(q)


def _votes(per_token: np.ndarray, columns: list[Position], ok: list[bool], p: int) -> float:
    """Share of tokens whose own best eligible column sits at position p."""
    m = np.where(np.array(ok)[:, None] & np.isfinite(per_token), per_token, -np.inf)
    live = np.isfinite(m).any(0)
    if not live.any():
        return float("nan")
    winners = np.argmax(m[:, live], axis=0)
    ps = np.array([c.p for c in columns])[winners]
    return float((ps == p).mean())


def _neighbours(best: Position, columns: list[Position], real: set[Position], n: int,
                step_of: Callable[[int, int], float] | None) -> tuple[float, int | None, list[int]]:
    """The capture's step at best.p (closest captured raw neighbour), that neighbour, and the missing ones."""
    raw = {c.p for c in real if not c.normed}
    p = best.p
    if best.normed and best.p == n:  # the final state: its only layer neighbour is p=N-1
        near = [p - 1]
    else:
        near = [q for q in (p - 1, p + 1) if 0 <= q <= n]
    missing = [q for q in near if q not in raw]
    if step_of is None or p not in raw:
        return float("nan"), None, missing
    steps = [(step_of(p, q), q) for q in near if q in raw]
    steps = [(s, q) for s, q in steps if s == s]
    if not steps:
        return float("nan"), None, missing
    s, q = max(steps)
    return s, q, missing


def step_reader(read_rows: Callable[[Position, int, int], Any], cs: int, lw: int,
                chunk: int = 1024) -> Callable[[int, int], float]:
    """``step_of(p, q)``: median per-token cosine of raw positions p and q over the aligned rows.

    Reads the two positions' aligned rows in chunks (bounded memory) and caches each pair.
    """
    cache: dict[tuple[int, int], float] = {}

    def step_of(p: int, q: int) -> float:
        key = (min(p, q), max(p, q))
        if key not in cache:
            parts = []
            for a in range(cs, cs + lw, chunk):
                b = min(a + chunk, cs + lw)
                x = f32(as_array(read_rows(Position(key[0]), a, b)))
                y = f32(as_array(read_rows(Position(key[1]), a, b)))
                parts.append(row_cosines(x, y))
            c = np.concatenate(parts) if parts else np.empty(0, np.float32)
            c = c[np.isfinite(c)]
            cache[key] = lower_median(c)
        return cache[key]

    return step_of


def row_cosines(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-row cosine of two float32 [L, H] arrays (a zero row gives 0, as with a tiny eps)."""
    with np.errstate(over="ignore", invalid="ignore"):
        dot = np.einsum("lh,lh->l", x, y)
        nx = np.sqrt(np.einsum("lh,lh->l", x, x))
        ny = np.sqrt(np.einsum("lh,lh->l", y, y))
        return dot / np.maximum(nx * ny, np.float32(1e-30))
