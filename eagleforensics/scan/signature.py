"""Inspect one training record for a dataset scan: layout, numerics, padding and a per-slot norm signature.

Everything here is per record and cheap (one read, per-token norms). The result is a plain
JSON-able dict, one line of the scan's results file; judgements that need the whole
dataset (robust z-scores, the layout most records share) are made later from those lines
(``scan_summary``).

Signature of a slot, over its real tokens (not padding, not zero or NaN rows), leaving out
the first token, whose massive activation would make every mean depend on sequence length:

* ``log_norm``: mean log per-token L2 norm (grows with depth in pre-LN models);
* ``norm_cv``: coefficient of variation of per-token norms (small after RMSNorm);
* ``first_excess``: log norm of the first token minus ``log_norm`` (the first token's
  massive activation appears after the first layers, so the embedding lacks it);
* ``post_norm``: ``norms.looks_post_norm`` over all real tokens, first included, as ``align``
  judges it (in real models a raw state's norms vary widely; the first token alone makes a
  raw state past the first layers fail the test).

Padding (SpecForge pads right with ``input_ids == 0``, ``loss_mask == 0`` and zero hidden
rows): padding rows must have loss mask 0, SpecForge padding rows zero hidden rows, and no
real token may have an all-zero hidden row. A mismatch means the padding is shifted
against the ids, so every supervised row past it is wrong.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..arrays import as_array, dtype_name, is_torch
from ..errors import ForensicsError
from ..evidence.norms import looks_post_norm, norm_cv, token_norms
from ..io.safeload import load_object
from ..io.training import TrainingRecord, from_object

ZERO_PADDED_FORMATS = ("specforge",)


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


def _ranges(rows: list[int], limit: int = 4) -> str:
    """``[3, 4, 5, 9]`` -> ``'3-5, 9'`` (at most ``limit`` ranges, then '...')."""
    out: list[str] = []
    for r in rows:
        if out and isinstance(out[-1], list) and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])  # type: ignore[arg-type]
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in out]  # type: ignore[misc]
    return ", ".join(text[:limit]) + (", ..." if len(text) > limit else "")


def trailing_id_padding(input_ids: Any) -> int:
    """Number of trailing rows whose input id is 0 (SpecForge's right padding); ids as a tensor or ndarray."""
    ids = as_array(input_ids)
    nz = np.argwhere(ids != 0)
    return int(ids.shape[0]) if nz.size == 0 else int(ids.shape[0]) - 1 - int(nz[-1, 0])


def slot_signature(data: Any, real: Any) -> dict[str, Any]:
    """Norm signature of one slot [S, H] over the rows flagged ``real`` (first real row left out of the means)."""
    return norm_signature(token_norms(data), real)


def norm_signature(norms: Any, real: Any) -> dict[str, Any]:
    """The signature from per-token norms alone (so a fingerprint's stored norms are enough).

    ``post_norm`` is ``norms.looks_post_norm`` on the real rows (all finite and positive here,
    so it is their coefficient of variation against ``norms.POST_NORM_CV``).
    """
    norms, real = as_array(norms), as_array(real)
    ok = real & np.isfinite(norms) & (norms > 0)
    idx = np.flatnonzero(ok)
    sig: dict[str, Any] = {"rows": int(idx.size)}
    if idx.size < 3:
        return {**sig, "log_norm": None, "norm_cv": None, "first_excess": None, "post_norm": None}
    first, rest = float(norms[idx[0]]), norms[idx[1:]].astype(np.float64)
    log_norm = float(np.log(rest).mean())
    return {**sig, "log_norm": _num(log_norm), "norm_cv": _num(norm_cv(rest)),
            "first_excess": _num(np.log(first) - log_norm), "post_norm": looks_post_norm(norms[idx])}


def _layout(obj: Any) -> tuple[list[str], dict[str, list[int]], dict[str, str]]:
    """Top-level keys, tensor shapes and dtypes of a loaded object (safetensors metadata left out)."""
    if not isinstance(obj, dict):
        return [], {}, {}
    keys = [str(k) for k in obj if k != "__metadata__"]
    tensors = {str(k): v for k, v in obj.items() if is_torch(v) or isinstance(v, np.ndarray)}
    return keys, {k: list(v.shape) for k, v in tensors.items()}, {k: dtype_name(v.dtype) for k, v in tensors.items()}


def hidden_size_of(record: TrainingRecord) -> int:
    """H: the width of the final-state entry, else the narrowest entry (aux entries are k*H wide)."""
    finals = [int(e.data.shape[1]) for e in record.entries if e.role == "final"]
    return finals[0] if finals else min(record.widths())


def padding_issues(record: TrainingRecord, zero: Any, names: list[str]) -> tuple[int, list[str]]:
    """Trailing id padding and what is inconsistent about it; ``zero`` [slots, S] marks all-zero rows per slot."""
    issues: list[str] = []
    s = record.num_tokens
    zero = as_array(zero)
    pad = trailing_id_padding(record.input_ids) if record.input_ids is not None else 0
    is_pad = np.zeros(s, dtype=bool)
    is_pad[s - pad:] = True
    if record.loss_mask is not None and pad:
        masked = np.argwhere(as_array(record.loss_mask)[s - pad:] != 0).reshape(-1) + (s - pad)
        if masked.size:
            issues.append(f"loss_mask is 1 on {masked.size} padding rows (input_ids 0): rows {_ranges(masked.tolist())}")
    if record.format in ZERO_PADDED_FORMATS:
        live = np.flatnonzero(is_pad & ~zero.all(0)).tolist()
        if live:
            issues.append(f"{len(live)} padding rows (input_ids 0) hold non-zero hidden states: rows {_ranges(live)}; "
                          "the zero padding is shifted against the ids")
    where = "padding not at the end, or shifted against the ids" if record.input_ids is not None else "zero rows"
    dead_all = ~is_pad & zero.all(0)
    if dead_all.any():
        rows = np.flatnonzero(dead_all).tolist()
        issues.append(f"{len(rows)} real token rows have all-zero hidden states: rows {_ranges(rows)} ({where})")
    for name, z in zip(names, zero):  # a slot zero where the others are not: that slot lost its rows
        rows = np.flatnonzero(~is_pad & z & ~dead_all).tolist()
        if rows:
            issues.append(f"{len(rows)} real token rows are all-zero in {name} only: rows {_ranges(rows)}")
    if pad == s:
        issues.append("every row is padding (input_ids all 0)")
    return pad, issues


def inspect_object(obj: Any, rel: str, path: str, reference: Any = None) -> dict[str, Any]:
    """The results line of one loaded record (``reference`` is a ``scan_reference.Reference`` or None)."""
    return inspect_loaded(obj, rel, path, reference)[0]


def inspect_loaded(obj: Any, rel: str, path: str, reference: Any = None) -> tuple[dict[str, Any], TrainingRecord]:
    """The results line of one loaded record and the record itself (for the training-data audit)."""
    keys, shapes, dtypes = _layout(obj)
    record = from_object(obj, path)
    h = hidden_size_of(record)
    if reference is not None and reference.hidden_size != h:
        raise ForensicsError(f"hidden size {h} differs from the reference capture's {reference.hidden_size}: "
                             "the record and the reference come from different models", path=path)
    slots = record.slots(h)
    data = [as_array(s.data) for s in slots]  # tensors from .ckpt/.pt, ndarrays from safetensors: numpy from here
    finite = np.stack([np.isfinite(d).all(-1) for d in data])
    zero = np.stack([(d == 0).all(-1) for d in data])
    pad, issues = padding_issues(record, zero, [s.name for s in slots])
    real = ~zero.all(0)
    real[record.num_tokens - pad:] = False
    out_slots = []
    for s, d, fin in zip(slots, data, finite):
        bad = np.flatnonzero(~fin).tolist()
        if bad:
            issues.append(f"NaN/Inf in {s.name}: {len(bad)} rows ({_ranges(bad)})")
        entry = {"name": s.name, "role": s.role, "dtype": dtype_name(d.dtype),
                 "nonfinite_rows": len(bad), **slot_signature(d, real)}
        out_slots.append(entry)
    if not dtypes:
        dtypes = {e.key: dtype_name(e.data.dtype) for e in record.entries}
    line: dict[str, Any] = {
        "path": rel, "error": None, "format": record.format, "keys": keys, "shapes": shapes, "dtypes": dtypes,
        "tokens": record.num_tokens, "padding": pad, "hidden_size": h, "issues": issues, "slots": out_slots,
    }
    if reference is not None:
        reference.annotate(line, slots, record, real)
    return line, record


def inspect_file(root: str | Path, rel: str, reference: Any = None, allow_unsafe: bool = False,
                 audit: Any = None) -> dict[str, Any]:
    """Inspect ``root/rel``; a file that cannot be read or understood becomes an error line, never an exception.

    With ``audit`` (a ``scan.audit.TargetAudit``) the line also carries ``_prepared``: the record's audit line and
    the rows its target agreement needs, which ``inspect_batch`` scores for the whole batch and puts under ``audit``.
    """
    path = Path(root) / rel
    try:
        obj = load_object(path, allow_unsafe=allow_unsafe)
        line, record = inspect_loaded(obj, rel, str(path), reference)
        if audit is not None:
            from .audit import prepare

            line["_prepared"] = prepare(rel, record, audit)
        return line
    except ForensicsError as exc:
        return error_line(rel, exc.detail)
    except Exception as exc:  # a corrupt record may fail anywhere; it is a finding, not a crash
        return error_line(rel, f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")


def error_line(rel: str, message: str) -> dict[str, Any]:
    """The results line of a record that could not be inspected."""
    return {"path": rel, "error": message, "format": None, "keys": [], "shapes": {}, "dtypes": {}, "tokens": None,
            "padding": None, "hidden_size": None, "issues": [], "slots": []}
