"""Training-side records: detect the producer's layout from content and expose each hidden-state slot.

A slot has a stable identity ``(key, index)``: ``("aux_hidden_state", 1)`` is the second
H-wide block of SpecForge's concatenated aux tensor, ``("hidden_states", 3)`` the fourth
entry of a list or of speculators' L axis, ``("hidden_state", None)`` a lone tensor.
Layouts (docs/conventions.md, "What the training data holds"):

* ``specforge``: ``input_ids [S]``, ``loss_mask [S]``, ``hidden_state [1,S,H]`` (post-norm
  final), ``aux_hidden_state [1,S,kH]``; ``.ckpt`` or ``.ckpt.gz``.
* ``speculators``: ``token_ids [S]``, ``hidden_states [S,L,H]`` (aux layers then the last).
* ``modelopt``: ``input_ids``, ``hidden_states [S,H]`` (final), ``aux_hidden_states [S,kH]``,
  ``conversation_id``.
* ``eagle``: EAGLE-1/2 ``input_ids``, ``hidden_state`` (post-norm final), ``loss_mask``.
* ``list``: ``{"hidden_states": [aux_0, ..., final]}``, index = list position.
* ``generic``: any dict/list/tuple/tensor; every float tensor is a slot.

A safetensors file cannot hold a list, so the list layout stored there has keys
``hidden_states.0`` .. ``hidden_states.<k-1>``; those are read back as the list (same slot names
and roles as the ``.pt``). Slot data, ids and masks are numpy arrays (bf16 as ``arrays.BF16``);
safetensors and numpy records are read without importing torch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..arrays import dtype_name, is_float
from ..errors import ForensicsError, printable
from .safeload import load_object, to_arrays

FORMATS = ("specforge", "speculators", "modelopt", "eagle", "list", "generic")
ID_KEYS = ("input_ids", "token_ids")
MASK_KEYS = ("loss_mask",)


@dataclass(frozen=True)
class Slot:
    """One H-wide hidden-state block of a training record, shape [S, H]."""

    key: str
    index: int | None
    data: np.ndarray  # [S, H], as stored (bf16 as arrays.BF16)
    role: str  # "aux", "final" or "unknown"

    @property
    def name(self) -> str:
        """``key[index]`` or ``key``: how the slot is named in tables and findings."""
        return self.key if self.index is None else f"{self.key}[{self.index}]"


@dataclass(frozen=True)
class Entry:
    """A float array as found in the file, [S, W]; W may be k*H until the hidden size is known."""

    key: str
    index: int | None
    data: np.ndarray
    role: str
    splittable: bool


@dataclass
class TrainingRecord:
    """What the drafter learned from: hidden-state entries, token ids, loss mask, metadata."""

    path: str
    format: str
    entries: list[Entry]
    input_ids: np.ndarray | None = None  # int64 [S]
    loss_mask: np.ndarray | None = None  # int64 [S]
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.entries[0].data.shape[0])

    def widths(self) -> list[int]:
        return [int(e.data.shape[1]) for e in self.entries]

    def slots(self, hidden_size: int) -> list[Slot]:
        """Split every entry into H-wide slots; a width that is not a multiple of H is an error."""
        out: list[Slot] = []
        for e in self.entries:
            width = int(e.data.shape[1])
            name = e.key if e.index is None else f"{e.key}[{e.index}]"
            if width == 0:
                raise ForensicsError(f"{name!r} has shape {list(e.data.shape)}: no hidden-state values", path=self.path)
            if width == hidden_size:
                out.append(Slot(e.key, e.index, e.data, e.role))
            elif e.splittable and width % hidden_size == 0:
                k = width // hidden_size
                for i in range(k):
                    out.append(Slot(e.key, i, e.data[:, i * hidden_size:(i + 1) * hidden_size], e.role))
            elif e.splittable:
                raise ForensicsError(
                    f"{name!r} has width {width}, which no split into k states of the capture's hidden size "
                    f"{hidden_size} fits (k x {hidden_size}): the record and the capture come from models of "
                    "different widths", path=self.path)
            else:
                raise ForensicsError(
                    f"{name!r} has hidden size {width} but the capture has hidden size {hidden_size}: the record and the "
                    "capture come from models of different widths", path=self.path)
        return out


def _as_rows(t: np.ndarray, key: str, path: str) -> np.ndarray:
    """Bring a hidden-state array to [S, W]: drop a batch dim of 1; refuse anything else."""
    if t.ndim == 3 and t.shape[0] == 1:
        t = t[0]
    if t.ndim != 2:
        raise ForensicsError(
            f"{key!r} has shape {list(t.shape)}; expected [S, W] or [1, S, W] (one sequence)", path=path
        )
    return t


def _is_float_array(t: Any) -> bool:
    return isinstance(t, np.ndarray) and is_float(t.dtype)


def _float_check(t: Any, key: str, path: str) -> np.ndarray:
    if not isinstance(t, np.ndarray):
        raise ForensicsError(f"{key!r} is {type(t).__name__}, expected a tensor", path=path)
    if not is_float(t.dtype):
        raise ForensicsError(f"{key!r} holds {dtype_name(t.dtype)} values; hidden states must be floating point",
                             path=path)
    return t


def _ids(t: Any, key: str, path: str) -> np.ndarray:
    if not isinstance(t, np.ndarray) or t.dtype.kind not in "biu":
        raise ForensicsError(f"{key!r} must be an integer tensor", path=path)
    t = t.reshape(-1) if t.ndim == 2 and t.shape[0] == 1 else t
    if t.ndim != 1:
        raise ForensicsError(f"{key!r} has shape {list(t.shape)}; expected [S]", path=path)
    return t.astype(np.int64, copy=False)


def _first(d: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if k in d), None)


def detect_format(obj: Any) -> str:
    """Name the producer layout of a loaded object by its keys and shapes."""
    if not isinstance(obj, dict):
        return "generic"
    keys = set(obj)
    if "aux_hidden_state" in keys and "hidden_state" in keys:
        return "specforge"
    if "token_ids" in keys and isinstance(obj.get("hidden_states"), np.ndarray) and obj["hidden_states"].ndim == 3:
        return "speculators"
    if "aux_hidden_states" in keys and "hidden_states" in keys:
        return "modelopt"
    if isinstance(obj.get("hidden_states"), (list, tuple)):
        return "list"
    if "hidden_state" in keys and "input_ids" in keys:
        return "eagle"
    return "generic"


def _metadata(obj: dict[str, Any], used: set[str]) -> dict[str, Any]:
    """Keep everything that is not a slot, ids or mask, as printable metadata."""
    meta: dict[str, Any] = {}
    for k, v in obj.items():
        if k in used:
            continue
        if k == "__metadata__" and isinstance(v, dict):
            meta.update({str(a): b for a, b in v.items()})
        elif isinstance(v, np.ndarray):
            meta[str(k)] = (v.reshape(-1)[0].item() if v.size == 1 and v.dtype.kind in "biu"
                            else f"tensor {dtype_name(v.dtype)} {list(v.shape)}")
        elif isinstance(v, (str, int, float, bool)) or v is None:
            meta[str(k)] = v
        else:
            meta[str(k)] = f"<{type(v).__name__}>"
    return meta


def _common(obj: dict[str, Any], path: str) -> tuple[np.ndarray | None, np.ndarray | None, set[str]]:
    used: set[str] = set()
    ids_key = _first(obj, ID_KEYS)
    mask_key = _first(obj, MASK_KEYS)
    ids = _ids(obj[ids_key], ids_key, path) if ids_key else None
    mask = _ids(obj[mask_key], mask_key, path) if mask_key else None
    used.update(k for k in (ids_key, mask_key) if k)
    return ids, mask, used


def _aux_and_final(obj: dict[str, Any], path: str, fmt: str, aux_key: str, final_key: str) -> TrainingRecord:
    """Layouts with one concatenated aux tensor [.., kH] and one final state (SpecForge, ModelOpt)."""
    ids, mask, used = _common(obj, path)
    aux = _as_rows(_float_check(obj[aux_key], aux_key, path), aux_key, path)
    fin = _as_rows(_float_check(obj[final_key], final_key, path), final_key, path)
    entries = [Entry(aux_key, None, aux, "aux", True), Entry(final_key, None, fin, "final", False)]
    used |= {aux_key, final_key}
    return TrainingRecord(path, fmt, entries, ids, mask, _metadata(obj, used))


def _from_specforge(obj: dict[str, Any], path: str) -> TrainingRecord:
    return _aux_and_final(obj, path, "specforge", "aux_hidden_state", "hidden_state")


def _from_modelopt(obj: dict[str, Any], path: str) -> TrainingRecord:
    return _aux_and_final(obj, path, "modelopt", "aux_hidden_states", "hidden_states")


def _from_speculators(obj: dict[str, Any], path: str) -> TrainingRecord:
    ids, mask, used = _common(obj, path)
    hs = _float_check(obj["hidden_states"], "hidden_states", path)
    if hs.ndim != 3:
        raise ForensicsError(f"'hidden_states' has shape {list(hs.shape)}; speculators writes [S, L, H]", path=path)
    n = hs.shape[1]
    entries = [Entry("hidden_states", i, hs[:, i, :], "final" if i == n - 1 else "aux", False) for i in range(n)]
    used.add("hidden_states")
    return TrainingRecord(path, "speculators", entries, ids, mask, _metadata(obj, used))


def _from_eagle(obj: dict[str, Any], path: str) -> TrainingRecord:
    ids, mask, used = _common(obj, path)
    fin = _as_rows(_float_check(obj["hidden_state"], "hidden_state", path), "hidden_state", path)
    used.add("hidden_state")
    return TrainingRecord(path, "eagle", [Entry("hidden_state", None, fin, "final", False)], ids, mask, _metadata(obj, used))


def _from_list(obj: dict[str, Any], path: str) -> TrainingRecord:
    ids, mask, used = _common(obj, path)
    items = list(obj["hidden_states"])
    if not items:
        raise ForensicsError("'hidden_states' is an empty list", path=path)
    entries = []
    for i, t in enumerate(items):
        t = _as_rows(_float_check(t, f"hidden_states[{i}]", path), f"hidden_states[{i}]", path)
        entries.append(Entry("hidden_states", i, t, "final" if i == len(items) - 1 and len(items) > 1 else "aux", False))
    used.add("hidden_states")
    return TrainingRecord(path, "list", entries, ids, mask, _metadata(obj, used))


def _from_generic(obj: Any, path: str) -> TrainingRecord:
    ids = mask = None
    meta: dict[str, Any] = {}
    entries: list[Entry] = []
    if isinstance(obj, np.ndarray):
        items: list[tuple[str, int | None, Any]] = [("tensor", None, obj)]
    elif isinstance(obj, (list, tuple)):
        items = [("[]", i, t) for i, t in enumerate(obj)]
    elif isinstance(obj, dict):
        ids, mask, used = _common(obj, path)
        meta = _metadata({k: v for k, v in obj.items() if not _is_float_array(v)}, used)
        # a key name is shown in every table: control characters are escaped here, where it enters
        items = [(printable(k), None, v) for k, v in obj.items() if _is_float_array(v)]
    else:
        raise ForensicsError(f"holds a {type(obj).__name__}, not tensors", path=path)
    for key, index, t in items:
        if not _is_float_array(t):
            continue
        if t.ndim == 3 and t.shape[0] != 1:  # [S, L, H]: one slot per L
            entries += [Entry(key, i, t[:, i, :], "unknown", False) for i in range(t.shape[1])]
        else:
            entries.append(Entry(key, index, _as_rows(t, key if index is None else f"[{index}]", path), "unknown", index is None))
    return TrainingRecord(path, "generic", entries, ids, mask, meta)


LOADERS: dict[str, Callable[[Any, str], TrainingRecord]] = {
    "specforge": _from_specforge,
    "speculators": _from_speculators,
    "modelopt": _from_modelopt,
    "eagle": _from_eagle,
    "list": _from_list,
    "generic": _from_generic,
}


def from_object(obj: Any, path: str, fmt: str | None = None) -> TrainingRecord:
    """Build a TrainingRecord from an already-loaded object (``fmt`` forces a layout); torch tensors in
    it are taken as arrays, as ``load_object`` hands them out."""
    if fmt is not None and fmt not in LOADERS:
        raise ForensicsError(f"unknown training format {fmt!r}; choose one of {', '.join(FORMATS)}")
    obj = _fold_numbered_list(to_arrays(obj, Path(path)))
    chosen = fmt or detect_format(obj)
    try:
        record = LOADERS[chosen](obj, path)
    except KeyError as exc:
        raise ForensicsError(f"format {chosen!r} needs key {exc}, which the file lacks", path=path) from None
    except (AttributeError, TypeError) as exc:
        raise ForensicsError(f"does not have the {chosen!r} layout ({exc})", path=path) from None
    _validate(record)
    return record


def _validate(record: TrainingRecord) -> None:
    if not record.entries:
        raise ForensicsError("no floating-point hidden-state tensors found", path=record.path)
    lengths = {int(e.data.shape[0]) for e in record.entries}
    if len(lengths) != 1:
        raise ForensicsError(f"hidden-state tensors disagree on sequence length: {sorted(lengths)}", path=record.path)
    (s,) = lengths
    if s == 0:
        raise ForensicsError("hidden states hold zero tokens", path=record.path)
    for name, t in (("input_ids", record.input_ids), ("loss_mask", record.loss_mask)):
        if t is not None and int(t.shape[0]) != s:
            raise ForensicsError(f"{name} has {int(t.shape[0])} tokens but the hidden states have {s}", path=record.path)


_LIST_ITEM = re.compile(r"hidden_states\.(0|[1-9][0-9]{0,8})")  # bounded: int() of a 5000-digit key raises


def _fold_numbered_list(obj: Any) -> Any:
    """``hidden_states.0`` .. ``hidden_states.<k-1>`` (the list layout as a safetensors file must store it)
    folded back into the list ``hidden_states``; anything else is returned unchanged.

    Only when every float array of the file is such an entry, numbered 0..k-1 without gaps, and no
    ``hidden_states`` key sits beside them; then the slots are named and given roles exactly as the
    same record saved as a ``.pt`` list. Anything else stays generic (every float array a slot)."""
    if not isinstance(obj, dict) or "hidden_states" in obj:
        return obj
    floats = [k for k, v in obj.items() if _is_float_array(v)]
    items = {int(m.group(1)): k for k in floats if isinstance(k, str) and (m := _LIST_ITEM.fullmatch(k))}
    if not items or len(items) != len(floats) or sorted(items) != list(range(len(items))):
        return obj
    folded = {k: v for k, v in obj.items() if k not in items.values()}
    folded["hidden_states"] = [obj[items[i]] for i in range(len(items))]
    return folded


def load_training(path: str | Path, *, fmt: str | None = None, allow_unsafe: bool = False) -> TrainingRecord:
    """Load one training record (any supported layout) from ``path``."""
    obj = load_object(path, allow_unsafe=allow_unsafe)
    return from_object(obj, str(path), fmt)
