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
from typing import Any

import numpy as np

from ..arrays import f32
from ..errors import ForensicsError
from ..io.capture import greedy_key
from ..io.modeldir import ModelDir
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
    """The target's lm_head (where it is stored: ``name`` in ``model``, [V, H]), final norm gain and eps.

    The head is never held whole: ``greedy`` streams it a block of vocabulary rows at a time from its shard."""

    model: ModelDir
    name: str
    shape: tuple[int, ...]
    norm: np.ndarray | None
    eps: float

    @property
    def hidden(self) -> int:
        return int(self.shape[1])


def target_head(art: Artifacts) -> TargetHead | None:
    """The target's lm_head (tied: the embedding) and final norm, found once; None without ``--target``."""
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
        info = t.info(name)  # its shard's header only (MissingShard when not downloaded)
        if len(info.shape) != 2:
            raise ForensicsError(f"target tensor {name} has shape {list(info.shape)}; expected [vocab, hidden]",
                                 path=info.file)
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
        return TargetHead(t, name, info.shape, f32(t.read(norm_name)) if norm_name else None,
                          float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) else 1e-6)
    return art.memo("target-head", make)


def greedy(final: np.ndarray, head: TargetHead | np.ndarray, device: str = "cpu") -> np.ndarray:
    """argmax over the vocabulary of ``final @ head.T``, a block of ``VOCAB_BLOCK`` vocabulary rows at a time: each
    block read (from the shard, for a ``TargetHead``) and widened to float32 once for all rows of ``final``;
    on ``device`` (cuda) through torch, each block copied there once."""
    if device != "cpu":
        return _greedy_torch(final, head, device)
    x = f32(final)
    best = np.full(x.shape[0], -np.inf, np.float32)
    arg = np.zeros(x.shape[0], np.int64)
    vocab = head.shape[0]
    buf: np.ndarray | None = None
    for a in range(0, vocab, VOCAB_BLOCK):
        if isinstance(head, TargetHead):
            w = head.model.row_block(head.name, a, min(vocab, a + VOCAB_BLOCK), out=buf)
            buf = w if buf is None else buf
        else:
            w = head[a:a + VOCAB_BLOCK]
        logits = x @ f32(w).T
        i = logits.argmax(-1)
        v = logits[np.arange(x.shape[0]), i]
        better = v > best
        best[better], arg[better] = v[better], i[better] + a
    return arg


def _greedy_torch(final: np.ndarray, head: TargetHead | np.ndarray, device: str) -> np.ndarray:
    """``greedy`` on a torch device: the same blocks and the same first-maximum rule, float32 products there."""
    import torch

    from ..arrays import to_torch

    x = to_torch(f32(final)).to(device)
    best = torch.full((x.shape[0],), -torch.inf, device=device)
    arg = torch.zeros(x.shape[0], dtype=torch.long, device=device)
    vocab = head.shape[0]
    buf: np.ndarray | None = None
    for a in range(0, vocab, VOCAB_BLOCK):
        if isinstance(head, TargetHead):
            w = head.model.row_block(head.name, a, min(vocab, a + VOCAB_BLOCK), out=buf)
            buf = w if buf is None else buf
        else:
            w = head[a:a + VOCAB_BLOCK]
        logits = x @ to_torch(w).to(device).to(torch.float32).T  # the stored dtype crosses the bus
        i = logits.argmax(-1)
        v = logits.gather(1, i[:, None])[:, 0]
        better = v > best
        best = torch.where(better, v, best)
        arg = torch.where(better, i + a, arg)
    return arg.cpu().numpy()


def _as_post_norm(state: np.ndarray, head: TargetHead) -> tuple[np.ndarray, str] | None:
    norms, _ = row_summary(state)
    if looks_post_norm(norms):
        return state, "post-norm"
    if head.norm is None or head.norm.shape[0] != state.shape[1]:
        return None
    return unit_rms(state) * head.norm, "raw, through the target's final norm"


def _record_states(art: Artifacts, head: TargetHead | None) -> tuple[list[np.ndarray], list[np.ndarray], set[str]]:
    """The records' supervised next ids, and the final states (post-norm) of the first ``MAX_TOKENS`` supervised
    positions whose greedy token can be computed: rows past the sample are never multiplied with the lm_head."""
    states: list[np.ndarray] = []
    ids_only: list[np.ndarray] = []
    kinds: set[str] = set()
    kept = 0
    for rec in art.records:
        ids = rec.input_ids
        if ids is None or ids.size < 2:
            continue
        mask = rec.loss_mask if rec.loss_mask is not None and rec.loss_mask.shape == ids.shape else np.ones_like(ids)
        n = ids.shape[0]
        sup = np.flatnonzero(mask[1:n] != 0)  # position t predicts t+1, supervised when t+1 is
        ids_only.append(ids[1:n][sup])
        final = next((e for e in rec.entries if e.role == "final"), None)
        if head is not None and final is not None and final.data.shape[1] == head.hidden \
                and final.data.shape[0] >= n:
            # post-norm or raw is decided on all the record's supervised rows (as before), the product on the sample
            state = _as_post_norm(final.data[: n - 1][sup], head) if sup.size else None
            if state is not None:
                take = state[0][: max(0, MAX_TOKENS - kept)]
                states.append(take)
                kept += take.shape[0]
                kinds.add(state[1])
    return states, ids_only, kinds


def _capture_state(art: Artifacts, head: TargetHead | None) -> tuple[np.ndarray, str] | None:
    """The capture's first ``MAX_TOKENS`` final states (post-norm; raw ones through the target's norm), or None."""
    cap = art.capture
    rows = min(cap.num_tokens, MAX_TOKENS)
    n = cap.num_layers
    if head is not None and n is not None and cap.hidden_size == head.hidden:
        post, raw = Position(n, True), Position(n)
        if post in cap.readers:
            return cap.read_rows(post, 0, rows), "post-norm"
        if raw in cap.readers and head.norm is not None:
            return unit_rms(cap.read_rows(raw, 0, rows)) * head.norm, "raw, through the target's final norm"
    return None


def _greedy_sources(art: Artifacts) -> dict[str, Any]:
    """The records' and the capture's sampled states and their greedy tokens, from one pass over the lm_head."""
    def make() -> dict[str, Any]:
        head = target_head(art)
        out: dict[str, Any] = {}
        if art.available("train"):
            out["records"] = _record_states(art, head)
        if art.available("capture"):
            out["capture"] = _capture_state(art, head)
        parts = [np.concatenate(out["records"][0]) if out.get("records") and out["records"][0] else None,
                 out["capture"][0] if out.get("capture") is not None else None]
        sizes = [0 if p is None else p.shape[0] for p in parts]
        if head is not None and sum(sizes):
            # the capture's greedy tokens are shared with replay (``Capture.greedy``): whoever passes over the
            # lm_head first (drafter-baseline's replay, this check, replay) keeps them for the others
            shared = getattr(art.capture, "greedy", None) if parts[1] is not None else None
            key = greedy_key(head.model.path, head.name)
            held = shared.get(key) if shared is not None else None
            held = held[: sizes[1]] if held is not None and held.shape[0] >= sizes[1] else None
            use = [f32(p) for p in (parts if held is None else parts[:1]) if p is not None]
            x = np.concatenate(use) if use else np.zeros((0, head.hidden), np.float32)
            tokens = greedy(x, head, art.inputs.device) if x.shape[0] else np.zeros(0, np.int64)
            out["greedy"] = (tokens[: sizes[0]], tokens[sizes[0]:] if held is None else held)
            if shared is not None and held is None:
                ok = np.isfinite(x[sizes[0]:]).all(-1)
                shared[key] = np.where(ok, tokens[sizes[0]:], -1)
        return out
    return art.memo("next-token-greedy", make)


def record_tokens(art: Artifacts) -> NextTokens | None:
    """The records' next tokens at supervised positions: the target's greedy choice when it can be computed."""
    got = _greedy_sources(art)
    states, ids_only, kinds = got["records"]
    if states:
        tokens = got["greedy"][0][:MAX_TOKENS]
        return NextTokens("records", tokens, "the target's greedy token (its lm_head on the records' final state, "
                          f"{'/'.join(sorted(kinds))}) at supervised positions", True)
    if ids_only:
        return NextTokens("records", np.concatenate(ids_only)[:MAX_TOKENS], "the records' own supervised ids", False)
    return None


def capture_tokens(art: Artifacts) -> NextTokens | None:
    """The capture's next tokens: the target's greedy choice from its final state, else its own next ids."""
    cap = art.capture
    rows = min(cap.num_tokens, MAX_TOKENS)
    got = _greedy_sources(art)
    state = got["capture"]
    if state is not None:
        return NextTokens("capture", got["greedy"][1],
                          f"the target's greedy token (its lm_head on the capture's final state, {state[1]})", True)
    if cap.input_ids is not None and cap.input_ids.size > 1:
        return NextTokens("capture", np.asarray(cap.input_ids[1:rows + 1], np.int64), "the capture's own next ids",
                          False)
    return None
