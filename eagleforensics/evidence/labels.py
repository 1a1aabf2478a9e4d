"""Content over labels: where a capture's own content contradicts what its labels say, the labels stop counting.

A capture's positions come from labels: the convention (HF's last entry is post-norm), a list
index, the number in a key. Content can check three of them without any weights:

* **post-norm signature**: a residual-stream state past the first layers carries a
  massive-activation row (the first token's norm is tens to hundreds of times the median), which
  a normalised state cannot hold; a normalised state's per-token norms are nearly flat. A column
  labelled post-norm that holds a massive row is raw; a column labelled raw at the top whose norms
  are flat while every other raw column of the same rows holds the massive row is post-norm;
* **embedding signature**: the embedding output is a lookup, so rows of equal token ids are
  identical; past layer 0 attention mixes in the context and they differ. A column labelled p0
  whose repeated ids give different rows, or that holds a massive-activation row (which decoder
  layers write, not the lookup), is not the embedding, and then the capture's integers are not
  positions at all (an engine's layer ids read as HF positions, typically);
* **list indices**: a list too short to be a full ``output_hidden_states`` tuple carries no
  positions at all (``io.capture`` marks it ``list-index``).

Where content decides, the column is relabelled (``relabel``) and the caller rescores; where it
does not, the column's position is unknown (``unknown``): a slot matching it gets no confident
position (identity ``position-unknown``). In a partial capture a p0 label counts only when the
embedding signature confirms it, so an ``embedding-included`` finding never rests on a label alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..arrays import as_array, f32
from ..positions import Position
from .norms import gain_kind

MASSIVE_RATIO = 10.0  # a row this many times the median per-token norm: a massive activation (raw stream)
FLAT_RATIO = 2.0  # a post-norm state: no row more than this many times the median ...
FLAT_CV = 0.15  # ... and per-token norms this flat (tiny models' post-norm finals: 0.06-0.12; raw: 5)
SAME_ROW = 1e-6  # relative distance below which two rows are one state (a lookup gives 0)
OTHER_ROW = 1e-3  # relative distance above which two rows are different states
MIN_STEP = 2  # raw columns from this position on carry the massive row in the residual stream


@dataclass(frozen=True)
class LabelCheck:
    """What content says about the capture's labels.

    ``relabel``: stored label -> position by content (rescore with it); ``unknown``: columns whose
    labels do not count and whose content does not decide; ``notes``: (finding code, message).
    """

    relabel: dict[Position, Position] = field(default_factory=dict)
    unknown: frozenset[Position] = frozenset()
    notes: tuple[tuple[str, str], ...] = ()
    confirmed_embedding: bool = False


def norm_kind(norms: Any) -> str:
    """``raw`` (a massive-activation row), ``post-norm`` (flat per-token norms) or ``""`` (cannot tell)."""
    n = np.asarray(as_array(norms), dtype=np.float64)
    n = n[np.isfinite(n) & (n > 0)]
    if n.size < 4:
        return ""
    med = float(np.median(n))
    ratio = float(n.max()) / med
    if ratio >= MASSIVE_RATIO:
        return "raw"
    cv = float(n.std(ddof=1) / n.mean())
    if ratio <= FLAT_RATIO and cv <= FLAT_CV:
        return "post-norm"
    return ""


def massive_ratio(norms: Any) -> float:
    """Largest per-token norm over the median one (NaN when fewer than 4 finite rows)."""
    n = np.asarray(as_array(norms), dtype=np.float64)
    n = n[np.isfinite(n) & (n > 0)]
    return float(n.max() / np.median(n)) if n.size >= 4 else float("nan")


def embedding_signature(rows: Any, ids: Any | None) -> tuple[bool | None, str]:
    """Whether rows of equal ids are identical, as an embedding lookup's are: (True / False / None, why).

    None when no id repeats (nothing to test). Without ids, byte-identical rows count as a weak
    True (a repeated token), and their absence as None.
    """
    x = f32(as_array(rows))
    if ids is None:
        if x.shape[0] < 2:
            return None, "no token ids and fewer than 2 rows"
        flat = np.ascontiguousarray(as_array(rows)).reshape(x.shape[0], -1)
        _, first, counts = np.unique(flat.view(np.dtype((np.void, flat.dtype.itemsize * flat.shape[1]))).ravel(),
                                     return_index=True, return_counts=True)
        if (counts > 1).any():
            return True, f"{int((counts > 1).sum())} rows repeat byte for byte (no token ids to say they are one token)"
        return None, "no token ids, and no row repeats"
    ids = np.asarray(as_array(ids)).reshape(-1)[: x.shape[0]]
    # a row with NaN/Inf says nothing about its token (the capture's non-finite finding names it); in
    # float64 a garbage row of huge finite values keeps a finite norm (in float32 it overflowed to Inf,
    # the pair was lost as NaN, and numpy's warnings reached the console)
    finite = np.isfinite(x[: ids.size]).all(axis=1)
    same = differ = 0
    example = ""
    for tok in np.unique(ids):
        where = np.flatnonzero((ids == tok) & finite)
        if where.size < 2:
            continue
        a = x[where[0]].astype(np.float64)
        na = float(np.linalg.norm(a)) or 1e-30
        for r in where[1:]:
            d = float(np.linalg.norm(x[r].astype(np.float64) - a)) / na
            if d <= SAME_ROW:
                same += 1
            elif d >= OTHER_ROW:
                differ += 1
                if not example:
                    example = f"token {int(tok)} at rows {int(where[0])} and {int(r)} differs by {d:.1e}"
    if differ:
        return False, f"rows of equal token ids differ ({example})"
    if same:
        return True, f"rows of equal token ids are identical ({same} repeated {'token' if same == 1 else 'tokens'})"
    return None, "no token id repeats in the compared rows, so identical rows cannot be tested"


def check_labels(positions: list[Position], column_norms: dict[Position, np.ndarray], label_kind: str,
                 convention: str, num_layers: int, read_rows: Callable[[Position], np.ndarray],
                 row_ids: Any | None, best: list[Position | None], gain: Any | None = None) -> LabelCheck:
    """Check every label of a capture against its content (see the module doc).

    ``column_norms``: per-token norms of every stored position; ``read_rows(pos)``: the compared
    rows of a position; ``row_ids``: the token ids of those rows (either side's), or None;
    ``best``: each slot's best column so far (the embedding is tested only when a slot needs it);
    ``gain``: the target's final norm weight, when known (else the final's kind is tested with a fitted gain).
    """
    relabel: dict[Position, Position] = {}
    unknown: set[Position] = set()
    notes: list[tuple[str, str]] = []
    have = set(positions)
    kinds = {p: norm_kind(column_norms[p]) for p in positions if p in column_norms}
    by_gain = final_kinds(positions, kinds, num_layers, read_rows, gain)
    kinds.update({p: k for p, (k, _) in by_gain.items()})
    raw_deep = [p for p in positions if not p.normed and p.p >= MIN_STEP and p in kinds]
    for p in positions:
        kind = kinds.get(p, "")
        if p.normed and kind == "raw":
            target = Position(p.p)
            ratio = massive_ratio(column_norms[p])
            why = by_gain[p][1] if p in by_gain else (f"holds a row {ratio:.0f}x the median per-token norm (a massive "
                                                      "activation), which a normalised state cannot")
            if target in have:
                unknown.add(p)
                notes.append(("labels-not-positions", f"capture entry {p.label} is read as the post-norm final "
                              f"(convention {convention}), but {why}; the raw p{p.p} is stored too, so its position "
                              "is unknown"))
            else:
                relabel[p] = target
                notes.append(("capture-relabelled", f"capture entry {p.label} is read as the post-norm final "
                              f"(convention {convention}), but {why}: it is read as the raw {target.label} (pass "
                              "--capture-convention vllm if the last entry is the raw last layer)"))
        elif not p.normed and kind == "post-norm" and p.p >= MIN_STEP:
            others = [q for q in raw_deep if q != p]
            if p not in by_gain and (not others or any(kinds[q] != "raw" for q in others)):
                continue  # nothing shows that these rows carry a massive row in the raw stream
            target = Position(p.p, normed=True)
            top = max(q.p for q in positions if not q.normed)
            if p.p == top == num_layers and target not in have:
                relabel[p] = target
                why = by_gain[p][1] if p in by_gain else (
                    "its per-token norms are flat like a normalised state's, while every other raw entry of the same "
                    f"rows holds a massive-activation row ({', '.join(q.label for q in others)})")
                notes.append(("capture-relabelled", f"capture entry {p.label} is read as a raw state, but {why}: "
                              f"it is read as the post-norm final {target.label}"))
            else:
                unknown.add(p)
                notes.append(("labels-not-positions", f"capture entry {p.label} is read as a raw state, but its "
                              "per-token norms are flat like a normalised state's while the other raw entries hold "
                              "a massive-activation row: what it holds is unknown, so a slot matching it is not "
                              "placed"))
    raw = sorted(p for p in positions if not p.normed)
    full = [p.p for p in raw] == list(range(num_layers + 1))
    if Position(0) in have and kinds.get(Position(0)) == "raw" and label_kind != "list-index":
        unknown |= set(positions)
        notes.append(("labels-not-positions", "capture entry p0 is not the embedding output: it holds a row "
                      f"{massive_ratio(column_norms[Position(0)]):.0f}x the median per-token norm, a massive "
                      "activation that decoder layers write and an embedding lookup does not. So the capture's "
                      "integers are not HF positions (an engine's layer ids or list indices?), and no entry's "
                      "position is known: pass --capture-convention"))
        return LabelCheck({}, frozenset(unknown), tuple(notes))
    if label_kind == "list-index":
        unknown |= {p for p in positions if p not in relabel}
        return _embedding_for_list(positions, read_rows, row_ids, relabel, unknown, notes)
    if Position(0) in have and Position(0) in best and Position(0) not in unknown:
        sig, why = embedding_signature(read_rows(Position(0)), row_ids)
        if sig and _has_power(positions, read_rows, row_ids):
            return LabelCheck(relabel, frozenset(relabel.get(p, p) for p in unknown), tuple(notes), True)
        if sig is False:
            unknown |= set(positions)
            notes.append(("labels-not-positions", f"capture entry p0 is not the embedding output: {why}. So the "
                          "capture's integers are not HF positions (an engine's layer ids, which capture p = k+1 in "
                          "SGLang and TensorRT-LLM?), and no entry's position is known: pass --capture-convention"))
        elif not full:
            unknown.add(Position(0))
            notes.append(("embedding-unconfirmed", "capture entry p0 is labelled the embedding output, but this "
                          f"partial capture's content cannot confirm it ({why if sig is None else 'every entry has identical rows for equal ids'}): "
                          "a slot matching it is not placed there, and no embedding-included finding rests on the "
                          "label alone. Capture the full sweep, or a prompt that repeats a token"))
    return LabelCheck(relabel, frozenset(relabel.get(p, p) for p in unknown), tuple(notes))


def final_kinds(positions: list[Position], kinds: dict[Position, str], num_layers: int,
                read_rows: Callable[[Position], np.ndarray], gain: Any | None) -> dict[Position, tuple[str, str]]:
    """The kind (raw or post-norm) of the capture's final entries by the RMS-after-gain test, where it decides:
    every entry labelled post-norm, and the raw-labelled last layer. A massive row already says raw (no gain
    needed); otherwise this test overrides the norm-flatness guess, which random norm gains blur."""
    top = max((p.p for p in positions if not p.normed), default=None)
    out: dict[Position, tuple[str, str]] = {}
    for p in positions:
        if p not in kinds or kinds[p] == "raw" or not (p.normed or p.p == top == num_layers):
            continue
        kind, why = gain_kind(read_rows(p), gain)
        if kind:
            out[p] = (kind, why)
    return out


def _has_power(positions: list[Position], read_rows: Callable[[Position], np.ndarray], row_ids: Any | None) -> bool:
    """True when some other raw column lacks the embedding signature (so the test can tell)."""
    for q in positions:
        if q.normed or q.p == 0:
            continue
        sig, _ = embedding_signature(read_rows(q), row_ids)
        return sig is False
    return False


def _embedding_for_list(positions: list[Position], read_rows: Callable[[Position], np.ndarray], row_ids: Any | None,
                        relabel: dict[Position, Position], unknown: set[Position],
                        notes: list[tuple[str, str]]) -> LabelCheck:
    """A short list's entries have no positions; one holding the embedding signature (entry 0) is p0."""
    sigs = {p: embedding_signature(read_rows(p), row_ids) for p in positions if not p.normed}
    yes = [p for p, (s, _) in sigs.items() if s]
    no = [p for p, (s, _) in sigs.items() if s is False]
    confirmed = False
    if len(yes) == 1 and no and yes[0] == Position(0):
        unknown.discard(Position(0))
        confirmed = True
        notes.append(("capture-relabelled", f"capture entry 0 of the list holds the embedding signature "
                      f"({sigs[Position(0)][1]}) while the others do not: it is the embedding output p0"))
    left = sorted(unknown)
    if left:
        notes.append(("labels-not-positions", f"capture list entries {', '.join(str(p.p) for p in left)} have "
                      "no position: a list this short is not an HF output_hidden_states tuple (an engine's aux states "
                      "before the concatenation?), so a slot matching one of them is a copy of that entry at an "
                      "unknown position, and no embedding-included finding can come from an index"))
    return LabelCheck(relabel, frozenset(relabel.get(p, p) for p in unknown), tuple(notes), confirmed)
