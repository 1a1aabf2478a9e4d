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
# A tensor with no elements holds no bytes to bound its shape by; past this, a dimension of one is taken for corrupt
# (no vocabulary, hidden size or token count comes near it, and code sized by a dimension must never see more).
MAX_EMPTY_DIM = 1 << 20
# The largest position (layer) number a key or file name may claim (models have a few hundred layers at most).
MAX_KEY_NUMBER = 100_000


def human_bytes(n: int) -> str:
    """``123 bytes``, ``4.0 GiB``: sizes as people read them."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def claimed_int(value: Any, what: str, path: str | Path, *, lo: int = 0, hi: int | None = None) -> int:
    """An integer a file claims (a dimension, an offset, a size): a JSON/Python int, not a bool, float or text, in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        shown = repr(value) if not isinstance(value, str) else repr(value[:40])
        raise ForensicsError(f"{what} is {shown[:60]}, not a whole number: corrupt", path=path)
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise ForensicsError(f"{what} is {value}, expected {bound}: corrupt", path=path)
    return value


def key_number(text: str, key: str, path: str | Path) -> int:
    """The position number a tensor key or file name carries (``layer_12`` -> 12), refused past ``MAX_KEY_NUMBER``.

    Code lays positions out from 0 to the largest number, so a key claiming position 10^12
    would size a list of 10^12 entries, and int() refuses more than 4300 digits.
    """
    digits = text.lstrip("-")
    if len(digits) > len(str(MAX_KEY_NUMBER)) or int(digits) > MAX_KEY_NUMBER:
        shown = digits[:12] + ("..." if len(digits) > 12 else "")
        raise ForensicsError(f"{str(key)[:80]!r} claims position {'-' if text.startswith('-') else ''}{shown}, past "
                             f"{MAX_KEY_NUMBER}: no model has that many layers; rename the key", path=path)
    return int(text)


def check_shape(shape: Any, what: str, path: str | Path) -> list[int]:
    """A claimed shape as a list of ints, each >= 0; a tensor with no elements claims no dimension past ``MAX_EMPTY_DIM``.

    A shape with elements is bounded by the bytes that hold them (checked by the caller);
    one with a zero dimension holds nothing, so its other dimensions are bounded here, or
    code sized by a dimension (a projection, a buffer per row) would allocate what it claims.
    """
    if not isinstance(shape, (list, tuple)):
        raise ForensicsError(f"{what} has shape {str(shape)[:60]!r}, not a list: corrupt", path=path)
    dims = [claimed_int(d, f"{what} dimension {i}", path) for i, d in enumerate(shape)]
    if 0 in dims and max(dims) > MAX_EMPTY_DIM:
        raise ForensicsError(f"{what} has shape {dims}: no elements, yet a dimension past {MAX_EMPTY_DIM}: corrupt",
                             path=path)
    return dims


def check_npy(fh: IO[bytes], available: int, path: str | Path, member: str = "") -> None:
    """Refuse an .npy header whose shape needs more bytes than follow it, or that holds objects."""
    where = f"npz member {member!r}: " if member else ""
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
        else:  # 3.0 differs only by UTF-8 field names: structured arrays, never hidden states
            raise ForensicsError(f"{where}numpy format {version[0]}.{version[1]} holds records with named fields; "
                                 "expected a plain array (format 1.0 or 2.0)", path=path)
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
        raise ForensicsError(f"{where}corrupt numpy header ({' '.join(str(exc).split())[:120]})", path=path) from None
    if dtype.hasobject:
        raise ForensicsError(f"{where}numpy array holds Python objects (unpickling would run code); not read",
                             path=path)
    if dtype.fields is not None or dtype.subdtype is not None:
        raise ForensicsError(f"{where}numpy array of records or sub-arrays (dtype {str(dtype)[:60]}); expected plain "
                             "numbers", path=path)
    shape = check_shape(shape, f"{where}numpy array", path)
    need = math.prod(shape) * dtype.itemsize
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


class _Clamped:
    """A read-only view of ``fh`` that never reads past ``size``: pickletools reads a length a pickle claims
    (BINBYTES8 of 2^40) in one call, which allocated it before finding the file shorter (a MemoryError)."""

    def __init__(self, fh: IO[bytes], size: int) -> None:
        self.fh, self.size = fh, size

    def read(self, n: int = -1) -> bytes:
        left = max(self.size - self.fh.tell(), 0)
        return self.fh.read(left if n is None or n < 0 else min(n, left))

    def readline(self) -> bytes:
        return self.fh.readline(max(self.size - self.fh.tell(), 0))

    def tell(self) -> int:
        return self.fh.tell()


# A compressed pickle (a deflated data.pkl, the pickles of a gzipped legacy file) may unfold to PICKLE_FLOOR bytes, or
# to PICKLE_RATIO times its compressed size when more: torch stores data.pkl plainly and real pickles deflate about
# 5:1, while a few KB of repeated opcodes deflate 1000:1 into minutes of pure-Python unpickling.
PICKLE_FLOOR = 1 << 20
PICKLE_RATIO = 16


def compressed_pickle_limit(packed: int) -> int:
    """The most pickle bytes ``packed`` compressed bytes may unfold to (``PICKLE_RATIO``, at least ``PICKLE_FLOOR``)."""
    return max(PICKLE_FLOOR, PICKLE_RATIO * packed)


def check_legacy_torch(fh: IO[bytes], size: int, path: str | Path, scan: int | None = None) -> None:
    """Refuse a legacy torch file whose storages claim more bytes than the file holds; the opcodes walked are
    at most ``scan`` bytes (a gzip payload's pickles are bounded by the gzip file, as the unpickler bounds them)."""
    start = fh.tell()
    claim = legacy_torch_claim(_Clamped(fh, size if scan is None else min(size, start + scan)))  # type: ignore[arg-type]
    fh.seek(start)
    if claim is not None and claim > size:
        raise ForensicsError(f"torch file declares {human_bytes(claim)} of tensor data but is only {human_bytes(size)}: "
                             "truncated or corrupt (nothing was allocated)", path=path)
