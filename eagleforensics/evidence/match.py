"""Score every training slot against every capture position, streaming the capture in bounded memory.

The main score is the per-token cosine averaged over aligned tokens: one cosine over the
flattened tensor would be dominated by the first token's massive activations and make
every middle layer look the same. Beside it the SGLang comparator's
``rel_diff = 1 - 2*sum(x*y) / sum(x^2 + y^2)`` (float64), the mean per-token norm ratio
(training / capture) and, for each slot's best column, the max absolute error are kept.

Slots that may be post-norm (the final state) are also scored against a *virtual*
post-norm version of each raw position: an RMSNorm whose per-dimension gain is fitted by
least squares, so a post-norm final can be placed even when the capture has no post-norm
state, and a final taken one layer early shows up as such. Those fitted cells are scored
with the per-token ``2xy / (|x|^2 + |y|^2)`` instead of the cosine: with H free gains and a
scale-blind cosine, any raw state would fit its own normed version perfectly; requiring the
per-token norms to match too keeps raw and post-norm apart.

How the capture is walked (the sums themselves live in ``sums``):

* CPU, a large capture whose rows lie in files (safetensors, zip .pt, per-file
  directories): the compiled kernels (``fused``) read every row of every position once,
  straight from the memory-mapped file. The gain fit needs a second look at a position, so
  fitted columns are computed only at the ``FIT_CANDIDATES`` raw positions a post-norm slot
  resembles most by its direct cosine (the fitted column of the right layer and its
  neighbours, the only ones that can win or be runner-up); the others stay NaN ("not
  computed"). ``fit_candidates=None`` fits every raw position.
* CPU, other captures (small ones, where loading the kernels costs more than the work; or
  no numba): numpy, one position at a time in token chunks.
* CUDA (``device="cuda"``, or ``"auto"`` when CUDA is available): ``gpu``, one position at
  a time with reads overlapping the copies. Only this path imports torch.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from ..arrays import as_array, dtype_name, f32, is_float, numpy_dtype
from ..errors import ForensicsError
from ..positions import Position
from ..process import usable_cores
from . import fused
from .steps import Steps, lower_neighbours, steps_from
from .sums import Sums

CHUNK_BYTES = 4 << 20  # float32 block [L, K, H] of training rows reduced at once on the numpy path
# numpy path: the aligned training rows are widened once for all positions up to this size (Kimi-K2, T=2048, four
# slots: 235 MB), else again for each position (as the compiled path never needs: it widens in registers)
Y_BUDGET = 256 << 20
# numpy path: positions run on threads from this many float32 bytes of capture on (a thread pool costs ~8 ms an
# align, half of what scoring the samples takes)
THREAD_BYTES = 16 << 20
FIT_CANDIDATES = 4  # compiled path: fitted columns at the raw positions each post-norm slot resembles most
PREVIEW_TOKENS = 64  # compiled path: aligned tokens scored first, to guess what the pass computes besides the sums
PREVIEW_SPARE = 2  # positions guessed beyond FIT_CANDIDATES for each fitted slot
DEVICES = ("cpu", "cuda", "auto")


@dataclass
class ScoreMatrix:
    """Scores and side metrics, slots x columns; NaN where a cell was not computed.

    ``max_abs`` is filled for each slot's best-scoring column only (the one reported).
    ``error`` is set when scores are estimates (a fingerprint): their standard error per cell.
    """

    columns: list[Position]
    score: np.ndarray
    rel_diff: np.ndarray
    max_abs: np.ndarray
    norm_ratio: np.ndarray
    tokens_used: np.ndarray
    per_token: np.ndarray  # slots x columns x aligned tokens (float32)
    column_norms: dict[Position, np.ndarray] = field(default_factory=dict)  # full-length per-token norms
    nonfinite_capture: dict[Position, int] = field(default_factory=dict)
    error: np.ndarray | None = None
    device: str = "cpu"
    steps: Steps | None = None  # the capture's layer steps where the scorer kept them (``steps.steps_from``)


def resolve_device(device: Any) -> str:
    """``cpu``, ``cuda[:i]`` or ``auto`` (CUDA when available) as a device name; refuse CUDA when absent.

    Only a device other than ``cpu`` imports torch (to ask it about CUDA)."""
    name = "auto" if device is None else str(device)
    if name == "cpu":
        return name
    if name != "auto" and not name.startswith("cuda"):
        raise ForensicsError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}")
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise ForensicsError("--device cuda asked for, but this torch build sees no CUDA GPU; use --device cpu or auto")
    try:
        return str(torch.device(name))
    except RuntimeError:
        raise ForensicsError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}") from None


class _Source:
    """What the scorer needs of a capture: row reads, the row count, whether rows stream from the file."""

    def __init__(self, read: Any, positions: list[Position]) -> None:
        owner = getattr(read, "__self__", None)
        read = owner if hasattr(owner, "read_rows") else read  # Capture.read given: use its capture
        self.capture = read if hasattr(read, "read_rows") else None
        if hasattr(read, "read_rows"):  # a capture.Capture
            self._rows, self.t, self.streams = read.read_rows, int(read.num_tokens), bool(read.streams)
            self._full = read.read
        else:  # a plain pos -> [T, H] callable
            self._full = read
            self._rows = lambda pos, a, b, out=None: read(pos)[a:b]
            self.t = int(read(positions[0]).shape[0]) if positions else 0
            self.streams = False
        first = self.full(positions[0]) if positions and not hasattr(read, "read_rows") else None
        self.dtype = numpy_dtype(dtype_name(first.dtype if first is not None else getattr(read, "dtype", "float32")))
        self.h = int(first.shape[-1]) if first is not None else int(getattr(read, "hidden_size", 0))

    def full(self, pos: Position) -> np.ndarray:
        """Position ``pos`` whole, [T, H], as stored."""
        return as_array(self._full(pos))

    def rows(self, pos: Position, a: int, b: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows [a, b) of ``pos`` as stored (into ``out`` where the reader can)."""
        if out is None:
            return as_array(self._rows(pos, a, b))
        return as_array(self._rows(pos, a, b, out=out))


def score_slots(
    slots: list[Any], fit: list[bool], positions: Iterable[Position],
    read: Any, train_start: int, capture_start: int, length: int,
    progress: Callable[[Position], None] | None = None, *, device: Any = "cpu",
    fit_candidates: int | None = FIT_CANDIDATES,
) -> ScoreMatrix:
    """Compare aligned rows of each slot [S,H] with each capture position (``read``: a Capture or pos -> [T,H]).

    ``fit[i]`` asks for slot i to be scored also against the gain-fitted post-norm version of
    every raw position (virtual columns ``Position(p, normed=True)``).
    """
    slots = [as_array(s) for s in slots]
    positions = sorted(positions)
    have = set(positions)
    fit_idx = [i for i, f in enumerate(fit) if f]
    virt = [g for g, p in enumerate(positions) if fit_idx and not p.normed and Position(p.p, True) not in have]
    columns = sorted(have | {Position(positions[g].p, True) for g in virt})
    dev = resolve_device(device)
    src = _Source(read, positions)
    k, length = len(slots), max(int(length), 0)
    h = int(slots[0].shape[1]) if slots else src.h
    sums = Sums(k, len(positions), src.t, length, capture_start, h, fit_idx, virt)
    size = _stage_dtype(src).itemsize
    mapped = _mapped(src, positions, h) if dev == "cpu" and src.streams and k and fused.wanted(
        len(positions) * src.t * h * size) else None
    if dev != "cpu":
        from .gpu import gpu_sweep

        gpu_sweep(src, positions, sums, slots, train_start, progress, dev)
    elif mapped is not None:
        with fused.LOCK:
            _fused_sweep(mapped, positions, sums, slots, train_start, progress, fit_candidates)
    else:
        _position_major(src, positions, sums, slots, train_start, progress, fit_candidates)
    return _assemble(sums, positions, columns, src, slots, train_start, fit_idx, virt, mapped, dev)


def _fill_y(yb: np.ndarray, slots: list[np.ndarray], row0: int) -> np.ndarray:
    """Training rows [row0, row0+L) of every slot into ``yb`` [L, K, H] (converted to its dtype)."""
    for i, s in enumerate(slots):
        part = s[row0:row0 + yb.shape[0]]
        yb[:, i] = f32(part) if yb.dtype == np.float32 else part
    return yb


def _segments(t: int, cs: int, lw: int, step: int) -> list[tuple[int, int, bool]]:
    """Row ranges of at most ``step`` rows covering [0, t), none straddling the aligned window's edges."""
    out: list[tuple[int, int, bool]] = []
    for a, b, win in ((0, cs, False), (cs, cs + lw, True), (cs + lw, t, False)):
        out += [(r, min(r + step, b), win) for r in range(a, b, step)]
    return out


def _stage_dtype(src: _Source) -> np.dtype:
    return src.dtype if is_float(src.dtype) else np.dtype(np.float32)


def _position_major(src: _Source, positions: list[Position], sums: Sums, slots: list[np.ndarray], ts: int,
                    progress: Callable[[Position], None] | None, fit_candidates: int | None) -> None:
    """numpy: one position at a time, read and reduced in token chunks; then the fitted columns, at
    the candidate positions as the compiled path chooses them (every one with ``fit_candidates=None``,
    fitted while the position is read). Positions of a large capture (``THREAD_BYTES``) run on threads
    (``each``): the reads and numpy's loops release the GIL, and each position's sums are its own, so the
    numbers are those of one thread."""
    h, cs, lw, t = sums.h, sums.cs, sums.lw, src.t
    lc = max(1, CHUNK_BYTES // max(1, h * 4 * max(1, sums.k)))
    local = threading.local()  # each thread's buffer of training rows
    virt_of = {g: j for j, g in enumerate(sums.virt)}
    every = fit_candidates is None
    segs = _segments(t, cs, lw, lc)

    # the aligned training rows, widened and checked once for every position (``prep_y``), when they fit the budget
    whole = np.empty((lw, sums.k, h), np.float32) if 0 < lw * sums.k * h * 4 <= Y_BUDGET else None
    for a, b, win in segs if whole is not None else ():
        if win:
            sums.prep_y(_fill_y(whole[a - cs:b - cs], slots, ts + a - cs), a - cs)

    def block(pos: Position, a: int, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        x = f32(src.rows(pos, a, a + n), copy=True)
        if not (cs <= a < cs + lw):
            return x, None
        if whole is not None:
            return x, whole[a - cs:a - cs + n]
        yb = getattr(local, "yb", None)
        if yb is None:
            yb = local.yb = np.empty((lc, sums.k, h), np.float32)
        # every thread records the same norms of these training rows (``prep_y``): equal values
        return x, sums.prep_y(_fill_y(yb[:n], slots, ts + a - cs), a - cs)

    def score_fitted(g: int) -> None:
        sums.fit([virt_of[g]])  # the normal equations of this position are complete
        for a, b, win in segs:
            if win:
                x, y = block(positions[g], a, b - a)
                assert y is not None
                sums.pass2(sums.unit(x, g, a), virt_of[g], a, y[:, sums.fit_idx])

    def direct(g: int) -> None:
        for a, b, _ in segs:
            x, y = block(positions[g], a, b - a)
            sums.pass1(x, g, a, y, fit=every and g in virt_of)
        if every and g in virt_of and lw:
            score_fitted(g)

    def fitted(j: int) -> None:
        g = sums.virt[j]
        for a, b, win in segs:
            if win:
                x, y = block(positions[g], a, b - a)
                assert y is not None
                sums.accumulate(sums.unit(x, g, a), g, y[:, sums.fit_idx])
        score_fitted(g)

    threads = len(positions) * t * h * 4 >= THREAD_BYTES
    each(direct, range(len(positions)), None if progress is None else lambda g: progress(positions[g]), threads)
    if every or not sums.virt or not lw:
        return
    each(fitted, _candidates(sums, fit_candidates), threads=threads)


def each(work: Callable[[int], None], items: Iterable[int], done: Callable[[int], None] | None = None,
         threads: bool = True) -> None:
    """``work(i)`` for every item, on up to one thread per usable core (``threads``; else in order here);
    ``done(i)`` in the caller's thread, in the items' order, as each finishes. The first error is raised once
    the running items end; the rest are dropped."""
    items = list(items)
    workers = min(len(items), usable_cores()) if threads else 1
    if workers <= 1:
        for i in items:
            work(i)
            if done is not None:
                done(i)
        return
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="eagleforensics-positions")
    try:
        futures = [pool.submit(work, i) for i in items]
        for i, fut in zip(items, futures):
            fut.result()
            if done is not None:
                done(i)
    finally:  # on an error or Ctrl-C the queued items are dropped; the running ones finish their position
        pool.shutdown(wait=True, cancel_futures=True)


def _candidates(sums: Sums, m: int) -> list[int]:
    """Virtual-column indices at the ``m`` raw positions each fitted slot resembles most (direct cosine)."""
    score = sums.results(direct_only=True)["direct_score"]  # [K, P]
    chosen: set[int] = set()
    for i in sums.fit_idx:
        ranked = sorted((float(score[i, g]), j) for j, g in enumerate(sums.virt) if score[i, g] == score[i, g])
        chosen.update(j for _, j in ranked[-m:])
    return sorted(chosen)


def _assemble(sums: Sums, positions: list[Position], columns: list[Position], src: _Source,
              slots: list[np.ndarray], ts: int, fit_idx: list[int], virt: list[int],
              mapped: fused.Stored | None = None, device: str = "cpu") -> ScoreMatrix:
    """Turn the sums into the slots x columns matrices, then the max abs error of each slot's best column."""
    k, lw = sums.k, sums.lw
    col = {c: j for j, c in enumerate(columns)}
    shape = (k, len(columns))
    out = {name: np.full(shape, np.nan) for name in ("score", "rel_diff", "max_abs", "norm_ratio")}
    tokens = np.zeros(shape)
    per_token = np.full((k, len(columns), lw), np.nan, dtype=np.float32)
    res = sums.results()
    direct = [col[p] for p in positions]
    for name in ("score", "rel_diff", "norm_ratio"):
        out[name][:, direct] = res[f"direct_{name}"]
    tokens[:, direct] = res["direct_tokens"]
    per_token[:, direct] = res["direct_per_token"]
    if "fitted_score" in res:
        fitted = [col[Position(positions[g].p, True)] for g in virt]
        rows = np.array(fit_idx)[:, None]
        for name in ("score", "rel_diff", "norm_ratio"):
            out[name][rows, fitted] = res[f"fitted_{name}"]
        tokens[rows, fitted] = res["fitted_tokens"]
        per_token[rows, fitted] = res["fitted_per_token"]
    norms = {p: np.sqrt(np.maximum(sums.xx[g], 0)) for g, p in enumerate(positions)}
    bad = sums.bad.sum(1)
    nonfinite = {p: int(bad[g]) for g, p in enumerate(positions)}
    _fill_max_abs(out["score"], out["max_abs"], columns, positions, sums, src, slots, ts, fit_idx, virt, mapped)
    steps = None if sums.adj is None else steps_from(sums.adj, sums.xx, sums.bad, positions, sums.cs, sums.lw)
    return ScoreMatrix(columns, out["score"], out["rel_diff"], out["max_abs"], out["norm_ratio"], tokens,
                       per_token, norms, nonfinite, device=device, steps=steps)


def _fill_max_abs(score: np.ndarray, max_abs: np.ndarray, columns: list[Position], positions: list[Position],
                  sums: Sums, src: _Source, slots: list[np.ndarray], ts: int, fit_idx: list[int],
                  virt: list[int], mapped: fused.Stored | None = None) -> None:
    """max |training - capture| over valid aligned tokens, for each slot's best column (one more read of it)."""
    index = {p: g for g, p in enumerate(positions)}
    virt_of = {g: j for j, g in enumerate(virt)}
    wanted: dict[int, list[tuple[int, int, int | None]]] = {}  # position index -> (slot, column, virtual j)
    for i in range(score.shape[0]):
        row = score[i]
        if not np.isfinite(row).any():
            continue
        j = int(np.nanargmax(row))
        c = columns[j]
        if c in index:
            wanted.setdefault(index[c], []).append((i, j, None))
        else:
            g = index[Position(c.p)]
            wanted.setdefault(g, []).append((i, j, virt_of[g]))
    if mapped is not None:  # compiled kernels, one at a time (each is parallel already)
        with fused.LOCK:
            _fused_cells(mapped, sums, wanted, slots, ts, fit_idx, max_abs)
        return
    cs, lw, h = sums.cs, sums.lw, sums.h
    step = max(1, CHUNK_BYTES // max(1, h * 4))
    for g, cells in wanted.items():
        worst = [0.0] * len(cells)
        for a in range(0, lw, step):
            n = min(step, lw - a)
            x = f32(src.rows(positions[g], cs + a, cs + a + n), copy=True)
            ok_x = ~sums.bad[g, cs + a:cs + a + n]
            x[~ok_x] = 0.0
            u = sums.unit(x.copy(), g, cs + a) if sums.gain is not None else None  # x / rms(x), for fitted cells
            for c, (i, _j, vj) in enumerate(cells):
                y = f32(slots[i][ts + a:ts + a + n], copy=True)
                ok = ok_x & sums.y_ok[a:a + n, i]
                pred = x if vj is None or u is None else u * sums.gain[vj, fit_idx.index(i)]
                with np.errstate(invalid="ignore", over="ignore"):
                    d = np.abs(y - pred)
                d[~ok] = 0.0
                worst[c] = max(worst[c], float(d.max()) if d.size else 0.0)
        for c, (i, j, _vj) in enumerate(cells):
            max_abs[i, j] = worst[c] if math.isfinite(worst[c]) else np.nan


def _fused_cells(mapped: fused.Stored, sums: Sums, wanted: dict[int, list[tuple[int, int, int | None]]],
                 slots: list[np.ndarray], ts: int, fit_idx: list[int], max_abs: np.ndarray) -> None:
    """``_fill_max_abs`` on the compiled path: position g of each (slot i, column j, virtual j) cell, from
    what the passes kept (the direct pass for the position guessed for slot i, ``fit_scores`` for every
    fitted column), else through the ``max_abs`` kernel (one more read of the position)."""
    plan = sums.plan
    for g, cells in wanted.items():
        for i, j, vj in cells:
            f = fit_idx.index(i) if vj is not None else 0
            kept = None
            if vj is None and plan is not None and sums.lw and int(plan.maxk[i]) == g:
                kept = plan.max_abs(i)
            elif vj is not None:
                kept = sums.fitted_max.get((vj, f))
            if kept is not None:
                max_abs[i, j] = _worst(kept) if sums.lw else 0.0
            else:
                max_abs[i, j] = _fused_max_abs(mapped, sums, g, slots[i][ts:ts + sums.lw], i, vj, f)


def _mapped(src: _Source, positions: list[Position], h: int) -> fused.Stored | None:
    """The capture's positions as (file, offset) for the compiled kernels, when each is a plain
    row block of a file (``filerows.FileRows`` behind ``Capture.read_rows``); None otherwise."""
    from ..io.filerows import FileRows

    cap = src.capture
    if cap is None or not hasattr(cap, "readers"):
        return None
    rows = []
    for pos in positions:
        reader = getattr(getattr(cap.readers.get(pos), "_rows", None), "__self__", None)
        if not isinstance(reader, FileRows) or reader.rows != src.t:
            return None
        rows.append(reader)
    return fused.Stored.of(rows, h)


def _fused_sweep(m: fused.Stored, positions: list[Position], sums: Sums, slots: list[np.ndarray], ts: int,
                 progress: Callable[[Position], None] | None, fit_candidates: int | None) -> None:
    """CPU, compiled: one pass over every row of every position (norms, slot products, and each row's
    product with the position below, ``sums.adj``, for the capture's layer step). The same pass, while
    each row is in cache, sums the gain normal equations of the positions the fitted columns will
    need and each slot's max |diff| against the position it will match, as guessed from the first
    ``PREVIEW_TOKENS`` aligned tokens (``_preview``). Then one more read of each fitted column's
    position scores its tokens (and its max |diff|, should it be a slot's best). A wrong guess costs
    a read, never an answer: what was not guessed is computed as before (``fit_equations``, ``max_abs``)."""
    cs, lw = sums.cs, sums.lw
    xx, bad, dot, yy, y_ok = sums.xx, sums.bad, sums.dot, sums.yy, sums.y_ok
    sums.adj = np.full(xx.shape, np.nan, np.float32)
    below = lower_neighbours(positions)
    plan = _preview(m, sums, slots, ts, below, fit_candidates)
    fused.direct(m, slots, ts, cs, lw, below, xx, bad, dot, yy, y_ok, sums.adj, plan=plan)
    sums.plan = plan
    if progress is not None:
        for pos in positions:
            progress(pos)
    if not sums.virt or not lw:
        return
    js = list(range(len(sums.virt))) if fit_candidates is None else _candidates(sums, fit_candidates)
    assert sums.num is not None and sums.den is not None and sums.gain is not None
    guessed = {int(g): c for c, g in enumerate(plan.fitg)}
    for j in js:
        g = sums.virt[j]
        c = guessed.get(g)
        if c is not None and plan.num is not None and plan.den is not None:
            sums.num[g] = plan.num[c]
            sums.den[g] = plan.den[c]
            continue
        for f, i in enumerate(sums.fit_idx):  # not guessed: its equations from one more read
            num, den = fused.fit_equations(m, g, slots[i][ts:ts + lw], i, cs, lw, xx, bad, y_ok)
            sums.num[g, f] = num
            sums.den[g] = den
    sums.fit(js)
    if not js:
        return
    for f, i in enumerate(sums.fit_idx):  # every fitted column of one slot in one read of their positions
        kept = fused.fit_scores(m, [sums.virt[j] for j in js], slots[i][ts:ts + lw], i, cs, lw, xx, bad, y_ok,
                                sums.gain, js, f, sums.fdot, sums.fpp)
        sums.fitted_max.update(((j, f), mx) for j, mx in zip(js, kept))


def _preview(m: fused.Stored, sums: Sums, slots: list[np.ndarray], ts: int, below: np.ndarray,
             fit_candidates: int | None) -> fused.Plan:
    """Score the first ``PREVIEW_TOKENS`` aligned tokens (a read of those rows alone) and guess, from their
    direct cosines, each fitted slot's ``FIT_CANDIDATES`` (+ ``PREVIEW_SPARE``) positions and each slot's
    best position: what the full pass should compute besides the sums (``fused.Plan``). Its sums are
    overwritten by the full pass with the same values."""
    n = min(PREVIEW_TOKENS, sums.lw)
    if n == 0:
        return fused.Plan.empty(sums.k)
    fused.direct(m, slots, ts, sums.cs, sums.lw, below, sums.xx, sums.bad, sums.dot, sums.yy, sums.y_ok,
                 sums.adj if sums.adj is not None else np.full(sums.xx.shape, np.nan, np.float32),
                 tokens=(sums.cs, sums.cs + n))
    score = sums.preview_score(n)  # [K, P]
    fitg: set[int] = set()
    if fit_candidates is not None:
        for i in sums.fit_idx:
            ranked = sorted((float(score[i, g]), g) for g in sums.virt if score[i, g] == score[i, g])
            fitg.update(g for _, g in ranked[-(fit_candidates + PREVIEW_SPARE):])
    best = [int(np.nanargmax(row)) if np.isfinite(row).any() else -1 for row in score]
    return fused.Plan(sorted(fitg), list(sums.fit_idx), best, sums.k, sums.lw)


def _fused_max_abs(m: fused.Stored, sums: Sums, g: int, y: np.ndarray, i: int, vj: int | None, f: int) -> float:
    """max |training - capture| of slot i against position g (or its fitted column ``vj``, slot ``f`` of the fit)."""
    if sums.lw == 0:
        return 0.0
    return _worst(fused.max_abs(m, g, y, i, sums.cs, sums.lw, sums.xx, sums.bad, sums.y_ok, sums.gain, vj, f))


def _worst(per_token: np.ndarray) -> float:
    """The largest of per-token max |diff| values (float32 [Lw]); NaN when it is not finite."""
    worst = float(per_token.max())
    return worst if math.isfinite(worst) else float("nan")
