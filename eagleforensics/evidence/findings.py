"""Findings: what is miswired, in plain words, each with a stable code and a severity.

Severity ``error`` means the drafter cannot be served as trained (or nothing could be
placed); ``warning`` a trap that an explicit id list or a check avoids; ``info`` context.
Rules cite docs/conventions.md through the conventions module.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..positions import Position, default_aux_positions
from ..records import Finding

if TYPE_CHECKING:  # pragma: no cover
    from ..records import SlotMatch
    from .tokens import TokenAlignment



def _layers(ps: list[int], n: int) -> str:
    return ", ".join(Position(p).describe(n) for p in ps)


def slot_findings(matches: list[SlotMatch], num_layers: int) -> list[Finding]:
    """Findings about the placed slots: unmatched, embedding, order, off-by-one, final-state kind."""
    out: list[Finding] = []
    n = num_layers
    for m in matches:
        if not m.confident:
            cand = m.best.label if m.best else "none"
            out.append(Finding("no-confident-match", "warning",
                               f"{m.name}: no confident match (best candidate {cand}, score {m.score:.4f}, "
                               f"margin {m.margin:.4f}: {m.reason})"))
    aux = [m for m in matches if m.role == "aux"]
    placed = [m.position.p for m in aux if m.confident and m.position is not None and not m.position.normed]
    if any(m.confident and m.position is not None and m.position.normed for m in aux):
        out.append(Finding("aux-post-norm", "error",
                           "an aux slot holds a post-norm state; engines capture aux states before any norm"))
    for m in aux:
        if m.confident and m.position == Position(0):
            out.append(Finding("embedding-included", "error",
                               f"{m.name} holds the embedding output (p=0), not a decoder layer's output. "
                               "EAGLE-3 feeds the drafter decoder-layer states, and only some engines can "
                               "capture the embedding: TensorRT-LLM never, SGLang and vLLM only in some "
                               "versions for some model families (see the engine ids)."))
    if len(placed) == len(aux) and aux:
        if placed != sorted(placed):
            out.append(Finding("concat-order", "error",
                               f"aux slots hold positions {placed}, not in ascending order. Every engine "
                               "concatenates captured states in ascending layer order, so no id list can "
                               "reproduce this training layout; regenerate the data or reorder the slots."))
        if len(set(placed)) != len(placed):
            out.append(Finding("duplicate-position", "warning", f"two aux slots hold the same position: {placed}"))
        default = default_aux_positions(n)
        if len(placed) == 3 and placed != default:
            delta = {p - d for p, d in zip(placed, default)}
            if len(delta) == 1 and delta != {0}:
                (d,) = delta
                out.append(Finding("off-by-default", "warning",
                                   f"aux slots are {abs(d)} layer{'s' if abs(d) > 1 else ''} "
                                   f"{'deeper' if d > 0 else 'shallower'} than the states every engine "
                                   f"captures by default (p={default}). An engine left on its default, or "
                                   "given ids read with another engine's rule, feeds the drafter the wrong "
                                   "layers without any error (what that costs: replay measures it). Write the ids below "
                                   "explicitly into the key each engine reads."))
        elif placed == default:
            out.append(Finding("engine-default", "info",
                               f"aux slots hold p={default}, the states every engine captures by default"))
        if placed:
            out.append(Finding("aux-layers", "info", f"aux slots hold: {_layers(placed, n)}"))
    for m in matches:
        if m.role != "final" or not m.confident or m.position is None:
            continue
        if m.position.p != n:
            out.append(Finding("final-wrong-layer", "warning",
                               f"{m.name} is the final state but holds p={m.position.p}, not the last layer "
                               f"(p={n}): an off-by-one in the dumper (cf. TorchSpec #87)."))
        # which trainer expects which kind: conventions.trainer_final_expectation holds the sources
        if m.position.normed:
            out.append(Finding("final-post-norm", "info",
                               f"{m.name} is the post-norm final state. Right for a SpecForge-style trainer "
                               "(it applies only the lm_head); wrong for speculators, which applies the "
                               "verifier norm first and would normalise it twice."))
        else:
            out.append(Finding("final-raw", "info",
                               f"{m.name} is the raw last-layer output (before the final norm). Right for "
                               "speculators (it applies the verifier norm, then the head); wrong for a "
                               "SpecForge-style trainer, which would feed the lm_head an un-normalised state."))
    return out


def identity_findings(matches: list[SlotMatch]) -> list[Finding]:
    """Findings from the identity and fidelity evidence: ambiguity, uncaptured neighbours, drift."""
    out: list[Finding] = []
    for m in matches:
        if m.identity == "ambiguous" and m.best is not None:
            out.append(Finding("ambiguous-position", "warning", f"{m.name}: {m.reason}"))
        elif m.identity == "best-among-captured" and m.best is not None:
            missing = " / ".join(f"p{q}" for q in m.missing_neighbours)
            out.append(Finding("neighbours-not-captured", "warning",
                               f"{m.name}: {m.best_label} is the best among the captured positions (robust score "
                               f"{m.robust_score:.4f}, {m.fidelity or 'not a copy'}); {missing} "
                               f"{'was' if len(m.missing_neighbours) == 1 else 'were'} not captured and could fit "
                               "better, so this is not a confident placement. Capture the neighbouring positions "
                               "(or the full sweep) to decide."))
        elif m.identity == "between" and m.best is not None and m.other is not None:
            lo, hi = sorted((m.best, m.other))
            out.append(Finding("between-positions", "warning",
                               f"{m.name} sits between {lo.label} and {hi.label} ({m.between_fraction:.0%} of "
                               f"the capture's layer step from {m.best.label}), at no residual-stream position: a state "
                               f"saved inside decoder layer {min(m.best.p, m.other.p)} (after attention, before the MLP, "
                               "e.g. the residual of a fused add-norm). No engine id captures it; regenerate the data "
                               "from a layer boundary."))
        elif m.identity == "position-unknown" and m.best is not None:
            out.append(Finding("position-unknown", "warning", f"{m.name}: {m.reason}."))
        elif m.identity == "rows-unverified" and m.best is not None:
            out.append(Finding("rows-unverified", "warning", f"{m.name}: {m.reason}. Give both sides their token ids."))
        elif m.confident and m.fidelity == "drift" and m.fidelity_cause in ("routing", "uniform", "scale", "context"):
            out.append(Finding("state-drift", "info",
                               f"{m.name} is placed at {m.best_label} (robust score {m.robust_score:.4f}, paired "
                               f"bound {m.paired_bound:+.2e} over the runner-up, {m.vote_share:.0%} of tokens vote "
                               f"for it) but is not a copy: {m.fidelity_text}"))
    return out


def token_evidence_findings(matches: list[SlotMatch], tok: TokenAlignment) -> list[Finding]:
    """Which row offset paired the rows (when not the plain prefix), and slots whose rows repeat tokens."""
    out: list[Finding] = []
    if tok.method in ("ids-run", "content-shift") or tok.candidates:
        tried = "; ".join(f"{d:+d}: {c:.4f}" for d, c in tok.candidates)
        how = {"ids-run": "the token ids (a contiguous run)", "content-shift": "content"}.get(tok.method, tok.method)
        out.append(Finding("row-offset", "info",
                           f"training row t is compared with capture row t{tok.offset:+d} (rows {tok.train_start}.."
                           f"{tok.train_start + tok.length - 1} of the record; found by {how})"
                           + (f"; offsets scored by content on the aux slots (mean robust score): {tried}" if tried else "")))
    for m in matches:  # a few repeated tokens (an embedding slot's repeated ids) are not worth a warning
        if 0 <= m.distinct_tokens and 2 * m.distinct_tokens < m.tokens:
            out.append(Finding("few-distinct-tokens", "warning",
                               f"{m.name}: its {m.tokens} compared rows hold only {m.distinct_tokens} distinct "
                               "(slot row, capture row) pairs: rows repeat one token's state, so the evidence counts "
                               f"{m.distinct_tokens} tokens, not {m.tokens}"))
    return out
