"""Whose embedding and lm_head each engine gives the drafter, how it maps draft ids, and what
each trainer writes, as sourced data.

* ``EMBED_RULES``: per engine and version range, whose ``embed_tokens`` and ``lm_head`` the
  served drafter uses when it ships its own and when it does not. ``embedding-random`` is a
  PROBLEM only where the engine really uses the drafter's own embedding.
* ``D2T_RULES``: the ``d2t`` convention each engine expects (offsets: target = draft +
  d2t[draft]) and what it does when ``d2t`` is missing while ``draft_vocab_size < vocab_size``, one row per
  engine read at every release it spans; ``d2t_reading`` is what the vocab-map check says of them.
* ``TRAINER_RULES``: per trainer, whether ``embed_tokens`` and ``lm_head`` are copies of the
  target's (then a head unlike the target's is a defect) or trained from scratch, how
  ``d2t``/``t2d`` are written, the default draft vocabulary and the fresh-init std (a fresh
  row has norm ~ std * sqrt(H)).

Every row cites the released version and file it was read from (wheels unpacked with ``pip
download --no-deps``; SafeAILab/EAGLE has no EAGLE-3 release, its git source is cited).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..errors import ForensicsError
from .rules import (ENGINE_NAMES, ENGINES, NEWEST, TRT_MAIN, parse_version, release_span, row_at,
                    runner_or_default)


# --- whose embedding and head ---------------------------------------------------------------------

@dataclass(frozen=True)
class EmbedRule:
    """Whose embedding / lm_head the served drafter uses on one engine from ``since`` on.

    ``embed_own`` / ``embed_absent``: what is used when the drafter ships ``embed_tokens`` / not
    ('draft', 'target' or 'uninitialised'); ``head_own`` / ``head_absent`` likewise for
    ``lm_head``. ``embed_widths_differ``: what is used when the drafter's hidden size differs
    from the target's (the target's embedding cannot be shared).
    """

    engine: str
    since: str
    until: str | None
    embed_own: str
    embed_absent: str
    head_own: str
    head_absent: str
    embed_widths_differ: str
    embed_note: str
    head_note: str
    source: str
    runner: str | None = None  # vLLM: v1 / v2; None: both

    @property
    def label(self) -> str:
        run = f" {self.runner} runner" if self.runner else ""
        return f"{self.engine}{run} embedding/head {release_span(self.since, self.until)}"

    def embedding_used(self, has_own: bool, widths_differ: bool = False) -> str:
        """'draft', 'target' or 'uninitialised': the embedding the served drafter reads."""
        if widths_differ:
            return self.embed_widths_differ if has_own else "uninitialised"
        return self.embed_own if has_own else self.embed_absent

    def lm_head_used(self, has_own: bool) -> str:
        """'draft', 'target' or 'uninitialised': the head the served drafter's logits come from."""
        return self.head_own if has_own else self.head_absent


_SEW = "sglang {v} srt/speculative/{f}"
_VEP = "vllm {v} vllm/v1/spec_decode/{f}"
EMBED_RULES: tuple[EmbedRule, ...] = (
    EmbedRule("sglang", "0.4.10", "0.5.1.post3", "target", "target", "draft", "uninitialised",
              "draft", "set_embed always replaces the drafter's embed_tokens with the target's "
              "unless the config's target_hidden_size differs from hidden_size",
              "EAGLE-3 keeps its own head; without lm_head.weight the ParallelLMHead is never "
              "loaded (torch.empty)",
              _SEW.format(v="0.4.10", f="eagle_worker.py") + " (set_embed for EAGLE3); sglang "
              "0.4.10 srt/models/llama.py LlamaForCausalLM.set_embed"),
    EmbedRule("sglang", "0.5.2", None, "target", "target", "draft", "target", "draft",
              "set_embed replaces the drafter's embed_tokens with the target's unless "
              "target_hidden_size differs from hidden_size (same in kimi_k25_eagle3.py)",
              "own head kept; the target's head is used only when the config says "
              "draft_vocab_size: null (load_lm_head_from_target); a missing lm_head.weight with "
              "draft_vocab_size set stays uninitialised",
              _SEW.format(v="0.5.2, 0.5.23", f="eagle_worker.py, eagle_worker_v2.py") +
              " (load_lm_head_from_target -> set_embed_and_head, else set_embed); sglang 0.5.23 "
              "srt/models/llama.py set_embed"),
    EmbedRule("vllm", "0.10.1.1", "0.11.0", "target", "target", "draft", "uninitialised", "draft",
              "with PP=1 the drafter's embed_tokens is replaced by the target's whenever the "
              "shapes agree (PP>1: the drafter's own)",
              "EAGLE-3 never shares the target head (method != 'eagle3'); a missing "
              "lm_head.weight stays uninitialised",
              _VEP.format(v="0.10.1.1, 0.11.0", f="eagle.py") + " EagleProposer.load_model"),
    EmbedRule("vllm", "0.11.1", "0.33.0", "draft", "target", "draft", "target", "draft",
              "the drafter's own embed_tokens is kept when its checkpoint has one that differs "
              "from the target's (vllm-project/vllm#28549), else the target's is shared",
              "the drafter's own lm_head is kept when present, else the target's is shared",
              _VEP.format(v="0.11.1", f="eagle.py") + " load_model (has_own_embed_tokens, "
              "has_own_lm_head); vllm 0.33.0 vllm/v1/spec_decode/llm_base_proposer.py "
              "_maybe_share_embeddings/_maybe_share_lm_head; vllm/model_executor/models/utils.py "
              "process_eagle_weight", runner="v1"),  # until 0.33.0: 0.34.0 has no V1 runner (rules.V1_REMOVED)
    EmbedRule("vllm", "0.17.1", None, "draft", "target", "draft", "target", "draft",
              "V2 runner: target embedding shared only when the drafter has none (or an "
              "identical one, 0.33.0; 0.34.0 keeps a quantized own copy, whose packed weight cannot be "
              "compared)", "V2 runner: target head shared only when the drafter "
              "has none", "vllm 0.17.1, 0.33.0, 0.34.0 vllm/v1/worker/gpu/spec_decode/eagle/utils.py "
              "load_eagle_model (0.34.0: _should_share, share_target_lm_head)", runner="v2"),
)


def embed_rule(engine: str, version: str | None = None, runner: str | None = None,
               model_type: str | None = None) -> EmbedRule:
    """The ``EmbedRule`` of ``engine`` at ``version`` (None: newest); vLLM runner None = v1 (v2 from 0.34.0,
    which has no V1 runner: ``rules.V1_REMOVED``).

    ``model_type`` is accepted for symmetry (the rule is the same for every drafter file).
    """
    eng = str(engine).strip().lower()
    if eng not in ENGINES:
        raise ForensicsError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if eng == "trtllm":
        return EmbedRule("trtllm", TRT_MAIN, None, "unknown", "unknown", "unknown", "unknown",
                         "unknown", "not read", "not read", "TensorRT-LLM not read")
    ver = str(parse_version(version or NEWEST[eng]))
    run = runner_or_default(ver, runner) if eng == "vllm" else None
    rows = [r for r in EMBED_RULES if r.engine == eng and (r.runner is None or r.runner == run)]
    row = row_at(rows, ver)
    if row is None and eng == "vllm" and run == "v2":
        raise ForensicsError(f"vLLM's V2 model runner has no EAGLE path before 0.17.1, not {ver}")
    if row is None:
        raise ForensicsError(f"{ENGINE_NAMES[eng]} {ver} is older than the embedding rules table")
    return row


# --- d2t -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class D2TRule:
    """The draft-to-target id map an engine expects, and what it does when ``d2t`` is missing.

    One row per engine: every release read gives the same answer, so the row holds from the first release read
    to the last (``read``; a release between two read is "not read", said by ``d2t_reading``)."""

    engine: str
    read: tuple[str, ...]  # every release read, oldest first
    convention: str  # "offsets": target = draft + d2t[draft]
    when_missing: str  # "identity": draft id i is served as target id i
    t2d_read: bool
    detail: str  # the rule in words, for the vocab-map finding's JSON
    source: str

    @property
    def since(self) -> str:
        return self.read[0]

    @property
    def until(self) -> str:
        return self.read[-1]

    def span(self) -> str:
        return release_span(self.since, self.until)

    @property
    def label(self) -> str:
        return f"{self.engine} d2t {self.span()}"


D2T_RULES: tuple[D2TRule, ...] = (
    D2TRule(
        "sglang", ("0.4.10", "0.5.4", "0.5.8", "0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.14", "0.5.17", "0.5.18",
                   "0.5.19", "0.5.20", "0.5.23"), "offsets", "identity", False,
        "d2t is read as offsets (hot_token_id = d2t + arange), t2d is skipped, with no d2t a draft id is used as the "
        "target id, and --speculative-token-map is ignored for EAGLE-3",
        "sglang 0.4.10, 0.5.4, 0.5.8, 0.5.9, 0.5.10, 0.5.11, 0.5.12, 0.5.14, 0.5.17, 0.5.18, 0.5.19, 0.5.20, 0.5.23 "
        "srt/models/llama_eagle3.py load_weights; sglang 0.4.10, 0.5.4, 0.5.8, 0.5.12 srt/speculative/eagle_worker.py "
        "EAGLEWorker.__init__; sglang 0.5.4, 0.5.14, 0.5.23 srt/speculative/eagle_worker_v2.py init_token_map, draft "
        "(hot_token_id[topk_index] only when a map is held)"),
    D2TRule(
        "vllm", ("0.9.2", "0.10.0", "0.10.1.1", "0.11.0", "0.11.1", "0.12.0", "0.14.0", "0.14.1", "0.25.0", "0.29.0",
                 "0.33.0", "0.34.0"), "offsets", "identity", False,
        "d2t is read into draft_id_to_target_id (compute_logits places draft id i at i + d2t[i]), t2d is skipped, "
        "and that buffer starts at zeros, so with no d2t draft id i is target id i",
        "vllm 0.9.2, 0.10.0, 0.10.1.1, 0.11.0, 0.11.1, 0.12.0, 0.14.0, 0.14.1, 0.25.0, 0.29.0, 0.33.0, 0.34.0 "
        "vllm/model_executor/models/llama_eagle3.py __init__, compute_logits, load_weights"),
)


def d2t_rule(engine: str, version: str | None = None) -> D2TRule | None:
    """The ``D2TRule`` of ``engine`` at ``version`` (the newest read when None); None for TensorRT-LLM (not read)
    and for a release outside the row."""
    eng = str(engine).strip().lower()
    if eng not in ENGINES:
        raise ForensicsError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if eng == "trtllm":
        return None
    return row_at([r for r in D2T_RULES if r.engine == eng], str(parse_version(version or NEWEST[eng])))


@dataclass(frozen=True)
class D2TReading:
    """What the vocab-map check may say of the engines: the rows that answer, and the release asked but not read."""

    rows: tuple[D2TRule, ...]
    release: str = ""  # the release the one row answers for
    assumed: bool = False  # that release is the newest read, assumed because none was given
    between: bool = False  # that release was not read, but releases read on both sides of it agree
    unread: str = ""  # "vLLM 0.35.0": a release outside the rows, or an engine with none; empty when answered

    def who(self, pin: str = "pass --engine-version or --log") -> str:
        """``SGLang 0.5.23``, or ``SGLang (0.4.10 - 0.5.23 read) and vLLM (0.9.2 - 0.34.0 read)``, for a message
        (``pin``: how to name the release, said when the newest read is assumed)."""
        if self.release:
            r = self.rows[0]
            note = (f" (the newest release read, assumed: {pin})" if self.assumed else
                    f" (not read; the releases read on both sides of it, {r.span()}, agree)" if self.between else "")
            return f"{ENGINE_NAMES[r.engine]} {self.release}{note}"
        return " and ".join(f"{ENGINE_NAMES[r.engine]} ({r.span()} read)" for r in self.rows)

    def source(self) -> str:
        return "; ".join(r.source for r in self.rows)


def d2t_reading(engine: str | None, version: str | None) -> D2TReading:
    """The row for ``engine`` at ``version`` (the newest read when none is given); with no engine, every engine's row.
    A release outside the rows, or an engine with none (TensorRT-LLM), is named in ``unread``, and the engine's row
    (every row for an engine with none) is given as what was read, not as its answer."""
    if engine is None:
        return D2TReading(D2T_RULES)
    rows = tuple(r for r in D2T_RULES if r.engine == engine)
    release = version or (NEWEST[engine] if rows else "")
    row = d2t_rule(engine, release) if rows else None
    if row is None:
        name = ENGINE_NAMES.get(engine, engine) + (f" {release}" if release else "")
        return D2TReading(rows or D2T_RULES, unread=name)
    read = {parse_version(v) for v in row.read}
    return D2TReading((row,), release=release, assumed=not version, between=parse_version(release) not in read)


def d2t_missing_consequence(engine: str, version: str | None, draft_vocab: int, vocab: int) -> str:
    """What ``engine`` serves when ``d2t`` is absent, for these vocabulary sizes."""
    rule = d2t_rule(engine, version)
    if rule is None:
        eng = str(engine).strip().lower()
        return ("not established for TensorRT-LLM (not read)" if eng == "trtllm" else
                f"not established for {ENGINE_NAMES[eng]} {version}: not read for this release")
    if draft_vocab >= vocab:
        return "nothing lost: the draft vocabulary is the target's, identity is right"
    return (f"{ENGINE_NAMES[rule.engine]} maps draft id i to target id i: every draft token "
            f"outside the first {draft_vocab} target ids is wrong and tokens above them are "
            f"never proposed ({rule.label})")


# --- trainers -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainerRule:
    """What one trainer writes into a drafter.

    ``embedding``: 'target-frozen' (copied from the target, not trained), 'not-exported'
    (the drafter carries none) ...; ``lm_head``: 'trained-from-scratch', 'target-frozen',
    'target-then-trained', or 'target-if-full-vocab' (ModelOpt copies the target head only
    when no reduced vocabulary is used). ``init_std``: std of a fresh normal init (None when
    not a normal init), ``init_note`` says how to recognise one.
    """

    trainer: str
    since: str
    until: str | None
    embedding: str
    lm_head: str
    d2t: str
    t2d: str
    default_draft_vocab: int | None
    init_std: float | None
    init_note: str
    norm_output: str
    source: str

    @property
    def label(self) -> str:
        return f"{self.trainer} {release_span(self.since, self.until)}"

    @property
    def head_is_target_copy(self) -> bool | None:
        """True when the head must equal the target's rows (a different head is a defect)."""
        return {"target-frozen": True, "trained-from-scratch": False,
                "target-then-trained": False}.get(self.lm_head)

    def fresh_row_norm(self, hidden_size: int) -> float | None:
        """Expected row norm of a freshly initialised (never loaded) embedding row: std*sqrt(H)."""
        return None if self.init_std is None else self.init_std * math.sqrt(hidden_size)


TRAINERS = ("specforge", "speculators", "modelopt", "eagle")
_SF = "specforge 0.2.0 specforge/"
_SP = "speculators {v} speculators/"
TRAINER_RULES: tuple[TrainerRule, ...] = (
    TrainerRule("specforge", "0.2.0", None, "target-frozen", "trained-from-scratch",
                "offsets (used_tokens[i] - i)", "bool mask over the target vocabulary",
                32000, 0.02, "transformers 5.8.1 (pinned) PreTrainedModel._init_weights: "
                "normal(0, initializer_range), LlamaConfig default 0.02, so a never-loaded row "
                "has norm ~0.02*sqrt(H); export refuses to write an embedding not copied",
                "true (default): head on norm(h), raw h fed back; false: head on raw h "
                "(before sgl-project/SpecForge#879)",
                _SF + "algorithms/model_providers.py build_eagle3_draft (load_embedding when "
                "model.load_target_embedding, default True; freeze_embedding); modeling/draft/"
                "llama3_eagle.py LlamaForCausalLMEagle3 (nn.Linear lm_head over draft_vocab_size, "
                "d2t zeros / t2d ones when not mapped); data/preprocessing.py "
                "process_token_dict_to_mappings; algorithms/eagle3/providers.py draft_vocab_size="
                "32000; export/to_hf.py export_to_hf"),
    TrainerRule("speculators", "0.3.0", "0.4.0", "target-frozen", "target-then-trained",
                "offsets", "bool mask", None, None, "embedding and head copied from the verifier "
                "at construction (embed frozen unless embed_requires_grad)",
                "true: norm(h) fed back (EAGLE-3.1); head always on norm(h)",
                _SP.format(v="0.3.0, 0.4.0") + "models/eagle3/core.py "
                "_setup_embeddings_and_lm_heads (lm_head = verifier rows at t2d, trainable)"),
    TrainerRule("speculators", "0.5.0", None, "target-frozen", "target-frozen",
                "offsets (selected_token_ids - arange)", "bool mask", None, None,
                "never-loaded embed/head are NaN (init constant_ nan), not random",
                "true: norm(h) fed back (EAGLE-3.1); head always on norm(h)",
                _SP.format(v="0.5.0, 0.9.0") + "model.py DraftVocabMixin._init_vocab / "
                "load_verifier_weights (lm_head = verifier head rows at t2d, requires_grad "
                "False); train/vocab_mapping.py build_vocab_mappings_from_distribution; "
                "train/config/schema.py draft_vocab_size default None (full vocabulary)"),
    TrainerRule("modelopt", "0.35.0", None, "not-exported", "target-if-full-vocab",
                "offsets (draft + d2t[draft])", "not written", None, None,
                "the drafter has no embedding (the base model's is used in training); its own "
                "lm_head exists only for a reduced vocabulary (or has_lm_head) and is a fresh "
                "nn.Linear trained from scratch",
                "not a ModelOpt key", "nvidia-modelopt 0.47.0 modelopt/torch/speculative/plugins/"
                "modeling_eagle.py EagleModule (lm_head only if draft_vocab_size != vocab_size or "
                "has_lm_head; d2t buffer), plugins/hf_eagle.py (arange + d2t; draft_vocab_size "
                "defaults to vocab_size), export/plugins/hf_spec_export.py _extract_state_dict "
                "(copies the base lm_head when the drafter has none; no embed_tokens, no t2d); "
                "0.35.0 plugins/transformers.py same EagleModule"),
    TrainerRule("eagle", "git-09fe6a0", None, "target-frozen", "trained-from-scratch",
                "offsets (used_tokens[i] - i)", "bool mask", 32000, 1.0,
                "with load_emb=False the embedding is a default nn.Embedding: N(0, 1), row norm "
                "~sqrt(H)", "not an EAGLE key (head on norm(h), raw h fed back)",
                "SafeAILab/EAGLE eagle/traineagle3/cnets.py Model.__init__ / scandata at commit "
                "09fe6a050421 (git, no EAGLE-3 release on PyPI); eagle/traineagle3/config.json "
                "draft_vocab_size 32000"),
)


def trainer_rule(trainer: str, version: str | None = None) -> TrainerRule:
    """The ``TrainerRule`` for ``trainer`` at ``version`` (None: the newest the table knows)."""
    key = str(trainer).strip().lower()
    rows = [r for r in TRAINER_RULES if r.trainer == key]
    if not rows:
        raise ForensicsError(f"unknown trainer {trainer!r}; choose one of {', '.join(TRAINERS)}")
    if version is None or key == "eagle":
        return max(rows, key=lambda r: parse_version(r.since) if key != "eagle" else 0)
    row = row_at(rows, str(parse_version(version)))
    if row is None:
        raise ForensicsError(f"{trainer} {version} is outside the versions the trainer table read "
                             f"({', '.join(r.label for r in rows)})")
    return row


def describe_embed_rules() -> list[dict]:
    """Every row of EMBED_RULES, D2T_RULES and TRAINER_RULES as plain dicts (``table`` says which)."""
    out: list[dict] = []
    for name, rows in (("embed", EMBED_RULES), ("d2t", D2T_RULES), ("trainer", TRAINER_RULES)):
        out += [{"table": name, "label": r.label, "since": r.since, "until": r.until, **asdict(r)} for r in rows]
    return out
