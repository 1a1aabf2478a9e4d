"""Chat-template skeletons: where an answer starts and ends in the target's template, and how records and served prompts compare.

``learn_skeleton(tok)`` renders probe conversations with the target's own chat template (with and
without a system prompt; ``enable_thinking`` left to its default, true and false; with and without
reasoning) and cuts the token ids around the probe texts into:

* the assistant **header**: the tokens between a user message and the answer, common to every
  probe (``<|im_end|>\\n<|im_start|>assistant\\n`` in ChatML, ``<|eot_id|><|start_header_id|>assistant
  <|end_header_id|>\\n\\n`` in Llama 3); it includes the user's end of turn, which makes it specific;
* **scaffolds**: what a mode puts between the header and the answer (nothing; the empty think block
  ``<think>\\n\\n</think>\\n\\n`` of non-thinking Qwen3; an opened ``<think>\\n``), each of kind
  ``plain``, ``empty-think`` or ``think-open``;
* the think **open/close** tokens and the **end of turn** (its first token and the whole suffix the
  template writes after an answer).

``classify_runs`` then reads each supervised run of a record (``loss_mask`` 1): does it start right
after a header (+ scaffold), one token late or early (a shifted mask: the first answer token never
supervised, sgl-project/SpecForge#885), or after something else (another template, raw text); does it
end at an end of turn; and is the answer thinking (``reasoning``), non-thinking (``empty-think``) or
``plain``. ``classify_prompt`` reads a served prompt (or a capture's ids) the same way: which mode its
generation prompt opens, another template's tokens, or none at all (a raw completion).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ..arrays import as_array
from ..errors import ForensicsError

PROBE_SYSTEM = "Probe system text."
PROBE_USER = "Probe user question?"
PROBE_ANSWER = "Probe answer text."
PROBE_REASON = "Probe reasoning text."
PROBE_USER2 = "Probe second question?"
PLAIN, EMPTY_THINK, THINK_OPEN = "plain", "empty-think", "think-open"
REASONING = "reasoning"  # a run whose answer holds non-empty thinking
STATES = (REASONING, EMPTY_THINK, PLAIN)
# start of a supervised run
START_OK, START_LATE, START_EARLY, START_OTHER, START_RAW = "after-header", "late-by-one", "early-by-one", "other", "raw"
# end of a supervised run
END_EOT, END_SUFFIX, END_BEFORE_EOT, END_TRUNCATED, END_OTHER = "eot", "eot+suffix", "before-eot", "truncated", "other"
CONTEXT_REACH = 3  # a token within this many after a template token counts as template text (role names)
CONTEXT_MAX = 24  # tokens of context kept for an unknown skeleton
# Recognisable assistant headers of public template families, by their decoded text.
FAMILIES: tuple[tuple[str, str], ...] = (
    ("<|im_start|>assistant", "ChatML (Qwen, Yi, Hermes)"),
    ("<|start_header_id|>assistant<|end_header_id|>", "Llama 3"),
    ("<|start|>assistant", "Harmony (gpt-oss)"),
    ("<｜Assistant｜>", "DeepSeek V3 / R1"),
    ("<start_of_turn>model", "Gemma"),
    ("[/INST]", "Mistral / Llama 2 [INST]"),
    ("<|assistant|>", "Phi / Zephyr"),
    ("<|Assistant|>", "DeepSeek (ASCII bars)"),
    ("### Assistant:", "Vicuna / Alpaca style"),
)


def family_of(text: str) -> str | None:
    """The template family whose assistant header ``text`` contains, or None."""
    return next((name for marker, name in FAMILIES if marker in text), None)


@dataclass(frozen=True)
class Scaffold:
    """What one mode puts between the assistant header and the answer."""

    ids: tuple[int, ...]
    kind: str  # plain | empty-think | think-open
    modes: tuple[str, ...]  # "default", "thinking", "non-thinking", "rendered" (an answer in history)


@dataclass(frozen=True)
class Skeleton:
    """A chat template's token skeleton around an answer (``learn_skeleton``)."""

    header: tuple[int, ...]
    scaffolds: tuple[Scaffold, ...]
    think_open: int | None
    think_close: int | None
    eot: int | None
    end_suffix: tuple[int, ...]
    template_ids: frozenset[int]  # every id the skeletons are made of that is an added (control) token
    header_text: str
    family: str | None
    generation: dict[str, tuple[int, ...]] = field(default_factory=dict)  # mode -> header + scaffold
    served_state: dict[str, str] = field(default_factory=dict)  # mode -> the answer state it asks for
    default_mode: str = "default"

    @property
    def thinks(self) -> bool:
        """Whether the template has think tokens at all."""
        return self.think_open is not None

    def candidates(self) -> list[tuple[tuple[int, ...], Scaffold]]:
        """header + scaffold for each scaffold, longest first (the longest match wins)."""
        return sorted(((self.header + s.ids, s) for s in self.scaffolds), key=lambda c: -len(c[0]))

    def to_dict(self, decode: Any = None) -> dict[str, Any]:
        """The skeleton as JSON (texts decoded when ``decode`` is given)."""
        def show(ids: Iterable[int]) -> Any:
            return decode(list(ids)) if decode else list(ids)

        return {"header": show(self.header), "family": self.family,
                "scaffolds": [{"text": show(s.ids), "kind": s.kind, "modes": list(s.modes)} for s in self.scaffolds],
                "end_of_turn": show(self.end_suffix), "think": self.thinks,
                "generation": {m: show(g) for m, g in self.generation.items()}, "served_state": dict(self.served_state),
                "default_mode": self.default_mode}


# ---------------------------------------------------------------------- learning the skeleton

def _between(tok: Any, text: str, left: str, right: str) -> tuple[list[int], list[int]] | None:
    """Token ids of the text strictly between the end of ``left`` and the start of ``right`` in ``text``, and all
    ids; None when a marker is missing or a token straddles a marker boundary."""
    i = text.find(left)
    j = text.find(right, i + len(left)) if i >= 0 else -1
    if i < 0 or j < 0:
        return None
    a, b = i + len(left), j
    enc = tok.tokenizer.encode(text, add_special_tokens=False)
    ids, offs = list(enc.ids), list(enc.offsets)
    inside = [k for k, (s, e) in enumerate(offs) if s >= a and e <= b and e > s]
    straddle = [k for k, (s, e) in enumerate(offs) if (s < a < e) or (s < b < e)]
    if straddle:
        return None
    return [ids[k] for k in inside], ids


def _after(tok: Any, text: str, left: str) -> list[int] | None:
    """Token ids of the text after ``left`` (its last occurrence)."""
    i = text.rfind(left)
    if i < 0:
        return None
    a = i + len(left)
    enc = tok.tokenizer.encode(text, add_special_tokens=False)
    return [t for t, (s, e) in zip(enc.ids, enc.offsets) if s >= a and e > s]


def _common_prefix(seqs: list[list[int]]) -> list[int]:
    out: list[int] = []
    for items in zip(*seqs):
        if len(set(items)) != 1:
            break
        out.append(items[0])
    return out


def _render(tok: Any, messages: list[dict[str, Any]], gen: bool, mode: str) -> str:
    kwargs = {} if mode == "default" else {"enable_thinking": mode == "thinking"}
    return tok.render(messages, add_generation_prompt=gen, **kwargs)


def _kind(ids: tuple[int, ...], think_open: int | None, think_close: int | None) -> str:
    if think_open is not None and think_open in ids:
        return EMPTY_THINK if think_close is not None and think_close in ids else THINK_OPEN
    return PLAIN


def learn_skeleton(tok: Any) -> Skeleton:
    """The skeleton of ``tok``'s chat template (``io.tokenizer.ChatTokenizer``), learnt from probe renders."""
    user = {"role": "user", "content": PROBE_USER}
    answer = {"role": "assistant", "content": PROBE_ANSWER}
    reasoned = {"role": "assistant", "content": PROBE_ANSWER, "reasoning_content": PROBE_REASON}
    system = {"role": "system", "content": PROBE_SYSTEM}
    modes = ("default", "thinking", "non-thinking")
    gen_tails: dict[str, list[list[int]]] = {}
    full_between: list[tuple[str, list[int]]] = []
    ends: list[list[int]] = []
    for mode in modes:
        for lead in ([], [system]):
            text = _render(tok, lead + [user], True, mode)
            tail = _after(tok, text, PROBE_USER)
            if tail is not None:
                gen_tails.setdefault(mode, []).append(tail)
            full = _render(tok, lead + [user, answer], False, mode)
            got = _between(tok, full, PROBE_USER, PROBE_ANSWER)
            if got is not None:
                full_between.append((mode, got[0]))
            end = _after(tok, full, PROBE_ANSWER)
            if end is not None:
                ends.append(end)
    # an answer in the history (before a second user turn) shows the end of turn between turns
    multi = _render(tok, [user, answer, {"role": "user", "content": PROBE_USER2}], True, "default")
    got = _between(tok, multi, PROBE_ANSWER, PROBE_USER2)
    if not full_between or not gen_tails:
        raise ForensicsError("the chat template does not render a user message and an answer as text the probes "
                             "can find (no header between them)", path=tok.template_file or tok.path)
    header = _common_prefix([b for _, b in full_between] + [t for tails in gen_tails.values() for t in tails])
    if not header:
        raise ForensicsError("the chat template puts nothing between a user message and the answer: no assistant "
                             "header to look for", path=tok.template_file or tok.path)
    # think tokens: from a render with reasoning, else the added tokens of the non-thinking scaffold
    think_open = think_close = None
    with_reason = _render(tok, [user, reasoned], False, "thinking")
    opener = _between(tok, with_reason, PROBE_USER, PROBE_REASON)
    closer = _between(tok, with_reason, PROBE_REASON, PROBE_ANSWER)
    added = tok.added_ids
    if opener is not None and closer is not None:
        think_open = next((t for t in opener[0][len(header):] if t in added), None)
        think_close = next((t for t in closer[0] if t in added), None)
    if think_open is None:  # the template ignores reasoning_content: read the think tokens off its scaffolds
        for tails in gen_tails.values():
            for tail in tails:
                extra = [t for t in tail[len(header):] if t in added]
                if len(extra) >= 2:
                    think_open, think_close = extra[0], extra[-1]
                elif len(extra) == 1 and think_open is None:  # an opened block (DeepSeek-R1: "<think>\n")
                    text = tok.decode([extra[0]])
                    if text.startswith("<") and text.endswith(">") and not text.startswith("</"):
                        think_open, think_close = extra[0], tok.token_id("</" + text[1:])
    scaffolds: dict[tuple[int, ...], set[str]] = {(): {"rendered"}}
    generation: dict[str, tuple[int, ...]] = {}
    for mode, tails in gen_tails.items():
        tail = tails[0]
        if tail[:len(header)] == header:
            generation[mode] = tuple(tail)
            scaffolds.setdefault(tuple(tail[len(header):]), set()).add(mode)
    for mode, between in full_between:
        if between[:len(header)] == header:
            scaffolds.setdefault(tuple(between[len(header):]), set()).add("rendered")
    end_suffix = tuple(ends[0]) if ends else ()
    if got is not None and end_suffix and got[0][:len(end_suffix)] != list(end_suffix):
        end_suffix = tuple(_common_prefix([list(end_suffix), got[0]]))
    eot = end_suffix[0] if end_suffix else None
    sc = tuple(Scaffold(ids, _kind(ids, think_open, think_close), tuple(sorted(m))) for ids, m in scaffolds.items())
    served = _served_states(generation, header, think_open, think_close)
    template_ids = frozenset(t for t in tuple(header) + end_suffix + tuple(x for s in sc for x in s.ids) if t in added)
    header_text = tok.decode(header)
    default = "default"
    if "default" in generation:
        default = next((m for m in ("thinking", "non-thinking") if generation.get(m) == generation["default"]),
                       "default")
    return Skeleton(tuple(header), sc, think_open, think_close, eot, end_suffix, template_ids, header_text,
                    family_of(header_text), generation, served, default)


def _served_states(generation: dict[str, tuple[int, ...]], header: list[int], think_open: int | None,
                   think_close: int | None) -> dict[str, str]:
    """The answer state each generation prompt asks the model for: an empty think block already written means a
    non-thinking answer; an opened think block, or a bare header in a template that can think (the model writes
    ``<think>`` itself, as Qwen3 does with enable_thinking true), a thinking one."""
    out: dict[str, str] = {}
    kinds = {m: _kind(g[len(header):], think_open, think_close) for m, g in generation.items()}
    for mode, kind in kinds.items():
        if kind == EMPTY_THINK:
            out[mode] = EMPTY_THINK
        elif kind == THINK_OPEN:
            out[mode] = REASONING
        elif think_open is not None and (mode == "thinking" or EMPTY_THINK in kinds.values()):
            out[mode] = REASONING
        else:
            out[mode] = PLAIN
    return out


# ---------------------------------------------------------------------- records

@dataclass(frozen=True)
class Run:
    """One supervised run [start, stop) of a record, as the skeleton reads it."""

    start: int
    stop: int
    start_kind: str  # after-header | late-by-one | early-by-one | other | raw
    end_kind: str  # eot | eot+suffix | before-eot | truncated | other
    state: str | None  # reasoning | empty-think | plain (None when the start is not understood)
    skeleton: str  # a key for the histogram: "target:<scaffold kind>" or the decoded context of another template
    context: tuple[int, ...] = ()  # the template tokens before the run when they are not the target's
    written_head: int = 0  # tokens at the start of the run the template wrote (an empty think block in the answer)
    written_tail: int = 0  # tokens at the end the template wrote (the end of turn and its suffix)


def runs_of(mask: Any) -> list[tuple[int, int]]:
    """[start, stop) of every run of non-zero ``mask`` values."""
    m = np.asarray(as_array(mask)).reshape(-1) != 0
    if not m.any():
        return []
    d = np.diff(np.concatenate([[0], m.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist()))


def _ends_with(ids: list[int], end: int, pattern: tuple[int, ...]) -> bool:
    n = len(pattern)
    return n > 0 and end - n >= 0 and tuple(ids[end - n:end]) == pattern


def template_context(ids: list[int], end: int, template: frozenset[int]) -> tuple[int, ...]:
    """The template-looking tokens just before ``end``: control (added) tokens and up to ``CONTEXT_REACH`` tokens
    after each (role names, newlines), walking back until plain text; empty when no control token is near."""
    k = end - 1
    start = end
    while k >= 0 and end - k <= CONTEXT_MAX:
        near = any(ids[j] in template for j in range(max(0, k - CONTEXT_REACH), k + 1))
        if not near:
            break
        start = k
        k -= 1
    ctx = tuple(ids[start:end])
    return ctx if any(t in template for t in ctx) else ()


def _state_in_answer(ids: list[int], a: int, b: int, skel: Skeleton, decode: Any) -> str:
    """The think state of an answer whose run starts right after the header: read from its first tokens."""
    for s in sorted(skel.scaffolds, key=lambda s: -len(s.ids)):
        if s.kind == EMPTY_THINK and s.ids and tuple(ids[a:a + len(s.ids)]) == s.ids:
            return EMPTY_THINK
    if skel.think_open is not None and a < b and ids[a] == skel.think_open:
        return _after_open(ids, a + 1, b, skel, decode)
    return PLAIN


def _after_open(ids: list[int], a: int, b: int, skel: Skeleton, decode: Any) -> str:
    """Reasoning when the think block opened before ``a`` holds text before its close (or never closes)."""
    close = next((k for k in range(a, b) if ids[k] == skel.think_close), None)
    if close is None:
        return REASONING
    inner = ids[a:close]
    return EMPTY_THINK if not inner or (decode is not None and not decode(inner).strip()) else REASONING


def classify_runs(ids: Any, mask: Any, skel: Skeleton, *, real: int | None = None, template: frozenset[int] = frozenset(),
                  decode: Any = None) -> list[Run]:
    """Every supervised run of a record read against ``skel``; ``real`` = tokens before padding; ``template`` =
    every control token of the tokenizer (to recognise another template's skeleton); ``decode`` ids -> text."""
    seq = [int(t) for t in np.asarray(as_array(ids)).reshape(-1)]
    n = len(seq) if real is None else real
    controls = template or skel.template_ids
    out: list[Run] = []
    cands = skel.candidates()
    for a, b in runs_of(np.asarray(as_array(mask)).reshape(-1)[:n]):
        kind, state, key, ctx, head = START_OTHER, None, "", (), 0
        exact = next((s for c, s in cands if _ends_with(seq, a, c)), None)
        if exact is not None:
            kind = START_OK
            if exact.kind == EMPTY_THINK:
                state = EMPTY_THINK
            elif exact.kind == THINK_OPEN:
                state = _after_open(seq, a, b, skel, decode)
            else:
                state = _state_in_answer(seq, a, b, skel, decode)
                head = _scaffold_in_answer(seq, a, b, skel)
            key = f"target:{'prompt ' + exact.kind if exact.ids else 'header'}"
        elif any(_ends_with(seq, a - 1, c) for c, _ in cands):
            kind = START_LATE  # the answer (and any empty think block in it) began one token earlier
            head = max(0, _scaffold_in_answer(seq, a - 1, b, skel) - 1)
        elif any(_ends_with(seq, a + 1, c) for c, _ in cands):
            kind = START_EARLY  # one header token is in the run before the answer
            head = 1 + _scaffold_in_answer(seq, a + 1, b, skel)
        else:
            ctx = template_context(seq, a, controls)
            kind = START_OTHER if ctx else START_RAW
            key = "raw" if not ctx else "other:" + (decode(list(ctx)) if decode else " ".join(map(str, ctx)))
        if kind in (START_LATE, START_EARLY):
            key = f"target:{kind}"
        end = _end_kind(seq, b, n, skel)
        tail = {END_SUFFIX: len(skel.end_suffix), END_EOT: 1}.get(end, 0)
        out.append(Run(a, b, kind, end, state, key, ctx, head, tail))
    return out


def _scaffold_in_answer(seq: list[int], a: int, b: int, skel: Skeleton) -> int:
    """Length of the longest non-empty scaffold (an empty think block) the run starts with, else 0."""
    for s in sorted(skel.scaffolds, key=lambda s: -len(s.ids)):
        if s.ids and s.kind == EMPTY_THINK and b - a >= len(s.ids) and tuple(seq[a:a + len(s.ids)]) == s.ids:
            return len(s.ids)
    return 0


def _end_kind(seq: list[int], b: int, n: int, skel: Skeleton) -> str:
    if skel.end_suffix and _ends_with(seq, b, skel.end_suffix) and len(skel.end_suffix) > 1:
        return END_SUFFIX
    if skel.eot is not None and b > 0 and seq[b - 1] == skel.eot:
        return END_EOT
    if skel.eot is not None and b < n and seq[b] == skel.eot:
        return END_BEFORE_EOT
    if b >= n:
        return END_TRUNCATED
    return END_OTHER


# ---------------------------------------------------------------------- served prompts

@dataclass(frozen=True)
class PromptRead:
    """What a served prompt (or a capture's ids) opens: the mode, another template, or a raw completion."""

    kind: str  # generation (ends with the target's generation prompt) | answered (holds an answer) | other | raw
    state: str | None  # the answer state the server asks for / the response holds
    mode: str | None  # default | thinking | non-thinking, when a generation prompt matched
    skeleton: str  # "target:<mode>" / "other:<decoded>" / "raw"


def classify_prompt(ids: Any, skel: Skeleton, *, template: frozenset[int] = frozenset(), decode: Any = None) -> PromptRead:
    """Read a served prompt: which generation prompt of the target's template it ends with (so which mode the
    server asked for), an answer after the target's header (a capture of prompt + response), another template's
    control tokens, or none at all (a raw completion)."""
    seq = [int(t) for t in np.asarray(as_array(ids)).reshape(-1)]
    controls = template or skel.template_ids
    for mode, gen in sorted(skel.generation.items(), key=lambda kv: -len(kv[1])):
        if _ends_with(seq, len(seq), gen):
            return PromptRead("generation", skel.served_state.get(mode), mode, f"target:{mode}")
    h = len(skel.header)
    starts = [k + h for k in range(len(seq) - h, -1, -1) if tuple(seq[k:k + h]) == skel.header]
    if starts:
        a = starts[0]
        for c, s in skel.candidates():
            if tuple(seq[a - h:a - h + len(c)]) == c and s.ids:
                state = EMPTY_THINK if s.kind == EMPTY_THINK else _after_open(seq, a - h + len(c), len(seq), skel, decode)
                return PromptRead("answered", state, None, f"target:answered {state}")
        state = _state_in_answer(seq, a, len(seq), skel, decode)
        return PromptRead("answered", state, None, f"target:answered {state}")
    if not any(t in controls for t in seq):
        return PromptRead("raw", None, None, "raw")
    ctx = template_context(seq, len(seq), controls)
    text = decode(list(ctx)) if decode and ctx else "template tokens elsewhere in the prompt"
    return PromptRead("other", None, None, "other:" + text)


def majority(values: Iterable[Any]) -> tuple[Any, int, int]:
    """(most common value, its count, total) of the non-None values; (None, 0, 0) when empty."""
    counts = Counter(v for v in values if v is not None)
    total = sum(counts.values())
    if not counts:
        return None, 0, 0
    value, n = counts.most_common(1)[0]
    return value, n, total
