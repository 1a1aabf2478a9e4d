"""What a file is, by its bytes: the container sniffed by structure, and a safetensors header read and
checked without its data. The floor of ``io``'s readers: ``filerows``, ``torchfile`` and ``safeload`` all
stand on it, and it imports none of them.
"""
from __future__ import annotations

import json
import math
import os
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

from ..errors import ForensicsError
from .guards import open_regular, parse_json
from .sizecheck import check_shape, claimed_int, human_bytes

UNSAFE_HINT = (
    "pass --allow-unsafe-pickle only if you trust where the file came from: "
    "unpickling runs whatever code the file contains"
)
# A header bigger than this is not a hidden-state dump; refuse before allocating it.
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
# bytes per element of each safetensors dtype (safetensors format spec); others are left to the library
_ST_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
                "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1, "C64": 8}
# every dtype name the safetensors format defines (its reader refuses others)
_ST_KNOWN = {*_ST_ITEMSIZE, "F4", "F6_E2M3", "F6_E3M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "C64"}

def is_pickle_head(head: bytes) -> bool:
    """True when ``head`` opens a pickle as torch writes one: PROTO (0x80) then a protocol byte 2..5.

    A lone 0x80 proves nothing: a safetensors file whose header length is 128 mod 256 starts with it."""
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= pickle.HIGHEST_PROTOCOL


def is_safetensors_head(head: bytes, size: int) -> bool:
    """True when ``head`` (the first 9+ bytes of a ``size``-byte file) has the safetensors structure:
    an 8-byte little-endian header length N with 8 + N within the file, the header a JSON object ('{')."""
    if len(head) < 9 or head[8:9] != b"{":
        return False
    (hlen,) = struct.unpack("<Q", head[:8])
    return 2 <= hlen and 8 + hlen <= size


def sniff(path: Path) -> str:
    """Name the container format by its structure: gzip, torch-zip, npz, npy, safetensors, pickle.

    Magic numbers first (gzip, npy, zip); then safetensors by its layout (header length, then a JSON
    object that fits in the file), before a pickle's PROTO opcode: a first byte alone is no proof."""
    with open_regular(path) as fh:
        head = fh.read(16)
        size = os.fstat(fh.fileno()).st_size
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[:6] == b"\x93NUMPY":
        return "npy"
    if head[:4] == b"PK\x03\x04":
        try:
            with open_regular(path) as fh, zipfile.ZipFile(fh) as zf:
                names = zf.namelist()
        except Exception as exc:  # zipfile raises many types for one cause (bad bytes)
            raise ForensicsError(f"truncated or corrupt zip archive ({' '.join(str(exc).split())[:120]})",
                                 path=path) from None
        if names and all(n.endswith(".npy") for n in names):
            return "npz"
        return "torch-zip"
    if is_safetensors_head(head, size):
        return "safetensors"
    if is_pickle_head(head):
        return "pickle"
    if head[8:9] == b"{":  # a damaged safetensors file (its length past the end): the reader says what is wrong
        return "safetensors"
    raise ForensicsError(
        "unknown format: not a torch, safetensors, numpy or gzip file (first bytes "
        f"{head[:8].hex()})",
        path=path,
    )


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """Parse and validate a safetensors header (names, dtypes, shapes, offsets) without reading data."""
    return read_header(path)[0]


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The validated header and the byte offset of the data section (8 + the header length).

    The file is opened once through the regular-file guard and measured on that descriptor.
    Every claim is checked as the safetensors library checks it: ``__metadata__`` an object
    of strings, each entry an object whose shape and offsets are whole numbers, whose bytes
    match its shape and dtype, the entries tiling the data section exactly.
    """
    with open_regular(path, "safetensors file") as fh:
        size = os.fstat(fh.fileno()).st_size
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
        except json.JSONDecodeError as exc:
            raise ForensicsError(f"corrupt safetensors header ({exc})", path=path) from None
    if not isinstance(header, dict):
        raise ForensicsError("corrupt safetensors header (not a JSON object)", path=path)
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise ForensicsError(f"corrupt safetensors header (__metadata__ must be an object of strings, got "
                             f"{type(meta).__name__ if not isinstance(meta, dict) else 'an object of other values'})",
                             path=path)
    data_len = size - 8 - hlen
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        what = f"safetensors entry {name[:80]!r}"
        if not isinstance(info, dict) or not isinstance(info.get("data_offsets"), list) \
                or len(info["data_offsets"]) != 2 or "shape" not in info:
            raise ForensicsError(f"corrupt {what} (expected dtype, shape and two data_offsets)", path=path)
        start, end = (claimed_int(x, f"{what} data offset", path) for x in info["data_offsets"])
        shape = check_shape(info["shape"], what, path)
        if not (start <= end <= data_len):
            raise ForensicsError(f"{what} points past the end of the file: truncated or corrupt", path=path)
        if str(info.get("dtype")) not in _ST_KNOWN:
            raise ForensicsError(f"{what} has unknown dtype {str(info.get('dtype'))[:40]!r}: corrupt header", path=path)
        item = _ST_ITEMSIZE.get(str(info.get("dtype")))
        if item is not None and math.prod(shape) * item != end - start:
            raise ForensicsError(
                f"{what} claims shape {shape} {info.get('dtype')} "
                f"({human_bytes(math.prod(shape) * item)}) but holds {human_bytes(end - start)}: corrupt header",
                path=path,
            )
        spans.append((start, end, str(name)))
    _check_tiling(spans, data_len, path)
    return header, 8 + hlen


def _check_tiling(spans: list[tuple[int, int, str]], data_len: int, path: Path) -> None:
    """The tensors must cover the data section end to end, no gap, no overlap (the safetensors library's rule)."""
    at = 0
    for start, end, name in sorted(spans):
        if start != at:
            raise ForensicsError(f"safetensors entry {name[:80]!r} starts at byte {start} of the data, expected {at} "
                                 "(tensors overlap or leave a gap): corrupt header", path=path)
        at = end
    if at != data_len:
        raise ForensicsError(f"safetensors data section holds {data_len} bytes but its tensors cover {at}: "
                             "truncated or corrupt", path=path)


def safetensors_data_start(path: Path) -> int:
    """Byte offset of a safetensors file's data section (8 + the header length)."""
    with open_regular(path, "safetensors file") as fh:
        raw = fh.read(8)
    if len(raw) < 8:
        raise ForensicsError("truncated safetensors file (no header length)", path=path)
    return 8 + struct.unpack("<Q", raw)[0]
