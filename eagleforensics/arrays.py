"""The package's one array type: numpy, with bf16 from ``ml_dtypes``; torch only at the edges.

Hidden states cross every module boundary as ``numpy.ndarray`` (float32, float16, float64 or
``ml_dtypes.bfloat16``; token ids int64). torch is imported only where it is the only way:
reading ``.pt``/``.ckpt`` files, ``--device cuda``, running a drafter or a model. So a CPU
alignment of safetensors/npy inputs never pays torch's start-up (1.4 s, ~220 MB here).

Careful: numpy does not count bfloat16 as floating (``np.issubdtype(BF16, np.floating)`` is
False, its kind is ``V``); ask ``is_float`` instead.
"""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = (BF16, np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_NAMES = {str(d): d for d in FLOAT_DTYPES}


def is_float(dtype: Any) -> bool:
    """Whether ``dtype`` (numpy, ml_dtypes or torch) holds floating-point values, bfloat16 included."""
    return dtype_name(dtype) in _NAMES


def dtype_name(dtype: Any) -> str:
    """``bfloat16``, ``float16``, ``float32``, ...: the same name for a numpy, ml_dtypes or torch dtype."""
    return str(dtype).replace("torch.", "")


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a name given by ``dtype_name`` (bfloat16 included)."""
    return _NAMES.get(name) or np.dtype(name)


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a torch tensor, asked without importing torch."""
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def as_array(x: Any) -> np.ndarray:
    """``x`` as an ndarray: arrays as they are, torch tensors as a view of their memory where they can
    be (CPU; bf16 through its 16 bits), anything else through ``np.asarray``."""
    if isinstance(x, np.ndarray):
        return x
    if is_torch(x):
        import torch

        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(BF16)
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        return t.numpy()
    return np.asarray(x)


def to_torch(a: Any) -> Any:
    """A torch tensor over the same memory (bf16 through its 16 bits); a copy when the array is
    read-only (a mapped file), since torch tensors are always writable; tensors pass through."""
    import torch

    if is_torch(a):
        return a
    a = np.asarray(a)
    if not a.flags.writeable:
        a = a.copy()
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def f32(a: np.ndarray, copy: bool = False) -> np.ndarray:
    """``a`` as float32 (a new array when converted or ``copy``); bf16 widened by a 16-bit shift."""
    if a.dtype == np.float32:
        return a.copy() if copy else a
    if a.dtype == BF16:
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)
