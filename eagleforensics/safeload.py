"""Open user files safely: sniff the real format from the bytes, never unpickle arbitrary objects.

Every reader here returns plain Python containers of tensors (and str/int metadata) or
raises ``ForensicsError`` naming the file. ``.pt``/``.ckpt`` go through
``torch.load(weights_only=True)``; the opt-in ``allow_unsafe`` exists for files from a
trusted source whose pickles hold other objects, and it runs their code on load.
"""
from __future__ import annotations

import gzip
import io
import json
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import ForensicsError

UNSAFE_HINT = (
    "pass --allow-unsafe-pickle only if you trust where the file came from: "
    "unpickling runs whatever code the file contains"
)
# A header bigger than this is not a hidden-state dump; refuse before allocating it.
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


def check_file(path: str | Path) -> Path:
    """Return ``path`` as a Path if it names a readable, non-empty regular file."""
    p = Path(path)
    if not p.exists():
        raise ForensicsError("no such file", path=p)
    if p.is_dir():
        raise ForensicsError("is a directory, expected a file", path=p)
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
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise ForensicsError(f"truncated or corrupt zip archive ({exc})", path=path) from None
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
        return torch.load(source, map_location="cpu", weights_only=not allow_unsafe, mmap=mmap)
    except Exception as exc:  # torch raises many types for one cause: bad bytes
        text = " ".join(str(exc).split())
        if "weights_only" in text or "Unsupported global" in text or "UnpicklingError" in type(exc).__name__:
            raise ForensicsError(
                "refused to unpickle: the file holds Python objects other than tensors and "
                f"plain containers; {UNSAFE_HINT}",
                path=path,
            ) from None
        raise ForensicsError(f"cannot read as a torch file: {text[:200]}", path=path) from None


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
            header = json.loads(fh.read(hlen))
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


def load_object(path: str | Path, *, allow_unsafe: bool = False, mmap: bool = True) -> Any:
    """Load a whole file into Python containers of tensors, whatever its container format.

    safetensors files come back as ``{"__metadata__": {...}, name: tensor, ...}``; npz as a
    dict; npy as one tensor; gzip is unpacked in memory then sniffed again (torch only).
    """
    p = check_file(path)
    kind = sniff(p)
    if kind == "gzip":
        try:
            with gzip.open(p, "rb") as fh:
                payload = fh.read()
        except (EOFError, OSError, zlib.error) as exc:
            raise ForensicsError(f"truncated or corrupt gzip stream ({exc})", path=p) from None
        if not payload:
            raise ForensicsError("gzip stream is empty", path=p)
        return _torch_load(io.BytesIO(payload), p, allow_unsafe=allow_unsafe, mmap=False)
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
    # npz
    with _np_load(p) as archive:
        return {name: _numpy_to_torch(archive[name], p) for name in archive.files}


def _np_load(p: Path) -> Any:
    try:
        return np.load(p, allow_pickle=False, mmap_mode=None)
    except ValueError as exc:
        if "pickle" in str(exc):
            raise ForensicsError(f"numpy file holds Python objects; {UNSAFE_HINT}", path=p) from None
        raise ForensicsError(f"corrupt numpy file ({exc})", path=p) from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ForensicsError(f"truncated or corrupt numpy file ({exc})", path=p) from None


def _numpy_to_torch(arr: Any, p: Path) -> Any:
    try:
        return torch.from_numpy(np.ascontiguousarray(arr))
    except (TypeError, ValueError, OSError) as exc:
        raise ForensicsError(f"unsupported numpy array ({exc})", path=p) from None
