"""Align one training record with one capture sweep: the pipeline that fills the result records.

``align`` loads both sides (or takes loaded ones), pairs tokens, scores every slot against
every position reading each position once, judges each slot's identity and fidelity from the
capture itself (``evidence.identity``; fingerprints keep the dtype bars), checks the token
pairing by content when the ids cannot vouch for it, derives findings, the id list and the
snippet each engine needs. ``AlignmentResult`` renders to a dict/JSON, text and plots.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .arrays import as_array, dtype_name
from .engines import rules
from .engines.advice import engine_advice, serving_advice
from .engines.crosscheck import check_request, crosscheck, serving_audit
from .errors import ForensicsError, printable
from .evidence.confidence import MIN_TOKENS, Choice, Thresholds, choose, thresholds
from .evidence.findings import identity_findings, slot_findings, token_evidence_findings
from .evidence.fused import preload
from .evidence.identity import Identity, judge, step_reader, unverified_rows
from .evidence.labels import LabelCheck, check_labels, massive_ratio, norm_kind
from .evidence.match import ScoreMatrix, score_slots
from .evidence.norms import looks_post_norm, norm_cv, row_summaries
from .evidence.steps import known_first
from .evidence.tokens import (
    TokenAlignment,
    align_tokens,
    candidate_offsets,
    distinct_pairs,
    trailing_padding,
)
from .io.capture import Capture, load_capture
from .io.guards import stored_bytes
from .io.training import Slot, TrainingRecord, load_training
from .positions import Position
from .results import AlignmentResult, Finding, SlotMatch

SHIFT_MIN_CORR = 0.5  # a candidate row offset's norm-profile correlation must reach this to be scored
MAX_SHIFT = 1024  # row offsets tried by content when the ids cannot pair the rows
OFFSET_CANDIDATES = 3  # offsets besides the current pairing scored by content on the aux slots


def _shifted(tok: TokenAlignment, d: int, usable: int, cap_len: int, c: float, c0: float) -> TokenAlignment:
    """A pairing where training row t meets capture row t+d."""
    ts, cs = (0, d) if d >= 0 else (-d, 0)
    length = max(0, min(usable - ts, cap_len - cs))
    note = (f"content says training row t pairs with capture row t{d:+d} (norm-profile correlation {c:.3f} "
            f"vs {c0:.3f} unshifted)")
    return replace(tok, train_start=ts, capture_start=cs, length=length, method="content-shift", note=note)


def _choices(sm: ScoreMatrix, n_slots: int, bar: Thresholds, cap: Capture | None = None, tok: TokenAlignment | None = None,
             bad_rows: list[int] | None = None, unknown: frozenset[Position] = frozenset(),
             slot_norms: list[np.ndarray] | None = None) -> tuple[list[Choice], list[Identity | None]]:
    """Each slot's choice; identity (evidence.identity) decides it when the capture's rows can be read."""
    if sm.error is not None:  # estimates from a fingerprint: confident only clear of their error
        from .evidence.fpmatch import choose_estimated

        return [choose_estimated(sm.score[i], sm.norm_ratio[i], sm.columns,
                                 float(np.nanmax(sm.tokens_used[i]) if sm.tokens_used.size else 0), bar, sm.error[i])
                for i in range(n_slots)], [None] * n_slots
    if cap is None or tok is None:
        return [choose(sm.score[i], sm.norm_ratio[i], sm.columns,
                       float(np.nanmax(sm.tokens_used[i]) if sm.tokens_used.size else 0), bar)
                for i in range(n_slots)], [None] * n_slots
    real = set(sm.column_norms)
    damaged = frozenset(p for p, rows in sm.nonfinite_capture.items() if rows)
    step_of = known_first(sm.steps, step_reader(cap.read_rows, tok.capture_start, tok.length))
    picks, ids = [], []
    for i in range(n_slots):
        tokens = int(np.nanmax(sm.tokens_used[i])) if sm.tokens_used.size else 0
        ident = judge(sm.per_token[i], sm.columns, real, sm.norm_ratio[i], tokens, bar.min_tokens, bar.copy_gap,
                      bar.norm_tol, int(cap.num_layers), step_of, alpha=bar.paired_alpha,
                      step_ratio=bar.step_ratio, min_votes=bar.min_votes,
                      extra_bad=(bad_rows or [0] * n_slots)[i], unknown=unknown,
                      distinct=None if slot_norms is None else _distinct(sm, tok, slot_norms[i]), damaged=damaged)
        picks.append(_as_choice(ident, sm, i))
        ids.append(ident)
    return picks, ids


def _distinct(sm: ScoreMatrix, tok: TokenAlignment, slot_norms: np.ndarray):
    """``distinct(pos)`` for ``judge``: which compared tokens are distinct (slot row, capture row) pairs
    against column ``pos`` (a fitted column by its raw position's rows)."""
    y = slot_norms[tok.train_start:tok.train_start + tok.length]

    def distinct(pos: Position) -> np.ndarray | None:
        col = sm.column_norms.get(pos, sm.column_norms.get(Position(pos.p)))
        if col is None:
            return None
        x = col[tok.capture_start:tok.capture_start + tok.length]
        if x.shape[0] != y.shape[0] or x.shape[0] != sm.per_token.shape[-1]:
            return None
        return distinct_pairs(y, x)

    return distinct


def _as_choice(ident: Identity, sm: ScoreMatrix, i: int) -> Choice:
    """The identity answer in the older Choice form (mean scores and their margin, as before)."""
    def mean(pos: Position | None) -> float:
        return float(sm.score[i, sm.columns.index(pos)]) if pos is not None else float("nan")

    runner = ident.other if ident.other in sm.columns else None
    margin = mean(ident.best) - mean(runner) if runner is not None else float("nan")
    return Choice(ident.best, mean(ident.best), runner, mean(runner), margin, ident.confident, ident.reason)


def align(
    train: str | Path | TrainingRecord, capture: str | Path | Capture, *, fmt: str | None = None,
    convention: str = "hf", num_layers: int | None = None, max_tokens: int | None = None,
    allow_unsafe: bool = False, progress: Callable[[Position], None] | None = None,
    min_score: float | None = None, min_margin: float | None = None,
    draft_config: str | Path | None = None, engine: str | None = None, engine_version: str | None = None,
    model_type: str | None = None, device: str = "cpu", vllm_runner: str | None = None,
    final_norm: Any | None = None,
) -> AlignmentResult:
    """Place every slot of a training record in the residual stream of a capture sweep.

    With ``engine`` (and optionally ``draft_config``), also check what that engine will capture
    for the drafter against what the record holds (``crosscheck``; no config = engine default).
    ``device`` (cpu, cuda, auto) is where the per-position reduction runs (see ``match``).
    ``vllm_runner`` (v1, v2) overrides the model runner vLLM would pick for that version.
    ``final_norm``: the target's final norm weight (its gain); with it the capture's final entry is raw or
    post-norm by its rows' RMS after dividing by the gain, whatever its label says (without it the gain is fitted
    when the compared rows are enough, ``evidence.norms.gain_kind``).
    """
    check_request(draft_config, engine, engine_version, model_type, vllm_runner)
    # a large input's kernels load on another thread while the inputs are read (fused.preload)
    loading = preload(stored_bytes(train) + stored_bytes(capture)) if device == "cpu" else None
    try:
        return _align(train, capture, fmt, convention, num_layers, max_tokens, allow_unsafe, progress, min_score,
                      min_margin, draft_config, engine, engine_version, model_type, device, vllm_runner, final_norm)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (interrupts.Terminated): stop now, the loader is a daemon
        loading = None
        raise
    finally:  # else the loader ends before align returns or raises: no thread outlives the call
        if loading is not None:
            loading.join()


def _align(train: str | Path | TrainingRecord, capture: str | Path | Capture, fmt: str | None, convention: str,
           num_layers: int | None, max_tokens: int | None, allow_unsafe: bool,
           progress: Callable[[Position], None] | None, min_score: float | None, min_margin: float | None,
           draft_config: str | Path | None, engine: str | None, engine_version: str | None,
           model_type: str | None, device: str, vllm_runner: str | None, final_norm: Any | None = None
           ) -> AlignmentResult:
    """``align``'s work, once the kernels are loading."""
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
        draft_config, engine, cap.num_layers, engine_version=engine_version, model_type=model_type,
        vllm_runner=vllm_runner)
    slots = record.slots(cap.hidden_size)
    padding = trailing_padding(record.input_ids, record.loss_mask)
    tok = align_tokens(record.input_ids, record.num_tokens, padding, cap.input_ids, cap.num_tokens, MIN_TOKENS)
    usable = record.num_tokens - padding
    if usable <= 0:
        raise ForensicsError("zero tokens left after dropping trailing padding", path=record.path)
    if max_tokens is not None and tok.length > max_tokens:
        tok = replace(tok, length=max_tokens, note=tok.note + f"; limited to the first {max_tokens}")
    if tok.length == 0:
        raise ForensicsError(f"zero tokens can be paired with the capture {cap.path}: {tok.note}, and they share no "
                             f"run of {MIN_TOKENS} ids anywhere (capture the record's own prompt)", path=record.path)
    slot_data = [as_array(s.data) for s in slots]
    summaries = row_summaries(slot_data)  # per-token norms and NaN/Inf rows, one pass each
    norms = [n[:usable] for n, _ in summaries]
    bad_rows = [int(b.sum()) for _, b in summaries]
    fit = [s.role in ("final", "unknown") or looks_post_norm(n) for s, n in zip(slots, norms)]
    thr = thresholds(cap.dtype, *(d.dtype for d in slot_data), min_score=min_score, min_margin=min_margin)

    def run(t: TokenAlignment) -> ScoreMatrix:
        if isinstance(cap, Fingerprint):
            from .evidence.fpmatch import score_fingerprint

            return score_fingerprint(slot_data, fit, cap, t.train_start, t.capture_start, t.length)
        return score_slots(slot_data, fit, cap.positions, cap,
                           t.train_start, t.capture_start, t.length, progress, device=device)

    labels = LabelCheck()

    def decide(t: TokenAlignment, sm: ScoreMatrix) -> tuple[list[Choice], list[Identity | None]]:
        return _choices(sm, len(slots), thr, None if isinstance(cap, Fingerprint) else cap, t, bad_rows,
                        labels.unknown, norms)

    sm = run(tok)
    picks, idents = decide(tok, sm)
    if isinstance(cap, Capture):  # content over labels (evidence.labels): relabel and rescore, or unknown
        labels = _check_labels(cap, sm, tok, record, picks, final_norm)
        if labels.relabel:
            cap = replace(cap, readers={labels.relabel.get(p, p): r for p, r in cap.readers.items()})
            sm = run(tok)
        if labels.relabel or labels.unknown:
            picks, idents = decide(tok, sm)
    if not any(c.confident and c.best is not None and not c.best.normed for c in picks) and (
            tok.method == "position" or tok.length >= 2 * MIN_TOKENS):
        tok, sm, picks, idents = _try_offsets(tok, sm, picks, idents, slots, norms, usable, cap, decide, run)
    idents = _final_rows_check(tok, idents, slots)
    picks = [_as_choice(d, sm, i) if d is not None else c for i, (c, d) in enumerate(zip(picks, idents))]
    matches = [_slot_match(s, c, sm, i, n, fit[i] and looks_post_norm(n), bad_rows[i], idents[i])
               for i, (s, c, n) in enumerate(zip(slots, picks, norms))]
    matches = [_in_context(_resolve_role(m, cap.num_layers), tok) for m in matches]
    findings = _token_findings(tok, record, sm, slots, [b for _, b in summaries], cap.input_ids)
    findings += [replace(f, message=f"{f.message}; {tok.other_context}: that context alone can keep the states "
                                    "from matching") if f.code == "no-confident-match" and tok.other_context else f
                 for f in slot_findings(matches, cap.num_layers)]
    findings += [Finding(code, "warning", msg) for code, msg in labels.notes]
    findings += identity_findings(matches) + token_evidence_findings(matches, tok) + _capture_findings(cap, sm, slots, labels)
    findings += _row_findings(matches, sm, tok, thr)
    _refuse_swapped(findings, record, cap, slots, sm)
    rule_type = model_type if model_type is not None else (audit.model_type if audit is not None else None)
    engine_ids, engine_notes, more = _engine_ids(matches, cap.num_layers, rule_type, engine, engine_version,
                                                 vllm_runner)
    findings += more
    if isinstance(cap, Fingerprint):
        from .evidence.fpmatch import estimate_finding

        findings.append(estimate_finding(cap, sm))
    result = AlignmentResult(
        record.path, record.format, cap.path, cap.convention, cap.num_layers, cap.num_layers_source,
        cap.hidden_size, tok, matches, sm, norms, engine_ids, engine_notes, findings, thr,
        dict(record.metadata),
    )
    aux = [m.position for m in matches if m.role == "aux"]
    trained = aux if aux and all(q is not None and not q.normed for q in aux) else None
    if audit is None:
        return replace(result, advice=engine_advice(engine_ids, engine_notes, trained, cap.num_layers, rule_type))
    check = crosscheck(result, audit)
    return replace(result, serving=check, findings=findings + check.findings, advice=serving_advice(check))


def _check_labels(cap: Capture, sm: ScoreMatrix, tok: TokenAlignment, record: TrainingRecord,
                  picks: list[Choice], final_norm: Any | None = None) -> LabelCheck:
    """``evidence.labels.check_labels`` on this capture's compared rows (the ids of either side name them)."""
    cs, lw = tok.capture_start, tok.length
    if cap.input_ids is not None:
        row_ids = cap.input_ids[cs:cs + lw]
    elif record.input_ids is not None:
        row_ids = record.input_ids[tok.train_start:tok.train_start + lw]
    else:
        row_ids = None
    stored = [p for p in cap.positions if p in sm.column_norms]
    return check_labels(stored, sm.column_norms, getattr(cap, "label_kind", "sweep"), cap.convention,
                        int(cap.num_layers), lambda pos: cap.read_rows(pos, cs, cs + lw), row_ids,
                        [c.best for c in picks], final_norm)


def _raw_placed(picks: list[Choice]) -> int:
    """Slots placed confidently at a raw position (content that vouches for the row pairing)."""
    return sum(bool(c.confident and c.best is not None and not c.best.normed) for c in picks)


def _try_offsets(tok: TokenAlignment, sm: ScoreMatrix, picks: list[Choice], idents: list[Identity | None],
                 slots: list[Slot], norms: list[np.ndarray], usable: int, cap: Capture,
                 decide: Callable[[TokenAlignment, ScoreMatrix], tuple[list[Choice], list[Identity | None]]],
                 run: Callable[[TokenAlignment], ScoreMatrix]
                 ) -> tuple[TokenAlignment, ScoreMatrix, list[Choice], list[Identity | None]]:
    """When no raw slot is placed, score a few other row offsets by content on the aux slots.

    Candidates are the offsets whose per-token norm profiles correlate best (the first token's
    massive activation marks where a request starts); each is scored, and the offset where the
    aux slots are placed best (most confident raw slots, then the highest robust scores) wins.
    The final state does not vote: post-norm states of different tokens look alike."""
    cols = [v for p, v in sm.column_norms.items() if not p.normed]
    aux = [n for s, n in zip(slots, norms) if s.role != "final"] or list(norms)
    if not cols:
        return tok, sm, picks, idents
    here = tok.offset
    ranked = candidate_offsets(aux, cols, MAX_SHIFT, None)
    cands = [(d, c) for d, c in ranked if d != here and c >= SHIFT_MIN_CORR][:OFFSET_CANDIDATES]
    corr0 = dict(ranked).get(here, float("nan"))
    tried: list[tuple[int, float]] = []

    def merit(p: list[Choice], d: list[Identity | None]) -> tuple[int, float]:
        rob = [x.robust for x, s in zip(d, slots) if x is not None and s.role != "final" and x.robust == x.robust]
        return _raw_placed(p), float(np.mean(rob)) if rob else -1.0

    best = (tok, sm, picks, idents, merit(picks, idents))
    for d, c in cands:
        shifted = _shifted(tok, d, usable, cap.num_tokens, c, corr0)
        if shifted.length < MIN_TOKENS:
            continue
        sm2 = run(shifted)
        p2, i2 = decide(shifted, sm2)
        m = merit(p2, i2)
        tried.append((d, m[1]))
        if m > best[4]:
            best = (shifted, sm2, p2, i2, m)
    tried = [(here, merit(picks, idents)[1])] + tried
    chosen, sm2, p2, i2, m = best
    if chosen is tok or m[0] == 0:
        return replace(tok, candidates=tuple(tried)) if len(tried) > 1 else tok, sm, picks, idents
    return replace(chosen, candidates=tuple(tried)), sm2, p2, i2


def _final_rows_check(tok: TokenAlignment, idents: list[Identity | None], slots: list[Slot]) -> list[Identity | None]:
    """A final (post-norm) slot on rows no ids vouch for and no raw slot confirms is never confident:
    post-norm states of different tokens look alike, and a fitted norm absorbs much of the rest."""
    if tok.vouched or any(d is not None and d.confident and d.best is not None and not d.best.normed for d in idents):
        return idents
    out = []
    for d, s in zip(idents, slots):
        final_like = s.role == "final" or (d is not None and d.best is not None and d.best.normed)
        out.append(unverified_rows(d, tok.method) if d is not None and d.confident and final_like else d)
    return out


def _slot_match(s: Slot, c: Choice, sm: ScoreMatrix, i: int, norms: np.ndarray, post: bool, bad: int,
                ident: Identity | None = None) -> SlotMatch:
    j = sm.columns.index(c.best) if c.best is not None else None
    get = (lambda a: float(a[i, j])) if j is not None else (lambda a: float("nan"))
    m = SlotMatch(s.key, s.index, s.role, dtype_name(s.data.dtype), c.best, c.score, c.runner_up,
                  c.margin, c.confident, c.reason, get(sm.rel_diff), get(sm.max_abs), get(sm.norm_ratio),
                  int(get(sm.tokens_used)) if j is not None else 0, norm_cv(norms), post, bad,
                  fitted=c.best is not None and c.best not in sm.column_norms)
    if ident is None:
        return m
    f = ident.fidelity
    return replace(m, identity=ident.verdict, other=ident.other, robust_score=ident.robust, vote_share=ident.votes,
                   paired_mean=ident.paired_mean, paired_bound=ident.paired_bound, neighbour_step=ident.step,
                   neighbour=ident.step_to, missing_neighbours=ident.missing, fidelity=f.kind,
                   fidelity_cause=f.cause, fidelity_text=f.text, differing_tokens=f.differing,
                   distinct_tokens=ident.distinct, between_fraction=ident.between)


def _in_context(m: SlotMatch, tok: TokenAlignment) -> SlotMatch:
    """Drift of rows that follow other tokens on the two sides is first the context's doing (another system prompt
    or template), not quantised weights or MoE routing, which only a capture of the same tokens could show."""
    why = tok.other_context
    if not why or m.fidelity != "drift" or m.fidelity_cause not in ("routing", "uniform"):
        return m
    return replace(m, fidelity_cause="context",
                   fidelity_text=f"{m.fidelity_text.split(': consistent with')[0]}: {why}; a different context moves "
                                 "every state, so other weights or kernels cannot be judged on these rows (capture "
                                 "the record's own token ids to tell them apart)")


def _resolve_role(m: SlotMatch, n: int) -> SlotMatch:
    """A slot of unknown role is the final state if it sits at p=N or post-norm, else an aux slot."""
    if m.role != "unknown":
        return m
    if m.confident and m.best is not None and (m.best.normed or m.best.p == n):
        return replace(m, role="final")
    return replace(m, role="aux")


def _token_findings(tok: TokenAlignment, record: TrainingRecord, sm: ScoreMatrix, slots: list[Slot],
                    bad_rows: list[np.ndarray], capture_ids: np.ndarray | None = None) -> list[Finding]:
    out = [Finding("tokens-compared", "info",
                   f"compared {tok.length} tokens (training has {tok.train_tokens}, capture {tok.capture_tokens}"
                   f"{f', {tok.padding_dropped} trailing padding rows dropped' if tok.padding_dropped else ''}): {tok.note}")]
    if tok.method == "ids-prefix" and tok.length < MIN_TOKENS:
        out.append(Finding("token-mismatch", "error",
                           f"training and capture token ids share only {tok.length} leading tokens: they are "
                           "not the same prompt, so no slot can be placed. Capture the record's own prompt."))
    if tok.method == "content-shift":
        both = record.input_ids is not None and capture_ids is not None
        out.append(Finding("token-misalignment", "error" if both else "warning",
                           f"hidden-state rows are offset from the capture: {tok.note}. "
                           + ("The token ids agree, so the record's hidden states are misaligned with its own "
                              "input_ids: the drafter learned each token from a neighbour's state."
                              if both else "The capture holds other rows before the record's (another request "
                              "flattened into it, padding, a template or an extra BOS): check the dumper's token "
                              "handling, or store the ids on both sides so rows pair by id.")))
    bad_slots = {s.name: np.flatnonzero(b).tolist() for s, b in zip(slots, bad_rows)}
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


def _capture_findings(cap: Capture, sm: ScoreMatrix, slots: list[Slot], labels: LabelCheck | None = None) -> list[Finding]:
    """How the capture's integers were read, content that contradicts the convention but did not decide
    (``evidence.labels`` relabels or un-positions the entries where it does), swapped arguments."""
    out = [Finding("capture-read-as-labelled", "warning", note) for note in getattr(cap, "notes", [])]
    acted = set(labels.relabel) | set(labels.relabel.values()) | set(labels.unknown) if labels is not None else set()
    normed_real = [p for p in sm.column_norms if p.normed]
    for p in normed_real:
        if p not in acted and norm_kind(sm.column_norms[p]) == "raw":
            out.append(Finding("convention-content", "warning",
                               f"capture entry {p.label} is read as the post-norm final (convention {cap.convention}), "
                               f"but holds a row {massive_ratio(sm.column_norms[p]):.0f}x the median per-token norm like "
                               "a raw state; if it is the raw last layer, use --capture-convention vllm"))
    raw_top = Position(cap.num_layers)
    if not normed_real and raw_top in sm.column_norms and raw_top not in acted and cap.num_layers > 0:
        norms = sm.column_norms[raw_top]
        if norm_kind(norms) == "post-norm":
            out.append(Finding("convention-content", "warning",
                               f"capture entry {raw_top.label} is read as a raw state, but its per-token norms are "
                               f"nearly constant like a post-norm state (coefficient of variation {norm_cv(norms):.2f}, "
                               "and no row of the capture shows the massive activation that would decide it); if it is "
                               "HF's post-norm last entry, use --capture-convention hf"))
    return out + _swapped(sm, slots)


SWEEP_SLOTS, RECORD_SLOTS = 6, 5  # at least this many states: a sweep; at most: a record (3 aux + final + embedding)


def _refuse_swapped(findings: list[Finding], record: Any, cap: Any, slots: list[Slot], sm: ScoreMatrix) -> None:
    """TRAIN holds a sweep and CAPTURE a record's few states: nothing to align, the arguments are swapped (exit 2)."""
    held = len(sm.column_norms)
    if any(f.code == "possibly-swapped" for f in findings) and len(slots) >= SWEEP_SLOTS and held <= RECORD_SLOTS:
        raise ForensicsError(f"TRAIN {printable(record.path)} holds {len(slots)} hidden states (a capture sweep's) and "
                             f"CAPTURE {printable(cap.path)} only {held} (a training record's): the two arguments look "
                             f"swapped; run: eagleforensics align {printable(cap.path)} {printable(record.path)}",
                             path=record.path)  # bad input: the doctor stops there, never a row "not run"


def _swapped(sm: ScoreMatrix, slots: list[Slot]) -> list[Finding]:
    """More slots than the capture has positions: the arguments may be swapped."""
    held = len(sm.column_norms)
    if sm.error is None and len(slots) >= 5 and len(slots) > held:
        return [Finding("possibly-swapped", "warning", f"the training record holds {len(slots)} slots but the capture "
                        f"only {held} positions: did you swap TRAIN and CAPTURE?")]
    return []


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
            context = bool(tok.other_context)  # explained by what precedes the rows: not a damaged record
            out.append(Finding("rows-differ", "info" if context else "warning",
                               f"{m.name} is placed at {m.best.label}, but {len(rows)} of its {m.tokens} compared rows "
                               f"{'differs' if len(rows) == 1 else 'differ'} from it beyond {m.dtype} precision "
                               f"({_rows_at(rows)}; per-token score down to {float(per[low].min()):.4f} < "
                               f"{bar.min_score}): {_row_cause(m, tok)}"))
    return out


def _row_cause(m: SlotMatch, tok: TokenAlignment) -> str:
    """What the pattern of differing rows suggests (evidence.fidelity); a context that differs comes first."""
    if tok.other_context:
        return (f"{tok.other_context}, so these rows differ by context, not because the record is damaged (capture the "
                "record's own token ids to compare like with like)")
    if m.fidelity_cause == "routing":
        return ("the other rows agree to 0.999+, consistent with MoE routing differences (other experts for those "
                "tokens), a context that differs for those tokens, or rows edited after capture")
    if m.fidelity_cause == "uniform":
        return "every row drifts a little, consistent with quantised weights or other kernels / dtypes"
    return "those rows are corrupted or were written from another state"


def _rows_at(rows: list[int], show: int = 8) -> str:
    """``row 5`` or ``3 rows: 5, 9, 12``: how many rows and which (the first few and the last)."""
    if len(rows) == 1:
        return f"row {rows[0]}"
    more = f", ... {rows[-1]}" if len(rows) > show else ""
    return f"{len(rows)} rows: {', '.join(map(str, rows[:show]))}{more}"


def _engine_ids(matches: list[SlotMatch], n: int, model_type: str | None = None, engine: str | None = None,
                version: str | None = None, runner: str | None = None,
                ) -> tuple[dict[str, list[int] | None], dict[str, list[str]], list[Finding]]:
    """The id list each engine needs for the aux positions, by the rules of this family.

    Each engine is answered at ``version`` when it is the ``engine`` asked about, else at its
    newest release (said in the notes), with the version ranges where the answer differs.
    Findings come only from ``engine`` (every engine when none is given) and this family.
    """
    aux = [m for m in matches if m.role == "aux"]
    ids: dict[str, list[int] | None] = {}
    notes: dict[str, list[str]] = {}
    findings: list[Finding] = []
    if not aux:
        return ids, notes, findings
    if any(m.position is None or m.position.normed for m in aux):
        for eng in rules.ENGINES:
            ids[eng], notes[eng] = None, ["not every aux slot has a confident raw-position match"]
        return ids, notes, findings
    wanted = [m.position.p for m in aux if m.position is not None]
    for eng in rules.ENGINES:
        asked = eng == engine
        rule = rules.resolve(eng, model_type, version if asked else None, runner if asked else None)
        plan = rules.ids_for_positions(rule, wanted, n)
        ids[eng] = plan.ids
        notes[eng] = [f"rule {rule.label}"] + list(plan.reasons) + list(plan.notes)
        notes[eng] += [r for r in rule.notes if not r.startswith("model type")]
        if not (asked and version is not None):
            answers = rules.answers_by_version(
                eng, model_type, lambda r: tuple(rules.ids_for_positions(r, wanted, n).ids or ()),
                runner if asked else None)
            if len(answers) > 1:
                notes[eng].append("ids by version: " + "; ".join(
                    f"{v}: {list(a) if a else 'none works'}" for v, a in answers))
        if plan.ids is None and (engine is None or asked):
            findings.append(Finding("engine-cannot-serve", "warning",
                                    f"{rule.label}: no id list captures p={wanted}: {'; '.join(plan.reasons)}"))
    if model_type is None:
        for eng in rules.ENGINES:
            notes[eng].append("model type unknown: Llama rules assumed (pass --model-type)")
    return ids, notes, findings
