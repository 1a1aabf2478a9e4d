"""Weights-only torch files (``.pt``/``.ckpt``: zip or legacy, also gzipped) read without torch.

``torch.save`` writes a pickle that rebuilds each tensor from a *storage* (raw bytes) with an
offset, a shape and strides, plus the storages themselves: as members ``<name>/data/<key>`` of a
zip archive (torch >= 1.6), or appended after the pickles (the legacy format, still written with
``_use_new_zipfile_serialization=False``). This module reads both with a restricted unpickler
(the pure-Python one: its memo is a dict, so a 7-byte pickle cannot make it allocate gigabytes)
whose globals are a short allowlist: the tensor and parameter rebuild functions, dtypes, storage
types and plain containers, each replaced by a function of ours that builds numpy arrays (bf16
through ``ml_dtypes``). Any other global is refused before anything is called, in the same words
as torch's weights-only loader, so ``--allow-unsafe-pickle`` (which goes through torch) stays the
only way to run a file's code.

The unpickler itself is bounded (issue 31): a compressed pickle (deflated data.pkl, a gzipped legacy file) may
unfold to ``PICKLE_RATIO`` times its compressed size (at least ``PICKLE_FLOOR``), the memo holds at most
``MAX_MEMO`` objects, ``bytearray``/``_codecs.encode`` calls make at most as many bytes as the pickle holds,
and a length a pickle claims is never allocated before it is read; BUILD is applied only where torch's
weights-only loader applies it (attributes of an OrderedDict). Sizes, strides and offsets are int64 as in torch.

Every size is checked before anything is allocated: a storage must equal its record's declared
size (zip) or fit in the file (legacy); a tensor must lie inside its storage; what tensors would
take once materialised (an expanded tensor has stride 0) is bounded like a decompressed archive
(``guards.check_expansion``), per tensor and for the whole file. Zip members stored plainly are
read at their offset with ``pread`` (a file cut short while it is read is a short read, one
line, never a SIGBUS); deflate-compressed members (torch reads those too) through ``zipfile``;
any other compression is refused. ``load`` returns arrays; ``load(lazy=True)`` returns
``StoredTensor`` leaves that read their rows from the file on demand (captures).
"""
from __future__ import annotations

import _compat_pickle
import collections
import io
import math
import pickle
import struct
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..arrays import dtype_name, numpy_dtype
from ..errors import ForensicsError
from .filerows import FileRows
from .guards import MAX_DEPTH, check_expansion, check_zip_members, open_regular
from .formats import UNSAFE_HINT, is_pickle_head
from .sizecheck import PICKLE_FLOOR, PICKLE_RATIO, compressed_pickle_limit, human_bytes

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch/serialization.py MAGIC_NUMBER
LEGACY_PROTOCOL = 1001
MAX_PICKLE = 256 << 20  # a torch pickle holds structure, not data: larger is not a checkpoint
MAX_WEIGHT = 1_000_000  # values a tuple may hold counting shared ones again (hashing walks them all)
MAX_MEMO = 1 << 21  # objects a pickle may memoize: torch memoizes about ten per tensor
# What bytearray() / _codecs.encode (how a pickle stores bytes) may make in all: as many bytes as the pickle holds
# (each bytes object is made once from its own string), at least MADE_FLOOR. Calling them again and again on one
# memoized string is how an 844-byte file took a gigabyte.
MADE_FLOOR = 1 << 20
INT64 = 1 << 63  # torch's sizes, strides and offsets are int64, and numpy's byte strides and sizes too

# storage classes torch names in its pickles -> the numpy dtype of their elements (None: none exists)
_STORAGES: dict[str, np.dtype | None] = {
    "DoubleStorage": np.dtype("<f8"), "FloatStorage": np.dtype("<f4"), "HalfStorage": np.dtype("<f2"),
    "BFloat16Storage": numpy_dtype("bfloat16"), "LongStorage": np.dtype("<i8"), "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"), "CharStorage": np.dtype("i1"), "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"), "ComplexFloatStorage": np.dtype("<c8"), "ComplexDoubleStorage": np.dtype("<c16"),
    "UntypedStorage": np.dtype("u1"), "QInt8Storage": None, "QUInt8Storage": None, "QInt32Storage": None,
    "QUInt4x2Storage": None, "QUInt2x4Storage": None,
}
_STORAGE_MODULES = ("torch", "torch.cuda", "torch.storage")
# torch dtypes by name -> numpy dtype (None: no numpy dtype holds it; such a tensor is refused)
_DTYPES: dict[str, np.dtype | None] = {
    "float64": np.dtype("<f8"), "float32": np.dtype("<f4"), "float16": np.dtype("<f2"),
    "bfloat16": numpy_dtype("bfloat16"), "int64": np.dtype("<i8"), "int32": np.dtype("<i4"),
    "int16": np.dtype("<i2"), "int8": np.dtype("i1"), "uint8": np.dtype("u1"), "uint16": np.dtype("<u2"),
    "uint32": np.dtype("<u4"), "uint64": np.dtype("<u8"), "bool": np.dtype("?"), "complex64": np.dtype("<c8"),
    "complex128": np.dtype("<c16"),
    **{name: None for name in (
        "complex32", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
        "float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2", "qint8", "quint8", "qint32",
        "quint4x2", "quint2x4", *(f"uint{i}" for i in range(1, 8)), *(f"int{i}" for i in range(1, 8)))},
}
_QSCHEMES = ("per_tensor_affine", "per_tensor_symmetric", "per_channel_affine", "per_channel_symmetric",
             "per_channel_affine_float_qparams")
# rebuild functions torch allows whose tensors are no plain strided array: refused, by kind
_OTHER_TENSORS = {
    "_rebuild_qtensor": "a quantized", "_rebuild_sparse_tensor": "a sparse", "_rebuild_nested_tensor": "a nested",
    "_rebuild_device_tensor_from_numpy": "a device", "_rebuild_device_tensor_from_cpu_tensor": "a device",
    "_rebuild_meta_tensor_no_storage": "a meta (data-less)", "_rebuild_wrapper_subclass": "a subclass",
}
_RUNS_CODE = {"exec", "eval", "compile", "__import__", "system", "popen", "Popen", "run", "call", "check_call",
              "check_output", "spawnv", "execv", "execve", "getattr", "apply", "touch", "write_text", "write_bytes"}


# ---------------------------------------------------------------- what a refusal says

def refusal(name: str) -> str:
    """Why a global named in a pickle is refused: it runs code, it is no tensor or container, or it does not exist.

    A builtin is named bare (``exec``), as torch names it."""
    name = name[len("builtins."):] if name.startswith("builtins.") and len(name) > 9 else name
    if name.rsplit(".", 1)[-1] in _RUNS_CODE:
        return f"the file calls {name}, which would run code on load"
    if _resolvable(name):
        return f"the file references {name}, which is not a tensor or a plain container"
    return (f"the file references {name}, which does not exist here: the pickle is corrupt or needs "
            "code this environment lacks")


def _resolvable(name: str) -> bool:
    """True if ``module.attr`` names something importable here, looked up statically (nothing in the file runs).

    A torch name is checked against torch itself, imported for that (only on this error path)."""
    import builtins
    import inspect

    if name.startswith("torch.") and "torch" not in sys.modules:
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
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


# ---------------------------------------------------------------- storages and tensors

class _Frozen:
    """Objects the pickle may see: BUILD (``__setstate__``) on them is refused, not applied."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise _Unsafe("BUILD on a tensor, storage or rebuild function")


class _Source:
    """Where a file's bytes are: a regular file (read with ``pread``) or bytes in memory (a gzip payload)."""

    def __init__(self, path: Path, data: bytes | None = None) -> None:
        self.path, self.data = path, data
        self.size = len(data) if data is not None else path.stat().st_size

    @property
    def in_file(self) -> bool:
        return self.data is None

    def read(self, offset: int, n: int) -> np.ndarray:
        """``n`` bytes from ``offset`` as a fresh writable uint8 array; a short read is one line."""
        if offset < 0 or offset + n > self.size:
            raise ForensicsError(f"storage data at byte {offset} (+{n}) lies past the end of the file "
                                 f"({self.size} bytes): truncated or corrupt", path=self.path)
        if self.data is not None:
            return np.frombuffer(self.data, np.uint8, n, offset).copy()
        return FileRows(self.path, offset, 1, n, np.dtype(np.uint8)).read()[0]


class _Storage(_Frozen):
    """A torch storage: ``nbytes`` bytes of elements of ``dtype`` (None: a dtype numpy has not)."""

    __slots__ = ("key", "dtype", "torch_name", "nbytes", "source", "offset", "member", "swap", "_bytes")

    def __init__(self, key: str, dtype: np.dtype | None, torch_name: str, nbytes: int) -> None:
        self.key, self.dtype, self.torch_name, self.nbytes = key, dtype, torch_name, nbytes
        self.source: _Source | None = None
        self.offset = -1  # byte offset in the source where the data starts (-1 until known)
        self.member: Callable[[], bytes] | None = None  # a compressed zip member's reader
        self.swap = False  # stored big-endian
        self._bytes: np.ndarray | None = None

    def raw(self, keep: bool = True) -> np.ndarray:
        """The storage's bytes (uint8 [nbytes]), read once when ``keep``."""
        if self._bytes is not None:
            return self._bytes
        if self.member is not None:
            data = self.member()
            if len(data) != self.nbytes:
                raise ForensicsError(f"storage {self.key!r} holds {len(data)} bytes, its tensors need {self.nbytes}: "
                                     "truncated or corrupt", path=self.source.path if self.source else None)
            out = np.frombuffer(data, np.uint8).copy()
        else:
            assert self.source is not None
            out = self.source.read(self.offset, self.nbytes)
        if keep:
            self._bytes = out
        return out


class StoredTensor(_Frozen):
    """A tensor of a torch file not yet read: its storage, dtype, element offset, shape and strides."""

    __slots__ = ("storage", "dtype", "offset", "shape", "strides", "neg", "conj")

    def __init__(self, storage: _Storage, dtype: np.dtype, offset: int, shape: tuple[int, ...],
                 strides: tuple[int, ...], neg: bool, conj: bool) -> None:
        self.storage, self.dtype, self.offset = storage, dtype, offset
        self.shape, self.strides, self.neg, self.conj = shape, strides, neg, conj

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the tensor takes once materialised (an expanded tensor takes more than its storage)."""
        return self.size * self.dtype.itemsize

    def squeeze0(self) -> "StoredTensor":
        """The tensor without its leading dimension of size 1 ([1, T, H] -> [T, H])."""
        if not self.shape or self.shape[0] != 1:
            raise ValueError("squeeze0 of a tensor whose first dimension is not 1")
        return StoredTensor(self.storage, self.dtype, self.offset, self.shape[1:], self.strides[1:], self.neg, self.conj)

    def _contiguous(self) -> bool:
        want = 1
        for d, s in zip(reversed(self.shape), reversed(self.strides)):
            if d != 1 and s != want:
                return False
            want *= d
        return True

    def file_rows(self) -> FileRows | None:
        """The tensor as [rows, last dim] rows of its file (``filerows``), where it lies there plainly: a
        C-contiguous tensor of a storage stored uncompressed in a file, little-endian, no neg/conj bit."""
        st = self.storage
        if not self.shape or st.source is None or not st.source.in_file or st.member is not None or st.swap \
                or self.neg or self.conj or not self._contiguous():
            return None
        return FileRows(st.source.path, st.offset + self.offset * self.dtype.itemsize,
                        math.prod(self.shape[:-1]), self.shape[-1], self.dtype)

    def read(self, keep: bool = True) -> np.ndarray:
        """The tensor as an ndarray, as ``torch.load(...).numpy()`` would give it (same shape, strides and
        values; views of one storage share its memory). ``keep=False``: its storage is not kept cached."""
        rows = None if keep else self.file_rows()
        if rows is not None:
            return rows.read().reshape(self.shape)
        raw = self.storage.raw(keep)
        if self.storage.swap:
            raw = _swapped(raw, self.dtype)
        item = self.dtype.itemsize
        base = raw[:raw.size // item * item].view(self.dtype) if raw.size else np.empty(0, self.dtype)
        # a dimension of one element is never stepped over: a byte stride there past int64 (torch reads a 2^62
        # stride) is taken as 0
        out = np.lib.stride_tricks.as_strided(base[self.offset:], shape=self.shape,
                                              strides=tuple(s * item if d > 1 or s * item < INT64 else 0
                                                            for d, s in zip(self.shape, self.strides)))
        if self.conj:
            out = np.conj(out)
        if self.neg:
            out = np.negative(out)
        return out


def _swapped(raw: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A big-endian storage's bytes in native (little-endian) order, element by element."""
    item = dtype.itemsize if dtype.kind != "c" else dtype.itemsize // 2
    if item == 1:
        return raw
    n = raw.size // item * item
    return raw[:n].reshape(-1, item)[:, ::-1].reshape(-1).copy()


# ---------------------------------------------------------------- the restricted unpickler

class _Call(_Frozen):
    """A global the pickle may call: one of our functions, never the object the name stands for in torch."""

    __slots__ = ("name", "fn")

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name, self.fn = name, fn

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class _Token(_Frozen):
    """A global the pickle may only pass around (a dtype, a storage type, a tensor class, a layout)."""

    __slots__ = ("kind", "name", "dtype")

    def __init__(self, kind: str, name: str, dtype: np.dtype | None = None) -> None:
        self.kind, self.name, self.dtype = kind, name, dtype


class TorchDevice(str):
    """What ``torch.device(...)`` in a pickle becomes: its name (``cuda:0``), printed as a device."""

    __slots__ = ()


class _Unpickler(pickle._Unpickler):  # type: ignore[name-defined]
    """``pickle``'s pure-Python unpickler with our globals and storages only (see the module docstring)."""

    def __init__(self, data: Any, loader: "_Loader") -> None:
        super().__init__(data, encoding="utf-8")
        self.loader = loader
        self.memo = _Memo()
        self._weights: dict[int, int] = {}
        self.dispatch = dict(self.dispatch)
        for op in (pickle.TUPLE, pickle.TUPLE1, pickle.TUPLE2, pickle.TUPLE3):
            self.dispatch[op[0]] = self._weighed(self.dispatch[op[0]])
        self.dispatch[pickle.BUILD[0]] = lambda _self: self._build()
        self.dispatch[pickle.BYTEARRAY8[0]] = lambda _self: self._bytearray8()

    def _bytearray8(self) -> None:
        """BYTEARRAY8 (protocol 5) with its claimed length checked against what the pickle can still hold:
        pickle's own loader allocates the length first, so 9 bytes could claim gigabytes."""
        (n,) = struct.unpack("<Q", self.read(8))
        if n > self.loader.pickle_limit - self.loader.pickle_used:
            raise pickle.UnpicklingError(f"a bytearray of {n} bytes claimed where the pickle holds fewer")
        self.loader.make(n)
        data = self.read(n)
        if len(data) != n:
            raise pickle.UnpicklingError("pickle data was truncated")
        self.append(bytearray(data))

    def _build(self) -> None:
        """BUILD as torch's weights-only unpickler applies it: on an OrderedDict, its state (a dict) becomes
        attributes (``state_dict()._metadata``); on anything else it is refused."""
        state = self.stack.pop()
        inst = self.stack[-1]
        if type(inst) is collections.OrderedDict and type(state) is dict:
            inst.__dict__.update(state)  # dropped by _finish, which rebuilds every container plainly
            return
        if type(inst) is collections.OrderedDict:
            raise pickle.UnpicklingError(f"BUILD on an OrderedDict with a {type(state).__name__} state, which torch "
                                         "cannot apply either")
        raise _Unsafe(f"BUILD on a {type(inst).__name__}" if not isinstance(inst, _Frozen)
                      else "BUILD on a tensor, storage or rebuild function")

    def _weighed(self, load: Callable[["_Unpickler"], None]) -> Callable[["_Unpickler"], None]:
        """Wrap a tuple-building opcode: refuse a tuple that holds more than MAX_WEIGHT values counting shared
        ones again (hashing one walks all of them: a 100-byte pickle of nested shared tuples would hang)."""
        def run(_self: Any) -> None:
            load(self)
            t = self.stack[-1]
            w = 1 + sum(self._weights.get(id(x), 1) for x in t)
            if w > MAX_WEIGHT:
                raise pickle.UnpicklingError(f"a tuple holds more than {MAX_WEIGHT} values through shared parts")
            self._weights[id(t)] = w
        return run

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _compat_pickle.NAME_MAPPING:  # Python 2 names, as pickle itself maps them
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        module = "torch._tensor" if module == "torch.tensor" else module  # torch's own rename (PR 51633)
        found = self.loader.allowed(module, name)
        if found is None:
            raise _Refused(f"{module}.{name}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        return self.loader.persistent(pid)


class _Memo(dict):  # type: ignore[type-arg]
    """The unpickler's memo, refusing its MAX_MEMO + 1-th entry (a one-byte MEMOIZE adds one: a flood of them
    would take a hundred bytes each)."""

    def __setitem__(self, key: Any, value: Any) -> None:
        if len(self) >= MAX_MEMO and key not in self:
            raise _Bound(f"the pickle memoizes more than {MAX_MEMO} objects")
        super().__setitem__(key, value)


class _Budget:
    """The stream a pickle is read from, counting what it gives: past ``limit`` bytes in all (the pickle's
    bound, shared by a legacy file's five pickles) the pickle is refused before the read is made."""

    def __init__(self, fh: Any, loader: "_Loader") -> None:
        self.fh, self.loader = fh, loader

    def _take(self, n: int) -> None:
        self.loader.pickle_used += n
        if self.loader.pickle_used > self.loader.pickle_limit:
            raise ForensicsError(f"the pickle is longer than {human_bytes(self.loader.pickle_limit)}, "
                                 f"{self.loader.pickle_why}: corrupt or hostile", path=self.loader.path)

    def read(self, n: int = -1) -> bytes:
        left = max(self.loader.pickle_limit - self.loader.pickle_used, 0)
        data = self.fh.read(left + 1 if n is None or n < 0 else min(n, left + 1))  # never a read of a claimed length
        self._take(len(data))
        return data

    def readline(self) -> bytes:
        line = self.fh.readline(max(self.loader.pickle_limit - self.loader.pickle_used, 0) + 1)
        self._take(len(line))
        return line


class _Bound(Exception):
    """A bound on what a pickle may make was passed (no object of the file's runs: a bomb, not code)."""


class _Refused(Exception):
    """A global outside the allowlist: said as torch's weights-only loader says it."""


class _Unsafe(pickle.UnpicklingError):
    """Something the weights-only rules do not allow (an opcode's use, a storage id): refused, not corrupt."""


class _Loader:
    """One torch file being read: its storages, the tensors built so far, the bounds they must keep."""

    def __init__(self, source: _Source, legacy: bool) -> None:
        self.source, self.legacy = source, legacy
        self.path = source.path
        self.storages: dict[str, _Storage] = {}
        self.tensors = 0
        self.swap = False
        self.resolve_member: Callable[[_Storage], None] | None = None  # zip: where a storage's record lies
        self.pickle_limit, self.pickle_used, self.pickle_why = source.size, 0, "the file's size"
        self.made = 0  # bytes made by bytearray() / _codecs.encode so far

    def bound_pickle(self, limit: int, why: str) -> None:
        """The most pickle bytes this file's pickles may hold in all, and why (said when it is passed)."""
        self.pickle_limit, self.pickle_why = min(self.pickle_limit, limit), why

    def make(self, n: int) -> None:
        """Account for ``n`` bytes about to be made by a call the pickle makes; past the budget it is refused."""
        self.made += n
        cap = max(MADE_FLOOR, self.pickle_limit)
        if self.made > cap:
            raise ForensicsError(f"the pickle's bytearray() / _codecs.encode calls make more than {human_bytes(cap)} "
                                 f"from a pickle of at most {human_bytes(self.pickle_limit)}: the same string copied "
                                 "again and again (corrupt or hostile)", path=self.path)

    def bytearray_(self, data: Any = b"", encoding: Any = None) -> bytearray:
        if isinstance(data, str) and encoding in ("latin1", "latin-1"):
            self.make(len(data))
            return bytearray(data.encode("latin-1"))
        if isinstance(data, (bytes, bytearray)) and encoding is None:
            self.make(len(data))
            return bytearray(data)
        raise _Unsafe("bytearray() of something that is not bytes")  # bytearray(10**12) would allocate

    def encode(self, text: Any, encoding: Any = "utf-8") -> bytes:
        if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
            raise _Unsafe("_codecs.encode other than a latin-1 string (how pickle stores bytes)")
        self.make(len(text))
        return text.encode("latin-1")

    # -- globals
    def allowed(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if module == "collections" and name in ("OrderedDict", "Counter"):
            return getattr(collections, name)
        if full == "builtins.complex":
            return complex
        if full == "builtins.set":
            return _Call(full, _make_set)
        if full == "builtins.bytearray":
            return _Call(full, self.bytearray_)
        if full == "_codecs.encode":
            return _Call(full, self.encode)
        if module in _STORAGE_MODULES and name in _STORAGES:
            return _Token("storage", name, _STORAGES[name])
        if module == "torch" and name in _DTYPES:
            return _Token("dtype", name, _DTYPES[name])
        if module == "torch" and name in _QSCHEMES:
            return _Token("qscheme", name)
        if full in ("torch.Tensor", "torch.nn.parameter.Parameter"):
            return _Token("class", full)
        if full == "torch.Size":
            return _Call(full, _size)
        if full == "torch.device":
            return _Call(full, _device)
        if full == "torch.serialization._get_layout":
            return _Call(full, lambda n: _Token("layout", str(n)))
        if module == "torch._utils":
            fn = {"_rebuild_tensor_v2": self.rebuild_v2, "_rebuild_tensor_v3": self.rebuild_v3,
                  "_rebuild_tensor": self.rebuild_v1, "_rebuild_parameter": _parameter,
                  "_rebuild_parameter_with_state": _parameter}.get(name)
            if fn is not None:
                return _Call(full, fn)
            if name in _OTHER_TENSORS:
                raise ForensicsError(f"holds {_OTHER_TENSORS[name]} tensor ({full}), which eagleforensics does not "
                                     "read; store hidden states as plain bfloat16, float16 or float32 tensors",
                                     path=self.path)
        if full == "torch._tensor._rebuild_from_type_v2":
            return _Call(full, _from_type)
        return None

    # -- storages
    def persistent(self, pid: Any) -> _Storage:
        if type(pid) is not tuple or not pid or _ascii(pid[0]) != "storage":
            raise _Unsafe("Only persistent_load of storage is allowed")
        rest = pid[1:]
        if len(rest) != (5 if self.legacy else 4):
            raise pickle.UnpicklingError(f"a storage id of {len(pid)} items")
        stype, key, _location, numel = rest[:4]
        key = _ascii(key)
        if not isinstance(stype, _Token) or stype.kind != "storage" or not isinstance(key, str) \
                or type(numel) is not int or numel < 0:
            raise pickle.UnpicklingError("a storage id that is not (storage type, key, location, size)")
        dtype = stype.dtype
        item = dtype.itemsize if dtype is not None else 1
        nbytes = numel * item
        st = self.storages.get(key)
        if st is None:
            st = self.storages[key] = _Storage(key, dtype, stype.name, nbytes)
            st.source, st.swap = self.source, self.swap
            if self.resolve_member is not None:
                self.resolve_member(st)
        if self.legacy and rest[4] is not None:
            return self._view(st, rest[4], dtype, item)
        return st

    def _view(self, root: _Storage, meta: Any, dtype: np.dtype | None, item: int) -> _Storage:
        """A legacy storage view (view key, element offset, element count) over ``root``."""
        if type(meta) is not tuple or len(meta) != 3 or type(meta[1]) is not int or type(meta[2]) is not int:
            raise pickle.UnpicklingError("a storage view that is not (key, offset, size)")
        vkey, off, n = _ascii(meta[0]), meta[1], meta[2]
        if off < 0 or n < 0 or (off + n) * item > root.nbytes:
            raise pickle.UnpicklingError("a storage view past its storage")
        view = self.storages.get(f"view:{vkey}")
        if view is None:
            view = self.storages[f"view:{vkey}"] = _Storage(str(vkey), dtype, root.torch_name, n * item)
            view.source, view.swap = root.source, root.swap
            view.member = lambda: bytes(root.raw()[off * item:(off + n) * item])
        return view

    # -- tensors
    def rebuild_v1(self, storage: Any, offset: Any, size: Any, stride: Any) -> StoredTensor:
        return self._tensor(storage, offset, size, stride, None, None)

    def rebuild_v2(self, storage: Any, offset: Any, size: Any, stride: Any, _grad: Any = False, _hooks: Any = None,
                   metadata: Any = None) -> StoredTensor:
        return self._tensor(storage, offset, size, stride, None, metadata)

    def rebuild_v3(self, storage: Any, offset: Any, size: Any, stride: Any, _grad: Any, _hooks: Any, dtype: Any,
                   metadata: Any = None) -> StoredTensor:
        if not isinstance(dtype, _Token) or dtype.kind != "dtype":
            raise pickle.UnpicklingError("_rebuild_tensor_v3 without a dtype")
        return self._tensor(storage, offset, size, stride, dtype, metadata)

    def _tensor(self, storage: Any, offset: Any, size: Any, stride: Any, dtype: _Token | None,
                metadata: Any) -> StoredTensor:
        if not isinstance(storage, _Storage):
            raise pickle.UnpicklingError("a tensor rebuilt from something that is not a storage")
        shape, strides = _ints(size, "size"), _ints(stride, "stride")
        if type(offset) is not int or not 0 <= offset < INT64 or len(shape) != len(strides):
            raise pickle.UnpicklingError("a tensor whose offset, size and stride do not agree")
        name = dtype.name if dtype is not None else storage.torch_name
        np_dtype = dtype.dtype if dtype is not None else storage.dtype
        if np_dtype is None:
            what = name if dtype is not None else f"{name} (quantized)"
            raise ForensicsError(f"holds a {what} tensor that cannot be read as an array (numpy has no such dtype); "
                                 "store hidden states as bfloat16, float16 or float32", path=self.path)
        item = np_dtype.itemsize
        numel = math.prod(shape)
        if math.prod(d for d in shape if d) * item >= INT64:  # numpy's limit, an empty tensor's shape included
            raise ForensicsError(f"a tensor of shape {list(shape)} {dtype_name(np_dtype)} would take 2^63 bytes or "
                                 "more, which no array can: corrupt", path=self.path)
        meta = metadata if isinstance(metadata, dict) else {}
        if meta.get("neg") and np_dtype.kind == "b":
            raise ForensicsError("a bool tensor has its negative bit set, which no boolean value can take "
                                 "(torch cannot resolve it either): corrupt", path=self.path)
        extent = offset + sum((d - 1) * s for d, s in zip(shape, strides)) + 1 if numel else 0
        if extent * item > storage.nbytes:
            raise ForensicsError(f"a tensor of shape {list(shape)} (strides {list(strides)}, offset {offset}) needs "
                                 f"{human_bytes(extent * item)} of its storage {storage.key!r}, which holds "
                                 f"{human_bytes(storage.nbytes)}: corrupt", path=self.path)
        # what it takes once materialised: an expanded (stride-0) tensor claims more than its storage holds
        check_expansion(numel * item, max(extent * item, 1), self.path,
                        f"tensor {self.tensors} ({list(shape)} {dtype_name(np_dtype)})")
        self.tensors += 1
        return StoredTensor(storage, np_dtype, offset, shape, strides, bool(meta.get("neg")), bool(meta.get("conj")))


def _ascii(x: Any) -> Any:
    return x.decode("ascii", "replace") if isinstance(x, bytes) else x


def _ints(x: Any, what: str) -> tuple[int, ...]:
    """A tensor's size or stride: at most 64 integers in [0, 2^63), as torch's int64 holds them."""
    if not isinstance(x, (tuple, list)) or len(x) > 64 or any(type(v) is not int or not 0 <= v < INT64 for v in x):
        raise pickle.UnpicklingError(f"a tensor {what} that is not a short tuple of non-negative int64 integers")
    return tuple(x)


def _parameter(data: Any, *_: Any) -> Any:
    if not isinstance(data, StoredTensor):
        raise pickle.UnpicklingError("a parameter of something that is not a tensor")
    return data


def _from_type(func: Any, new_type: Any, args: Any, _state: Any) -> Any:
    if not isinstance(func, _Call) or not isinstance(new_type, _Token) or new_type.kind != "class" \
            or not isinstance(args, tuple):
        raise pickle.UnpicklingError("_rebuild_from_type_v2 of something that is not a tensor")
    return func(*args)


def _size(x: Any) -> tuple[int, ...]:
    return _ints(x, "torch.Size")


def _device(*args: Any) -> TorchDevice:
    if not args or not isinstance(args[0], str) or len(args) > 2 or (len(args) == 2 and type(args[1]) is not int):
        raise pickle.UnpicklingError("a torch.device that is not (type[, index])")
    return TorchDevice(args[0] if len(args) == 1 else f"{args[0]}:{args[1]}")


def _make_set(items: Any = ()) -> set[Any]:
    if not isinstance(items, (list, tuple)):
        raise pickle.UnpicklingError("set() of something that is not a list")
    return set(items)


# ---------------------------------------------------------------- the two layouts

def _unpickle(loader: _Loader, stream: Any) -> Any:
    """One pickle from ``stream`` through the restricted unpickler; every failure is one line."""
    try:
        # a zip's data.pkl comes whole (its size bounded first); a legacy file's pickles are read off the stream
        whole = isinstance(stream, io.BytesIO) and loader.resolve_member is not None
        return _Unpickler(stream if whole else _Budget(stream, loader), loader).load()
    except ForensicsError:
        raise
    except _Bound as exc:
        raise ForensicsError(f"{exc}: corrupt or hostile", path=loader.path) from None
    except _Refused as exc:
        raise ForensicsError(f"refused to unpickle: {refusal(str(exc))}; {UNSAFE_HINT}", path=loader.path) from None
    except _Unsafe as exc:
        raise ForensicsError(f"refused to unpickle: {exc} (the pickle is corrupt or holds more than tensors and plain "
                             f"containers); {UNSAFE_HINT}", path=loader.path) from None
    except RecursionError:
        raise ForensicsError("cannot read as a torch file: the pickle is nested too deeply (corrupt)",
                             path=loader.path) from None
    except Exception as exc:  # the unpickler raises many types for one cause: bad bytes
        text = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise ForensicsError(f"cannot read as a torch file (truncated or corrupt): {text}", path=loader.path) from None


def _local_data_offset(fh: Any, info: zipfile.ZipInfo, path: Path) -> int:
    """Where member ``info``'s data starts: after its local header, whose name and extra field
    lengths may differ from the central directory's (torch pads the extra field to align data)."""
    head = b""
    if info.header_offset >= 0:  # a damaged directory can point anywhere, before the file too
        try:
            fh.seek(info.header_offset)
            head = fh.read(30)
        except OSError:
            head = b""
    if len(head) < 30 or head[:4] != b"PK\x03\x04":
        raise ForensicsError(f"zip member {info.filename!r} has no local header where the directory says: "
                             "truncated or corrupt zip archive", path=path)
    n, m = struct.unpack("<HH", head[26:30])
    return info.header_offset + 30 + n + m


def _read_zip(source: _Source, fh: Any, lazy: bool) -> Any:
    """A torch zip archive (``<name>/data.pkl``, ``<name>/data/<key>``, ``<name>/byteorder``)."""
    path = source.path
    try:
        zf = zipfile.ZipFile(fh)
    except Exception as exc:  # zipfile raises many types for one cause (bad bytes)
        raise ForensicsError(f"truncated or corrupt zip archive ({' '.join(str(exc).split())[:120]})",
                             path=path) from None
    with zf:
        check_zip_members(zf, path, "inside the gzip stream: " if not source.in_file else "")
        infos = zf.infolist()
        if not infos:
            raise ForensicsError("zip archive is empty: not a torch file", path=path)
        prefix = infos[0].filename.split("/", 1)[0] + "/"  # torch reads the archive named by its first entry
        members = {i.filename[len(prefix):]: i for i in infos if i.filename.startswith(prefix)}
        if "data.pkl" not in members:
            raise ForensicsError("zip archive holds no data.pkl: not a torch file (a numpy .npz or another zip?)",
                                 path=path)

        def member(name: str) -> bytes:
            info = members[name]
            if info.compress_type == zipfile.ZIP_STORED:
                start = _local_data_offset(fh, info, path)
                if info.compress_size != info.file_size or start + info.file_size > source.size:
                    raise ForensicsError(f"zip member {info.filename!r} lies past the end of the file: truncated or "
                                         "corrupt", path=path)
                return source.read(start, info.file_size).tobytes()
            return _inflate(zf, info, path)

        order = member("byteorder").strip() if "byteorder" in members else b"little"
        if order not in (b"little", b"big"):
            raise ForensicsError(f"unknown byte order {order[:20]!r} in the torch archive: corrupt", path=path)
        if members["data.pkl"].file_size > MAX_PICKLE:
            raise ForensicsError(f"data.pkl is {human_bytes(members['data.pkl'].file_size)}: not a checkpoint's "
                                 "structure (corrupt or hostile)", path=path)
        loader = _Loader(source, legacy=False)
        loader.swap = order == b"big"
        pkl = members["data.pkl"]
        loader.pickle_limit, loader.pickle_why = pkl.file_size, "data.pkl's declared size"  # its own stream
        if pkl.compress_type != zipfile.ZIP_STORED or not source.in_file:
            _bound_packed(loader, pkl.compress_size if source.in_file else _packed_size(source),
                          "deflated" if source.in_file else "gzipped")
            if pkl.file_size > loader.pickle_limit:
                raise ForensicsError(f"data.pkl unfolds to {human_bytes(pkl.file_size)}, past "
                                     f"{human_bytes(loader.pickle_limit)} ({loader.pickle_why}): a compressed torch "
                                     "pickle is never that repetitive (corrupt or hostile)", path=path)

        def resolve(st: _Storage) -> None:
            info = members.get(f"data/{st.key}")
            if info is None:
                raise ForensicsError(f"storage record data/{st.key} is missing from the archive: truncated or corrupt",
                                     path=path)
            if info.file_size != st.nbytes:
                raise ForensicsError(f"storage record data/{st.key} holds {human_bytes(info.file_size)} but its "
                                     f"tensors' storage needs {human_bytes(st.nbytes)}: corrupt", path=path)
            if info.compress_type == zipfile.ZIP_STORED:
                st.offset = _local_data_offset(fh, info, path)
                if info.compress_size != info.file_size or st.offset + st.nbytes > source.size:
                    raise ForensicsError(f"storage record data/{st.key} lies past the end of the file: truncated or "
                                         "corrupt", path=path)
            elif info.compress_type == zipfile.ZIP_DEFLATED:
                st.member = lambda info=info: _inflate_again(source, info)
            else:
                raise ForensicsError(f"storage record data/{st.key} is compressed with zip method "
                                     f"{info.compress_type}, which torch files never use: corrupt", path=path)

        loader.resolve_member = resolve
        obj = _unpickle(loader, io.BytesIO(member("data.pkl")))
    return _finish(obj, loader, lazy)


def _packed_size(source: _Source) -> int:
    """Bytes on disk of a source held in memory (the gzip file its payload came from)."""
    try:
        return source.path.stat().st_size
    except OSError:
        return 0


def _bound_packed(loader: _Loader, packed: int, how: str) -> None:
    """Bound a compressed pickle by its compressed size (``PICKLE_RATIO``, at least ``PICKLE_FLOOR``)."""
    loader.bound_pickle(compressed_pickle_limit(packed),
                        f"the most a pickle {how} to {human_bytes(packed)} may hold: {PICKLE_RATIO} times that, "
                        f"at least {human_bytes(PICKLE_FLOOR)}")


def _inflate_again(source: _Source, info: zipfile.ZipInfo) -> bytes:
    """A deflate-compressed storage record, decompressed when its tensor is read (the archive opened anew)."""
    with (io.BytesIO(source.data) if source.data is not None else open_regular(source.path)) as fh:
        try:
            zf = zipfile.ZipFile(fh)
        except Exception as exc:  # the file changed since it was first opened
            raise ForensicsError(f"truncated or corrupt zip archive ({' '.join(str(exc).split())[:120]})",
                                 path=source.path) from None
        with zf:
            return _inflate(zf, info, source.path)


def _inflate(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path) -> bytes:
    """A deflate-compressed member, decompressed by zipfile (its size was bounded by ``check_zip_members``)."""
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ForensicsError(f"zip member {info.filename!r} is compressed with zip method {info.compress_type}, "
                             "which torch files never use: corrupt", path=path)
    try:
        with zf.open(info) as fh:
            return fh.read()
    except Exception as exc:  # zipfile: bad CRC, bad deflate stream, cut short
        raise ForensicsError(f"zip member {info.filename!r} is truncated or corrupt "
                             f"({' '.join(str(exc).split())[:120]})", path=path) from None


def _read_legacy(source: _Source, fh: Any, lazy: bool) -> Any:
    """A legacy torch file: magic number, protocol, system info, the object, the storage keys, then each
    storage as its element count (int64) and its bytes, in the order of the keys."""
    loader = _Loader(source, legacy=True)
    if not source.in_file:
        _bound_packed(loader, _packed_size(source), "gzipped")
    magic = _unpickle(loader, fh)
    if magic != LEGACY_MAGIC:
        raise ForensicsError("cannot read as a torch file (truncated or corrupt): Invalid magic number; corrupt file?",
                             path=source.path)
    if _unpickle(loader, fh) != LEGACY_PROTOCOL:
        raise ForensicsError("cannot read as a torch file: unknown legacy protocol version", path=source.path)
    info = _unpickle(loader, fh)
    if isinstance(info, dict) and info.get("little_endian") is False:
        raise ForensicsError("legacy torch file written on a big-endian machine: re-save it with torch.save on a "
                             "little-endian one", path=source.path)
    obj = _unpickle(loader, fh)
    keys = _unpickle(loader, fh)
    if not isinstance(keys, list) or any(not isinstance(_ascii(k), str) for k in keys):
        raise ForensicsError("cannot read as a torch file (corrupt): the storage key list is not a list of keys",
                             path=source.path)
    offset = fh.tell()
    for key in map(_ascii, keys):
        st = loader.storages.get(key)
        if st is None:
            raise ForensicsError(f"storage key {key!r} is listed but no tensor uses it: corrupt", path=source.path)
        head = source.read(offset, 8) if offset + 8 <= source.size else None
        if head is None:
            raise ForensicsError(f"file ends before storage {key!r}: truncated", path=source.path)
        (count,) = struct.unpack("<q", head.tobytes())
        item = st.dtype.itemsize if st.dtype is not None else 1
        if count * item != st.nbytes:
            raise ForensicsError(f"storage {key!r} holds {count} elements, its tensors need {st.nbytes // item}: "
                                 "corrupt", path=source.path)
        st.offset = offset + 8
        offset = st.offset + st.nbytes
        if offset > source.size:
            raise ForensicsError(f"storage {key!r} lies past the end of the file: truncated", path=source.path)
    missing = [k for k, s in loader.storages.items() if s.offset < 0 and s.member is None]
    if missing:
        raise ForensicsError(f"storage {missing[0]!r} has no data in the file: truncated or corrupt", path=source.path)
    return _finish(obj, loader, lazy)


def _finish(obj: Any, loader: _Loader, lazy: bool) -> Any:
    """The unpickled object with every StoredTensor read into an array (or left lazy); containers
    shared in the pickle stay shared, one that contains itself or nests past MAX_DEPTH is refused."""
    done: dict[int, Any] = {}
    busy: set[int] = set()
    total = 0

    def walk(x: Any, depth: int) -> Any:
        nonlocal total
        if isinstance(x, StoredTensor):
            total += x.nbytes  # each place a tensor is used may be materialised on its own
            return x if lazy else x.read()
        if not isinstance(x, (dict, list, tuple, set, frozenset)):
            return x
        if id(x) in done:
            return done[id(x)]
        if id(x) in busy:
            raise ForensicsError("holds a container that contains itself: corrupt or hostile", path=loader.path)
        if depth > MAX_DEPTH:
            raise ForensicsError(f"holds containers nested more than {MAX_DEPTH} levels deep: corrupt or hostile",
                                 path=loader.path)
        busy.add(id(x))
        if isinstance(x, dict):
            out: Any = type(x)() if type(x) is not dict else {}
            for k, v in dict.items(x):  # the type's items: BUILD may have set an attribute named items
                out[k] = walk(v, depth + 1)
        elif isinstance(x, list):
            out = [walk(v, depth + 1) for v in x]
        elif isinstance(x, tuple):
            out = tuple(walk(v, depth + 1) for v in x)
        else:
            if any(isinstance(v, StoredTensor) for v in x):
                raise ForensicsError("holds a set of tensors: corrupt", path=loader.path)
            out = x
        busy.discard(id(x))
        done[id(x)] = out
        return out

    out = walk(obj, 0)
    # by ratio only (a capture's tensors are never all in memory at once): many expanded views of one
    # small storage add up, each under the per-tensor floor
    check_expansion(total, max(loader.source.size, 1), loader.path, "the file's tensors together", limit=sys.maxsize)
    return out


# ---------------------------------------------------------------- entry point

def load(path: str | Path, data: bytes | None = None, *, lazy: bool = False) -> Any:
    """A torch file's object with tensors as ndarrays (``lazy``: as ``StoredTensor``), read without torch.

    ``data``: the file's bytes when they are not the file itself (a gzip payload; ``path`` names the file)."""
    p = Path(path)
    source = _Source(p, data)
    if data is not None:
        fh: Any = io.BytesIO(data)
    else:
        fh = open_regular(p)
    with fh:
        head = fh.read(4)
        fh.seek(0)
        if head == b"PK\x03\x04":
            return _read_zip(source, fh, lazy)
        if is_pickle_head(head):
            return _read_legacy(source, fh, lazy)
    raise ForensicsError(f"not a torch file (first bytes {head.hex()})", path=p)

