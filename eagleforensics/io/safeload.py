"""Open user files safely: sniff the real format from the bytes, never unpickle arbitrary objects.

Every reader here returns plain Python containers of tensors (and str/int metadata) or
raises ``ForensicsError`` naming the file. ``.pt``/``.ckpt`` go through
``torch.load(weights_only=True)``; the opt-in ``allow_unsafe`` exists for files from a
trusted source whose pickles hold other objects, and it runs their code on load.
"""
from __future__ import annotations

import builtins
import gzip
import inspect
import io
import json
import math
import os
import re
import struct
import sys
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ForensicsError
from .guards import check_expansion, check_zip_members, expansion_limit, parse_json
from .sizecheck import check_legacy_torch, check_npy, human_bytes

UNSAFE_HINT = (
    "pass --allow-unsafe-pickle only if you trust where the file came from: "
    "unpickling runs whatever code the file contains"
)
# A header bigger than this is not a hidden-state dump; refuse before allocating it.
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
# bytes per element of each safetensors dtype (safetensors format spec); others are left to the library
_ST_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
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


def sniff(path: Path) -> str:
    """Name the container format from the first bytes: gzip, torch-zip, npz, npy, pickle, safetensors."""
    with path.open("rb") as fh:
        head = fh.read(16)
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[:6] == b"\x93NUMPY":
        return "npy"
    if head[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
        except Exception as exc:  # zipfile raises many types for one cause (bad bytes)
            raise ForensicsError(f"truncated or corrupt zip archive ({' '.join(str(exc).split())[:120]})",
                                 path=path) from None
        if names and all(n.endswith(".npy") for n in names):
            return "npz"
        return "torch-zip"
    if head[:1] == b"\x80":
        return "pickle"
    if len(head) >= 9 and head[8:9] == b"{":
        return "safetensors"
    raise ForensicsError(
        "unknown format: not a torch, safetensors, numpy or gzip file (first bytes "
        f"{head[:8].hex()})",
        path=path,
    )


def _torch_load(source: Any, path: Path, *, allow_unsafe: bool, mmap: bool) -> Any:
    try:
        with warnings.catch_warnings():  # torch warns on stderr about pickle protocols; we say it in one line
            warnings.simplefilter("ignore")
            return torch.load(source, map_location="cpu", weights_only=not allow_unsafe, mmap=mmap)
    except Exception as exc:  # torch raises many types for one cause: bad bytes
        text = " ".join(str(exc).split())
        if "Weights only load failed" in text or "WeightsUnpickler error" in text or "Unsupported global" in text:
            raise ForensicsError(f"refused to unpickle: {_refusal(text)}; {UNSAFE_HINT}", path=path) from None
        raise ForensicsError(f"cannot read as a torch file (truncated or corrupt): {text[:200]}", path=path) from None


_RUNS_CODE = {"exec", "eval", "compile", "__import__", "system", "popen", "Popen", "run", "call", "check_call",
              "check_output", "spawnv", "execv", "execve", "getattr", "apply", "touch", "write_text", "write_bytes"}


def _refusal(text: str) -> str:
    """Say what the weights-only unpickler refused: a named global (real or garbled) or an opcode."""
    m = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (\S+)", text)
    if m:
        name = m.group(1)
        if name.rsplit(".", 1)[-1] in _RUNS_CODE:
            return f"the file calls {name}, which would run code on load"
        if _resolvable(name):
            return f"the file references {name}, which is not a tensor or a plain container"
        return (f"the file references {name}, which does not exist here: the pickle is corrupt or needs "
                "code this environment lacks")
    m = re.search(r"WeightsUnpickler error: (.*?)(?: Check the documentation|$)", text)
    detail = m.group(1)[:120] if m else "the weights-only unpickler stopped on it"
    return f"{detail} (the pickle is corrupt or holds more than tensors and plain containers)"


def _resolvable(name: str) -> bool:
    """True if ``module.attr`` names something already imported (static lookups: nothing is imported or run)."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        obj = sys.modules.get(".".join(parts[:i]))
        if obj is None:
            continue
        for attr in parts[i:]:
            obj = inspect.getattr_static(obj, attr, None)
            if obj is None:
                return False
        return True
    return name in dir(builtins)


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """Parse and validate a safetensors header (names, dtypes, shapes, offsets) without reading data."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise ForensicsError("truncated safetensors file (no header length)", path=path)
        (hlen,) = struct.unpack("<Q", raw)
        if hlen > MAX_SAFETENSORS_HEADER or 8 + hlen > size:
            raise ForensicsError(
                f"safetensors header claims {hlen} bytes but the file has {size}: truncated or corrupt",
                path=path,
            )
        try:
            header = parse_json(fh.read(hlen), path, "safetensors header")
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ForensicsError(f"corrupt safetensors header ({exc})", path=path) from None
    if not isinstance(header, dict):
        raise ForensicsError("corrupt safetensors header (not a JSON object)", path=path)
    data_len = size - 8 - hlen
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
            shape = [int(d) for d in info["shape"]]
        except (TypeError, KeyError, ValueError):
            raise ForensicsError(f"corrupt safetensors entry {name!r}", path=path) from None
        if not (0 <= start <= end <= data_len) or any(d < 0 for d in shape):
            raise ForensicsError(
                f"safetensors entry {name!r} points past the end of the file: truncated or corrupt",
                path=path,
            )
        item = _ST_ITEMSIZE.get(str(info.get("dtype")))
        if item is not None and math.prod(shape) * item != end - start:
            raise ForensicsError(
                f"safetensors entry {name!r} claims shape {shape} {info.get('dtype')} "
                f"({human_bytes(math.prod(shape) * item)}) but holds {human_bytes(end - start)}: corrupt header",
                path=path,
            )
    return header


def open_safetensors(path: Path) -> Any:
    """A lazy safetensors handle (tensors are read one at a time); header validated first."""
    from safetensors import safe_open

    read_safetensors_header(path)
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as exc:
        raise ForensicsError(f"cannot open safetensors file: {' '.join(str(exc).split())[:200]}", path=path) from None


def read_tensor(handle: Any, name: str, path: Path) -> torch.Tensor:
    """Read one tensor from a safetensors handle, turning library errors into ForensicsError."""
    try:
        return handle.get_tensor(name)
    except Exception as exc:
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
        with gzip.open(p, "rb") as fh:
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
        with zipfile.ZipFile(source) as zf:
            check_zip_members(zf, p, where)
    except ForensicsError:
        raise
    except Exception as exc:  # zipfile raises many types for one cause (bad bytes)
        raise ForensicsError(f"{where}truncated or corrupt zip archive ({' '.join(str(exc).split())[:120]})",
                             path=p) from None
    finally:
        if hasattr(source, "seek"):
            source.seek(0)


def load_object(path: str | Path, *, allow_unsafe: bool = False, mmap: bool = True) -> Any:
    """Load a whole file into Python containers of tensors, whatever its container format.

    safetensors files come back as ``{"__metadata__": {...}, name: tensor, ...}``; npz as a
    dict; npy as one tensor; gzip is unpacked in memory then sniffed again (torch only).
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
        if payload[:1] == b"\x80":
            check_legacy_torch(buf, len(payload), p)
        return _torch_load(buf, p, allow_unsafe=allow_unsafe, mmap=False)
    if kind == "pickle":
        with p.open("rb") as fh:
            check_legacy_torch(fh, p.stat().st_size, p)
    if kind in ("torch-zip", "npz"):
        _check_zip(p, p)
    if kind in ("torch-zip", "pickle"):
        return _torch_load(str(p), p, allow_unsafe=allow_unsafe, mmap=mmap and kind == "torch-zip")
    if kind == "safetensors":
        handle = open_safetensors(p)
        out: dict[str, Any] = {"__metadata__": dict(handle.metadata() or {})}
        for name in handle.keys():
            out[name] = read_tensor(handle, name, p)
        return out
    if kind == "npy":
        return _numpy_to_torch(_np_load(p), p)
    # npz: members are read lazily, so a damaged one fails here, not in np.load
    with _np_load(p) as archive:
        out = {}
        for name in archive.files:
            try:
                out[name] = _numpy_to_torch(archive[name], p)
            except ForensicsError:
                raise
            except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as exc:
                raise ForensicsError(f"npz member {name!r} is truncated or corrupt "
                                     f"({' '.join(str(exc).split())[:120]})", path=p) from None
        return out


def _np_load(p: Path) -> Any:
    _check_np_headers(p)
    try:
        return np.load(p, allow_pickle=False, mmap_mode=None)
    except ValueError as exc:
        if "pickle" in str(exc):
            raise ForensicsError(f"numpy file holds Python objects; {UNSAFE_HINT}", path=p) from None
        raise ForensicsError(f"corrupt numpy file ({exc})", path=p) from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ForensicsError(f"truncated or corrupt numpy file ({exc})", path=p) from None


def _check_np_headers(p: Path) -> None:
    """Validate the .npy header(s) of ``p`` against the bytes present before numpy allocates."""
    if sniff(p) == "npy":
        with p.open("rb") as fh:
            check_npy(fh, p.stat().st_size, p)
        return
    try:
        with zipfile.ZipFile(p) as zf:
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


def _numpy_to_torch(arr: Any, p: Path) -> Any:
    try:
        return torch.from_numpy(np.ascontiguousarray(arr))
    except (TypeError, ValueError, OSError) as exc:
        raise ForensicsError(f"unsupported numpy array ({exc})", path=p) from None
