"""A model directory's ``pytorch_model.bin`` (the EAGLE repository's training output, which SGLang and vLLM load)
read like a safetensors file: names, dtypes and shapes first, each tensor's data on demand.

The file goes through the project's restricted torch-file reader (``io.torchfile.load(lazy=True)``: an allowlist
unpickler, never ``torch.load``), which leaves every tensor as a ``StoredTensor`` until it is read. The handle
offers what ``io.modeldir.ModelDir`` and ``io.drafter`` ask of a safetensors handle: ``header`` (safetensors dtype
codes), ``keys``, ``rows`` and ``get``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ForensicsError
from .torchfile import StoredTensor, load

BIN_NAMES = ("pytorch_model.bin",)
BIN_INDEX = "pytorch_model.bin.index.json"
_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
          "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


class _Rows:
    """[rows, last dim] of a tensor held in memory (one the file does not lay out plainly), read like ``FileRows``."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr.reshape(-1, arr.shape[-1]) if arr.ndim else arr.reshape(1, 1)
        self.dtype = self.arr.dtype

    def read(self, start: int = 0, stop: int | None = None, out: Any = None) -> np.ndarray:
        block = self.arr[start:stop]
        if out is None:
            return block.copy()
        out[: block.shape[0]] = block
        return out[: block.shape[0]]


def _state_dict(obj: Any, path: Path) -> dict[str, StoredTensor]:
    """The flat name -> tensor map of a saved state dict (also under a ``state_dict`` / ``model`` key)."""
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict) and not any(
                isinstance(v, StoredTensor) for v in obj.values()):
            obj = obj[key]
    if not isinstance(obj, dict) or not obj:
        raise ForensicsError("not a state dict (a map of tensor names to tensors)", path=path)
    out = {str(k): v for k, v in obj.items() if isinstance(v, StoredTensor)}
    if not out:
        raise ForensicsError("holds no tensors", path=path)
    return out


class TorchWeightsFile:
    """A ``pytorch_model*.bin`` state dict, its tensors read on demand (restricted reader, no torch)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.tensors = _state_dict(load(self.path, lazy=True), self.path)
        self.header: dict[str, Any] = {}
        for name, t in self.tensors.items():
            code = _CODES.get(np.dtype(t.dtype).name if np.dtype(t.dtype).name != "void" else "", None)
            if code is None and "bfloat16" in str(t.dtype):
                code = "BF16"
            self.header[name] = {"dtype": code or str(t.dtype).upper(), "shape": list(t.shape)}

    def keys(self) -> list[str]:
        return list(self.tensors)

    def rows(self, name: str) -> Any:
        t = self.tensors[name]
        plain = t.file_rows()
        return plain if plain is not None and t.ndim else _Rows(np.ascontiguousarray(t.read(keep=False)))

    def get(self, name: str) -> np.ndarray:
        return np.ascontiguousarray(self.tensors[name].read(keep=False))


def torch_header(path: Path) -> dict[str, Any]:
    """``{name: {"dtype": code, "shape": [...]}}`` of a torch weights file, as a safetensors header reads."""
    return TorchWeightsFile(path).header
