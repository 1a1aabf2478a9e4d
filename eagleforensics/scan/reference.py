"""The reference side of a dataset scan: what each capture position looks like, small enough to ship to workers.

Two kinds of evidence, both cheap per record:

* **norm statistics** (any prompt): each position's ``slot_signature`` over the capture's
  tokens; a slot "resembles" the position whose signature is nearest. Neighbouring layers
  have near-equal statistics, so this tells regimes apart (embedding or not, raw or
  post-norm, shallow or deep), not neighbours;
* **shared opening tokens** (exact): chat-templated datasets open every record with the same
  tokens, and a causal model gives identical states for identical prefixes. When a record's
  ``input_ids`` start with the reference's, its slots are compared with the reference rows
  token by token (per-token cosine, as ``align`` does) and placed only with a clear winner.
  The first token is left out: its massive activation is alike at every position past the
  first layers and only dilutes the margin.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..arrays import BF16, as_array, f32
from ..errors import ForensicsError
from ..positions import Position
from .signature import slot_signature

PREFIX_ROWS = 32  # reference rows kept for prefix placement
MIN_PREFIX = 4  # shared tokens (after the first) needed to place a slot
# bars for a placement from bf16 records (align uses the same for bf16)
MIN_SCORE = 0.99
MIN_MARGIN = 0.005
# units of the nearest-signature distance: differences that matter for each statistic
UNITS = {"log_norm": 0.05, "log_cv": 0.25, "first_excess": 0.1}


def signature_vector(sig: dict[str, Any]) -> dict[str, float] | None:
    """(log_norm, log cv, first_excess) of a signature, or None when any is missing."""
    if sig.get("log_norm") is None or not sig.get("norm_cv") or sig.get("first_excess") is None:
        return None
    return {"log_norm": sig["log_norm"], "log_cv": math.log(sig["norm_cv"]), "first_excess": sig["first_excess"]}


def signature_distance(a: dict[str, float], b: dict[str, float]) -> float:
    """Euclidean distance of two signature vectors in ``UNITS``."""
    return math.sqrt(sum(((a[k] - b[k]) / u) ** 2 for k, u in UNITS.items()))


@dataclass
class Reference:
    """Per-position signatures and opening rows of a capture (or fingerprint)."""

    path: str
    hidden_size: int
    num_layers: int | None
    labels: list[str]
    signatures: dict[str, dict[str, Any]]
    input_ids: np.ndarray | None  # int64, the first PREFIX_ROWS
    prefix: dict[str, np.ndarray] = field(default_factory=dict)  # label -> [K, H] bfloat16
    unplaced: list[str] = field(default_factory=list)  # entries whose position neither labels nor content give
    notes: list[str] = field(default_factory=list)  # what content said against the labels

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "hidden_size": self.hidden_size, "num_layers": self.num_layers,
                "positions": [x for x in self.labels if x not in self.unplaced], "unplaced": list(self.unplaced),
                "label_notes": list(self.notes), "signatures": self.signatures,
                "prefix_tokens": 0 if self.input_ids is None else min(int(self.input_ids.shape[0]), PREFIX_ROWS)}

    def nearest(self, sig: dict[str, Any]) -> tuple[str | None, float | None]:
        """The position whose norm signature is nearest to ``sig``, and the distance."""
        v = signature_vector(sig)
        if v is None:
            return None, None
        best: tuple[str | None, float] = (None, math.inf)
        for label in self.labels:
            w = signature_vector(self.signatures[label])
            if w is not None:
                d = signature_distance(v, w)
                if d < best[1]:
                    best = (label, d)
        if best[0] in self.unplaced:  # nearest to an entry of unknown position: no position to name
            return None, None
        return best[0], (None if best[0] is None else round(best[1], 4))

    def shared_prefix(self, input_ids: Any, usable: int) -> int:
        """How many leading ids (a tensor or ndarray) the record shares with the reference (at most PREFIX_ROWS)."""
        if input_ids is None or self.input_ids is None or not self.prefix:
            return 0
        n = min(usable, int(self.input_ids.shape[0]), PREFIX_ROWS)
        diff = np.argwhere(as_array(input_ids)[:n] != as_array(self.input_ids)[:n])
        return n if diff.size == 0 else int(diff[0, 0])

    def _stack(self) -> np.ndarray:
        """All prefix rows as one float32 [P, K, H] array, built once per process."""
        cached = self.__dict__.get("_stacked")
        if cached is None:
            cached = np.stack([f32(as_array(self.prefix[label])) for label in self.prefix])
            self.__dict__["_stacked"] = cached
        return cached

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_stacked"}

    def place(self, rows: Any) -> dict[str, Any]:
        """Place slot rows [K, H] (the shared opening tokens, first one included) among the reference positions."""
        y = f32(as_array(rows)[1:])
        k = int(y.shape[0])
        with np.errstate(over="ignore", invalid="ignore"):
            ok = np.isfinite(y).all(-1) & (np.abs(y).sum(-1) > 0)
        if int(ok.sum()) < MIN_PREFIX:
            return {"position": None, "score": None, "margin": None, "confident": False, "tokens": int(ok.sum())}
        x = self._stack()[:, 1:k + 1]
        cos = _cosine(y[ok][None], x[:, ok])  # [P, tokens]
        mean = cos.astype(np.float64).mean(-1)
        labels = list(self.prefix)
        order = sorted(range(len(mean)), key=lambda j: (not math.isnan(mean[j]), -mean[j]))  # NaN first, as torch sorts
        best = order[0]
        score = float(mean[best])
        margin = score - float(mean[order[1]]) if len(order) > 1 else 1.0
        if not math.isfinite(score):
            return {"position": None, "score": None, "margin": None, "confident": False, "tokens": int(ok.sum())}
        confident = score >= MIN_SCORE and margin >= MIN_MARGIN
        if labels[best] in self.unplaced:  # a copy of an entry whose position is unknown: no position, no "best"
            return {"position": None, "score": round(score, 6), "margin": round(margin, 6), "confident": False,
                    "tokens": int(ok.sum()), "nearest_entry": labels[best]}
        return {"position": labels[best], "score": round(score, 6), "margin": round(margin, 6),
                "confident": bool(confident), "tokens": int(ok.sum())}

    def annotate(self, line: dict[str, Any], slots: list[Any], record: Any, real: Any) -> None:
        """Add, per slot of a results line, the nearest position by norms and the prefix placement."""
        usable = int(record.num_tokens) - int(line["padding"] or 0)
        shared = self.shared_prefix(record.input_ids, usable)
        line["prefix_tokens"] = shared
        for entry, slot in zip(line["slots"], slots):
            entry["resembles"], entry["resembles_distance"] = self.nearest(entry)
            entry["prefix"] = self.place(slot.data[:shared]) if shared - 1 >= MIN_PREFIX else None


def _cosine(a: np.ndarray, b: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """Cosine along the last axis of float32 arrays, each side divided by its norm first (as torch computes it)."""
    with np.errstate(over="ignore", invalid="ignore"):
        na = np.maximum(np.sqrt(np.einsum("...h,...h->...", a, a)), np.float32(eps))[..., None]
        nb = np.maximum(np.sqrt(np.einsum("...h,...h->...", b, b)), np.float32(eps))[..., None]
        return ((a / na) * (b / nb)).sum(-1)


def _label(pos: Position) -> str:
    return pos.label


def reference_from_capture(cap: Any) -> Reference:
    """Build the scan reference from a loaded ``capture.Capture`` (reads each position once).

    Each entry is named by what its content says, not by its label alone (``evidence.labels.check_labels``, as
    ``align`` does): an entry read as post-norm by the convention that holds a massive-activation row is the raw
    state (an engine sweep's last entry), and an entry whose position content cannot give (a short list's index,
    a p0 that is not the embedding) is named ``entry K (position unknown)``: a slot matching it is not placed."""
    from ..evidence.labels import check_labels
    from ..evidence.norms import token_norms

    arrays: dict[Position, np.ndarray] = {}
    norms: dict[Position, np.ndarray] = {}
    for pos in cap.positions:
        x = as_array(cap.read(pos))
        arrays[pos] = x
        norms[pos] = token_norms(x)
    ids_all = None if cap.input_ids is None else as_array(cap.input_ids)
    layers = cap.num_layers if cap.num_layers is not None else max((p.p for p in cap.positions), default=0)
    check = check_labels(list(cap.positions), norms, getattr(cap, "label_kind", "sweep"), cap.convention,
                         int(layers), lambda pos: arrays[pos], ids_all, [])
    labels: list[str] = []
    sigs: dict[str, dict[str, Any]] = {}
    prefix: dict[str, np.ndarray] = {}
    unplaced: list[str] = []
    for pos in cap.positions:
        x = arrays.pop(pos)
        named = check.relabel.get(pos, pos)
        label = f"entry {pos.p} (position unknown)" if named in check.unknown else _label(named)
        if named in check.unknown:
            unplaced.append(label)
        labels.append(label)
        real = np.isfinite(x).all(-1) & (x != 0).any(-1)
        sigs[label] = slot_signature(x, real)
        prefix[label] = x[:PREFIX_ROWS].astype(BF16)  # a copy: the reference outlives the capture's memory
    ids = None if ids_all is None else ids_all[:PREFIX_ROWS].astype(np.int64)
    return Reference(cap.path, cap.hidden_size, cap.num_layers, labels, sigs, ids, prefix, unplaced=unplaced,
                     notes=[msg for _, msg in check.notes])


def load_reference(path: str | Path, *, convention: str = "hf", num_layers: int | None = None,
                   allow_unsafe: bool = False) -> Reference:
    """Open a capture sweep (file or directory) as a scan reference."""
    from ..io.capture import load_capture

    p = Path(path)
    if not p.exists():
        raise ForensicsError("no such reference capture", path=p)
    cap = load_capture(p, convention=convention, num_layers=num_layers, allow_unsafe=allow_unsafe)
    return reference_from_capture(cap)
