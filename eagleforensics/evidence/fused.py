"""The scorer's hot loops as compiled kernels (numba): each capture row read once, straight from its file.

Every capture position of a sweep lies in a file (safetensors, zip .pt, one file per
position) as a row-major [T, H] block. Each kernel thread copies a few rows at a time into
its own buffer with ``pread``, widens the stored values as it loads them (bf16 is the top half
of a float32: a shift; fp16 by the CPU's conversion; fp32 as stored) and keeps what
``sums.Sums`` keeps, in one pass, in parallel over tokens. (The page cache's copy runs at ~20 GB/s
a core here. A memory map skips it and was 1.2x faster where the cache holds 2 MB folios, but 2x
slower on a file read back 4 KB at a time, and a file cut short while mapped ends the process
with SIGBUS.) The kernels:

* ``direct``: token-major. A thread takes a range of tokens, 4 at a time: one read per
  position brings those rows of every position into its buffer, and their training rows are
  widened once. Then per token, H is walked in pieces of 2048 values, so the slots' pieces
  stay in L1 cache while every position's piece meets them: each row's squared norm and
  finiteness, for aligned rows the dot product with every slot, and the dot product with the
  same token's row of the position below it (``adj``: the capture's own layer step, so
  identity needs no second read for it, see ``steps``);
* ``fit_equations`` / ``fit_scores``: the gain normal equations of a post-norm slot against
  a raw position, then each token's products with the fitted gain (two reads of that position);
* ``max_abs``: the largest |training - capture| over valid tokens of one cell.

Sums are float32 over blocks (256 values, 2048 in ``direct``; vectorised, each lane summing a
few), added up in float64, so results agree with the numpy path (float32 throughout) to
float32 rounding. Every array reaches a kernel as the same numba type whatever the dtypes
(flat uint16 buffers plus offsets and row strides), so each kernel compiles once. Nothing is
mapped: the process holds only the per-thread buffers (a few MB), whatever the capture's size.

A file cut short (or truncated while it is read) gives a short read, which the kernel reports
and ``Stored.check`` turns into a one-line error naming the file.

Without numba (or for small captures, or off POSIX) the numpy path in ``match`` runs instead (CUDA: ``gpu``). The
compiled code is cached next to this file, or in numba's user cache (``kernelcache`` says where). A
machine whose cache does not hold it yet gets the numpy path while one detached process compiles it
(``compile_into_cache``): no command waits for the compiler. Where no cache can be written (a read-only
install) the numpy path stays. ``align`` starts loading the cached code on a background thread while it
reads the inputs (``preload``).
"""
from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import threading
import types
from typing import Any, Callable, Iterator

import numpy as np

from .. import process
from ..arrays import BF16 as BF16_NP, as_array, dtype_name, f32
from ..errors import ForensicsError
from ..io.guards import open_regular_fd
from . import cachetrust, kernelcache

prange = range  # numba.prange once ``kernels()`` has imported numba (0.3 s, paid only when they are used)
_pread: Any = None  # libc's pread as numba calls it, set by ``kernels()``
_IN_MEMORY: list[str] = []  # kernels numba could not cache (no folder it may write): compiled per process
LOCK = threading.RLock()  # one launch at a time: numba's workqueue pool takes no concurrent launches

_MODE = os.environ.get("EAGLEFORENSICS_FUSED", "auto")  # 0: never, 1: always, auto: by size
AVAILABLE = _MODE != "0" and importlib.util.find_spec("numba") is not None and os.name == "posix"
# Below this many bytes to read the work goes to numpy: loading the kernels' cached machine code
# (~0.5 s, and numba's import) costs more than scoring a small capture takes.
MIN_BYTES = 0 if _MODE == "1" else 64 << 20
BF16, F16, F32 = 0, 1, 2  # how a kernel widens stored values; all arrive as uint16 (fp32 as two)
EPS = 1e-12  # as sums.EPS / norms.unit_rms
BLOCK = 256  # elements summed in float32 (vectorised) before each float64 addition
READ_ROWS = 4  # rows of a position per read (``direct``: of every position at once, into L2/L3)
CHUNK = 2048  # values of a row met at once in ``direct``: four slots' pieces (32 KB) stay in L1 cache
_FLAGS = {"reassoc", "contract"}  # lets sums vectorise; no nnan/ninf: NaN/Inf rows must stay visible


def _jit(numba: Any, fn: Callable[..., Any], parallel: bool = True) -> Any:
    """``njit(parallel, cache=True)``; in memory only where no cache folder can be written (read-only install)
    or the folder numba chose is not trusted (``cachetrust``). Checked before anything is loaded from it:
    numba reads its cache on a kernel's first call, not when the kernel is declared."""
    opts = dict(parallel=parallel, nogil=True, fastmath=_FLAGS)
    try:
        kernel = numba.njit(cache=True, **opts)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        pass
    else:
        why = cachetrust.distrust(getattr(getattr(kernel, "_cache", None), "cache_path", None))
        if not why:
            return kernel
        kernelcache.refuse(why, "the kernels are compiled in memory for this process")
    _IN_MEMORY.append(fn.__name__)
    return numba.njit(cache=False, **opts)(fn)


def _bf16_ir(typingctx: Any, v: Any) -> Any:
    """uint16 -> float32 as bf16 (a 16-bit shift), in a register: lets the loops widen as they load."""
    from llvmlite import ir
    from numba.core import types as nt

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i32 = ir.IntType(32)
        return builder.bitcast(builder.shl(builder.zext(args[0], i32), ir.Constant(i32, 16)), ir.FloatType())

    return nt.float32(nt.uint16), codegen


def _f16_ir(typingctx: Any, v: Any) -> Any:
    """uint16 -> float32 as IEEE fp16 (exact; one F16C instruction for 16 values)."""
    from llvmlite import ir
    from numba.core import types as nt

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return nt.float32(nt.uint16), codegen


def _u32_ir(typingctx: Any, v: Any) -> Any:
    """The bits of a float32 as uint32, in a register (non-negative floats order as their bits)."""
    from llvmlite import ir
    from numba.core import types as nt

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.IntType(32))

    return nt.uint32(nt.float32), codegen


def _addr_ir(typingctx: Any, addr: Any) -> Any:
    """An integer address as a pointer, for ``numba.carray``: a training row read where it lies."""
    from llvmlite import ir
    from numba.core import types as nt

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

    return nt.voidptr(nt.uint64), codegen


_bf16: Any = None  # the intrinsics, set by ``kernels()``
_addr: Any = None
_carray: Any = None
_f16: Any = None
_u32: Any = None


def _units(kind: int) -> int:
    """uint16 units per stored value."""
    return 2 if kind == F32 else 1


def _read(fd: int, buf: Any, nbytes: int, off: int) -> bool:
    """``nbytes`` from byte ``off`` of file ``fd`` into ``buf``; False on a short read (file cut short) or an error."""
    addr = buf.ctypes.data
    got = 0
    while got < nbytes:
        n = _pread(fd, addr + np.uint64(got), nbytes - got, off + got)
        if n <= 0:
            return False
        got += n
    return True


def _read_rows(fds: Any, offs: Any, buf: Any, stride: int, nbytes: int, at: int) -> int:
    """For each c, ``nbytes`` from byte ``offs[c] + at`` of file ``fds[c]`` into ``buf`` from unit
    ``c * stride`` (the same rows of several positions, side by side); the first c that could not be
    read in full, or -1."""
    for c in range(fds.shape[0]):
        u0 = c * stride
        if not _read(fds[c], buf[u0:u0 + nbytes // 2], nbytes, offs[c] + at):
            return c
    return -1


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


def _scale(xx: Any, h: int) -> Any:
    """1 / rms of a row from its squared norm, in float32 as the numpy path computes it."""
    return np.float32(1.0) / np.sqrt(np.float32(xx) / np.float32(h) + np.float32(EPS))


def _six(rw: Any, rwf: Any, xo: int, po: int, y0: Any, y1: Any, y2: Any, y3: Any, yo: int, m: int, kind: int,
         block: int, out: Any) -> None:
    """Add to out[0..5] the sums [x.x, x.y0, x.y1, x.y2, x.y3, x.p] over m values: x and p (the row
    below) stored at element ``xo`` / ``po`` of ``rw`` (``rwf``: it as float32, for fp32 rows) and
    widened in registers; y rows from element ``yo``. float32 sums over blocks of ``block`` values
    (vectorised: each lane sums a few), added to ``out`` in float64."""
    for b0 in range(0, m, block):
        n = min(block, m - b0)
        aa = np.float32(0.0)
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        a3 = np.float32(0.0)
        ap = np.float32(0.0)
        # slices, so each index is a non-negative loop counter: numba's negative-index fix-up on
        # ``rw[x0 + q]`` turned these loads into per-lane gathers
        z0 = yo + b0
        u0, u1, u2, u3 = y0[z0:z0 + n], y1[z0:z0 + n], y2[z0:z0 + n], y3[z0:z0 + n]
        xs, ps = rw[xo + b0:xo + b0 + n], rw[po + b0:po + b0 + n]
        xf, pf = rwf[xo + b0:xo + b0 + n], rwf[po + b0:po + b0 + n]
        for q in range(n):
            v = _ld(xs, xf, q, kind)
            aa += v * v
            ap += v * _ld(ps, pf, q, kind)
            a0 += v * u0[q]
            a1 += v * u1[q]
            a2 += v * u2[q]
            a3 += v * u3[q]
        out[0] += aa
        out[1] += a0
        out[2] += a1
        out[3] += a2
        out[4] += a3
        out[5] += ap


def _fit4(rw: Any, rwf: Any, o0: int, h: int, kind: int, s0: Any, s1: Any, s2: Any, s3: Any, y0: Any, y1: Any,
          y2: Any, y3: Any, an: Any, ad: Any, den: bool) -> None:
    """Gain normal equations of four rows at once: x_r stored at element ``o0 + r*h`` of ``rw``, u_r = x_r * s_r;
    an[q] += sum_r u_r[q] * y_r[q] and, with ``den``, ad[q] += sum_r u_r[q]^2, in float64. Four tokens meet
    the float64 sums once (per token they were a load and a store of 16 bytes per value)."""
    x0s, x1s, x2s, x3s = rw[o0:o0 + h], rw[o0 + h:o0 + 2 * h], rw[o0 + 2 * h:o0 + 3 * h], rw[o0 + 3 * h:o0 + 4 * h]
    x0f, x1f, x2f, x3f = rwf[o0:o0 + h], rwf[o0 + h:o0 + 2 * h], rwf[o0 + 2 * h:o0 + 3 * h], rwf[o0 + 3 * h:o0 + 4 * h]
    if den:
        for q in range(h):
            u0 = np.float64(_ld(x0s, x0f, q, kind) * s0)
            u1 = np.float64(_ld(x1s, x1f, q, kind) * s1)
            u2 = np.float64(_ld(x2s, x2f, q, kind) * s2)
            u3 = np.float64(_ld(x3s, x3f, q, kind) * s3)
            ad[q] += (u0 * u0 + u1 * u1) + (u2 * u2 + u3 * u3)
            an[q] += (u0 * np.float64(y0[q]) + u1 * np.float64(y1[q])) + (u2 * np.float64(y2[q]) + u3 * np.float64(y3[q]))
    else:
        for q in range(h):
            u0 = np.float64(_ld(x0s, x0f, q, kind) * s0)
            u1 = np.float64(_ld(x1s, x1f, q, kind) * s1)
            u2 = np.float64(_ld(x2s, x2f, q, kind) * s2)
            u3 = np.float64(_ld(x3s, x3f, q, kind) * s3)
            an[q] += (u0 * np.float64(y0[q]) + u1 * np.float64(y1[q])) + (u2 * np.float64(y2[q]) + u3 * np.float64(y3[q]))


def _diffmax(rw: Any, rwf: Any, xo: int, y: Any, c: int, m: int, kind: int) -> Any:
    """The largest |y - x| over m values (x stored at element ``xo`` of ``rw``, y from element ``c``) as the
    bits of a float32 (non-negative floats order as their bits, NaN above Inf; an integer max vectorises)."""
    worst = np.uint32(0)
    xs, xf, ys = rw[xo:xo + m], rwf[xo:xo + m], y[c:c + m]
    for q in range(m):
        worst = max(worst, _u32(abs(ys[q] - _ld(xs, xf, q, kind))))
    return worst


def _direct(gfd: Any, goff: Any, below: Any, h: int, kind: int, a: int, b: int, cs: int, lw: int,
            yaddr: Any, ystep: Any, ykind: Any, rows: int, chunk: int, work: int,
            xx: Any, bad: Any, dot: Any, yy: Any, y_ok: Any, adj: Any, err: Any,
            fitg: Any, fitk: Any, accf: Any, maxk: Any, mx: Any) -> None:
    """Tokens [a, b) of every position g (rows from byte ``goff[g]`` of file ``gfd[g]``): squared norms,
    finiteness and, where ``below[g]`` (position g-1 is the raw position right below g), the dot
    product with that position's row (``adj``, NaN elsewhere); in the aligned window also the slot
    products. Slot k's training row for capture row i lies in memory at address
    ``yaddr[k] + (i - cs) * ystep[k]``, stored as ``ykind[k]``. Outputs are ``Sums``' arrays (xx, bad,
    adj [P, T]; dot [Lw, P, K]; yy, y_ok [Lw, K]); a bad row is zero in every slot product, as in the
    numpy path. ``err[w]`` = g + 1 when position g could not be read.

    Each work item takes a range of tokens, ``rows`` at a time: one read per position brings those
    rows of every position into a buffer (L2/L3), and their training rows are widened once. Then per
    token, H is walked in pieces of ``chunk`` values: the slots' pieces stay in L1 cache while every
    position's piece (and the piece of the position below, just used) meets them.

    While the rows are in cache, also (``Plan``): for each position ``fitg[c]`` and fitted slot
    ``fitk[f]``, the gain normal equations over the aligned tokens (work item w adds into
    ``accf[w, c, f]`` = sum u*y and ``accf[w, c, F]`` = sum u*u, float64, u = x / rms(x), as
    ``_fit_equations``); and for each slot k with ``maxk[k]`` = g >= 0, the largest
    |training - capture| of each aligned token against position g, as float32 bits in ``mx[k, j]``
    (``_max_abs``)."""
    p_count = gfd.shape[0]
    k_count = yaddr.shape[0]
    k_pad = max(4, (k_count + 3) // 4 * 4)
    xu_ = _units(kind)
    rowb = h * xu_ * 2
    wa, wb = max(a, cs), min(b, cs + lw)
    nan = np.float32(np.nan)
    n_fit, f_count = fitg.shape[0], fitk.shape[0]
    mx_any = np.zeros(p_count, np.bool_)
    for k in range(k_count):
        if maxk[k] >= 0:
            mx_any[maxk[k]] = True
    for w in prange(work):
        t0 = a + (b - a) * w // work
        t1 = a + (b - a) * (w + 1) // work
        rw = np.empty(p_count * rows * h * xu_, np.uint16)
        rwf = rw.view(np.float32)
        yw = np.zeros((rows, k_pad, h), np.float32)
        zero = np.zeros(h, np.float32)
        acc = np.zeros((p_count, 6))
        tmp = np.empty(h, np.float32)
        sc = np.zeros(4, np.float32)
        yz = np.zeros(4, np.bool_)
        if n_fit:
            accf[w] = 0.0
        for r0 in range(t0, t1, rows):
            n = min(rows, t1 - r0)
            g = _read_rows(gfd, goff, rw, rows * h * xu_, n * rowb, r0 * rowb)
            if g >= 0:
                err[w] = g + 1
                break
            for r in range(n):
                i = r0 + r
                inwin = wa <= i < wb
                if inwin:
                    j = i - cs
                    for k in range(k_count):
                        dst = yw[r, k]
                        src = _carray(_addr(yaddr[k] + np.uint64(j * ystep[k])), h * _units(ykind[k]), np.uint16)
                        _widen(src, 0, h, ykind[k], dst, dst.view(np.uint32))
                        s = _sq64(dst, h)
                        if not np.isfinite(s):
                            s = _sq_exact(dst, h)
                        ok = np.isfinite(s)
                        y_ok[j, k] = ok
                        yy[j, k] = np.float32(s) if ok else 0.0
                        if not ok:
                            dst[:] = 0.0
                for k0 in range(0, k_pad if inwin else 4, 4):
                    acc[:] = 0.0
                    for c in range(0, h, chunk):
                        m = min(chunk, h - c)
                        for g in range(p_count):
                            xo = (g * rows + r) * h + c
                            po = xo - rows * h if below[g] != 0 else xo
                            if inwin:
                                _six(rw, rwf, xo, po, yw[r, k0], yw[r, k0 + 1], yw[r, k0 + 2], yw[r, k0 + 3], c, m,
                                     kind, chunk, acc[g])
                                if k0 == 0 and mx_any[g]:
                                    for k in range(k_count):
                                        if maxk[k] == g:
                                            worst = _diffmax(rw, rwf, xo, yw[r, k], c, m, kind)
                                            if c == 0 or worst > mx[k, i - cs]:
                                                mx[k, i - cs] = worst
                            else:
                                _six(rw, rwf, xo, po, zero, zero, zero, zero, c, m, kind, chunk, acc[g])
                    for g in range(p_count):
                        if k0 == 0:
                            s = acc[g, 0]
                            low = below[g] != 0
                            adj[g, i] = np.float32(acc[g, 5]) if low else nan
                            if not np.isfinite(s):
                                _widen(rw, (g * rows + r) * h * xu_, h, kind, tmp, tmp.view(np.uint32))
                                s = _sq_exact(tmp, h)
                            xx[g, i] = np.float32(s)
                            bad[g, i] = not np.isfinite(s)  # a NaN/Inf row: recorded, and zero in every product
                        if inwin:
                            rowbad = bad[g, i]
                            for k in range(k0, min(k0 + 4, k_count)):
                                dot[i - cs, g, k] = 0.0 if rowbad else np.float32(acc[g, 1 + k - k0])
                                if maxk[k] == g and (rowbad or not y_ok[i - cs, k]):
                                    mx[k, i - cs] = 0  # as _max_abs: a NaN/Inf row on either side counts 0
            if n_fit:  # the gain normal equations of the candidate positions, 4 tokens at once
                for ci in range(n_fit):
                    g = fitg[ci]
                    for r in range(4):
                        i = r0 + r
                        live = r < n and wa <= i < wb and not bad[g, i]
                        sc[r] = _scale(xx[g, i], h) if live else 0.0
                        yz[r] = not live
                        if not live:  # past the block or the window, or NaN/Inf: zero, so it adds nothing
                            o = (g * rows + r) * h
                            if kind == F32:
                                rwf[o:o + h] = 0.0
                            else:
                                rw[o:o + h] = 0
                    o0 = g * rows * h
                    for f in range(f_count):
                        k = fitk[f]
                        y0 = zero if yz[0] or not y_ok[r0 - cs, k] else yw[0, k]
                        y1 = zero if yz[1] or not y_ok[r0 + 1 - cs, k] else yw[1, k]
                        y2 = zero if yz[2] or not y_ok[r0 + 2 - cs, k] else yw[2, k]
                        y3 = zero if yz[3] or not y_ok[r0 + 3 - cs, k] else yw[3, k]
                        _fit4(rw, rwf, o0, h, kind, sc[0], sc[1], sc[2], sc[3], y0, y1, y2, y3, accf[w, ci, f],
                              accf[w, ci, f_count], f == 0)


def _ld(rw: Any, rwf: Any, q: int, kind: int) -> Any:
    """Value q of a stored row as float32, widened in a register (``rwf``: the row as float32, read for
    fp32). The kind test sits inside the callers' loops: LLVM moves it out (one vectorised loop per kind)."""
    if kind == BF16:
        return _bf16(rw[q])
    if kind == F16:
        return _f16(rw[q])
    return rwf[q]


def _fit_equations(fd: int, off: int, h: int, kind: int, cs: int, lw: int, xx: Any, bad: Any, g: int,
                   yb: Any, ybf: Any, yoff: int, yrow: int, ykind: int, y_ok: Any, col: int, work: int,
                   acc_n: Any, acc_d: Any, bufs: Any, zs: Any, err: Any) -> None:
    """Gain normal equations of position g (rows from byte ``off`` of file ``fd``) and one slot (aligned
    row j from unit ``yoff + j*yrow`` of ``yb``, or of ``ybf`` as float32 for fp32; validity
    ``y_ok[:, col]``) over the window, with u = x / rms(x) and bad rows counting as zero: work item w
    sums its range of tokens into acc_n[w] = sum u*y and acc_d[w] = sum u*u (float64; the caller adds
    the items up). Four tokens (one read) at a time meet the float64 sums once: per token they
    were a load and a store of 16 bytes per value, more than the rest of the work. ``bufs[w]`` is
    work item w's read buffer (4 rows), ``zs`` a zero training row (uint16, H values of ``ykind``)."""
    xu_ = _units(kind)
    yu_ = _units(ykind)
    rowb = h * xu_ * 2
    for w in prange(work):
        j0 = lw * w // work
        j1 = lw * (w + 1) // work
        rw = bufs[w, :4 * h * xu_]
        rwf = rw.view(np.float32)
        zf = zs.view(np.float32)  # a zero training row, for tokens that add nothing
        sc = np.zeros(4, np.float32)
        yo = np.zeros(4, np.int64)
        yz = np.zeros(4, np.bool_)
        an = acc_n[w]
        ad = acc_d[w]
        an[:] = 0.0
        ad[:] = 0.0
        for b0 in range(j0, j1, 4):
            n = min(4, j1 - b0)
            if not _read(fd, rw, n * rowb, off + (cs + b0) * rowb):
                err[w] = 1
                break
            for r in range(4):
                j = b0 + r
                live = r < n and not bad[g, cs + j]
                sc[r] = _scale(xx[g, cs + j], h) if live else 0.0
                if not live:  # past the range, or NaN/Inf: zero, so it adds nothing (0 * NaN would)
                    rw[r * h * xu_:(r + 1) * h * xu_] = 0
                yz[r] = not (live and y_ok[j, col])
                yo[r] = yoff + j * yrow
            s0, s1, s2, s3 = sc[0], sc[1], sc[2], sc[3]
            x0s, x1s, x2s, x3s = rw[0:h], rw[h:2 * h], rw[2 * h:3 * h], rw[3 * h:4 * h]
            x0f, x1f, x2f, x3f = rwf[0:h], rwf[h:2 * h], rwf[2 * h:3 * h], rwf[3 * h:4 * h]
            y0s = zs if yz[0] else yb[yo[0]:yo[0] + h * yu_]
            y1s = zs if yz[1] else yb[yo[1]:yo[1] + h * yu_]
            y2s = zs if yz[2] else yb[yo[2]:yo[2] + h * yu_]
            y3s = zs if yz[3] else yb[yo[3]:yo[3] + h * yu_]
            y0f = zf if yz[0] else ybf[yo[0] // 2:yo[0] // 2 + h]
            y1f = zf if yz[1] else ybf[yo[1] // 2:yo[1] // 2 + h]
            y2f = zf if yz[2] else ybf[yo[2] // 2:yo[2] // 2 + h]
            y3f = zf if yz[3] else ybf[yo[3] // 2:yo[3] // 2 + h]
            for q in range(h):
                u0 = np.float64(_ld(x0s, x0f, q, kind) * s0)
                u1 = np.float64(_ld(x1s, x1f, q, kind) * s1)
                u2 = np.float64(_ld(x2s, x2f, q, kind) * s2)
                u3 = np.float64(_ld(x3s, x3f, q, kind) * s3)
                ad[q] += (u0 * u0 + u1 * u1) + (u2 * u2 + u3 * u3)
                an[q] += (u0 * np.float64(_ld(y0s, y0f, q, ykind)) + u1 * np.float64(_ld(y1s, y1f, q, ykind))) + \
                    (u2 * np.float64(_ld(y2s, y2f, q, ykind)) + u3 * np.float64(_ld(y3s, y3f, q, ykind)))


def _fit_scores(fds: Any, offs: Any, h: int, kind: int, cs: int, lw: int, xx: Any, bad: Any, gs: Any,
                yb: Any, ybf: Any, yoff: int, yrow: int, ykind: int, y_ok: Any, col: int, gain: Any, vjs: Any, f: int,
                fdot: Any, fpp: Any, rows: int, work: int, bufs: Any, err: Any, mx: Any) -> None:
    """Per aligned token, for each fitted column c (position ``gs[c]``, rows from byte ``offs[c]`` of file
    ``fds[c]``) against its fitted gain ``gain[vjs[c], f]``: pred = gain * u; fdot[j, vj, f] = pred . y,
    fpp[j, vj, f] = |pred|^2 (other arguments as ``fit_equations``; summed as ``_sq64``, in one pass over
    the row). In the same pass ``mx[c, j]``: the largest |y - pred| as float32 bits (0 where either row is
    bad), what ``_max_abs`` gives for the fitted cell, should it be a slot's best.

    All the columns in one launch: each read brings ``rows`` rows of every column's position, and each
    training row is met by all of them while it is in cache (one call per column streamed the slot's
    rows from memory once per column). ``err[w]`` = g + 1 when position g could not be read."""
    xu_ = _units(kind)
    yu_ = _units(ykind)
    rowb = h * xu_ * 2
    n_c = gs.shape[0]
    for w in prange(work):
        j0 = lw * w // work
        j1 = lw * (w + 1) // work
        rw = bufs[w, :n_c * rows * h * xu_]
        rwf = rw.view(np.float32)
        for b0 in range(j0, j1, rows):
            n = min(rows, j1 - b0)
            c = _read_rows(fds, offs, rw, rows * h * xu_, n * rowb, (cs + b0) * rowb)
            if c >= 0:
                err[w] = gs[c] + 1
                break
            for r in range(n):
                j = b0 + r
                i = cs + j
                ok = y_ok[j, col]
                y0 = yoff + j * yrow
                ys, yf = yb[y0:y0 + h * yu_], ybf[y0 // 2:y0 // 2 + h]
                for c in range(n_c):
                    g = gs[c]
                    vj = vjs[c]
                    mx[c, j] = 0
                    if bad[g, i]:
                        fdot[j, vj, f] = 0.0
                        fpp[j, vj, f] = 0.0
                        continue
                    gn = gain[vj, f]
                    scale = _scale(xx[g, i], h)
                    xo = (c * rows + r) * h
                    xs, xf = rw[xo:xo + h], rwf[xo:xo + h]
                    pp = 0.0
                    py = 0.0
                    worst = np.uint32(0)
                    for c0 in range(0, h, BLOCK):
                        m = min(BLOCK, h - c0)
                        xs_, xf_, g_ = xs[c0:c0 + m], xf[c0:c0 + m], gn[c0:c0 + m]
                        ys_, yf_ = ys[c0 * yu_:(c0 + m) * yu_], yf[c0:c0 + m]
                        app = np.float32(0.0)
                        apy = np.float32(0.0)
                        for q in range(m):
                            pr = _ld(xs_, xf_, q, kind) * scale * g_[q]
                            yv = _ld(ys_, yf_, q, ykind)
                            app += pr * pr
                            apy += pr * yv
                            worst = max(worst, _u32(abs(yv - pr)))
                        pp += app
                        py += apy
                    fpp[j, vj, f] = np.float32(pp)
                    fdot[j, vj, f] = np.float32(py) if ok else 0.0
                    if ok:
                        mx[c, j] = worst


def _max_abs(fd: int, off: int, h: int, kind: int, cs: int, lw: int, xx: Any, bad: Any, g: int,
             yb: Any, ybf: Any, yoff: int, yrow: int, ykind: int, y_ok: Any, col: int, gain: Any, vj: int, f: int,
             fitted: bool, out: Any, rows: int, work: int, bufs: Any, err: Any) -> None:
    """out[j] = max |y - pred| of aligned token j (0 where either row is bad); pred = x, or with
    ``fitted`` gain[vj, f] * x / rms(x) (arguments as ``fit_equations``)."""
    xu_ = _units(kind)
    yu_ = _units(ykind)
    rowb = h * xu_ * 2
    gn = gain[vj, f]
    for w in prange(work):
        j0 = lw * w // work
        j1 = lw * (w + 1) // work
        rw = bufs[w, :rows * h * xu_]
        rwf = rw.view(np.float32)
        y = np.empty(1, np.float32)
        yu = y.view(np.uint32)
        for b0 in range(j0, j1, rows):
            n = min(rows, j1 - b0)
            if not _read(fd, rw, n * rowb, off + (cs + b0) * rowb):
                err[w] = 1
                break
            for r in range(n):
                j = b0 + r
                i = cs + j
                out[j] = 0.0
                if bad[g, i] or not y_ok[j, col]:
                    continue
                y0 = yoff + j * yrow
                ys, yf = yb[y0:y0 + h * yu_], ybf[y0 // 2:y0 // 2 + h]
                xs, xf = rw[r * h:(r + 1) * h], rwf[r * h:(r + 1) * h]
                # the max of the bits: non-negative floats order as their bits, NaN above Inf, and an
                # integer max vectorises
                worst = np.uint32(0)
                if fitted:
                    scale = _scale(xx[g, i], h)
                    for q in range(h):
                        worst = max(worst, _u32(abs(_ld(ys, yf, q, ykind) - _ld(xs, xf, q, kind) * scale * gn[q])))
                else:
                    for q in range(h):
                        worst = max(worst, _u32(abs(_ld(ys, yf, q, ykind) - _ld(xs, xf, q, kind))))
                yu[0] = worst
                out[j] = y[0]


def _row_stats(yb: Any, yoff: int, yrow: int, t: int, h: int, ykind: int, norms: Any, bad: Any, work: int) -> None:
    """Per row of a [t, H] tensor (row r from unit ``yoff + r*yrow`` of ``yb``): L2 norm (float32), NaN/Inf flag."""
    for w in prange(work):
        xf = np.empty(h, np.float32)
        xu = xf.view(np.uint32)
        for r in range(t * w // work, t * (w + 1) // work):
            u0 = yoff + r * yrow
            if ykind == F32:
                _widen(yb, u0, h, ykind, xf, xu)
                s = _sq64(xf, h)
            else:  # 16-bit values widened in registers: one pass, summed as ``_sq64``
                s = 0.0
                for c0 in range(0, h, BLOCK):
                    xs = yb[u0 + c0:u0 + min(h, c0 + BLOCK)]
                    acc = np.float32(0.0)
                    for q in range(xs.shape[0]):
                        v = _ld(xs, xf, q, ykind)
                        acc += v * v
                    s += acc
            if not np.isfinite(s):
                _widen(yb, u0, h, ykind, xf, xu)
                s = _sq_exact(xf, h)
            norms[r] = np.float32(np.sqrt(s))
            bad[r] = not np.isfinite(s)


_KERNELS: types.SimpleNamespace | None = None


def kernels() -> types.SimpleNamespace:
    """The compiled kernels (``direct``, ``fit_equations``, ``fit_scores``, ``max_abs``, ``row_stats``):
    numba imported, each loaded from its cache (or compiled) on first call."""
    global _KERNELS, prange, _pread
    if _KERNELS is not None:  # set last, once everything below is done: no lock needed to read it
        return _KERNELS
    with LOCK:
        if _KERNELS is None:
            # numba also takes settings from a .numba_config.yaml in the current folder, unless a variable
            # names them: these two name the folder it loads cached code from and classes it imports, and
            # neither may come from a file the user did not write (empty is numba's default)
            for name in ("NUMBA_CACHE_DIR", "NUMBA_CACHE_LOCATOR_CLASSES"):
                os.environ.setdefault(name, "")
            import numba
            import numba.extending

            if not os.environ.get("NUMBA_THREADING_LAYER"):
                # numba's own pthread pool: its threads sleep when idle. OpenMP threads spin at every
                # join, and with another process on a core a 2-thread kernel ran 5-10x slower.
                numba.config.THREADING_LAYER = "workqueue"
            prange = numba.prange
            nt = numba.types
            # a named C symbol (resolved when the code is loaded), not a ctypes address: the code stays cacheable
            _pread = nt.ExternalFunction("pread", nt.intp(nt.intc, nt.uintp, nt.uintp, nt.int64))
            g = globals()
            g["_bf16"] = numba.extending.intrinsic(_bf16_ir)
            g["_f16"] = numba.extending.intrinsic(_f16_ir)
            g["_u32"] = numba.extending.intrinsic(_u32_ir)
            g["_addr"] = numba.extending.intrinsic(_addr_ir)
            g["_carray"] = numba.carray
            for name in ("_units", "_read", "_read_rows", "_widen", "_sq64", "_six", "_ld", "_scale", "_fit4", "_diffmax"):
                g[name] = numba.njit(inline="always", fastmath=_FLAGS)(g[name])
            g["_sq_exact"] = numba.njit(fastmath=_FLAGS)(g["_sq_exact"])
            _KERNELS = types.SimpleNamespace(
                direct=_jit(numba, _direct), fit_equations=_jit(numba, _fit_equations),
                fit_scores=_jit(numba, _fit_scores), max_abs=_jit(numba, _max_abs),
                row_stats=_jit(numba, _row_stats), threads=int(numba.get_num_threads()))
    return _KERNELS


def wanted(nbytes: int) -> bool:
    """Whether to score ``nbytes`` of stored values with the kernels: numba present and allowed, the work
    large enough to pay for loading them, and their machine code already in this machine's cache
    (``kernelcache``; else its compile starts in another process and numpy answers meanwhile).
    Never by what ran before in the process: one input gets the same numbers from any process once the
    cache is filled (the two paths differ in the last bits). ``EAGLEFORENSICS_FUSED=1`` compiles here."""
    if not AVAILABLE or nbytes < MIN_BYTES:
        return False
    if _MODE == "1":
        why = kernelcache.distrust()  # forced kernels, but their cache is not to be loaded: numpy answers
        if why:
            kernelcache.refuse(why, "the numpy path answers")
        return not why
    if kernelcache.ready():
        return True
    kernelcache.start_compiling()
    return False


# ---- arrays and files as the kernels' uint16 views ----------------------------------------------

_KINDS = {"bfloat16": BF16, "float16": F16, "float32": F32}


def kind_of(dtype: Any) -> int | None:
    """The kernel kind of a numpy, ml_dtypes or torch dtype, None when the kernels do not read it."""
    return _KINDS.get(dtype_name(dtype))


def _as16(t: Any) -> tuple[np.ndarray, int, bool]:
    """A [T, H] tensor or array as a [T, H * units] uint16 view (rows may be strided), its kind, and
    whether it is a float32 copy (the kernels do not read its dtype, or its columns are strided)."""
    a = as_array(t)
    kind = kind_of(a.dtype)
    copied = kind is None or a.ndim != 2 or (a.shape[1] > 1 and a.strides[1] != a.itemsize)
    if copied:
        a, kind = f32(np.ascontiguousarray(a)), F32
    return a.view(np.uint16), kind, copied


class Rows:
    """A CPU [T, H] tensor or array as the kernels read it: one flat uint16 view from row 0, units
    between rows, and its kind. Not bf16/fp16/fp32, or with strided columns: a float32 copy
    (``copied``)."""

    def __init__(self, t: Any) -> None:
        a16, self.kind, self.copied = _as16(t)
        n, width = a16.shape
        self.row = a16.strides[0] // 2 if n > 1 else width
        self.base = np.lib.stride_tricks.as_strided(a16, shape=((n - 1) * self.row + width if n else 0,),
                                                    strides=(2,))
        self.off = 0
        # fp32 rows also as float32 (read as they are); a one-value stand-in for the other kinds
        self.basef = self.base.view(np.float32) if self.kind == F32 else np.zeros(1, np.float32)
        self.keep = a16  # the memory must outlive the view


def row_stats(a: Any, job_bytes: int | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """(per-row L2 norms float32, per-row NaN/Inf flags) of a [T, H] array in one compiled pass, or
    None where the kernels should not read it (no numba, too small to pay for loading them, another
    dtype, strided columns). ``job_bytes``: the size to decide by when the array is one of several
    read together (a record's slots), so all of them take the same path; else the array's own."""
    a = as_array(a)
    if a.ndim != 2 or kind_of(a.dtype) is None or (a.shape[1] > 1 and a.strides[1] != a.itemsize) \
            or not wanted(a.size * a.itemsize if job_bytes is None else job_bytes):
        return None
    k = kernels()
    with LOCK:
        y = Rows(a)
        norms = np.empty(a.shape[0], np.float32)
        bad = np.empty(a.shape[0], bool)
        k.row_stats(y.base, y.off, y.row, a.shape[0], a.shape[1], y.kind, norms, bad,
                    max(1, min(a.shape[0], 4 * k.threads)))
    return norms, bad


class Stored:
    """Every position of a capture as an open file and the byte offset of its row-major [T, H] block.

    Built only when each position is such a block, all of one dtype the kernels read (bf16,
    fp16, fp32) and all inside their files; else ``of`` is None. The files stay open until it
    is collected (or ``close``).
    """

    def __init__(self, paths: list[str], fds: list[int], fidx: np.ndarray, offs: np.ndarray, kind: int,
                 h: int, t: int) -> None:
        self.paths, self.fds, self.fidx, self.offs = paths, fds, fidx, offs
        self.kind, self.h, self.t = kind, h, t
        self.itemsize = 4 if kind == F32 else 2
        self.gfd = np.array([fds[f] for f in fidx], np.int64)  # each position's file descriptor
        self._bufs: dict[tuple[Any, ...], np.ndarray] = {}

    @classmethod
    def of(cls, rows: list[Any], h: int) -> "Stored | None":
        """``rows``: one ``filerows.FileRows`` per position (in the scorer's order)."""
        if not rows or not AVAILABLE:
            return None
        kinds = {kind_of(r.dtype) for r in rows}
        if len(kinds) != 1 or None in kinds or any(r.cols != h or r.rows != rows[0].rows for r in rows):
            return None
        (kind,) = kinds
        files: dict[str, int] = {}
        fds: list[int] = []
        sizes: list[int] = []
        fidx, offs = [], []
        try:
            for r in rows:
                if r.path not in files:
                    # judged on the descriptor: a file swapped for a FIFO since the reader checked it
                    # cannot block the kernels' pread
                    fd = open_regular_fd(r.path, "capture file")
                    files[r.path] = len(fds)
                    fds.append(fd)
                    sizes.append(os.fstat(fd).st_size)
                f = files[r.path]
                if r.offset + r.rows * r.row_bytes > sizes[f]:
                    raise ValueError  # shorter than its header says: the numpy path names the error
                fidx.append(f)
                offs.append(r.offset)
        except (OSError, ValueError, ForensicsError):
            for fd in fds:
                os.close(fd)
            return None
        return cls(list(files), fds, np.array(fidx, np.int64), np.array(offs, np.int64), kind, h, rows[0].rows)

    def buffers(self, work: int, units: int, zero: bool = False, dtype: Any = np.uint16, name: str = "") -> np.ndarray:
        """[work, units] of ``dtype``, zero-filled, kept for this sweep's later kernel calls (``name`` tells
        apart two of one shape; ``zero``: one the kernels only read, so it stays zero).

        Allocated inside every call, such buffers were mapped and faulted in afresh each time (glibc
        maps blocks over 128 KB anew and unmaps them on free), from both kernel threads at once: in a
        fresh process the fitted columns of a Kimi-K2 sweep took 0.12 s instead of 0.02 s."""
        key = (work, units, zero, np.dtype(dtype).str, name)
        buf = self._bufs.get(key)
        if buf is None:
            buf = self._bufs[key] = np.empty((work, units), dtype)
            buf.fill(0)  # its pages faulted in here, by one thread
        return buf

    def check(self, err: np.ndarray, g: int | None = None) -> None:
        """Raise the one-line error for a kernel's short read (``err``: nonzero where one happened;
        position g + 1 of ``direct``, or 1 with the position ``g`` read)."""
        bad = np.flatnonzero(err)
        if bad.size:
            g = int(err[bad[0]]) - 1 if g is None else g
            raise ForensicsError("could not read every row of a capture position: the file is shorter than its "
                                 "header says, or it changed while it was being read", path=self.paths[self.fidx[g]])

    def close(self) -> None:
        """Close the files (idempotent)."""
        fds, self.fds = self.fds, []
        for fd in fds:
            try:
                os.close(fd)
            except OSError:  # pragma: no cover - already closed
                pass

    def __del__(self) -> None:
        self.close()


# ---- the kernels over a whole capture, as the scorer calls them ---------------------------------

class Plan:
    """What the direct pass computes beside the sums while each row is in cache (``_direct``): the gain
    normal equations of positions ``fitg`` for the fitted slots ``fitk``, and for each slot k with
    ``maxk[k]`` >= 0 the largest |training - capture| of every aligned token against that position.

    The positions are guesses made before the pass (``match._preview``); the caller uses what was
    guessed right and computes the rest as before, so the answers never depend on the guess."""

    def __init__(self, fitg: list[int], fitk: list[int], maxk: list[int], k: int, lw: int) -> None:
        self.fitg = np.array(fitg, np.int64)
        self.fitk = np.array(fitk, np.int64)
        self.maxk = np.array(maxk + [-1] * (k - len(maxk)), np.int64)
        self.mx = np.zeros((k, lw), np.uint32)
        self.num: np.ndarray | None = None  # [C, F, H] float64 once the pass ran
        self.den: np.ndarray | None = None  # [C, H]

    @classmethod
    def empty(cls, k: int) -> "Plan":
        return cls([], [], [], k, 0)

    def max_abs(self, k: int) -> np.ndarray:
        """Per aligned token, max |training - capture| of slot k against position ``maxk[k]`` (float32 [Lw])."""
        return self.mx[k].view(np.float32)


def _launch(kernel: Any, args: tuple[Any, ...], load_only: bool) -> bool:
    """Run ``kernel`` on ``args`` (the caller holds ``LOCK``), or with ``load_only`` only load its machine
    code for their types: no launch, so no ``LOCK``, and a kernel running meanwhile is not disturbed.
    Returns whether it ran."""
    if load_only:
        import numba

        kernel.compile(tuple(numba.typeof(a) for a in args))
        return False
    kernel(*args)
    return True


def direct(st: Stored, slots: list[Any], ts: int, cs: int, lw: int, below: np.ndarray, xx: np.ndarray,
           bad: np.ndarray, dot: np.ndarray, yy: np.ndarray, y_ok: np.ndarray, adj: np.ndarray,
           plan: Plan | None = None, tokens: tuple[int, int] | None = None, load_only: bool = False) -> None:
    """One pass over every row of every position (``direct``), filling ``Sums``' arrays in place:
    xx, bad, adj [P, T]; dot [Lw, P, K]; yy, y_ok [Lw, K]. Slot k's aligned row j is row ts + j of
    ``slots[k]`` ([S, H] tensors or arrays); ``below[g]`` marks positions whose lower neighbour
    is position g - 1 (``steps.lower_neighbours``). ``plan``: what else to compute in the same pass
    (its ``num``, ``den`` and ``mx`` are filled). ``tokens``: only capture rows [a, b). ``load_only``:
    see ``_launch``."""
    h, t = st.h, st.t
    a, b = tokens if tokens is not None else (0, t)
    ys = [_as16(s)[:2] for s in slots]  # kept alive: the kernel reads their memory by address
    if any(y.shape[0] < ts + lw for y, _ in ys):
        raise ValueError("a slot holds fewer rows than the aligned window")
    yaddr = np.array([y[ts:].ctypes.data if lw else 0 for y, _ in ys], np.uint64)
    ystep = np.array([y.strides[0] for y, _ in ys], np.int64)
    ykind = np.array([kd for _, kd in ys], np.int64)
    kern = kernels()
    work = max(1, min(8 * kern.threads, -(-(b - a) // READ_ROWS)))
    err = np.zeros(work, np.int64)
    below = np.ascontiguousarray(below, np.int8)
    plan = plan if plan is not None and lw else Plan.empty(len(slots))
    n_fit, n_f = len(plan.fitg), len(plan.fitk)
    accf = st.buffers(work * max(n_fit, 1), (n_f + 1) * h if n_fit else 1, dtype=np.float64, name="accf")
    accf = accf.reshape(work, max(n_fit, 1), n_f + 1 if n_fit else 1, h if n_fit else 1)
    mx = plan.mx if plan.mx.shape[1] == lw else np.zeros((len(slots), lw), np.uint32)
    args = (st.gfd, st.offs, below, h, st.kind, a, b, cs, lw, yaddr, ystep, ykind, READ_ROWS, CHUNK, work,
            xx, bad, dot, yy, y_ok, adj, err, plan.fitg, plan.fitk, accf, plan.maxk, mx)
    if not _launch(kern.direct, args, load_only):
        return
    st.check(err)
    if n_fit:
        total = accf.sum(0)
        plan.num, plan.den = total[:, :n_f], total[:, n_f]
    del ys


def _row_buffers(st: Stored, rows: int, work: int) -> np.ndarray:
    """Each work item's read buffer for the one-position kernels (``rows`` rows of the capture)."""
    return st.buffers(work, rows * st.h * (2 if st.kind == F32 else 1))


def _one_position_work(lw: int) -> tuple[int, int, np.ndarray]:
    """(rows per read, work items, error flags) for the one-position kernels."""
    work = max(1, min(4 * kernels().threads, -(-lw // READ_ROWS)))
    return READ_ROWS, work, np.zeros(work, np.int64)


def fit_equations(st: Stored, g: int, y: Any, col: int, cs: int, lw: int, xx: np.ndarray, bad: np.ndarray,
                  y_ok: np.ndarray, load_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(sum u*y, sum u*u) per dimension over the aligned tokens (float64 [H] each): position g
    against training rows ``y`` [Lw, H] of slot ``col`` (see ``_fit_equations``). ``load_only``: see ``_launch``."""
    kern, yv = kernels(), Rows(y)
    rows, work, err = _one_position_work(lw)
    acc_n, acc_d = (st.buffers(work, st.h, dtype=np.float64, name=n) for n in ("num", "den"))
    zs = st.buffers(1, st.h * (2 if yv.kind == F32 else 1), zero=True)[0]
    args = (int(st.gfd[g]), int(st.offs[g]), st.h, st.kind, cs, lw, xx, bad, g, yv.base, yv.basef, yv.off, yv.row,
            yv.kind, y_ok, col, work, acc_n, acc_d, _row_buffers(st, rows, work), zs, err)
    if _launch(kern.fit_equations, args, load_only):
        st.check(err, g)
    return acc_n.sum(0), acc_d.sum(0)


def fit_scores(st: Stored, gs: list[int], y: Any, col: int, cs: int, lw: int, xx: np.ndarray, bad: np.ndarray,
               y_ok: np.ndarray, gain: np.ndarray, vjs: list[int], f: int, fdot: np.ndarray, fpp: np.ndarray,
               load_only: bool = False) -> list[np.ndarray]:
    """fdot[:, vj, f], fpp[:, vj, f] of each fitted column ``vjs[c]`` (position ``gs[c]``) against its
    fitted gain (``_fit_scores``, one launch for them all); returns, from the same pass, each column's
    per-token max |training - fitted prediction| (float32 [Lw], as ``max_abs``). ``load_only``: see ``_launch``."""
    kern, yv = kernels(), Rows(y)
    rows, work, err = _one_position_work(lw)
    g_arr, vj_arr = np.array(gs, np.int64), np.array(vjs, np.int64)
    mx = np.zeros((len(gs), lw), np.uint32)
    args = (st.gfd[g_arr], st.offs[g_arr], st.h, st.kind, cs, lw, xx, bad, g_arr, yv.base, yv.basef, yv.off,
            yv.row, yv.kind, y_ok, col, gain, vj_arr, f, fdot, fpp, rows, work,
            _row_buffers(st, rows * len(gs), work), err, mx)
    if _launch(kern.fit_scores, args, load_only):
        st.check(err)
    return [m.view(np.float32) for m in mx]


def max_abs(st: Stored, g: int, y: Any, col: int, cs: int, lw: int, xx: np.ndarray, bad: np.ndarray,
            y_ok: np.ndarray, gain: np.ndarray | None, vj: int | None, f: int, load_only: bool = False) -> np.ndarray:
    """Per aligned token, max |training - capture| (float32 [Lw]) of slot ``col`` (rows ``y``) against
    position g, or its fitted column ``vj`` (slot ``f`` of the fit) where ``vj`` is given. ``load_only``:
    see ``_launch``."""
    kern, yv = kernels(), Rows(y)
    out = np.zeros(lw, np.float32)
    if lw == 0 and not load_only:
        return out
    rows, work, err = _one_position_work(lw)
    fitted = vj is not None and gain is not None
    g_arr = gain if fitted else np.zeros((1, 1, st.h), np.float32)
    args = (int(st.gfd[g]), int(st.offs[g]), st.h, st.kind, cs, lw, xx, bad, g, yv.base, yv.basef, yv.off, yv.row,
            yv.kind, y_ok, col, g_arr, vj or 0, f, fitted, out, rows, work, _row_buffers(st, rows, work), err)
    if _launch(kern.max_abs, args, load_only):
        st.check(err, g)
    return out


# ---- loading the kernels ahead of their first use ---------------------------------------------

def _warm(every: bool = False) -> None:
    """Load the kernels a large align always uses, in the order it needs them, for argument types built
    as the scorer builds them (zero-sized). ``row_stats`` runs once (under ``LOCK``, as every launch;
    it also starts numba's thread pool); ``direct`` and ``fit_scores`` are only loaded, without
    ``LOCK``, so the record's norms (and then the direct pass) can run while the next kernel loads.
    ``every``: also ``fit_equations`` and ``max_abs`` (compiling them all into the cache)."""
    from .sums import Sums

    h, k = 8, 4
    slots = [np.zeros((1, 3 * h), BF16_NP)[:, :h] for _ in range(k)]  # a record's aux slots are column slices
    row_stats(slots[0], 1 << 62)  # takes LOCK itself, as every launch does
    st = Stored([""], [-1], np.zeros(1, np.int64), np.zeros(1, np.int64), BF16, h, 0)  # one position, no rows
    st.fds = []  # nothing to read and nothing to close
    sums = Sums(k, 1, 0, 0, 0, h, [0], [0])
    adj = np.full(sums.xx.shape, np.nan, np.float32)
    direct(st, slots, 0, 0, 0, np.zeros(1, np.int8), sums.xx, sums.bad, sums.dot, sums.yy, sums.y_ok, adj,
           tokens=(0, 0), load_only=True)
    assert sums.gain is not None
    fit_scores(st, [0], slots[0][:0], 0, 0, 0, sums.xx, sums.bad, sums.y_ok, sums.gain, [0], 0, sums.fdot, sums.fpp,
               load_only=True)
    if every:
        fit_equations(st, 0, slots[0][:0], 0, 0, 0, sums.xx, sums.bad, sums.y_ok, load_only=True)
        max_abs(st, 0, slots[0][:0], 0, 0, 0, sums.xx, sums.bad, sums.y_ok, sums.gain, 0, 0, load_only=True)


def compile_into_cache() -> None:
    """The detached process ``kernelcache.start_compiling`` starts: compile every kernel into numba's cache,
    then write the mark that lets later processes use them. At low priority, one such process per cache
    folder at a time (a lock), ended by an alarm past ``kernelcache.COMPILE_LIMIT_S``."""
    import fcntl
    import signal

    global _MODE
    _MODE = "1"  # this process compiles: ``wanted`` must not wait for the mark it is about to write
    signal.alarm(kernelcache.COMPILE_LIMIT_S)
    with contextlib.suppress(OSError):
        os.nice(10)
    lock_path = kernelcache.folder() / "eagleforensics-kernels.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    if kernelcache.distrust():  # made by another user meanwhile, or with a loose umask: never filled
        return
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # another process is compiling them
        if kernelcache.stamp().is_file():
            return
        _warm(every=True)
        if not _IN_MEMORY:  # else later processes would compile them again: the numpy path stays theirs
            kernelcache.mark_compiled()


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic collection while numba loads (it allocates ~10^5 objects that all stay): the collector
    would walk them again and again. Restores the collector's state, whoever set it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def preload(nbytes: int) -> threading.Thread | None:
    """Start loading the kernels on a background thread when ``nbytes`` of input will be scored by
    them (``wanted``): numba's import and the cached code's load (~0.4 s of Python) then overlap the
    reading of the inputs, which waits on the OS with the GIL released. A real call that comes first
    waits for its kernel (on ``LOCK``, or on numba's compiler lock while that kernel loads).

    Returns the thread (join it when the work ends), or None when nothing was started. A daemon, so
    that Ctrl-C need not wait for it; a failure here is left for the real call to meet and report."""
    if not wanted(nbytes) or _KERNELS is not None:
        return None

    def run() -> None:
        with _collector_paused():
            try:
                _warm()
            except Exception:  # noqa: BLE001 - the first real call meets it again, where it is handled
                return
            if process.SHORT_LIVED:
                # numba leaves ~10^5 objects that live as long as the process: out of the cyclic collector's
                # sight, later collections stop walking them (0.1-0.2 s of a command's CPU). Frozen before
                # the collector is back: in between, the main thread's next allocation could start a full
                # collection over all of them (40-80 ms at T=512). Not in a host process: frozen
                # objects' cycles are never collected there.
                gc.freeze()

    thread = threading.Thread(target=run, name="eagleforensics-kernels", daemon=True)
    thread.start()
    return thread
