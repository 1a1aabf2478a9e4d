"""Check the sizes a file's header claims against the bytes it holds, before anything is allocated.

A flipped bit in a header can claim terabytes. numpy allocates what an ``.npy`` header says
before it reads, and a legacy (non-zip) ``torch.save`` file makes torch allocate every storage
at its declared size before reading it. These checks read only headers (pickles are scanned
with ``pickletools``, never executed) and raise ``ForensicsError`` when the claim exceeds
the file. torch-zip archives are left to torch, which compares each record's size with the
tensor's before allocating; safetensors headers are checked in ``safeload``.
"""
from __future__ import annotations

import collections
import math
import pickletools
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..errors import ForensicsError

# element sizes of the typed storages a legacy torch pickle names (torch/storage.py)
_STORAGE_BYTES = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
    "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
    "ComplexFloatStorage": 8, "ComplexDoubleStorage": 16, "UntypedStorage": 1,
}
_SCALARS = {"BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8", "BINSTRING", "SHORT_BINSTRING",
            "BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG", "GLOBAL"}
_PUTS = {"BINPUT", "LONG_BINPUT", "PUT"}
_GETS = {"BINGET", "LONG_BINGET", "GET"}
_UNKNOWN = object()


def human_bytes(n: int) -> str:
    """``123 bytes``, ``4.0 GiB``: sizes as people read them."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def check_npy(fh: IO[bytes], available: int, path: str | Path, member: str = "") -> None:
    """Refuse an .npy header whose shape needs more bytes than follow it, or that holds objects."""
    where = f"npz member {member!r}: " if member else ""
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            return  # numpy's own reader validates other versions
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
        raise ForensicsError(f"{where}corrupt numpy header ({' '.join(str(exc).split())[:120]})", path=path) from None
    if dtype.hasobject:
        raise ForensicsError(f"{where}numpy array holds Python objects (unpickling would run code); not read",
                             path=path)
    need = math.prod(int(d) for d in shape) * dtype.itemsize
    left = available - fh.tell()
    if need > left:
        raise ForensicsError(f"{where}numpy header claims shape {list(shape)} {dtype} ({human_bytes(need)}) but only "
                             f"{human_bytes(max(left, 0))} follow: truncated or corrupt", path=path)


def _skip_pickle(fh: IO[bytes]) -> None:
    for _ in pickletools.genops(fh):
        pass


def legacy_torch_claim(fh: IO[bytes]) -> int | None:
    """Bytes of tensor data a legacy torch pickle declares (distinct storages), or None if not one.

    Legacy layout (torch/serialization.py ``_legacy_save``): magic number, protocol, sys info,
    then the object pickle whose persistent ids are ``('storage', torch.<T>Storage, key,
    location, numel, ...)``. Only opcodes are read; nothing is constructed.
    """
    try:
        for _ in range(3):
            _skip_pickle(fh)
        recent: collections.deque[tuple[str, Any]] = collections.deque(maxlen=64)
        memo: dict[Any, Any] = {}
        storages: dict[str, int] = {}
        for op, arg, _ in pickletools.genops(fh):
            name = op.name
            if name in _SCALARS:
                value = arg
            elif name == "NONE":
                value = None
            elif name in _GETS:
                value = memo.get(arg, _UNKNOWN)
            elif name in _PUTS:
                memo[arg] = recent[-1][1] if recent else _UNKNOWN
                continue
            elif name == "BINPERSID":
                pid = _persistent_tuple(recent)
                if pid is not None:
                    key, nbytes = pid
                    storages[key] = max(nbytes, storages.get(key, 0))
                value = _UNKNOWN
            else:
                value = _UNKNOWN
            recent.append((name, value))
    except (ValueError, EOFError, KeyError, IndexError, TypeError, UnicodeDecodeError):
        return None  # not a pickle pickletools can walk: torch.load will say what is wrong
    return sum(storages.values())


def _persistent_tuple(recent: collections.deque[tuple[str, Any]]) -> tuple[str, int] | None:
    """(key, nbytes) from the MARK ... TUPLE that was just pushed as a persistent id."""
    ops = list(recent)
    if not ops or ops[-1][0] != "TUPLE":
        return None
    i = len(ops) - 2
    group: list[Any] = []
    while i >= 0 and ops[i][0] != "MARK":
        group.append(ops[i][1])
        i -= 1
    group.reverse()
    if len(group) < 5 or group[0] != "storage" or not isinstance(group[1], str):
        return None
    kind, key, numel = group[1].rsplit(" ", 1)[-1], group[2], group[4]
    if kind not in _STORAGE_BYTES or not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
        return None
    return key, numel * _STORAGE_BYTES[kind]


def check_legacy_torch(fh: IO[bytes], size: int, path: str | Path) -> None:
    """Refuse a legacy torch file whose storages claim more bytes than the file holds."""
    start = fh.tell()
    claim = legacy_torch_claim(fh)
    fh.seek(start)
    if claim is not None and claim > size:
        raise ForensicsError(f"torch file declares {human_bytes(claim)} of tensor data but is only {human_bytes(size)}: "
                             "truncated or corrupt (nothing was allocated)", path=path)
