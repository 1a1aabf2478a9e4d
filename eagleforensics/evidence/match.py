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

* CPU, a capture whose rows can be read from the file (safetensors, zip .pt, per-file
  directories): token-major. A few rows of *every* position are read at once (a background
  thread reads the next rows meanwhile), so each training row is converted to float32 once
  and meets all positions while it sits in cache. Memory: the training record plus about
  two positions' worth of read buffers, whatever N is. The gain fit needs a second look at
  a position, so fitted columns are computed only at the ``FIT_CANDIDATES`` raw positions a
  post-norm slot resembles most by its direct cosine (the fitted column of the right layer
  and its neighbours, the only ones that can win or be runner-up); the others stay NaN
  ("not computed"). ``fit_candidates=None`` fits every raw position (a second full read).
* CPU, other captures: one position at a time, in token chunks.
* CUDA (``device="cuda"``, or ``"auto"`` when CUDA is available): one position at a time;
  a reader thread fills pinned buffers, a side stream copies them to the GPU while the GPU
  reduces the previous position.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch

from ..errors import ForensicsError
from ..io.prefetch import Prefetch
from ..positions import Position
from . import fused
from .steps import Steps, lower_neighbours, steps_from
from .sums import Sums

CHUNK_BYTES = 4 << 20  # float32 block [L, P, H] reduced at once on CPU (measured best on a 2-core Zen 4)
READ_BYTES = 16 << 20  # one read buffer of [rows, P, H] stored values (two are in flight)
READ_ROWS = 64  # at most this many rows of every position per read
GPU_READERS = 4  # reader threads filling pinned buffers in GPU mode; env EAGLEFORENSICS_READERS overrides
FIT_CANDIDATES = 4  # CPU: fitted columns at the raw positions each post-norm slot resembles most
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


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``cpu``, ``cuda[:i]`` or ``auto`` (CUDA when available) as a torch.device; refuse CUDA when absent."""
    name = "auto" if device is None else str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ForensicsError("--device cuda asked for, but this torch build sees no CUDA GPU; use --device cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ForensicsError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}") from None


class _Source:
    """What the scorer needs of a capture: row reads, the row count, whether rows stream from the file."""

    def __init__(self, read: Any, positions: list[Position]) -> None:
        owner = getattr(read, "__self__", None)
        read = owner if hasattr(owner, "read_rows") else read  # Capture.read given: use its capture
        self.capture = read if hasattr(read, "read_rows") else None
        if hasattr(read, "read_rows"):  # a capture.Capture
            self.rows, self.t, self.streams = read.read_rows, int(read.num_tokens), bool(read.streams)
            self.full = read.read
        else:  # a plain pos -> [T, H] callable
            self.full = read
            self.rows = lambda pos, a, b, out=None: read(pos)[a:b]
            self.t = int(read(positions[0]).shape[0]) if positions else 0
            self.streams = False
        first = self.full(positions[0]) if positions and not hasattr(read, "read_rows") else None
        self.dtype = first.dtype if first is not None else getattr(read, "dtype", torch.float32)
        self.h = int(first.shape[-1]) if first is not None else int(getattr(read, "hidden_size", 0))


def score_slots(
    slots: list[torch.Tensor], fit: list[bool], positions: Iterable[Position],
    read: Any, train_start: int, capture_start: int, length: int,
    progress: Callable[[Position], None] | None = None, *, device: str | torch.device | None = "cpu",
    fit_candidates: int | None = FIT_CANDIDATES,
) -> ScoreMatrix:
    """Compare aligned rows of each slot [S,H] with each capture position (``read``: a Capture or pos -> [T,H]).

    ``fit[i]`` asks for slot i to be scored also against the gain-fitted post-norm version of
    every raw position (virtual columns ``Position(p, normed=True)``).
    """
    positions = sorted(positions)
    have = set(positions)
    fit_idx = [i for i, f in enumerate(fit) if f]
    virt = [g for g, p in enumerate(positions) if fit_idx and not p.normed and Position(p.p, True) not in have]
    columns = sorted(have | {Position(positions[g].p, True) for g in virt})
    dev = resolve_device(device)
    src = _Source(read, positions)
    k, length = len(slots), max(int(length), 0)
    h = int(slots[0].shape[1]) if slots else src.h
    sums = Sums(k, len(positions), src.t, length, capture_start, h, fit_idx, virt, dev)
    size = torch.empty((), dtype=_stage_dtype(src)).element_size()
    mapped = _mapped(src, positions, h) if dev.type == "cpu" and src.streams and k and fused.wanted(
        len(positions) * src.t * h * size) else None
    with _workers(dev) as (pool, workers):
        if dev.type == "cuda":
            _position_major(src, positions, sums, slots, train_start, progress, gpu=True)
        elif mapped is not None:
            with fused.LOCK:
                _fused_sweep(mapped, positions, sums, slots, train_start, progress, fit_candidates)
        elif src.streams:
            _token_major(src, positions, sums, slots, train_start, progress, fit_candidates, pool, workers)
        else:
            _position_major(src, positions, sums, slots, train_start, progress, gpu=False)
        return _assemble(sums, positions, columns, src, slots, train_start, fit_idx, virt, pool, mapped)


@contextmanager
def _workers(dev: torch.device) -> Iterator[tuple[ThreadPoolExecutor, int]]:
    """Worker threads running single-threaded torch ops on disjoint positions.

    torch's own (OpenMP) threads wait for each other at the end of every small op and stall
    badly when another process holds a core; plain threads on disjoint work do not.
    """
    before = torch.get_num_threads()
    workers = max(1, before) if dev.type == "cpu" else 1
    if dev.type == "cpu":
        torch.set_num_threads(1)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="eagleforensics-score")
    try:
        yield pool, workers
    finally:
        pool.shutdown(wait=True)
        torch.set_num_threads(before)


def _fill_y(yb: torch.Tensor, slots: list[torch.Tensor], row0: int) -> torch.Tensor:
    """Training rows [row0, row0+L) of every slot into ``yb`` [L, K, H] (converted to its dtype)."""
    for i, s in enumerate(slots):
        yb[:, i].copy_(s[row0:row0 + yb.shape[0]], non_blocking=True)
    return yb


def _segments(t: int, cs: int, lw: int, step: int) -> list[tuple[int, int, bool]]:
    """Row ranges of at most ``step`` rows covering [0, t), none straddling the aligned window's edges."""
    out: list[tuple[int, int, bool]] = []
    for a, b, win in ((0, cs, False), (cs, cs + lw, True), (cs + lw, t, False)):
        out += [(r, min(r + step, b), win) for r in range(a, b, step)]
    return out


def _stage_dtype(src: _Source) -> torch.dtype:
    return src.dtype if src.dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64) else torch.float32


def _read_block(src: _Source, positions: list[Position], a: int, b: int, buf: torch.Tensor) -> None:
    """Rows [a, b) of each of ``positions`` into ``buf`` [rows, G, H] (file reads scatter there directly)."""
    for g, pos in enumerate(positions):
        dst = buf[: b - a, g]
        got = src.rows(pos, a, b, out=dst if dst.dtype == src.dtype else None)
        if got.data_ptr() != dst.data_ptr():
            dst.copy_(got)


def _token_major(src: _Source, positions: list[Position], sums: Sums, slots: list[torch.Tensor], ts: int,
                 progress: Callable[[Position], None] | None, fit_candidates: int | None, pool: ThreadPoolExecutor,
                 workers: int) -> None:
    """CPU: a few rows of all positions at a time, positions split between workers; then the fitted columns."""
    h, cs, lw = sums.h, sums.cs, sums.lw
    stage = _stage_dtype(src)
    size = torch.empty((), dtype=stage).element_size()
    every = fit_candidates is None

    def sweep(group: list[Position], jobs: list[tuple[int, int, bool]], step: Callable[..., None]) -> None:
        g = len(group)
        lr = max(1, min(src.t, READ_ROWS, READ_BYTES // max(1, g * h * size)))
        parts = [(g * w // workers, g * (w + 1) // workers) for w in range(workers)]
        parts = [(a, b) for a, b in parts if b > a]
        scratch = [torch.empty((max(1, CHUNK_BYTES // max(1, (b - a) * h * 4)), b - a, h)) for a, b in parts]
        yb = torch.empty((lr, sums.k, h))
        bufs = [torch.empty((lr, g, h), dtype=stage) for _ in range(2)]

        def work(part: int, a: int, b: int, buf: torch.Tensor, y: torch.Tensor | None) -> None:
            g0, g1 = parts[part]
            xb = scratch[part]
            for c in range(a, b, xb.shape[0]):
                n = min(xb.shape[0], b - c)
                x = xb[:n]
                x.copy_(buf[c - a:c - a + n, g0:g1])
                step(x, g0, g1, c, None if y is None else y[c - a:c - a + n])

        for (a, b, win), _, buf in Prefetch(jobs, bufs, lambda j, buf: _read_block(src, group, j[0], j[1], buf)):
            y = sums.prep_y(_fill_y(yb[:b - a], slots, ts + a - cs), a - cs) if win else None
            for f in [pool.submit(work, i, a, b, buf, y) for i in range(len(parts))]:
                f.result()

    rows = max(1, min(READ_ROWS, READ_BYTES // max(1, len(positions) * h * size)))
    sweep(positions, _segments(src.t, cs, lw, rows),
          lambda x, g0, g1, c, y: sums.pass1(x, g0, c, y, fit=every))
    if progress is not None:
        for pos in positions:
            progress(pos)
    if not sums.virt or not lw:
        return
    if every:
        sums.fit()
        group = [positions[g] for g in sums.virt]
        sweep(group, [seg for seg in _segments(src.t, cs, lw, rows) if seg[2]],
              lambda x, g0, g1, c, y: sums.pass2(sums.unit(x, sums.virt[g0:g1], c), g0, c, y[:, sums.fit_idx]))
        return
    js = _candidates(sums, fit_candidates)
    for f in [pool.submit(_fit_position, src, positions, sums, slots, ts, j) for j in js]:
        f.result()


def _candidates(sums: Sums, m: int) -> list[int]:
    """Virtual-column indices at the ``m`` raw positions each fitted slot resembles most (direct cosine)."""
    score = sums.results(direct_only=True)["direct_score"]  # [K, P]
    chosen: set[int] = set()
    for i in sums.fit_idx:
        ranked = sorted((float(score[i, g]), j) for j, g in enumerate(sums.virt) if score[i, g] == score[i, g])
        chosen.update(j for _, j in ranked[-m:])
    return sorted(chosen)


def _fit_position(src: _Source, positions: list[Position], sums: Sums, slots: list[torch.Tensor], ts: int,
                  j: int) -> None:
    """The fitted column of virtual index ``j``: its position's aligned rows read once, fitted, scored."""
    h, cs, lw = sums.h, sums.cs, sums.lw
    g = sums.virt[j]
    fitted = [slots[i] for i in sums.fit_idx]
    lc = max(1, min(lw, CHUNK_BYTES // max(1, h * 4)))
    yb = sums.scratch("fit_y", (lc, len(fitted), h))
    xs = sums.scratch("fit_x", (lc, 1, h))
    raw = sums.scratch("fit_raw", (lc, h), _stage_dtype(src))

    def blocks() -> Iterable[tuple[int, torch.Tensor, torch.Tensor]]:
        for a in range(0, lw, lc):
            n = min(lc, lw - a)
            x = xs[:n]
            x[:, 0].copy_(src.rows(positions[g], cs + a, cs + a + n, out=raw))
            y = _fill_y(yb[:n], fitted, ts + a)
            ok = sums.y_ok[a:a + n, sums.fit_idx]
            if not bool(ok.all()):  # bad training rows zeroed as pass 1 found them
                y.masked_fill_(~ok.unsqueeze(-1), 0.0)
            yield cs + a, sums.unit(x, [g], cs + a), y

    for _r0, u, y in blocks():
        sums.accumulate(u, g, y)
    sums.fit([j])
    for r0, u, y in blocks():
        sums.pass2(u, j, r0, y)


def _position_major(src: _Source, positions: list[Position], sums: Sums, slots: list[torch.Tensor], ts: int,
                    progress: Callable[[Position], None] | None, gpu: bool) -> None:
    """One position at a time (whole position read once), reduced in token chunks; GPU copies overlap reads."""
    dev, h, cs, lw, t = sums.device, sums.h, sums.cs, sums.lw, src.t
    stage = _stage_dtype(src)
    lc = t if gpu else max(1, CHUNK_BYTES // max(1, h * 4 * max(1, sums.k)))
    y_all = sums.prep_y(_fill_y(torch.empty((lw, sums.k, h), device=dev), slots, ts), 0) if gpu else None
    yb = None if gpu else torch.empty((lc, sums.k, h))
    virt_of = {g: j for j, g in enumerate(sums.virt)}
    wanted = int(os.environ.get("EAGLEFORENSICS_READERS", "0") or 0) or GPU_READERS
    readers = max(1, min(wanted, (os.cpu_count() or 2) // 2)) if gpu else 1
    if gpu:
        bufs = [torch.empty((t, h), dtype=stage).pin_memory() for _ in range(readers + 2)]
        fill: Callable[[Any, Any], Any] = lambda job, buf: _read_block(src, [job[1]], 0, t, buf.unsqueeze(1))
        on_dev = [torch.empty((t, h), dtype=stage, device=dev) for _ in range(2)]
        copy_stream = torch.cuda.Stream(device=dev)
        done = [torch.cuda.Event() for _ in on_dev]
    else:
        bufs = [None, None]  # type: ignore[list-item]
        fill = lambda job, _buf: src.full(job[1])
    feed = Prefetch(list(enumerate(positions)), bufs, fill, hold=gpu, readers=readers)
    for step, ((g, pos), got, buf) in enumerate(feed):
        if gpu:
            slot = step % 2
            with torch.cuda.stream(copy_stream):
                copy_stream.wait_event(done[slot])
                x_full = on_dev[slot].copy_(buf, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(copy_stream)
            torch.cuda.current_stream(dev).wait_event(copied)
            copied.synchronize()
            feed.release(buf)
        else:
            x_full = got

        def block(a: int, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
            x = x_full[a:a + n].to(dev, torch.float32, copy=True).unsqueeze(1)
            if not (cs <= a < cs + lw):
                return x, None
            if gpu:
                return x, y_all[a - cs:a - cs + n]
            return x, sums.prep_y(_fill_y(yb[:n], slots, ts + a - cs), a - cs)

        segs = _segments(t, cs, lw, lc)
        for a, b, _ in segs:
            x, y = block(a, b - a)
            sums.pass1(x, g, a, y, fit=g in virt_of)
        if g in virt_of and lw:
            sums.fit([virt_of[g]])  # pass1 accumulated this position's normal equations
            for a, b, win in segs:
                if win:
                    x, y = block(a, b - a)
                    sums.pass2(sums.unit(x, [g], a), virt_of[g], a, y[:, sums.fit_idx])
        if gpu:
            done[slot].record(torch.cuda.current_stream(dev))
        if progress is not None:
            progress(pos)
        del x_full


def _assemble(sums: Sums, positions: list[Position], columns: list[Position], src: _Source,
              slots: list[torch.Tensor], ts: int, fit_idx: list[int], virt: list[int],
              pool: ThreadPoolExecutor, mapped: fused.Stored | None = None) -> ScoreMatrix:
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
        out[name][:, direct] = res[f"direct_{name}"].numpy()
    tokens[:, direct] = res["direct_tokens"].numpy()
    per_token[:, direct] = res["direct_per_token"].numpy()
    if "fitted_score" in res:
        fitted = [col[Position(positions[g].p, True)] for g in virt]
        rows = np.array(fit_idx)[:, None]
        for name in ("score", "rel_diff", "norm_ratio"):
            out[name][rows, fitted] = res[f"fitted_{name}"].numpy()
        tokens[rows, fitted] = res["fitted_tokens"].numpy()
        per_token[rows, fitted] = res["fitted_per_token"].numpy()
    xx = sums.xx.cpu()
    norms = {p: xx[g].clamp_min(0).sqrt().numpy() for g, p in enumerate(positions)}
    bad = sums.bad.sum(1).cpu()
    nonfinite = {p: int(bad[g]) for g, p in enumerate(positions)}
    _fill_max_abs(out["score"], out["max_abs"], columns, positions, sums, src, slots, ts, fit_idx, virt, pool,
                  mapped)
    steps = None if sums.adj is None else steps_from(sums.adj, sums.xx.numpy(), sums.bad.numpy(), positions,
                                                     sums.cs, sums.lw)
    return ScoreMatrix(columns, out["score"], out["rel_diff"], out["max_abs"], out["norm_ratio"], tokens,
                       per_token, norms, nonfinite, device=str(sums.device), steps=steps)


def _fill_max_abs(score: np.ndarray, max_abs: np.ndarray, columns: list[Position], positions: list[Position],
                  sums: Sums, src: _Source, slots: list[torch.Tensor], ts: int, fit_idx: list[int],
                  virt: list[int], pool: ThreadPoolExecutor, mapped: fused.Stored | None = None) -> None:
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
    dev, cs, lw, h = sums.device, sums.cs, sums.lw, sums.h
    step = max(1, CHUNK_BYTES // max(1, h * 4))

    def one(g: int, cells: list[tuple[int, int, int | None]]) -> None:
        worst = [0.0] * len(cells)
        raw = sums.scratch("abs_raw", (step, h), _stage_dtype(src)) if dev.type == "cpu" else None
        for a in range(0, lw, step):
            n = min(step, lw - a)
            x = sums.scratch("abs_x", (n, h))
            x.copy_(src.rows(positions[g], cs + a, cs + a + n, out=raw))
            ok_x = ~sums.bad[g, cs + a:cs + a + n]
            x.masked_fill_(~ok_x.unsqueeze(1), 0.0)
            for c, (i, _j, vj) in enumerate(cells):
                y = sums.scratch("abs_y", (n, h))
                y.copy_(slots[i][ts + a:ts + a + n])
                ok = ok_x & sums.y_ok[a:a + n, i]
                pred = x
                if vj is not None and sums.gain is not None:
                    xx = sums.xx[g, cs + a:cs + a + n].unsqueeze(1)
                    scale = torch.rsqrt(torch.where(ok_x.unsqueeze(1), xx, 0.0) / h + 1e-12)
                    pred = x * scale * sums.gain[vj, fit_idx.index(i)]
                y.sub_(pred).abs_().masked_fill_(~ok.unsqueeze(1), 0.0)
                worst[c] = max(worst[c], float(y.amax()) if y.numel() else 0.0)
        for c, (i, j, _vj) in enumerate(cells):
            max_abs[i, j] = worst[c] if math.isfinite(worst[c]) else np.nan

    if mapped is not None:  # compiled kernels, one at a time (each is parallel already)
        with fused.LOCK:
            _fused_cells(mapped, sums, wanted, slots, ts, fit_idx, max_abs)
        return
    for f in [pool.submit(one, g, cells) for g, cells in wanted.items()]:
        f.result()


def _fused_cells(mapped: fused.Stored, sums: Sums, wanted: dict[int, list[tuple[int, int, int | None]]],
                 slots: list[torch.Tensor], ts: int, fit_idx: list[int], max_abs: np.ndarray) -> None:
    """``_fill_max_abs`` through the compiled kernel: position g of each (slot i, column j, virtual j) cell."""
    for g, cells in wanted.items():
        for i, j, vj in cells:
            f = fit_idx.index(i) if vj is not None else 0
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


def _fused_sweep(m: fused.Stored, positions: list[Position], sums: Sums, slots: list[torch.Tensor], ts: int,
                 progress: Callable[[Position], None] | None, fit_candidates: int | None) -> None:
    """CPU, compiled: one pass over every row of every position (norms, slot products, and each row's
    product with the position below, ``sums.adj``, for the capture's layer step); then the fitted
    columns (two reads of each candidate)."""
    cs, lw = sums.cs, sums.lw
    xx, bad, dot = sums.xx.numpy(), sums.bad.numpy(), sums.dot.numpy()
    yy, y_ok = sums.yy.numpy(), sums.y_ok.numpy()
    sums.adj = np.full(xx.shape, np.nan, np.float32)
    fused.direct(m, slots, ts, cs, lw, lower_neighbours(positions), xx, bad, dot, yy, y_ok, sums.adj)
    if progress is not None:
        for pos in positions:
            progress(pos)
    if not sums.virt or not lw:
        return
    js = list(range(len(sums.virt))) if fit_candidates is None else _candidates(sums, fit_candidates)
    assert sums.num is not None and sums.den is not None and sums.gain is not None
    fdot, fpp, gain = sums.fdot.numpy(), sums.fpp.numpy(), sums.gain.numpy()
    for j in js:
        g = sums.virt[j]
        for f, i in enumerate(sums.fit_idx):
            num, den = fused.fit_equations(m, g, slots[i][ts:ts + lw], i, cs, lw, xx, bad, y_ok)
            sums.num[g, f] = torch.from_numpy(num)
            sums.den[g] = torch.from_numpy(den)
        sums.fit([j])
        for f, i in enumerate(sums.fit_idx):
            fused.fit_scores(m, g, slots[i][ts:ts + lw], i, cs, lw, xx, bad, y_ok, gain, j, f, fdot, fpp)


def _fused_max_abs(m: fused.Stored, sums: Sums, g: int, y: torch.Tensor, i: int, vj: int | None, f: int) -> float:
    """max |training - capture| of slot i against position g (or its fitted column ``vj``, slot ``f`` of the fit)."""
    if sums.lw == 0:
        return 0.0
    out = fused.max_abs(m, g, y, i, sums.cs, sums.lw, sums.xx.numpy(), sums.bad.numpy(), sums.y_ok.numpy(),
                        sums.gain.numpy() if sums.gain is not None else None, vj, f)
    worst = float(out.max())
    return worst if math.isfinite(worst) else float("nan")
