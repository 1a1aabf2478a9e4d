"""A model directory (a drafter's or a target's): its config.json and its safetensors tensors, without torch.

A directory without safetensors but with ``pytorch_model.bin`` (or its shard index) is read through the
restricted torch-file reader (``io.torchweights``): the EAGLE repository's training output, which the engines load.

Tensors are listed from the safetensors headers (or the shard index) without reading any data;
one tensor, or a few rows of one, is read on demand with one positional read. The doctor's checks
read drafters and targets through here, so a check that needs only shapes never reads a weight
and one that compares embeddings reads only the rows it samples.

A target is often a partial download (config, tokenizer and the shards holding the embedding, final
norm and lm_head, not hundreds of GB of experts): with a shard index, names come from the index and
a shard's header is read only when one of its tensors is asked for. A tensor whose shard is absent
raises ``MissingShard`` (a check then says "not run" naming the file), never the whole directory.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ForensicsError
from .bounds import check_config_ints
from .guards import parse_json, read_regular
from .formats import read_safetensors_header
from .safeload import SafetensorsFile, open_safetensors
from .shardindex import weight_map_of

MAX_CONFIG_BYTES = 4 * 1024 * 1024
BIN_NAME, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
INDEX_NAME = "model.safetensors.index.json"
# A shard index of a real checkpoint: DeepSeek-V3 / Kimi-K2 FP8 list ~140k tensors (weights and their
# scales) in ~13 MB; 64 MiB leaves room for larger models and still refuses what cannot be an index.
MAX_INDEX_BYTES = 64 * 1024 * 1024


class MissingShard(ForensicsError):
    """A tensor the index lists lives in a shard that is not in the directory (a partial download).

    ``shard`` is the file it needs; a doctor check that reads it is "not run" naming that file.
    """

    def __init__(self, tensor: str, shard: str, directory: Path) -> None:
        self.tensor, self.shard = tensor, shard
        super().__init__(f"tensor {tensor!r} is in shard {shard!r}, which is not in the directory (a partial "
                         f"download: fetch that file to run what reads it)", path=directory)


_INDEXES: dict[tuple[Any, ...], dict[str, str]] = {}  # (path, device, inode, size, mtime, ctime) -> weight_map


def read_index(path: str | Path) -> dict[str, str]:
    """The ``weight_map`` of a shard index (tensor name -> shard file name), checked, nothing else kept.

    Bounded by ``MAX_INDEX_BYTES``; every shard must be a plain ``*.safetensors`` name in the same directory.
    Shard names are shared strings, so a 140k-entry index costs its names and one string per shard. Parsed
    once per process while the file is unchanged (a 13 MB index takes ~0.7 s; doctor opens the target 5 times).
    """
    p = Path(path)
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except OSError:
        key = None
    if key is not None and key in _INDEXES:
        return _INDEXES[key]
    wmap = _parse_index(p)
    if key is not None:
        if len(_INDEXES) >= 4:
            _INDEXES.pop(next(iter(_INDEXES)))
        _INDEXES[key] = wmap
    return wmap


def _parse_index(p: Path) -> dict[str, str]:
    raw = read_regular(p, MAX_INDEX_BYTES, "safetensors shard index")
    wmap = weight_map_of(raw, p)  # only weight_map is decoded: metadata and the rest are skipped, never built
    del raw
    if not wmap:
        raise ForensicsError("shard index has no weight_map object", path=p)
    shards: dict[str, str] = {}
    out: dict[str, str] = {}
    for name, shard in wmap.items():
        if not isinstance(shard, str):
            raise ForensicsError(f"weight_map entry {str(name)[:80]!r} names {str(shard)[:80]!r}; expected a "
                                 ".safetensors file in the same directory", path=p)
        known = shards.get(shard)
        if known is None:
            if Path(shard).name != shard or not shard.endswith(".safetensors") or shard in (".", ".."):
                raise ForensicsError(f"weight_map entry {str(name)[:80]!r} names {shard[:80]!r}; expected a "
                                     ".safetensors file in the same directory", path=p)
            known = shards[shard] = shard
        out[name] = known
    return out


def index_tensor_names(directory: str | Path) -> list[str]:
    """Every tensor name a model directory holds or lists (its shard index when it has one; else its headers),
    without reading any shard that is not needed: what a check looks up (MTP layers, experts) before reading."""
    return list(ModelDir(directory).names)
# The HF names of the tensors checks ask for by role; a stored name that ends with the tail counts
# when exactly one does (drafters and some converters add a prefix). MTP heads and layers never count.
_ROLE_NAMES = {"embed": ("model.embed_tokens.weight", "embed_tokens.weight"),
               "lm_head": ("lm_head.weight", "lm_head.weight"),
               "norm": ("model.norm.weight", "model.norm.weight")}


def read_config(path: str | Path, what: str = "config.json") -> dict[str, Any]:
    """The JSON object in ``path`` (a config file, or a directory's ``config.json``); bad input is one line."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise ForensicsError(f"no {what} here", path=p)
    raw = read_regular(p, MAX_CONFIG_BYTES, what)
    try:
        obj = parse_json(raw, p, what)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ForensicsError(f"{what} is not valid JSON ({' '.join(str(exc).split())[:120]})", path=p) from None
    if not isinstance(obj, dict):
        raise ForensicsError(f"{what} is not a JSON object", path=p)
    check_config_ints(obj, p)  # layer counts, widths, vocabularies within what any engine serves
    return obj


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config: ``text_config`` for multimodal targets, else the config itself."""
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) else cfg


@dataclass(frozen=True)
class TensorInfo:
    """Where one stored tensor lives and what it claims to be (from its file's header, no data read)."""

    name: str
    file: Path
    dtype: str  # the safetensors code: BF16, F32, I64, ...
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class ModelDir:
    """A drafter or target directory: ``config`` and the tensors of its safetensors files, read lazily."""

    def __init__(self, path: str | Path, what: str = "model directory") -> None:
        self.path = Path(path)
        self.what = what
        if not self.path.is_dir():
            raise ForensicsError(f"expected a {what} (config.json + safetensors weights)", path=self.path)
        self._handles: dict[Path, SafetensorsFile] = {}

    @cached_property
    def config(self) -> dict[str, Any]:
        """Its ``config.json`` as a dict."""
        return read_config(self.path, f"{self.what}'s config.json")

    @property
    def text(self) -> dict[str, Any]:
        """The language model's config (``text_config`` when nested)."""
        return text_config(self.config)

    @cached_property
    def index(self) -> dict[str, str] | None:
        """The shard index's weight_map (tensor name -> shard file name), None without an index."""
        index = self.path / INDEX_NAME
        return read_index(index) if index.is_file() else None

    @cached_property
    def names(self) -> dict[str, Any]:
        """Every tensor name (a mapping, in stored order), from the index when there is one (no shard opened), else
        from the headers."""
        if self.index is not None:
            return self.index
        return self.tensors

    @cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        """Every tensor of the shards present, by name, from their headers (with an index, the shards it names that
        are in the directory; the others' tensors are in ``names`` only and ``info`` raises ``MissingShard``)."""
        out: dict[str, TensorInfo] = {}
        for f in self._files():
            out.update(self._header(f))
        return out

    def _header(self, f: Path) -> dict[str, TensorInfo]:
        """One file's tensors from its header, read once."""
        headers = self.__dict__.setdefault("_headers", {})
        if f not in headers:
            header = weights_header(f)
            headers[f] = {str(name): TensorInfo(str(name), f, str(info["dtype"]), tuple(int(d) for d in info["shape"]))
                          for name, info in header.items() if name != "__metadata__"}
        return headers[f]

    def shard_of(self, name: str) -> str | None:
        """The shard file name the index puts ``name`` in (None without an index or for a name it lacks)."""
        return None if self.index is None else self.index.get(name)

    def _files(self) -> list[Path]:
        if self.index is not None:
            shards = dict.fromkeys(self.index.values())
            return [self.path / s for s in shards if (self.path / s).exists()]
        single = self.path / "model.safetensors"
        if single.exists():
            return [single]
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            files = _bin_files(self.path)
        if not files:
            raise ForensicsError("no model.safetensors, shard index, *.safetensors or pytorch_model.bin here (the "
                                 "weights formats read; convert other .pt checkpoints first)", path=self.path)
        return files

    def has(self, name: str) -> bool:
        """``name`` is stored or listed by the index (its shard may still be absent: ``info`` says)."""
        return name in self.names

    def info(self, name: str) -> TensorInfo:
        """Where ``name`` lives and its dtype and shape, from its file's header (only that shard's header is read).

        ``MissingShard`` when the index lists it in a shard that is not in the directory."""
        shard = self.shard_of(name)
        if shard is not None:
            f = self.path / shard
            if not f.exists():
                raise MissingShard(name, shard, self.path)
            found = self._header(f).get(name)
            if found is None:
                raise ForensicsError(f"the shard index puts tensor {name!r} in {shard!r}, whose header lacks it",
                                     path=f)
            return found
        if self.index is None:
            try:
                return self.tensors[name]
            except KeyError:
                pass
        raise ForensicsError(f"no tensor {name!r} in the safetensors weights", path=self.path)

    def _handle(self, f: Path) -> SafetensorsFile:
        if f not in self._handles:
            self._handles[f] = open_weights(f)
        return self._handles[f]

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` whole, in its stored shape and dtype (bf16 as ``arrays.BF16``)."""
        t = self.info(name)
        try:
            return self._handle(t.file).get(name)
        except ForensicsError:
            raise
        except (OSError, KeyError, ValueError) as exc:
            raise ForensicsError(f"cannot read tensor {name!r}: {' '.join(str(exc).split())[:200]}",
                                 path=t.file) from None

    def rows(self, name: str, index: Any) -> np.ndarray:
        """Rows ``index`` (ascending or not) of a 2-D tensor, each read on its own: a sample of a large
        embedding costs only the rows asked for."""
        t = self.info(name)
        if len(t.shape) != 2:
            raise ForensicsError(f"tensor {name!r} has shape {list(t.shape)}; expected 2 dimensions", path=t.file)
        idx = np.asarray(index, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= t.shape[0]):
            raise ForensicsError(f"row index out of range for {name!r} {list(t.shape)}", path=t.file)
        reader = self._handle(t.file).rows(name)
        out = np.empty((idx.size, t.shape[1]), dtype=reader.dtype)
        for i, r in enumerate(idx.tolist()):
            reader.read(r, r + 1, out=out[i:i + 1])
        return out

    def row_block(self, name: str, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows [start, stop) of a 2-D tensor in one positional read (a vocabulary chunk of an lm_head), stored
        dtype; ``out`` (same dtype, at least stop - start rows) is filled and a view of it returned."""
        t = self.info(name)
        if len(t.shape) != 2:
            raise ForensicsError(f"tensor {name!r} has shape {list(t.shape)}; expected 2 dimensions", path=t.file)
        readers = self.__dict__.setdefault("_row_readers", {})
        if name not in readers:  # one open file per tensor, kept for the next chunk
            readers[name] = self._handle(t.file).rows(name)
        return readers[name].read(start, stop, out=out)

    def find(self, role: str) -> str | None:
        """The stored name of the ``embed``, ``lm_head`` or final ``norm`` tensor, or None when absent or ambiguous."""
        exact, tail = _ROLE_NAMES[role]
        if exact in self.names:
            return exact
        hits = [k for k in self.names if k.endswith(tail) and "mtp" not in k and ".layers." not in k
                and "midlayer" not in k]
        return hits[0] if len(hits) == 1 else None


def check_weight_kinds(md: ModelDir) -> None:
    """A drafter's fc, norm and lm_head weights hold floats (any width): from the headers, by stored name, with
    no config needed (doctor opens drafters replay cannot run). An integer one with no ``*_scale`` beside it (no
    quantized layout) is one line: engines would copy its integers into their bf16 parameters."""
    tensors = md.tensors
    for stored, info in tensors.items():
        bare = stored[len("model."):] if stored.startswith("model.") else stored
        if bare not in ("fc.weight", "norm.weight", "lm_head.weight") or info.dtype.startswith(("F", "BF")):
            continue
        if any(k.startswith(stored[:-len("weight")]) and k.endswith("_scale") for k in tensors):
            continue
        raise ForensicsError(f"tensor {stored} has dtype {info.dtype}; a drafter's {bare} holds floating-point "
                             "weights (float16/bfloat16/float32), which engines load", path=info.file)


def _bin_files(d: Path) -> list[Path]:
    """``pytorch_model.bin``, or the shards its index names (each a plain file name in ``d``)."""
    index = d / BIN_INDEX
    if index.is_file():
        wmap = read_config(index, "pytorch_model.bin shard index").get("weight_map")
        if not isinstance(wmap, dict) or not wmap:
            raise ForensicsError("shard index has no weight_map object", path=index)
        shards: list[Path] = []
        for shard in wmap.values():
            if not isinstance(shard, str) or Path(shard).name != shard or not shard.endswith(".bin"):
                raise ForensicsError(f"weight_map names {str(shard)[:80]!r}; expected a .bin file in the same "
                                     "directory", path=index)
            if not (d / shard).is_file():
                raise ForensicsError(f"weight_map names shard {shard!r}, which is missing", path=index)
            if d / shard not in shards:
                shards.append(d / shard)
        return shards
    return [d / BIN_NAME] if (d / BIN_NAME).is_file() else []


def weights_header(f: Path) -> dict[str, Any]:
    """A weights file's ``{name: {"dtype", "shape"}}``: the safetensors header, or a torch file's through the
    restricted reader."""
    if f.suffix == ".bin":
        from .torchweights import torch_header

        return torch_header(f)
    return read_safetensors_header(f)


def open_weights(f: Path) -> Any:
    """A handle reading one tensor (or rows of one) at a time: safetensors, or a torch file (restricted reader)."""
    if f.suffix == ".bin":
        from .torchweights import TorchWeightsFile

        return TorchWeightsFile(f)
    return open_safetensors(f)
