"""The tokens a target emits next, from the training records and from the capture (numpy, no torch).

With the target's lm_head these are the target's own greedy choices, computed from the final
state the record or the capture holds (post-norm as stored; a raw last state is passed through the
target's final norm first, told apart by the post-norm signature of ``evidence.norms``). Without
the target they are the ids themselves: the records' supervised tokens (``loss_mask`` 1) or the
capture's next ids, which equal the target's choices only when the text is the target's own
greedy output. Checks say which kind they used.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..arrays import f32
from ..errors import ForensicsError
from ..evidence.norms import looks_post_norm, row_summary, unit_rms
from ..positions import Position
from .base import Artifacts

MAX_TOKENS = 4096  # per source: enough for a share to 1-2 points, bounded lm_head work
VOCAB_BLOCK = 8192  # lm_head rows widened to float32 at once


@dataclass(frozen=True)
class NextTokens:
    """Next tokens from one source (``records`` or ``capture``), and whether they are the target's own choices."""

    source: str
    tokens: np.ndarray  # int64
    how: str
    exact: bool  # True: the target's greedy tokens (lm_head on the final state); False: the ids themselves


@dataclass(frozen=True)
class TargetHead:
    """The target's lm_head [V, H] (as stored), final norm gain and eps, for greedy tokens."""

    lm_head: np.ndarray
    norm: np.ndarray | None
    eps: float


def target_head(art: Artifacts) -> TargetHead | None:
    """The target's lm_head (tied: the embedding) and final norm, read once; None without ``--target``."""
    if not art.available("target"):
        return None

    def make() -> TargetHead:
        t = art.target
        name = t.find("lm_head")
        if name is None and t.text.get("tie_word_embeddings"):
            name = t.find("embed")
        if name is None:
            raise ForensicsError("target has no lm_head tensor (looked for lm_head.weight in the safetensors index)",
                                 path=t.path)
        norm_name = t.find("norm")
        head_shape = t.info(name).shape
        if len(head_shape) != 2:
            raise ForensicsError(f"target tensor {name} has shape {list(head_shape)}; an lm_head is [vocab, hidden]",
                                 path=t.info(name).file)
        if norm_name is not None and t.info(norm_name).shape != (head_shape[1],):
            # checked from the header, before a raw final state is multiplied by it (a broadcast error, exit 3)
            raise ForensicsError(f"target tensor {norm_name} has shape {list(t.info(norm_name).shape)}; the final "
                                 f"norm of a target whose {name} reads {head_shape[1]} features is "
                                 f"[{head_shape[1]}]", path=t.info(norm_name).file)
        eps = t.text.get("rms_norm_eps", 1e-6)
        return TargetHead(t.read(name), f32(t.read(norm_name)) if norm_name else None,
                          float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) else 1e-6)
    return art.memo("target-head", make)


def greedy(final: np.ndarray, head: np.ndarray) -> np.ndarray:
    """argmax over the vocabulary of ``final @ head.T``, a block of vocabulary rows at a time."""
    x = f32(final)
    best = np.full(x.shape[0], -np.inf, np.float32)
    arg = np.zeros(x.shape[0], np.int64)
    for a in range(0, head.shape[0], VOCAB_BLOCK):
        logits = x @ f32(head[a:a + VOCAB_BLOCK]).T
        i = logits.argmax(-1)
        v = logits[np.arange(x.shape[0]), i]
        better = v > best
        best[better], arg[better] = v[better], i[better] + a
    return arg


def _as_post_norm(state: np.ndarray, head: TargetHead) -> tuple[np.ndarray, str] | None:
    norms, _ = row_summary(state)
    if looks_post_norm(norms):
        return state, "post-norm"
    if head.norm is None or head.norm.shape[0] != state.shape[1]:
        return None
    return unit_rms(state) * head.norm, "raw, through the target's final norm"


def record_tokens(art: Artifacts) -> NextTokens | None:
    """The records' next tokens at supervised positions: the target's greedy choice when it can be computed."""
    head = target_head(art)
    exact: list[np.ndarray] = []
    ids_only: list[np.ndarray] = []
    kinds: set[str] = set()
    for rec in art.records:
        ids = rec.input_ids
        if ids is None or ids.size < 2:
            continue
        mask = rec.loss_mask if rec.loss_mask is not None and rec.loss_mask.shape == ids.shape else np.ones_like(ids)
        n = ids.shape[0]
        sup = np.flatnonzero(mask[1:n] != 0)  # position t predicts t+1, supervised when t+1 is
        ids_only.append(ids[1:n][sup])
        final = next((e for e in rec.entries if e.role == "final"), None)
        if head is not None and final is not None and final.data.shape[1] == head.lm_head.shape[1] \
                and final.data.shape[0] >= n:
            state = _as_post_norm(final.data[: n - 1][sup], head) if sup.size else None
            if state is not None:
                exact.append(greedy(state[0], head.lm_head))
                kinds.add(state[1])
    if exact:
        tokens = np.concatenate(exact)[:MAX_TOKENS]
        return NextTokens("records", tokens, "the target's greedy token (its lm_head on the records' final state, "
                          f"{'/'.join(sorted(kinds))}) at supervised positions", True)
    if ids_only:
        return NextTokens("records", np.concatenate(ids_only)[:MAX_TOKENS], "the records' own supervised ids", False)
    return None


def capture_tokens(art: Artifacts) -> NextTokens | None:
    """The capture's next tokens: the target's greedy choice from its final state, else its own next ids."""
    cap = art.capture
    head = target_head(art)
    rows = min(cap.num_tokens, MAX_TOKENS)
    n = cap.num_layers
    if head is not None and n is not None and cap.hidden_size == head.lm_head.shape[1]:
        post, raw = Position(n, True), Position(n)
        state = None
        if post in cap.readers:
            state, kind = cap.read_rows(post, 0, rows), "post-norm"
        elif raw in cap.readers and head.norm is not None:
            state, kind = unit_rms(cap.read_rows(raw, 0, rows)) * head.norm, "raw, through the target's final norm"
        if state is not None:
            return NextTokens("capture", greedy(state, head.lm_head),
                              f"the target's greedy token (its lm_head on the capture's final state, {kind})", True)
    if cap.input_ids is not None and cap.input_ids.size > 1:
        return NextTokens("capture", np.asarray(cap.input_ids[1:rows + 1], np.int64), "the capture's own next ids",
                          False)
    return None

