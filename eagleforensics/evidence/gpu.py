"""The scorer's GPU path: one capture position at a time on a CUDA device, torch only here.

Reader threads fill pinned host buffers (``io.prefetch``), a side stream copies each to the
GPU while the GPU reduces the previous position, and every per-token sum (the product of each
row with the position below too, for the capture's layer step) stays on the device until the
sweep ends; then they are copied once into the host ``Sums`` that the CPU paths fill
too, so scores are computed by the same code (``Sums.results``) whatever the device.
The arithmetic is ``Sums``' (norms, slot products, the fitted gain and its scores), in float32.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
import torch

from ..arrays import as_array, f32, to_torch
from ..io.prefetch import Prefetch
from ..positions import Position
from .steps import lower_neighbours
from .sums import EPS, Sums

GPU_READERS = 4  # reader threads filling pinned buffers; env EAGLEFORENSICS_READERS overrides


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype staging buffers use for stored values of ``dtype`` (float32 for others)."""
    name = str(dtype)
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
            "float64": torch.float64}.get(name, torch.float32)


def _neighbour_products(g: int, x: torch.Tensor, below: np.ndarray, held: dict[int, torch.Tensor], seen: set[int],
                        adj: torch.Tensor) -> None:
    """adj[g] = x_g . x_(g-1) per row, and adj[g+1], as soon as both positions have been seen; a
    position is held only while a neighbour it pairs with is still to come."""
    if below[g] and g - 1 in held:
        adj[g] = torch.linalg.vecdot(x, held[g - 1])
    if g + 1 < len(below) and below[g + 1] and g + 1 in held:
        adj[g + 1] = torch.linalg.vecdot(held[g + 1], x)
    seen.add(g)
    held[g] = x
    for k in [k for k in held if (not below[k] or k - 1 in seen) and (k + 1 >= len(below) or not below[k + 1]
                                                                     or k + 1 in seen)]:
        del held[k]


def gpu_sweep(src: Any, positions: list[Position], sums: Sums, slots: list[np.ndarray], ts: int,
              progress: Callable[[Position], None] | None, device: str) -> None:
    """Fill ``sums`` for every position on ``device`` (a ``match._Source`` gives the rows)."""
    dev = torch.device(device)
    h, cs, lw, t, k = sums.h, sums.cs, sums.lw, sums.t, sums.k
    p, nf, fit_idx = len(positions), len(sums.fit_idx), sums.fit_idx
    f32d = dict(dtype=torch.float32, device=dev)
    y = torch.empty((lw, k, h), **f32d)
    for i, s in enumerate(slots):
        y[:, i] = to_torch(np.ascontiguousarray(f32(s[ts:ts + lw]))).to(dev)
    yy = torch.linalg.vector_norm(y, dim=-1).square_()
    y_ok = torch.isfinite(y).all(-1)
    y.masked_fill_(~y_ok.unsqueeze(-1), 0.0)
    yy = torch.where(y_ok, yy, torch.zeros((), device=dev))
    xx = torch.full((p, t), float("nan"), **f32d)
    bad = torch.zeros((p, t), dtype=torch.bool, device=dev)
    dot = torch.full((lw, p, k), float("nan"), **f32d)
    virt_of = {g: j for j, g in enumerate(sums.virt)}
    gain = torch.zeros((len(sums.virt), nf, h), **f32d)
    fdot = torch.full((lw, len(sums.virt), nf), float("nan"), **f32d)
    fpp = torch.full((lw, len(sums.virt), nf), float("nan"), **f32d)
    adj = torch.full((p, t), float("nan"), **f32d)  # each row . the same token's row one position below
    below = lower_neighbours(positions)
    held: dict[int, torch.Tensor] = {}  # positions whose neighbour's product is still to come (readers finish
    seen: set[int] = set()              # out of order, so g - 1 need not have come just before g)
    stage = _torch_dtype(src.dtype)
    wanted = int(os.environ.get("EAGLEFORENSICS_READERS", "0") or 0) or GPU_READERS
    readers = max(1, min(wanted, (os.cpu_count() or 2) // 2))
    bufs = [torch.empty((t, h), dtype=stage).pin_memory() for _ in range(readers + 2)]

    def fill(job: tuple[int, Position], buf: torch.Tensor) -> None:
        dst = as_array(buf)
        got = src.rows(job[1], 0, t, out=dst if dst.dtype == src.dtype else None)
        if got.ctypes.data != dst.ctypes.data:
            dst[...] = got if got.dtype == dst.dtype else f32(got)

    on_dev = [torch.empty((t, h), dtype=stage, device=dev) for _ in range(2)]
    copy_stream = torch.cuda.Stream(device=dev)
    done = [torch.cuda.Event() for _ in on_dev]
    feed = Prefetch(list(enumerate(positions)), bufs, fill, hold=True, readers=readers)
    for step, ((g, pos), _got, buf) in enumerate(feed):
        slot = step % 2
        with torch.cuda.stream(copy_stream):
            copy_stream.wait_event(done[slot])
            staged = on_dev[slot].copy_(buf, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(copy_stream)
        torch.cuda.current_stream(dev).wait_event(copied)
        copied.synchronize()
        feed.release(buf)
        x = staged.to(torch.float32, copy=True)  # a copy even for fp32: the staging buffer is reused
        xx[g] = torch.linalg.vector_norm(x, dim=-1).square_()  # NaN/Inf rows keep theirs (as Sums does)
        row_bad = ~torch.isfinite(x).all(-1)
        x.masked_fill_(row_bad.unsqueeze(-1), 0.0)
        bad[g] = row_bad
        _neighbour_products(g, x, below, held, seen, adj)
        if lw:
            xw = x[cs:cs + lw]
            dot[:, g] = torch.bmm(y, xw.unsqueeze(-1)).squeeze(-1)
            if g in virt_of and nf:
                j = virt_of[g]
                xxw = torch.where(row_bad[cs:cs + lw], 0.0, xx[g, cs:cs + lw])
                u = xw * torch.rsqrt(xxw / h + EPS).unsqueeze(-1)  # u = x / rms(x), bad rows zero
                yf = y[:, fit_idx]
                num = torch.einsum("lh,lfh->fh", u, yf)
                den = (u * u).sum(0)
                gain[j] = num / den.clamp_min(EPS).unsqueeze(0)
                for f in range(nf):
                    pred = u * gain[j, f]
                    fpp[:, j, f] = torch.linalg.vector_norm(pred, dim=-1).square_()
                    fdot[:, j, f] = torch.linalg.vecdot(pred, yf[:, f])
        done[slot].record(torch.cuda.current_stream(dev))
        if progress is not None:
            progress(pos)
    sums.xx[:] = xx.cpu().numpy()
    sums.bad[:] = bad.cpu().numpy()
    sums.dot[:] = dot.cpu().numpy()
    sums.yy[:] = yy.cpu().numpy()
    sums.y_ok[:] = y_ok.cpu().numpy()
    sums.adj = adj.cpu().numpy()
    if sums.gain is not None:
        sums.gain[:] = gain.cpu().numpy()
        sums.fdot[:] = fdot.cpu().numpy()
        sums.fpp[:] = fpp.cpu().numpy()
