"""A large 2-D weight left in its safetensors file: a vocabulary-sized embedding or lm_head read as it is used.

A Kimi-K2-size embedding or lm_head is 163840 x 7168 bf16, 2.35 GB each; replay needs the embedding's rows
for the ids it looks up and the lm_head one vocabulary block at a time. ``DiskRows`` answers both from the
file (positional reads of the rows asked for), so neither is ever held whole in host memory; on a GPU it is
copied there once, block by block, in its stored dtype.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..arrays import as_array, to_torch
from ..errors import ForensicsError
from .filerows import FileRows

BLOCK_ROWS = 8192  # rows read at once by ``blocks`` (a 7168-wide bf16 block: 117 MB)
_EXPONENT = {torch.bfloat16: (torch.int16, 0x7F80), torch.float16: (torch.int16, 0x7C00)}


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in ``t``. A bf16 / fp16 tensor is tested on its bits (exponent all ones), an integer pass
    that runs on every core, where ``torch.isfinite`` on a CPU half tensor is slow (GBs of weights a load)."""
    if not t.is_floating_point():
        return True
    half = _EXPONENT.get(t.dtype)
    if half is None or t.device.type != "cpu":
        return bool(torch.isfinite(t).all())
    kind, mask = half
    bits = t.contiguous().view(kind)
    return not bool(((bits & mask) == mask).any())


class DiskRows:
    """Rows of a [rows, cols] tensor stored in a safetensors file, read on demand in the stored dtype.

    Quacks like the few tensor operations replay uses on an embedding or lm_head: ``shape``, ``dtype``,
    ``is_floating_point``, ``rows[ids]`` (a gather), ``block(a, b)`` and ``to(device)``.
    """

    def __init__(self, rows: FileRows, name: str, path: str | Path) -> None:
        self._rows = rows
        self.name = name
        self.path = str(path)
        self.shape = torch.Size((rows.rows, rows.cols))
        self.dtype = to_torch(np.empty(0, rows.dtype)).dtype
        self.device = torch.device("cpu")

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def dim(self) -> int:
        return 2

    def block(self, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) in the stored dtype (one positional read) into a buffer this object reuses: valid until
        the next ``block`` call (every caller widens or copies it at once). A fresh 117 MB buffer a block cost a page
        fault per 4 KB, three times the read itself."""
        n = max(0, min(stop, self.shape[0]) - start)
        buf = self.__dict__.get("_buf")
        if buf is None or buf.shape[0] < n:
            buf = self.__dict__["_buf"] = np.empty((n, self.shape[1]), dtype=self._rows.dtype)
        return to_torch(self._rows.read(start, stop, out=buf))

    def blocks(self, size: int = BLOCK_ROWS) -> Any:
        """(start, rows) for every block of ``size`` rows, in order (each valid until the next)."""
        for a in range(0, self.shape[0], size):
            yield a, self.block(a, min(self.shape[0], a + size))

    def __getitem__(self, index: Any) -> torch.Tensor:
        """Rows ``index`` (a tensor or array of ids, any shape): each distinct row read once, in the stored dtype."""
        idx = torch.as_tensor(index).to("cpu", torch.long)
        flat = idx.reshape(-1)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.shape[0]):
            raise IndexError(f"row index out of range for {self.name} {list(self.shape)}")
        uniq, inverse = torch.unique(flat, return_inverse=True)
        got = np.empty((uniq.numel(), self.shape[1]), dtype=self._rows.dtype)
        ids = uniq.tolist()
        i = 0
        while i < len(ids):  # runs of consecutive ids are one read
            j = i + 1
            while j < len(ids) and ids[j] == ids[j - 1] + 1:
                j += 1
            self._rows.read(ids[i], ids[j - 1] + 1, out=got[i:j])
            i = j
        return to_torch(got)[inverse].reshape(*idx.shape, self.shape[1])

    def to(self, device: Any = None, dtype: torch.dtype | None = None) -> Any:
        """Itself on the CPU (stored dtype); elsewhere a tensor copied there block by block (stored dtype), or the
        whole matrix in ``dtype`` when one is asked for (what a caller that needs it all gets)."""
        dev = torch.device(device) if device is not None else self.device
        if dev.type == "cpu" and (dtype is None or dtype == self.dtype):
            return self
        if dev.type == "cuda" and (dtype is None or dtype == self.dtype):
            return self._to_cuda(dev)
        out = torch.empty(tuple(self.shape), dtype=dtype or self.dtype, device=dev)
        for a, w in self.blocks():
            out[a:a + w.shape[0]] = w.to(dev)
        return out

    def _to_cuda(self, dev: torch.device, size: int = BLOCK_ROWS) -> torch.Tensor:
        """The whole matrix on a CUDA device in its stored dtype: each block read from the file into one of two
        pinned buffers while the other one's copy runs (a read of block k+1 overlaps the copy of block k; a copy
        from pageable memory stages through the driver and waits for it). 2.35 GB: one read at the file's rate."""
        out = torch.empty(tuple(self.shape), dtype=self.dtype, device=dev)
        n = min(size, self.shape[0])
        bufs = [torch.empty((n, self.shape[1]), dtype=self.dtype, pin_memory=True) for _ in range(2)]
        done: list[Any] = [None, None]
        stream = torch.cuda.current_stream(dev)
        for k, a in enumerate(range(0, self.shape[0], size)):
            i, b = k % 2, min(self.shape[0], a + size)
            if done[i] is not None:
                done[i].synchronize()  # that buffer's last copy has left it
            buf = bufs[i][: b - a]
            self._rows.read(a, b, out=as_array(buf))
            out[a:b].copy_(buf, non_blocking=True)
            done[i] = torch.cuda.Event()
            done[i].record(stream)
        stream.synchronize()
        return out

    def float(self) -> torch.Tensor:
        return self.to("cpu", torch.float32)

    def check_finite(self, what: str, path: str | Path) -> None:
        """One streamed pass: NaN or Inf anywhere is bad input (``what`` holds NaN or Inf), as for a tensor read whole."""
        for _a, w in self.blocks():
            if not all_finite(w):
                raise ForensicsError(f"{what} holds NaN or Inf", path=path)


def disk_rows(md: Any, name: str) -> DiskRows:
    """Tensor ``name`` of a ``ModelDir`` (2-D, its header already checked) as ``DiskRows``."""
    info = md.info(name)
    return DiskRows(md._handle(info.file).rows(name), name, info.file)


def head_block(head: Any, start: int, stop: int) -> torch.Tensor:
    """Rows [start, stop) of an lm_head given as a tensor or as ``DiskRows`` (stored dtype, its device)."""
    return head.block(start, stop) if isinstance(head, DiskRows) else head[start:stop]
