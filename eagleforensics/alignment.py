"""Align one training record with one capture sweep: the pipeline that fills the result records.

``align`` loads both sides (or takes loaded ones), pairs tokens, scores every slot against
every position reading each position once, chooses with dtype-aware confidence, checks
the token pairing by content when the ids cannot vouch for it, derives findings and the
id list each engine needs. ``AlignmentResult`` renders to a dict/JSON, text and plots.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .engines import rules
from .engines.advice import engine_advice, serving_advice
from .engines.crosscheck import check_request, crosscheck, serving_audit
from .errors import ForensicsError
from .evidence.confidence import MIN_TOKENS, Choice, Thresholds, choose, thresholds
from .evidence.findings import slot_findings
from .evidence.match import ScoreMatrix, score_slots
from .evidence.norms import looks_post_norm, norm_cv, token_norms
from .evidence.tokens import (
    TokenAlignment,
    align_tokens,
    detect_shift,
    trailing_padding,
)
from .io.capture import Capture, load_capture
from .io.training import Slot, TrainingRecord, load_training
from .positions import Position
from .results import AlignmentResult, Finding, SlotMatch

SHIFT_MIN_CORR = 0.9
SHIFT_MIN_GAIN = 0.05


def _shifted(tok: TokenAlignment, d: int, usable: int, cap_len: int, c: float, c0: float) -> TokenAlignment:
    """A pairing where training row t meets capture row t+d."""
    ts, cs = (0, d) if d >= 0 else (-d, 0)
    length = max(0, min(usable - ts, cap_len - cs))
    note = (f"content says training row t pairs with capture row t{d:+d} (norm-profile correlation {c:.3f} "
            f"vs {c0:.3f} unshifted)")
    return replace(tok, train_start=ts, capture_start=cs, length=length, method="content-shift", note=note)


def _choices(sm: ScoreMatrix, n_slots: int, bar: Thresholds) -> list[Choice]:
    if sm.error is not None:  # estimates from a fingerprint: confident only clear of their error
        from .evidence.fpmatch import choose_estimated

        return [choose_estimated(sm.score[i], sm.norm_ratio[i], sm.columns,
                                 float(np.nanmax(sm.tokens_used[i]) if sm.tokens_used.size else 0), bar, sm.error[i])
                for i in range(n_slots)]
    return [choose(sm.score[i], sm.norm_ratio[i], sm.columns,
                   float(np.nanmax(sm.tokens_used[i]) if sm.tokens_used.size else 0), bar)
            for i in range(n_slots)]


def align(
    train: str | Path | TrainingRecord, capture: str | Path | Capture, *, fmt: str | None = None,
    convention: str = "hf", num_layers: int | None = None, max_tokens: int | None = None,
    allow_unsafe: bool = False, progress: Callable[[Position], None] | None = None,
    min_score: float | None = None, min_margin: float | None = None,
    draft_config: str | Path | None = None, engine: str | None = None, engine_version: str | None = None,
    model_type: str | None = None, device: str = "cpu",
) -> AlignmentResult:
    """Place every slot of a training record in the residual stream of a capture sweep.

    With ``engine`` (and optionally ``draft_config``), also check what that engine will capture
    for the drafter against what the record holds (``crosscheck``; no config = engine default).
    ``device`` (cpu, cuda, auto) is where the per-position reduction runs (see ``match``).
    """
    check_request(draft_config, engine, engine_version, model_type)
    record = train if isinstance(train, TrainingRecord) else load_training(train, fmt=fmt, allow_unsafe=allow_unsafe)
    from .evidence.fingerprint import Fingerprint, is_fingerprint, load_fingerprint

    if isinstance(capture, (Capture, Fingerprint)):
        cap = capture
    elif is_fingerprint(capture):  # a fingerprint instead of the sweep: scores become estimates (fpmatch)
        cap = load_fingerprint(capture)
    else:
        cap = load_capture(capture, convention=convention, num_layers=num_layers, allow_unsafe=allow_unsafe)
    if num_layers is not None:
        cap.num_layers, cap.num_layers_source = num_layers, "given"
    if max_tokens is not None and max_tokens < 1:
        raise ForensicsError(f"max_tokens must be at least 1, got {max_tokens}")
    audit = None if engine is None else serving_audit(
        draft_config, engine, cap.num_layers, engine_version=engine_version, model_type=model_type)
    slots = record.slots(cap.hidden_size)
    padding = trailing_padding(record.input_ids, record.loss_mask)
    tok = align_tokens(record.input_ids, record.num_tokens, padding, cap.input_ids, cap.num_tokens)
    usable = record.num_tokens - padding
    if usable <= 0:
        raise ForensicsError("zero tokens left after dropping trailing padding", path=record.path)
    if max_tokens is not None and tok.length > max_tokens:
        tok = replace(tok, length=max_tokens, note=tok.note + f"; limited to the first {max_tokens}")
    if tok.length == 0:
        raise ForensicsError(f"zero tokens can be paired with the capture {cap.path}: {tok.note} (if one side has an "
                             "extra BOS or template token, drop it so both start at the same token)", path=record.path)
    slot_rows = [s.data[:usable] for s in slots]
    norms = [token_norms(r) for r in slot_rows]
    fit = [s.role in ("final", "unknown") or looks_post_norm(n) for s, n in zip(slots, norms)]
    thr = thresholds(cap.dtype, *(s.data.dtype for s in slots), min_score=min_score, min_margin=min_margin)

    def run(t: TokenAlignment) -> ScoreMatrix:
        if isinstance(cap, Fingerprint):
            from .evidence.fpmatch import score_fingerprint

            return score_fingerprint([s.data for s in slots], fit, cap, t.train_start, t.capture_start, t.length)
        return score_slots([s.data for s in slots], fit, cap.positions, cap,
                           t.train_start, t.capture_start, t.length, progress, device=device)

    sm = run(tok)
    picks = _choices(sm, len(slots), thr)
    if not any(c.confident for c in picks) and (tok.method == "position" or tok.length >= 2 * MIN_TOKENS):
        tok, sm, picks = _try_shift(tok, sm, picks, slots, norms, usable, cap, thr, run)
    matches = [_slot_match(s, c, sm, i, n, fit[i] and looks_post_norm(n))
               for i, (s, c, n) in enumerate(zip(slots, picks, norms))]
    matches = [_resolve_role(m, cap.num_layers) for m in matches]
    findings = _token_findings(tok, record, sm, slots) + slot_findings(matches, cap.num_layers)
    findings += _row_findings(matches, sm, tok, thr)
    engine_ids, engine_notes, more = _engine_ids(matches, cap.num_layers)
    findings += more
    if isinstance(cap, Fingerprint):
        from .evidence.fpmatch import estimate_finding

        findings.append(estimate_finding(cap, sm))
    result = AlignmentResult(
        record.path, record.format, cap.path, cap.convention, cap.num_layers, cap.num_layers_source,
        cap.hidden_size, tok, matches, sm, [n.numpy() for n in norms], engine_ids, engine_notes, findings, thr,
        dict(record.metadata),
    )
    aux = [m.position for m in matches if m.role == "aux"]
    trained = aux if aux and all(q is not None and not q.normed for q in aux) else None
    if audit is None:
        return replace(result, advice=engine_advice(engine_ids, engine_notes, trained, cap.num_layers))
    check = crosscheck(result, audit)
    return replace(result, serving=check, findings=findings + check.findings, advice=serving_advice(check))


def _try_shift(tok: TokenAlignment, sm: ScoreMatrix, picks: list[Choice], slots: list[Slot], norms: list[torch.Tensor],
               usable: int, cap: Capture, thr: Thresholds, run: Callable[[TokenAlignment], ScoreMatrix]
               ) -> tuple[TokenAlignment, ScoreMatrix, list[Choice]]:
    """When nothing matched, test whether the rows are offset by a few tokens; rescore if so."""
    cols = [torch.from_numpy(v) for p, v in sm.column_norms.items() if not p.normed]
    # every slot votes; a post-norm slot's flat norm profile simply correlates poorly
    d, c, c0 = max((detect_shift(n, cols) for n in norms), key=lambda t: t[1] if t[1] == t[1] else -2.0)
    if d == 0 or not c >= SHIFT_MIN_CORR or (c0 == c0 and c - c0 < SHIFT_MIN_GAIN):
        return tok, sm, picks
    shifted = _shifted(tok, d, usable, cap.num_tokens, c, c0)
    sm2 = run(shifted)
    picks2 = _choices(sm2, len(slots), thr)
    if sum(p.confident for p in picks2) > 0:
        return shifted, sm2, picks2
    return tok, sm, picks


def _slot_match(s: Slot, c: Choice, sm: ScoreMatrix, i: int, norms: torch.Tensor, post: bool) -> SlotMatch:
    j = sm.columns.index(c.best) if c.best is not None else None
    get = (lambda a: float(a[i, j])) if j is not None else (lambda a: float("nan"))
    bad = int((~torch.isfinite(s.data.abs().amax(-1))).sum())  # NaN/Inf rows; amax is ~10x faster than isfinite().all()
    return SlotMatch(s.key, s.index, s.role, str(s.data.dtype).replace("torch.", ""), c.best, c.score, c.runner_up,
                     c.margin, c.confident, c.reason, get(sm.rel_diff), get(sm.max_abs), get(sm.norm_ratio),
                     int(get(sm.tokens_used)) if j is not None else 0, norm_cv(norms), post, bad)


def _resolve_role(m: SlotMatch, n: int) -> SlotMatch:
    """A slot of unknown role is the final state if it sits at p=N or post-norm, else an aux slot."""
    if m.role != "unknown":
        return m
    if m.confident and m.best is not None and (m.best.normed or m.best.p == n):
        return replace(m, role="final")
    return replace(m, role="aux")


def _token_findings(tok: TokenAlignment, record: TrainingRecord, sm: ScoreMatrix, slots: list[Slot]) -> list[Finding]:
    out = [Finding("tokens-compared", "info",
                   f"compared {tok.length} tokens (training has {tok.train_tokens}, capture {tok.capture_tokens}"
                   f"{f', {tok.padding_dropped} trailing padding rows dropped' if tok.padding_dropped else ''}): {tok.note}")]
    if tok.method == "ids-prefix" and tok.length < MIN_TOKENS:
        out.append(Finding("token-mismatch", "error",
                           f"training and capture token ids share only {tok.length} leading tokens: they are "
                           "not the same prompt, so no slot can be placed. Capture the record's own prompt."))
    if tok.method == "content-shift":
        both = record.input_ids is not None
        out.append(Finding("token-misalignment", "error" if both else "warning",
                           f"hidden-state rows are offset from the capture: {tok.note}. "
                           + ("The token ids agree, so the record's hidden states are misaligned with its own "
                              "input_ids: the drafter learned each token from a neighbour's state."
                              if both else "Check the dumper's token handling (BOS, chat template).")))
    bad_slots = {s.key if s.index is None else f"{s.key}[{s.index}]":
                 (~torch.isfinite(s.data.abs().amax(-1))).nonzero().flatten().tolist() for s in slots}
    bad_slots = {k: v for k, v in bad_slots.items() if v}
    if bad_slots:
        out.append(Finding("nonfinite-training", "warning",
                           "NaN/Inf in training rows (those tokens are skipped in matching): "
                           + "; ".join(f"{k}: {_rows_at(v)}" for k, v in bad_slots.items())))
    bad_cols = {p: v for p, v in sm.nonfinite_capture.items() if v}
    if bad_cols:
        where = {p: np.flatnonzero(~np.isfinite(sm.column_norms[p])).tolist() if p in sm.column_norms else []
                 for p in bad_cols}
        out.append(Finding("nonfinite-capture", "warning",
                           "NaN/Inf in capture rows (those tokens are skipped in matching): "
                           + "; ".join(f"{p.label}: {_rows_at(where[p]) if len(where[p]) == v else f'{v} rows'}"
                                       for p, v in bad_cols.items())))
    return out


def _row_findings(matches: list[SlotMatch], sm: ScoreMatrix, tok: TokenAlignment, bar: Thresholds) -> list[Finding]:
    """Rows of a placed slot that do not match its position: the slot is right, those rows are damaged."""
    out = []
    for i, m in enumerate(matches):
        if not m.confident or m.best not in sm.columns:
            continue
        per = sm.per_token[i, sm.columns.index(m.best)]
        low = np.flatnonzero(np.isfinite(per) & (per < bar.min_score))
        if low.size:
            rows = [int(tok.train_start + j) for j in low]
            out.append(Finding("rows-differ", "warning",
                               f"{m.name} is placed at {m.best.label}, but {len(rows)} of its {m.tokens} compared rows "
                               f"{'differs' if len(rows) == 1 else 'differ'} from it beyond {m.dtype} precision "
                               f"({_rows_at(rows)}; per-token score down to {float(per[low].min()):.4f} < "
                               f"{bar.min_score}): those rows are corrupted or were written from another state"))
    return out


def _rows_at(rows: list[int], show: int = 8) -> str:
    """``row 5`` or ``3 rows: 5, 9, 12``: how many rows and which (the first few and the last)."""
    if len(rows) == 1:
        return f"row {rows[0]}"
    more = f", ... {rows[-1]}" if len(rows) > show else ""
    return f"{len(rows)} rows: {', '.join(map(str, rows[:show]))}{more}"


def _engine_ids(matches: list[SlotMatch], n: int) -> tuple[dict[str, list[int] | None], dict[str, list[str]], list[Finding]]:
    """The id list each engine target needs to capture exactly the aux positions, or why none works."""
    aux = [m for m in matches if m.role == "aux"]
    ids: dict[str, list[int] | None] = {}
    notes: dict[str, list[str]] = {}
    findings: list[Finding] = []
    if not aux:
        return ids, notes, findings
    if any(m.position is None or m.position.normed for m in aux):
        reason = "not every aux slot has a confident raw-position match"
        for t in rules.ENGINE_TARGETS:
            ids[t.label], notes[t.label] = None, [reason]
        return ids, notes, findings
    wanted = [m.position.p for m in aux if m.position is not None]
    for t in rules.ENGINE_TARGETS:
        plan = rules.ids_for_positions(t, wanted, n)
        ids[t.label], notes[t.label] = plan.ids, list(plan.reasons)
        if plan.ids is None:
            findings.append(Finding("engine-cannot-serve", "warning",
                                    f"{t.label}: no id list captures p={wanted}: {'; '.join(plan.reasons)}"))
    return ids, notes, findings
