"""Row ranges of one capture position, read straight from the file so a sweep streams in bounded memory.

Memory-mapped tensors (what ``torch.load(mmap=True)`` and safetensors' ``safe_open`` hand out)
keep every page they touched mapped into the process: scoring a 2 GB sweep through them
ends with 2 GB of resident memory. ``FileRows`` copies only the rows asked for into a buffer
with one positional read (``os.preadv``), so only that buffer is resident and the reads can
run on a background thread. ``PositionSource`` pairs such a row reader with the whole-tensor
reader the rest of the library uses (``Capture.read``). Rows are numpy arrays (bf16 as
``arrays.BF16``). A ``.pt`` capture read by ``torchfile`` knows where its rows lie; torch is
imported here only to locate the rows of one that ``torch.load`` mapped (``--allow-unsafe-pickle``).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..arrays import as_array, dtype_name, numpy_dtype
from ..errors import ForensicsError
from .guards import open_regular_fd

RowReader = Callable[..., np.ndarray]  # (start, stop, out=None) -> [stop-start, H]
IOV_BATCH = 512


class FileRows:
    """A row-major [rows, cols] array stored at byte ``offset`` of ``path``; ``read`` copies any row range.

    ``dtype`` is a numpy dtype (``arrays.BF16`` for bf16; a torch dtype or a name is converted).
    """

    def __init__(self, path: str | Path, offset: int, rows: int, cols: int, dtype: Any) -> None:
        dtype = dtype if isinstance(dtype, np.dtype) else numpy_dtype(dtype_name(dtype))
        self.path, self.offset, self.rows, self.cols, self.dtype = str(path), int(offset), int(rows), int(cols), dtype
        self.row_bytes = self.cols * dtype.itemsize
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._views: dict[tuple[int, int, int], list[memoryview]] = {}  # row buffers of recent strided outs

    def _open(self) -> int:
        with self._lock:
            if self._fd is None:
                self._fd = open_regular_fd(self.path, "file")  # a FIFO swapped in is refused, never waited on
            return self._fd

    def read(self, start: int = 0, stop: int | None = None, out: Any = None) -> np.ndarray:
        """Rows [start, stop) as a [n, cols] array of the stored dtype.

        ``out`` (an ndarray, or a torch tensor seen through ``arrays.as_array``; same dtype, at
        least n rows, each row contiguous; rows may be strided, e.g. one position's column of a
        [rows, positions, H] buffer) is filled by one scatter read and a view of it returned.
        """
        stop = self.rows if stop is None else min(stop, self.rows)
        start = max(0, min(start, stop))
        n = stop - start
        if out is not None and not isinstance(out, np.ndarray):
            out = as_array(out)
        if out is None or out.dtype != self.dtype or out.ndim != 2 or out.shape[0] < n \
                or out.shape[1] != self.cols or (n and self.cols > 1 and out.strides[1] != self.dtype.itemsize) \
                or not out.flags.writeable:
            out = np.empty((n, self.cols), dtype=self.dtype)
        out = out[:n]
        if n == 0 or self.row_bytes == 0:
            return out
        if out.flags.c_contiguous:
            views = [memoryview(out.reshape(-1).view(np.uint8))]
        else:
            views = self._row_views(out, n)
        pos = self.offset + start * self.row_bytes
        for i in range(0, len(views), IOV_BATCH):  # the kernel takes at most IOV_MAX buffers per call
            batch = views[i:i + IOV_BATCH]
            size = sum(len(v) for v in batch)
            self._pread(batch, pos, size, start, stop)
            pos += size
        return out

    def _row_views(self, out: np.ndarray, n: int) -> list[memoryview]:
        """One memoryview per row of a strided ``out`` (cached: readers refill the same buffers)."""
        key = (out.__array_interface__["data"][0], out.strides[0], n)
        views = self._views.get(key)
        if views is None:
            views = [memoryview(out[i].view(np.uint8)) for i in range(n)]
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

    def __call__(self) -> np.ndarray:
        return self.read()

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)  # None too when __init__ refused its arguments
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


class PositionSource:
    """One capture position: calling it returns the whole [T, H] array; ``rows(a, b)`` just those rows.

    ``streams`` says whether ``rows`` touches only the rows asked for (a file read or a view of
    an array already in memory) rather than loading the whole position first.
    """

    def __init__(self, full: Callable[[], np.ndarray], rows: RowReader | None = None) -> None:
        self.full = full
        self._rows = rows

    @classmethod
    def of_array(cls, t: np.ndarray) -> "PositionSource":
        """A position already in memory (or memory-mapped): rows are views."""
        return cls(lambda: t, lambda a, b, out=None: t[a:b])

    @property
    def streams(self) -> bool:
        return self._rows is not None

    def __call__(self) -> np.ndarray:
        return self.full()

    def rows(self, start: int, stop: int, out: Any = None) -> np.ndarray:
        """Rows [start, stop); ``out`` is a buffer the reader may fill (a view may be returned instead)."""
        if self._rows is None:
            return self.full()[start:stop]
        return self._rows(start, stop, out=out)

    def with_rows(self, rows: RowReader) -> "PositionSource":
        return PositionSource(self.full, rows)


def safetensors_rows(path: Path, header: dict[str, Any], name: str, dtype: Any) -> FileRows:
    """A FileRows for tensor ``name`` of a safetensors file whose (validated) header is ``header``."""
    from .formats import safetensors_data_start

    start = int(header[name]["data_offsets"][0])
    shape = [int(d) for d in header[name]["shape"]] or [1]
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return FileRows(path, safetensors_data_start(path) + start, rows, shape[-1], dtype)


def _arrays(obj: Any) -> Iterator[np.ndarray]:
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _arrays(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _arrays(v)


def _tensors(obj: Any) -> Iterator[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def torch_zip_locator(path: Path, loaded: Any) -> Callable[[np.ndarray], FileRows | None] | None:
    """For a ``load_object`` result of a zip .pt file (loaded with ``mmap=True``, tensors turned into
    arrays over the same memory): a function giving each row-contiguous array's FileRows (None for
    arrays not laid out as plain rows); None when offsets cannot be proven.

    The storages' file offsets come from loading the same file again onto the meta device, which
    records each storage's offset without reading data; an array of the memory-mapped load sits
    at (its address - its offset inside its storage - the storage's file offset - the mapping's
    base). The base must agree for every array.
    """
    import torch

    try:
        meta = torch.load(str(path), map_location="meta", weights_only=True)
    except Exception:
        return None
    real, fake = list(_arrays(loaded)), list(_tensors(meta))
    if len(real) != len(fake):
        return None
    bases = set()
    for r, f in zip(real, fake):
        off = getattr(f.untyped_storage(), "_checkpoint_offset", None)
        if off is None or dtype_name(r.dtype) != dtype_name(f.dtype) or r.shape != tuple(f.shape):
            return None
        bases.add(_address(r) - f.storage_offset() * f.element_size() - int(off))
    if len(bases) != 1:
        return None
    (base,) = bases
    size = path.stat().st_size

    def locate(t: np.ndarray) -> FileRows | None:
        item = t.dtype.itemsize
        if t.ndim != 2 or (t.shape[1] > 1 and t.strides[1] != item) \
                or (t.shape[0] > 1 and t.strides[0] != t.shape[1] * item):
            return None
        offset = _address(t) - base
        if offset < 0 or offset + t.size * item > size:
            return None
        return FileRows(path, offset, t.shape[0], t.shape[1], t.dtype)

    return locate


def file_locator(path: Path, loaded: Any) -> Callable[[np.ndarray], FileRows | None] | None:
    """Where in ``path`` an array of its ``load_object`` result lies, as FileRows; None if not provable.

    Zip .pt files go through ``torch_zip_locator``; a safetensors file holding exactly one
    floating-point tensor of 2+ dims maps to that tensor. Other formats are read into memory
    whole, so their arrays are plain in-memory views already.
    """
    from .formats import read_safetensors_header, sniff

    kind = sniff(path)
    if kind == "torch-zip":
        return torch_zip_locator(path, loaded)
    if kind != "safetensors":
        return None
    dtypes = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
    header = read_safetensors_header(path)
    names = [k for k, v in header.items() if k != "__metadata__" and v.get("dtype") in dtypes
             and len(v.get("shape", [])) >= 2]
    if len(names) != 1:
        return None
    rows = safetensors_rows(path, header, names[0], numpy_dtype(dtypes[header[names[0]]["dtype"]]))

    def locate(t: np.ndarray) -> FileRows | None:
        return rows if (t.ndim == 2 and (rows.rows, rows.cols) == tuple(t.shape) and t.dtype == rows.dtype) else None

    return locate
