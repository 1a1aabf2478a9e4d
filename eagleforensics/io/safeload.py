"""Open user files safely: sniff the real format from the bytes, never unpickle arbitrary objects.

Every reader here returns plain Python containers of numpy arrays (and str/int metadata) or
raises ``ForensicsError`` naming the file. Nothing here imports torch: safetensors and numpy
files are read by their headers (bf16 as ``arrays.BF16``), ``.pt``/``.ckpt`` (zip or legacy,
also gzipped) by ``torchfile``'s restricted unpickler, which rebuilds tensors as arrays and
refuses every other object, as ``torch.load(weights_only=True)`` does. The opt-in
``allow_unsafe`` exists for files from a trusted source whose pickles hold other objects: it
goes through ``torch.load(weights_only=False)``, runs their code on load, and only then is
torch imported; its tensors become arrays right there (``arrays.as_array``, zero-copy).
"""
from __future__ import annotations

import contextlib
import gzip
import io
import math
import os
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..arrays import BF16, as_array, is_torch
from ..errors import ForensicsError
from .filerows import FileRows
from .formats import UNSAFE_HINT, is_pickle_head, read_header, sniff
from .guards import MAX_DEPTH, check_expansion, check_zip_members, expansion_limit, open_regular
from .sizecheck import check_legacy_torch, check_npy, compressed_pickle_limit

# numpy dtype of each safetensors dtype read here (all little-endian, as the format stores them)
_ST_NUMPY = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": BF16,
             "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
             "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
             "BOOL": np.dtype("?")}
_KIND_WORDS = {"torch-zip": "a torch zip archive", "pickle": "a pickle", "npy": "a numpy array",
               "npz": "an npz archive", "safetensors": "safetensors"}


def check_file(path: str | Path) -> Path:
    """Return ``path`` as a Path if it names a readable, non-empty regular file."""
    p = Path(path)
    if not p.exists():
        raise ForensicsError("no such file", path=p)
    if p.is_dir():
        raise ForensicsError("is a directory, expected a file", path=p)
    if not p.is_file():
        raise ForensicsError("is not a regular file (a device, pipe or socket); copy the data to a file", path=p)
    if not os.access(p, os.R_OK):
        raise ForensicsError("cannot be read: permission denied", path=p)
    if p.stat().st_size == 0:
        raise ForensicsError("file is empty", path=p)
    return p


def _torch_load(source: Any, path: Path, *, allow_unsafe: bool, mmap: bool) -> Any:
    """``torch.load`` for ``--allow-unsafe-pickle`` (runs the file's code), its many failure types as one line."""
    import torch

    try:
        with warnings.catch_warnings():  # torch warns on stderr about pickle protocols; we say it in one line
            warnings.simplefilter("ignore")
            return torch.load(source, map_location="cpu", weights_only=not allow_unsafe, mmap=mmap)
    except Exception as exc:  # torch raises many types for one cause: bad bytes
        text = " ".join(str(exc).split())
        raise ForensicsError(f"cannot read as a torch file (truncated or corrupt): {text[:200]}", path=path) from None


class SafetensorsFile:
    """A safetensors file read without torch: the header is validated once, each tensor is read on demand
    into a fresh ndarray (bf16 as ``arrays.BF16``) with one positional read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.header, self.data_start = read_header(path)

    def keys(self) -> list[str]:
        return [k for k in self.header if k != "__metadata__"]

    def metadata(self) -> dict[str, str]:
        """The header's ``__metadata__`` (an object of strings: checked when the header was read)."""
        return dict(self.header.get("__metadata__") or {})

    def dtype(self, name: str) -> np.dtype:
        """The numpy dtype of tensor ``name``; a stored dtype numpy cannot hold here is one clear error."""
        code = str(self.header[name].get("dtype"))
        dtype = _ST_NUMPY.get(code)
        if dtype is None:
            raise ForensicsError(f"tensor {name!r} holds {code} values, which eagleforensics does not read "
                                 "(store hidden states as BF16, F16, F32 or F64)", path=self.path)
        return dtype

    def rows(self, name: str) -> FileRows:
        """Tensor ``name`` as [rows, last dim] file rows (a 0-d tensor is one row of one value)."""
        info = self.header[name]
        shape = [int(d) for d in info["shape"]] or [1]
        return FileRows(self.path, self.data_start + int(info["data_offsets"][0]), math.prod(shape[:-1]),
                        shape[-1], self.dtype(name))

    def get(self, name: str) -> np.ndarray:
        """Tensor ``name`` read whole into memory, in its stored shape and dtype."""
        shape = [int(d) for d in self.header[name]["shape"]]
        return self.rows(name).read().reshape(shape)


def open_safetensors(path: Path) -> SafetensorsFile:
    """A lazy safetensors handle (tensors are read one at a time); header validated first. No torch."""
    return SafetensorsFile(path)


def read_tensor(handle: SafetensorsFile, name: str, path: Path) -> np.ndarray:
    """Read one tensor of a safetensors file as an ndarray; a failed read is one ForensicsError line."""
    try:
        return handle.get(name)
    except ForensicsError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise ForensicsError(f"cannot read tensor {name!r}: {' '.join(str(exc).split())[:200]}", path=path) from None


def gunzip_limit() -> int:
    """The most a gzip stream may expand to: half of the memory this process may use (cgroup-aware)."""
    return expansion_limit()


def gunzip(p: Path, limit: int | None = None) -> bytes:
    """Decompress a gzip file in chunks, refusing one that expands past ``limit`` or ``MAX_RATIO`` (a gzip bomb)."""
    cap = gunzip_limit() if limit is None else limit
    packed = p.stat().st_size
    out = bytearray()
    try:
        with open_regular(p, "gzip file") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as fh:
            while chunk := fh.read(1 << 22):
                out += chunk
                if len(out) > cap:
                    raise ForensicsError(f"gzip stream expands past {cap} bytes (half the memory this process may "
                                         "use): refusing what looks like a gzip bomb", path=p)
                check_expansion(len(out), packed, p, "gzip stream", limit=cap)
    except (EOFError, OSError, zlib.error) as exc:
        raise ForensicsError(f"truncated or corrupt gzip stream ({exc})", path=p) from None
    return bytes(out)


def _check_zip(source: Any, p: Path, where: str = "") -> None:
    """Bound every member of the zip archive ``source`` (a path or a buffer) before torch or numpy expands it."""
    try:
        with (open_regular(source) if isinstance(source, (str, Path)) else contextlib.nullcontext(source)) as fh, \
                zipfile.ZipFile(fh) as zf:
            check_zip_members(zf, p, where)
    except ForensicsError:
        raise
    except Exception as exc:  # zipfile raises many types for one cause (bad bytes)
        raise ForensicsError(f"{where}truncated or corrupt zip archive ({' '.join(str(exc).split())[:120]})",
                             path=p) from None
    finally:
        if hasattr(source, "seek"):
            source.seek(0)


def load_object(path: str | Path, *, allow_unsafe: bool = False, mmap: bool = True, lazy: bool = False) -> Any:
    """Load a whole file into Python containers of ndarrays, whatever its container format.

    safetensors files come back as ``{"__metadata__": {...}, name: array, ...}``; npz as a
    dict; npy as one array; gzip is unpacked in memory then sniffed again (torch formats only).
    torch formats (zip, legacy pickle, gzip) are read by ``torchfile`` without torch; ``lazy``
    leaves their tensors as ``torchfile.StoredTensor`` (read from the file on demand). Only
    ``allow_unsafe`` imports torch (``torch.load``, memory-mapped where ``mmap``).
    """
    p = check_file(path)
    kind = sniff(p)
    if p.name.endswith(".gz") and kind != "gzip":
        raise ForensicsError(f"named .gz but is not gzip (the bytes look like {_KIND_WORDS.get(kind, kind)}): "
                             "renamed or half-written; give it a name that matches its content", path=p)
    if kind == "gzip":
        payload = gunzip(p)
        if not payload:
            raise ForensicsError("gzip stream is empty", path=p)
        buf = io.BytesIO(payload)
        if payload[:4] == b"PK\x03\x04":  # a zip inside the gzip: its members are bounded too
            _check_zip(buf, p, "inside the gzip stream: ")
        if is_pickle_head(payload[:2]):  # its pickles walked no further than the unpickler will read them
            check_legacy_torch(buf, len(payload), p, scan=compressed_pickle_limit(p.stat().st_size))
        if not allow_unsafe:
            from . import torchfile  # imported only for torch files

            return torchfile.load(p, payload, lazy=lazy)
        return to_arrays(_torch_load(buf, p, allow_unsafe=allow_unsafe, mmap=False), p)
    if kind == "pickle":
        with open_regular(p) as fh:
            check_legacy_torch(fh, os.fstat(fh.fileno()).st_size, p)
    if kind in ("torch-zip", "npz"):
        _check_zip(p, p)
    if kind in ("torch-zip", "pickle"):
        if not allow_unsafe:
            from . import torchfile  # imported only for torch files

            return torchfile.load(p, lazy=lazy)
        return to_arrays(_torch_load(str(p), p, allow_unsafe=allow_unsafe, mmap=mmap and kind == "torch-zip"), p)
    if kind == "safetensors":
        handle = open_safetensors(p)
        out: dict[str, Any] = {"__metadata__": handle.metadata()}
        for name in handle.keys():
            out[name] = read_tensor(handle, name, p)
        return out
    if kind == "npy":
        with open_regular(p) as fh:
            return _plain_array(_np_load(p, fh), p)
    # npz: members are read lazily, so a damaged one fails here, not in np.load
    with open_regular(p) as fh, _np_load(p, fh) as archive:
        out = {}
        for name in archive.files:
            try:
                out[name] = _plain_array(archive[name], p)
            except ForensicsError:
                raise
            except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as exc:
                raise ForensicsError(f"npz member {name!r} is truncated or corrupt "
                                     f"({' '.join(str(exc).split())[:120]})", path=p) from None
        return out


def _np_load(p: Path, fh: Any) -> Any:
    """``np.load`` of the regular file ``fh`` (opened from ``p`` through the guard) once its headers are checked."""
    _check_np_headers(p)
    try:
        return np.load(fh, allow_pickle=False, mmap_mode=None)
    except ValueError as exc:
        if "pickle" in str(exc):
            raise ForensicsError(f"numpy file holds Python objects; {UNSAFE_HINT}", path=p) from None
        raise ForensicsError(f"corrupt numpy file ({exc})", path=p) from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ForensicsError(f"truncated or corrupt numpy file ({exc})", path=p) from None


def _check_np_headers(p: Path) -> None:
    """Validate the .npy header(s) of ``p`` against the bytes present before numpy allocates."""
    if sniff(p) == "npy":
        with open_regular(p) as fh:
            check_npy(fh, os.fstat(fh.fileno()).st_size, p)
        return
    try:
        with open_regular(p) as raw, zipfile.ZipFile(raw) as zf:
            for info in zf.infolist():
                with zf.open(info) as fh:
                    check_npy(_Counted(fh), info.file_size, p, member=info.filename)
    except ForensicsError:
        raise
    except Exception as exc:  # zipfile: bad CRC, bad member header, unsupported compression
        raise ForensicsError(f"truncated or corrupt npz archive ({' '.join(str(exc).split())[:120]})", path=p) from None


class _Counted(io.RawIOBase):
    """A forward-only reader that knows how many bytes it has read (zip members cannot tell())."""

    def __init__(self, fh: Any) -> None:
        self._fh, self._n = fh, 0

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        self._n += len(data)
        return data

    def tell(self) -> int:
        return self._n


# what a numpy file's array may hold: bools, integers, IEEE floats of 2/4/8 bytes, complex of 8/16 bytes
_ARRAY_SIZES = {"b": (1,), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8), "c": (8, 16)}


def _plain_array(arr: Any, p: Path) -> np.ndarray:
    """A numpy file's array as a contiguous, native-byte-order ndarray of a numeric dtype."""
    arr = np.asarray(arr)
    if arr.dtype.itemsize not in _ARRAY_SIZES.get(arr.dtype.kind, ()):
        raise ForensicsError(f"unsupported numpy array (dtype {arr.dtype}; expected numbers)", path=p)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return np.ascontiguousarray(arr)


def to_arrays(obj: Any, p: Path) -> Any:
    """What torch loaded, with every tensor (in dicts, lists, tuples) turned into an ndarray, zero-copy
    where it can be: the boundary past which no module sees a torch tensor.

    Containers shared in the object are converted once (a pickle of nested shared lists would
    otherwise take exponential time); one nested past ``guards.MAX_DEPTH`` or containing itself is refused."""
    done: dict[int, Any] = {}
    busy: set[int] = set()

    def walk(x: Any, depth: int) -> Any:
        if is_torch(x):
            try:
                return as_array(x)
            except (TypeError, RuntimeError, ValueError) as exc:
                raise ForensicsError(f"holds a {str(getattr(x, 'dtype', '?')).replace('torch.', '')} tensor that "
                                     f"cannot be read as an array ({' '.join(str(exc).split())[:100]}); store hidden "
                                     "states as bfloat16, float16 or float32", path=p) from None
        plain_tuple = isinstance(x, tuple) and not hasattr(x, "_fields")
        if not (isinstance(x, (dict, list)) or plain_tuple):
            return x
        if id(x) in done:
            return done[id(x)]
        if id(x) in busy:
            raise ForensicsError("holds a container that contains itself: corrupt or hostile", path=p)
        if depth > MAX_DEPTH:
            raise ForensicsError(f"holds containers nested more than {MAX_DEPTH} levels deep: corrupt or hostile",
                                 path=p)
        busy.add(id(x))
        if isinstance(x, dict):
            out: Any = {k: walk(v, depth + 1) for k, v in x.items()}
        elif isinstance(x, list):
            out = [walk(v, depth + 1) for v in x]
        else:
            out = tuple(walk(v, depth + 1) for v in x)
        busy.discard(id(x))
        done[id(x)] = out
        return out

    return walk(obj, 0)
