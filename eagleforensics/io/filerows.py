"""Row ranges of one capture position, read straight from the file so a sweep streams in bounded memory.

Memory-mapped tensors (what ``torch.load(mmap=True)`` and safetensors' ``safe_open`` hand out)
keep every page they touched mapped into the process: scoring a 2 GB sweep through them
ends with 2 GB of resident memory. ``FileRows`` copies only the rows asked for into a buffer
with one positional read (``os.preadv``), so only that buffer is resident and the reads can
run on a background thread. ``PositionSource`` pairs such a row reader with the whole-tensor
reader the rest of the library uses (``Capture.read``).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ..errors import ForensicsError

RowReader = Callable[..., torch.Tensor]  # (start, stop, out=None) -> [stop-start, H]
IOV_BATCH = 512


class FileRows:
    """A row-major [rows, cols] tensor stored at byte ``offset`` of ``path``; ``read`` copies any row range."""

    def __init__(self, path: str | Path, offset: int, rows: int, cols: int, dtype: torch.dtype) -> None:
        self.path, self.offset, self.rows, self.cols, self.dtype = str(path), int(offset), int(rows), int(cols), dtype
        self.row_bytes = self.cols * torch.empty((), dtype=dtype).element_size()
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._views: dict[tuple[int, int, int], list[memoryview]] = {}  # row buffers of recent strided outs

    def _open(self) -> int:
        with self._lock:
            if self._fd is None:
                try:
                    self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
                except OSError as exc:
                    raise ForensicsError(f"cannot open for reading ({exc.strerror})", path=self.path) from None
            return self._fd

    def read(self, start: int = 0, stop: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows [start, stop) as a [n, cols] tensor of the stored dtype.

        ``out`` (same dtype, at least n rows, each row contiguous; rows may be strided, e.g. one
        position's column of a [rows, positions, H] buffer) is filled by one scatter read.
        """
        stop = self.rows if stop is None else min(stop, self.rows)
        start = max(0, min(start, stop))
        n = stop - start
        if out is None or out.dtype != self.dtype or out.dim() != 2 or out.shape[0] < n \
                or out.shape[1] != self.cols or (n and out.stride(1) != 1):
            out = torch.empty((n, self.cols), dtype=self.dtype)
        out = out[:n]
        if n == 0:
            return out
        if out.is_contiguous():
            views = [memoryview(out.view(torch.uint8).numpy()).cast("B")]
        else:
            views = self._row_views(out, n)
        pos = self.offset + start * self.row_bytes
        for i in range(0, len(views), IOV_BATCH):  # the kernel takes at most IOV_MAX buffers per call
            batch = views[i:i + IOV_BATCH]
            size = sum(len(v) for v in batch)
            self._pread(batch, pos, size, start, stop)
            pos += size
        return out

    def _row_views(self, out: torch.Tensor, n: int) -> list[memoryview]:
        """One memoryview per row of a strided ``out`` (cached: readers refill the same buffers)."""
        key = (out.data_ptr(), out.stride(0), n)
        views = self._views.get(key)
        if views is None:
            flat = out.as_strided((out.untyped_storage().nbytes() // out.element_size(),), (1,), 0)
            base = memoryview(flat.view(torch.uint8).numpy()).cast("B")
            step, size = out.stride(0) * out.element_size(), self.row_bytes
            first = out.storage_offset() * out.element_size()
            views = [base[first + i * step:first + i * step + size] for i in range(n)]
            if len(self._views) >= 8:
                self._views.clear()
            self._views[key] = views
        return views

    def _pread(self, views: list[memoryview], pos: int, want: int, start: int, stop: int) -> None:
        fd = self._open()
        done = 0
        while done < want:
            if hasattr(os, "preadv"):
                got = os.preadv(fd, views, pos + done)
            else:  # pragma: no cover - platforms without preadv
                with self._lock:
                    os.lseek(fd, pos + done, os.SEEK_SET)
                    got = os.readv(fd, views)
            if got <= 0:
                raise ForensicsError(f"file ended while reading rows {start}..{stop}: it changed after it was opened",
                                     path=self.path)
            done += got
            while views and got >= len(views[0]):  # drop what a short read filled
                got -= len(views[0])
                views = views[1:]
            if views and got:
                views = [views[0][got:], *views[1:]]

    def __call__(self) -> torch.Tensor:
        return self.read()

    def __del__(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass


class PositionSource:
    """One capture position: calling it returns the whole [T, H] tensor; ``rows(a, b)`` just those rows.

    ``streams`` says whether ``rows`` touches only the rows asked for (a file read or a view of
    a tensor already in memory) rather than loading the whole position first.
    """

    def __init__(self, full: Callable[[], torch.Tensor], rows: RowReader | None = None) -> None:
        self.full = full
        self._rows = rows

    @classmethod
    def of_tensor(cls, t: torch.Tensor) -> "PositionSource":
        """A position already in memory (or memory-mapped): rows are views."""
        return cls(lambda: t, lambda a, b, out=None: t[a:b])

    @property
    def streams(self) -> bool:
        return self._rows is not None

    def __call__(self) -> torch.Tensor:
        return self.full()

    def rows(self, start: int, stop: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows [start, stop); ``out`` is a buffer the reader may fill (a view may be returned instead)."""
        if self._rows is None:
            return self.full()[start:stop]
        return self._rows(start, stop, out=out)

    def with_rows(self, rows: RowReader) -> "PositionSource":
        return PositionSource(self.full, rows)


def safetensors_rows(path: Path, header: dict[str, Any], name: str, dtype: torch.dtype) -> FileRows:
    """A FileRows for tensor ``name`` of a safetensors file whose (validated) header is ``header``."""
    import struct

    with path.open("rb") as fh:
        (hlen,) = struct.unpack("<Q", fh.read(8))
    start = int(header[name]["data_offsets"][0])
    shape = [int(d) for d in header[name]["shape"]] or [1]
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return FileRows(path, 8 + hlen + start, rows, shape[-1], dtype)


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def torch_zip_locator(path: Path, loaded: Any) -> Callable[[torch.Tensor], FileRows | None] | None:
    """For a ``torch.load(mmap=True)`` result of a zip .pt file: a function giving each row-contiguous
    tensor's FileRows (None for tensors not laid out as plain rows); None when offsets cannot be proven.

    The storages' file offsets come from loading the same file again onto the meta device, which
    records each storage's offset without reading data; a tensor of the memory-mapped load sits
    at (its storage's address - the mapping's base). The base must agree for every storage.
    """
    try:
        meta = torch.load(str(path), map_location="meta", weights_only=True)
    except Exception:
        return None
    real, fake = list(_tensors(loaded)), list(_tensors(meta))
    if len(real) != len(fake):
        return None
    bases = set()
    for r, f in zip(real, fake):
        off = getattr(f.untyped_storage(), "_checkpoint_offset", None)
        if off is None or r.dtype != f.dtype or r.shape != f.shape:
            return None
        bases.add(r.untyped_storage().data_ptr() - int(off))
    if len(bases) != 1:
        return None
    (base,) = bases
    size = path.stat().st_size

    def locate(t: torch.Tensor) -> FileRows | None:
        if t.dim() != 2 or t.stride(1) != 1 or (t.shape[0] > 1 and t.stride(0) != t.shape[1]):
            return None
        offset = t.untyped_storage().data_ptr() - base + t.storage_offset() * t.element_size()
        if offset < 0 or offset + t.numel() * t.element_size() > size:
            return None
        return FileRows(path, offset, t.shape[0], t.shape[1], t.dtype)

    return locate


def file_locator(path: Path, loaded: Any) -> Callable[[torch.Tensor], FileRows | None] | None:
    """Where in ``path`` a tensor of its ``load_object`` result lies, as FileRows; None if not provable.

    Zip .pt files go through ``torch_zip_locator``; a safetensors file holding exactly one
    floating-point tensor of 2+ dims maps to that tensor. Other formats are read into memory
    whole, so their tensors are plain in-memory views already.
    """
    from .safeload import read_safetensors_header, sniff

    kind = sniff(path)
    if kind == "torch-zip":
        return torch_zip_locator(path, loaded)
    if kind != "safetensors":
        return None
    dtypes = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    header = read_safetensors_header(path)
    names = [k for k, v in header.items() if k != "__metadata__" and v.get("dtype") in dtypes
             and len(v.get("shape", [])) >= 2]
    if len(names) != 1:
        return None
    rows = safetensors_rows(path, header, names[0], dtypes[header[names[0]]["dtype"]])

    def locate(t: torch.Tensor) -> FileRows | None:
        return rows if (t.dim() == 2 and (rows.rows, rows.cols) == tuple(t.shape) and t.dtype == rows.dtype) else None

    return locate
