"""The scorer's hot loops as compiled kernels (numba): each capture row read once, straight from the file.

Every capture position of a sweep lies in a file (safetensors, zip .pt, one file per
position); the file is memory-mapped and each kernel reads the stored bits as 16-bit
integers (bf16 is the top half of a float32: a shift; fp16 is rebuilt from its fields; fp32
from two halves), widened into a small per-thread row buffer, and keeps what ``sums.Sums``
keeps, in one pass, in parallel:

* ``direct``: every row's squared norm and finiteness, and for aligned rows the dot product
  with every slot and the slots' own norms;
* ``fit_equations`` / ``fit_scores``: the gain normal equations of a post-norm slot against
  a raw position, then each token's products with the fitted gain (two reads of that position);
* ``max_abs``: the largest |training - capture| over valid tokens of one cell.

Sums are float32 over blocks of 256 values (vectorised), added up in float64, so results agree
with the numpy path (float32 throughout) to float32 rounding. Every array reaches a kernel as
the same numba type whatever the dtypes (a flat uint16 view plus offsets and row strides), so
each kernel compiles once. Mapped pages are dropped after each block
(``MADV_DONTNEED``): they stay in the page cache but leave the process's resident memory.

A file cut short before it is mapped goes to the numpy path, which names the error; one cut short
*while* it is being read ends the process with SIGBUS (a mapping cannot raise), where the numpy
path's reads would raise a one-line error.

Without numba, or for small inputs, the numpy path in ``match`` runs instead (torch on CUDA). The compiled code is
cached next to this file, or in numba's user cache; where neither is writable (a read-only
install) it is compiled in memory at each start instead.
"""
from __future__ import annotations

import importlib.util
import mmap
import os
import types
import threading
from typing import Any, Callable

import numpy as np

from ..arrays import as_array, dtype_name, f32

prange = range  # numba.prange once ``kernels()`` has imported numba (0.3 s, paid only when they are used)
LOCK = threading.RLock()  # one launch at a time: numba's workqueue pool takes no concurrent launches

_MODE = os.environ.get("EAGLEFORENSICS_FUSED", "auto")  # 0: never, 1: always, auto: by size
AVAILABLE = _MODE != "0" and importlib.util.find_spec("numba") is not None
# Below this many bytes to read the work goes to numpy: loading the kernels' cached machine code
# (~0.5 s, and numba's import) costs more than scoring a small capture takes.
MIN_BYTES = 0 if _MODE == "1" else 64 << 20
BF16, F16, F32 = 0, 1, 2  # how a kernel widens stored values; all arrive as uint16 (fp32 as two)
EPS = 1e-12  # as sums.EPS / norms.unit_rms
BLOCK = 256  # elements summed in float32 (vectorised) before each float64 addition
REMAP_MARGIN = 2 << 20  # bytes around a dropped block that are dropped again (see ``Mapped.drop``)
Y_BYTES = 512 << 10  # widened training rows per ``direct`` call: they stay in L2 cache while every position meets them
_FLAGS = {"reassoc", "contract"}  # lets sums vectorise; no nnan/ninf: NaN/Inf rows must stay visible


def _jit(numba: Any, fn: Callable[..., Any], parallel: bool = True) -> Any:
    """``njit(parallel, cache=True)``; in memory only where no cache folder can be written (read-only install)."""
    opts = dict(parallel=parallel, nogil=True, fastmath=_FLAGS)
    try:
        return numba.njit(cache=True, **opts)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return numba.njit(cache=False, **opts)(fn)


def _units(kind: int) -> int:
    """uint16 units per stored value."""
    return 2 if kind == F32 else 1


def _widen(src: Any, start: int, n: int, kind: int, out: Any, bits: Any) -> None:
    """n stored values from unit ``start`` of uint16 ``src`` into float32 ``out`` (``bits``: it as uint32)."""
    if kind == BF16:  # bf16 is the top half of a float32
        for h in range(n):
            bits[h] = np.uint32(src[start + h]) << np.uint32(16)
    elif kind == F32:  # little-endian halves
        for h in range(n):
            bits[h] = np.uint32(src[start + 2 * h]) | (np.uint32(src[start + 2 * h + 1]) << np.uint32(16))
    else:  # fp16: magnitude bits moved into float32 place and rescaled; Inf/NaN and sign set apart
        for h in range(n):
            bits[h] = (np.uint32(src[start + h]) & np.uint32(0x7FFF)) << np.uint32(13)
        for h in range(n):
            out[h] *= np.float32(5.192296858534828e33)  # 2**112: the exponent bias difference
        for h in range(n):
            v = np.uint32(src[start + h])
            sign = (v & np.uint32(0x8000)) << np.uint32(16)
            if (v & np.uint32(0x7C00)) == np.uint32(0x7C00):
                bits[h] = sign | np.uint32(0x7F800000) | ((v & np.uint32(0x3FF)) << np.uint32(13))
            else:
                bits[h] |= sign


def _sq64(x: Any, n: int) -> float:
    """sum(x*x): float32 partial sums over blocks of BLOCK (vectorised), added up in float64."""
    total = 0.0
    nb = n // BLOCK
    for b in range(nb + 1):
        b0 = b * BLOCK
        acc = np.float32(0.0)
        for q in range(BLOCK if b < nb else n - b0):
            v = x[b0 + q]
            acc += v * v
        total += acc
    return total


def _sq_exact(x: Any, n: int) -> float:
    """sum(x*x) in float64 throughout: where the float32 partial sums overflowed, the row may still
    be finite (values above ~1e19). Non-finite exactly when a value is NaN or Inf."""
    total = 0.0
    for h in range(n):
        v = np.float64(x[h])
        total += v * v
    return total


def _dot64(x: Any, y: Any, n: int) -> float:
    """sum(x*y), summed as ``_sq64``."""
    total = 0.0
    nb = n // BLOCK
    for b in range(nb + 1):
        b0 = b * BLOCK
        acc = np.float32(0.0)
        for q in range(BLOCK if b < nb else n - b0):
            acc += x[b0 + q] * y[b0 + q]
        total += acc
    return total


def _row4(x: Any, y0: Any, y1: Any, y2: Any, y3: Any, n: int, out: Any) -> None:
    """out = [x.x, x.y0, x.y1, x.y2, x.y3] in one read of x (summed as ``_sq64``)."""
    s = 0.0
    t0 = 0.0
    t1 = 0.0
    t2 = 0.0
    t3 = 0.0
    nb = n // BLOCK
    for b in range(nb + 1):
        b0 = b * BLOCK
        aa = np.float32(0.0)
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        a3 = np.float32(0.0)
        for q in range(BLOCK if b < nb else n - b0):
            h = b0 + q
            v = x[h]
            aa += v * v
            a0 += v * y0[h]
            a1 += v * y1[h]
            a2 += v * y2[h]
            a3 += v * y3[h]
        s += aa
        t0 += a0
        t1 += a1
        t2 += a2
        t3 += a3
    out[0] = s
    out[1] = t0
    out[2] = t1
    out[3] = t2
    out[4] = t3


def _scale(xx: Any, h: int) -> Any:
    """1 / rms of a row from its squared norm, in float32 as the numpy path computes it."""
    return np.float32(1.0) / np.sqrt(np.float32(xx) / np.float32(h) + np.float32(EPS))


def _direct(base: Any, gidx: Any, offs: Any, h: int, kind: int, r0: int, r1: int, cs: int, lw: int,
            yb: Any, yoff: int, yrow: int, yslot: int, ykind: int, widen_y: bool, yw: Any,
            xx: Any, bad: Any, dot: Any, yy: Any, y_ok: Any) -> None:
    """Rows [r0, r1) of the positions ``gidx`` (row 0 of each at unit ``offs`` of ``base``, one file):
    squared norms and finiteness; in the aligned window also the slot products. Training row r of
    the window part of [r0, r1), slot k, starts at unit ``yoff + r*yrow + k*yslot`` of ``yb``; they
    are widened into ``yw`` [>= rows, K rounded up to 4, H] when ``widen_y`` (else ``yw`` holds them
    from a call on another file). Outputs are ``Sums``' arrays (xx, bad [P, T]; dot [Lw, P, K];
    yy, y_ok [Lw, K]); a bad row is zero in every product, as in the numpy path.

    The training rows are widened once (a few rows, sized to stay in L2 cache); then each
    position's rows are read in file order, one position per work item."""
    k_count = dot.shape[2]
    k_pad = yw.shape[1]
    wa, wb = max(r0, cs), min(r1, cs + lw)
    step = h * _units(kind)
    for r in prange(max(0, wb - wa) if widen_y else 0):
        j = wa + r - cs
        for k in range(k_pad):
            if k >= k_count:
                yw[r, k, :] = 0.0
                continue
            _widen(yb, yoff + r * yrow + k * yslot, h, ykind, yw[r, k], yw[r, k].view(np.uint32))
            s = _sq64(yw[r, k], h)
            if not np.isfinite(s):
                s = _sq_exact(yw[r, k], h)
            ok = np.isfinite(s)
            y_ok[j, k] = ok
            yy[j, k] = np.float32(s) if ok else 0.0
            if not ok:
                yw[r, k, :] = 0.0
    for q in prange(offs.shape[0]):
        g = gidx[q]
        xf = np.empty(h, np.float32)
        xu = xf.view(np.uint32)
        part = np.empty(5)
        for i in range(r0, r1):
            _widen(base, offs[q] + i * step, h, kind, xf, xu)
            if not (wa <= i < wb):
                s = _sq64(xf, h)
            else:
                yr = yw[i - wa]
                for k0 in range(0, k_pad, 4):
                    _row4(xf, yr[k0], yr[k0 + 1], yr[k0 + 2], yr[k0 + 3], h, part)
                    if k0 == 0:
                        s = part[0]
                    for k in range(k0, min(k0 + 4, k_count)):
                        dot[i - cs, g, k] = np.float32(part[1 + k - k0])
            if not np.isfinite(s):
                s = _sq_exact(xf, h)
            xx[g, i] = np.float32(s)
            rowbad = not np.isfinite(s)  # a NaN/Inf row: recorded, and zero in every product
            bad[g, i] = rowbad
            if rowbad and wa <= i < wb:
                for k in range(k_count):
                    dot[i - cs, g, k] = 0.0


def _fit_equations(base: Any, off: int, h: int, kind: int, cs: int, lw: int, xx: Any, bad: Any, g: int,
                   yb: Any, yoff: int, yrow: int, ykind: int, y_ok: Any, col: int, num: Any, den: Any,
                   work: int) -> None:
    """Gain normal equations of position g (rows from unit ``off`` of ``base``) and one slot (aligned
    row j from unit ``yoff + j*yrow`` of ``yb``; validity ``y_ok[:, col]``) over the window:
    num = sum u*y, den = sum u*u with u = x / rms(x), bad rows counting as zero. Parallel over
    slices of H, each summing every token in float64."""
    step = h * _units(kind)
    yu_ = _units(ykind)
    xu_ = _units(kind)
    for w in prange(work):
        h0, h1 = h * w // work, h * (w + 1) // work
        m = h1 - h0
        xf = np.empty(m, np.float32)
        xu = xf.view(np.uint32)
        yf = np.empty(m, np.float32)
        yu = yf.view(np.uint32)
        acc_n = np.zeros(m)
        acc_d = np.zeros(m)
        for j in range(lw):
            i = cs + j
            if bad[g, i]:
                continue
            scale = _scale(xx[g, i], h)
            _widen(base, off + i * step + h0 * xu_, m, kind, xf, xu)
            for q in range(m):
                xf[q] *= scale
                acc_d[q] += np.float64(xf[q]) * np.float64(xf[q])
            if y_ok[j, col]:
                _widen(yb, yoff + j * yrow + h0 * yu_, m, ykind, yf, yu)
                for q in range(m):
                    acc_n[q] += np.float64(xf[q]) * np.float64(yf[q])
        for q in range(m):
            den[h0 + q] = acc_d[q]
            num[h0 + q] = acc_n[q]


def _fit_scores(base: Any, off: int, h: int, kind: int, cs: int, lw: int, xx: Any, bad: Any, g: int,
                yb: Any, yoff: int, yrow: int, ykind: int, y_ok: Any, col: int, gain: Any, vj: int, f: int,
                fdot: Any, fpp: Any, work: int) -> None:
    """Per aligned token of position g against fitted gain ``gain[vj, f]``: pred = gain * u;
    fdot[j, vj, f] = pred . y, fpp[j, vj, f] = |pred|^2 (arguments as ``fit_equations``)."""
    step = h * _units(kind)
    for w in prange(work):
        xf = np.empty(h, np.float32)
        xu = xf.view(np.uint32)
        yf = np.empty(h, np.float32)
        yu = yf.view(np.uint32)
        for j in range(lw * w // work, lw * (w + 1) // work):
            i = cs + j
            if bad[g, i]:
                fdot[j, vj, f] = 0.0
                fpp[j, vj, f] = 0.0
                continue
            scale = _scale(xx[g, i], h)
            _widen(base, off + i * step, h, kind, xf, xu)
            for q in range(h):
                xf[q] = xf[q] * scale * gain[vj, f, q]
            fpp[j, vj, f] = np.float32(_sq64(xf, h))
            if y_ok[j, col]:
                _widen(yb, yoff + j * yrow, h, ykind, yf, yu)
                fdot[j, vj, f] = np.float32(_dot64(xf, yf, h))
            else:
                fdot[j, vj, f] = 0.0


def _max_abs(base: Any, off: int, h: int, kind: int, cs: int, lw: int, xx: Any, bad: Any, g: int,
             yb: Any, yoff: int, yrow: int, ykind: int, y_ok: Any, col: int, gain: Any, vj: int, f: int,
             fitted: bool, out: Any, work: int) -> None:
    """out[j] = max |y - pred| of aligned token j (0 where either row is bad); pred = x, or with
    ``fitted`` gain[vj, f] * x / rms(x) (arguments as ``fit_equations``)."""
    step = h * _units(kind)
    for w in prange(work):
        xf = np.empty(h, np.float32)
        xu = xf.view(np.uint32)
        yf = np.empty(h, np.float32)
        yu = yf.view(np.uint32)
        for j in range(lw * w // work, lw * (w + 1) // work):
            i = cs + j
            out[j] = 0.0
            if bad[g, i] or not y_ok[j, col]:
                continue
            _widen(base, off + i * step, h, kind, xf, xu)
            _widen(yb, yoff + j * yrow, h, ykind, yf, yu)
            if fitted:
                scale = _scale(xx[g, i], h)
                for q in range(h):
                    xf[q] = abs(yf[q] - xf[q] * scale * gain[vj, f, q])
            else:
                for q in range(h):
                    xf[q] = abs(yf[q] - xf[q])
            worst = np.uint32(0)
            for q in range(h):  # non-negative floats order as their bits: an integer max vectorises
                worst = max(worst, xu[q])
            xu[0] = worst
            out[j] = xf[0]


def _row_stats(yb: Any, yoff: int, yrow: int, t: int, h: int, ykind: int, norms: Any, bad: Any, work: int) -> None:
    """Per row of a [t, H] tensor (row r from unit ``yoff + r*yrow`` of ``yb``): L2 norm (float32), NaN/Inf flag."""
    for w in prange(work):
        xf = np.empty(h, np.float32)
        xu = xf.view(np.uint32)
        for r in range(t * w // work, t * (w + 1) // work):
            _widen(yb, yoff + r * yrow, h, ykind, xf, xu)
            s = _sq64(xf, h)
            if not np.isfinite(s):
                s = _sq_exact(xf, h)
            norms[r] = np.float32(np.sqrt(s))
            bad[r] = not np.isfinite(s)


_KERNELS: types.SimpleNamespace | None = None


def kernels() -> types.SimpleNamespace:
    """The compiled kernels (``direct``, ``fit_equations``, ``fit_scores``, ``max_abs``, ``row_stats``):
    numba imported, each loaded from its cache (or compiled) on first call."""
    global _KERNELS, prange
    with LOCK:
        if _KERNELS is None:
            import numba

            if not os.environ.get("NUMBA_THREADING_LAYER"):
                # numba's own pthread pool: its threads sleep when idle. OpenMP threads spin at every
                # join, and with another process on a core a 2-thread kernel ran 5-10x slower.
                numba.config.THREADING_LAYER = "workqueue"
            prange = numba.prange
            g = globals()
            for name in ("_units", "_widen", "_sq64", "_dot64", "_row4", "_scale"):
                g[name] = numba.njit(inline="always", fastmath=_FLAGS)(g[name])
            g["_sq_exact"] = numba.njit(fastmath=_FLAGS)(g["_sq_exact"])
            _KERNELS = types.SimpleNamespace(
                direct=_jit(numba, _direct), fit_equations=_jit(numba, _fit_equations),
                fit_scores=_jit(numba, _fit_scores), max_abs=_jit(numba, _max_abs),
                row_stats=_jit(numba, _row_stats), threads=int(numba.get_num_threads()))
    return _KERNELS


def wanted(nbytes: int) -> bool:
    """Whether to score ``nbytes`` of stored values with the kernels: numba present and allowed, and
    the work large enough to pay for loading them. By size alone, never by what ran before in the
    process, so one input always gets the same numbers (the two paths differ in the last bits)."""
    return AVAILABLE and nbytes >= MIN_BYTES


# ---- arrays and files as the kernels' uint16 views -----------------------------------------------

_KINDS = {"bfloat16": BF16, "float16": F16, "float32": F32}


def kind_of(dtype: Any) -> int | None:
    """The kernel kind of a numpy (or torch) dtype, None when the kernels do not read it."""
    return _KINDS.get(dtype_name(dtype))


class Rows:
    """A [T, H] array as the kernels read it: its memory as flat uint16 from row 0, units between
    rows, and its kind. Not bf16/fp16/fp32, or with strided columns: a float32 copy (``copied``)."""

    def __init__(self, a: Any) -> None:
        a = as_array(a)
        if a.ndim == 1:
            a = a.reshape(1, -1)
        self.copied = kind_of(a.dtype) is None or (a.shape[1] > 1 and a.strides[1] != a.itemsize) \
            or a.strides[0] < 0
        if self.copied:
            a = np.ascontiguousarray(f32(a))
        units = a.itemsize // 2
        rows, cols = int(a.shape[0]), int(a.shape[1])
        self.row = (a.strides[0] // 2) if rows > 1 else cols * units
        extent = (rows - 1) * self.row + cols * units if rows and cols else 0
        # a 1-D uint16 window over exactly the bytes the rows span (a view, no copy)
        self.base = np.lib.stride_tricks.as_strided(a.view(np.uint16), shape=(extent,), strides=(2,), writeable=False)
        self.off = 0
        self.kind = kind_of(a.dtype)
        self.keep = a  # the memory must outlive the view


def row_stats(a: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """(per-row L2 norms float32, per-row NaN/Inf flags) of a [T, H] array in one compiled pass, or
    None where the kernels should not read it (no numba, too small to pay for loading them, another
    dtype, strided columns)."""
    a = as_array(a)
    if a.ndim != 2 or kind_of(a.dtype) is None or (a.shape[1] > 1 and a.strides[1] != a.itemsize) \
            or not wanted(a.size * a.itemsize):
        return None
    k = kernels()
    with LOCK:
        y = Rows(a)
        norms = np.empty(a.shape[0], np.float32)
        bad = np.empty(a.shape[0], bool)
        k.row_stats(y.base, y.off, y.row, a.shape[0], a.shape[1], y.kind, norms, bad,
                    max(1, min(a.shape[0], 4 * k.threads)))
    return norms, bad


class Mapped:
    """Every position of a capture as (file index, uint16 offset) into read-only maps of its files.

    Built only when each position is a plain row-major [T, H] block of one file at an even byte
    offset, all of one dtype the kernels read (bf16, fp16, fp32); else ``of`` is None.
    """

    def __init__(self, maps: list[mmap.mmap], arrays: list[np.ndarray], fidx: np.ndarray, offs: np.ndarray,
                 kind: int, itemsize: int, h: int) -> None:
        self.maps, self.arrays, self.fidx, self.offs = maps, arrays, fidx, offs
        self.kind, self.itemsize, self.h = kind, itemsize, h
        self.page = mmap.PAGESIZE
        self.t = 0  # rows per position

    @classmethod
    def of(cls, rows: list[Any], h: int) -> "Mapped | None":
        """``rows``: one ``filerows.FileRows`` per position (in the scorer's order)."""
        if not rows or not AVAILABLE:
            return None
        kinds = {kind_of(r.dtype) for r in rows}
        if len(kinds) != 1 or None in kinds:
            return None
        (kind,) = kinds
        if any(r.cols != h or r.offset % 2 for r in rows):
            return None
        files: dict[str, int] = {}
        maps: list[mmap.mmap] = []
        arrays: list[np.ndarray] = []
        fidx, offs = [], []
        try:
            for r in rows:
                if r.path not in files:
                    with open(r.path, "rb") as fh:
                        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                    files[r.path] = len(maps)
                    maps.append(mm)
                    arrays.append(np.frombuffer(mm, dtype=np.uint16, count=len(mm) // 2))
                if r.offset + r.rows * r.row_bytes > len(maps[files[r.path]]):
                    return None  # the file is shorter than its header says: the numpy path names the error
                fidx.append(files[r.path])
                offs.append(r.offset // 2)
        except (OSError, ValueError):
            return None
        out = cls(maps, arrays, np.array(fidx, np.int64), np.array(offs, np.int64), kind, 4 if kind == F32 else 2, h)
        out.t = rows[0].rows
        return out

    def groups(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per file: (its uint16 view, the indices of its positions, their unit offsets)."""
        out = []
        for f, arr in enumerate(self.arrays):
            idx = np.flatnonzero(self.fidx == f).astype(np.int64)
            out.append((arr, idx, self.offs[idx]))
        return out

    def drop(self, r0: int, r1: int, positions: Any = None) -> None:
        """Unmap rows [r0, r1) of the given positions (all by default) from this process; the page cache keeps them."""
        row = self.h * self.itemsize
        for g in (range(len(self.offs)) if positions is None else positions):
            mm = self.maps[self.fidx[g]]
            first = int(self.offs[g]) * 2
            # from a little before r0: a fault maps the pages around it (fault-around, or a whole large
            # folio of the page cache, up to 2 MB), so the block after the last drop re-mapped some
            # pages before it; the same past a position's last row
            a = max(first, first + r0 * row - REMAP_MARGIN)
            start = a - a % self.page
            stop = min(len(mm), first + r1 * row + (REMAP_MARGIN if r1 >= self.t else 0))
            if stop > start:
                try:
                    mm.madvise(mmap.MADV_DONTNEED, start, stop - start)
                except (OSError, AttributeError, ValueError):  # pragma: no cover - platforms without madvise
                    return
