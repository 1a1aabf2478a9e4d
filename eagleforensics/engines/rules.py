"""Engine rules as data: which residual-stream position each serving engine captures per id.

Every engine reads a list of ``eagle_aux_hidden_state_layer_ids`` and captures residual-stream
states (``hidden_states + residual``); they disagree on what id ``k`` means. This module is the
single place those rules live: a table of frozen records (``RULES``, each with its source) and
the functions the matcher, the config audit and the docs call. Facts and sources are collected
in shared/reference/conventions.md; what was re-read in engine source for this module:

* SGLang ``models/llama.py`` (sgl-project/sglang, stored commits 0023954, bf7a0e2):
  ``set_eagle3_layers_to_capture`` stores ``[k + 1 for k in ids]``; the default
  ``[2, N//2, N-3]`` is stored unshifted. ``LlamaModel.forward`` checks ``i in
  layers_to_capture`` BEFORE layer i for i in ``range(start_layer, end_layer)``, appending
  ``hidden_states + residual``: index N is never reached (id N-1 captures nothing), and index
  0 (id -1) meets ``residual is None`` (an error in these versions; ``models/qwen3_vl.py``
  guards it, so the embedding may be reachable on some models -- unverified, treated as not).
* SGLang ``models/deepseek_v2.py`` (stored commit 3e4a39e, a pre-0.5.13 release): the same loop
  and an unconditional ``+1``. The >= 0.5.13 rule (``+1`` only when ``ids[0] == 1``, PR #25454)
  was seen only in an annotated copy of that file, not in sgl-project/sglang itself.
* SGLang ``models/gpt_oss.py`` (stored commit e914904) still has the unconditional ``+1``; the
  "p = k when max(ids) == N" rule comes from conventions.md only: UNVERIFIED.
* vLLM: ``EagleModelMixin._maybe_add_hidden_state`` (``model_executor/models/interfaces.py``)
  and its callers (docs.vllm.ai latest, ``ArceeModel.forward``) call it with index 0 before the
  first layer (residual None -> the embedding output) and with ``idx + 1`` after layer idx, so
  id k = p k, id 0 = embedding, id N = raw last-layer output. Older ``llama.py`` (stored commit
  e06c9ba) checked ``idx`` before layer idx with ``hidden_states + residual``: id 0 failed there
  and id N captured nothing. ``v1/worker/gpu_model_runner.py::_get_eagle3_aux_layers_from_config``
  reads the top-level key first, then ``eagle_config`` (some versions read only the top level).
* TensorRT-LLM ``_torch/speculative/eagle3.py`` (``Eagle3SpecMetadata.__post_init__``): ids are
  sorted, -1 moved last, default ``(1, N//2 - 1, N - 4)`` (ValueError when N <= 5);
  ``maybe_capture_hidden_states`` is called at the END of decoder layer k (models/modeling_*.py)
  with ``hidden_states + residual`` -> p = k + 1; ``SpecDecOneEngineForCausalLM.forward``
  (``models/modeling_speculative.py``, ``layer_idx = -1``) captures the model output, which is
  already normed -> -1 = post-norm final. ``llmapi/llm_args.py``: ``eagle3_layers_to_capture``
  is a ``Set[int]`` in ``speculative_config``.
* Every engine tests ``layer in <ids>`` once per layer, so duplicates add no state and the
  concatenation follows layer order (ascending), whatever order the list was written in.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Sequence

from ..errors import ForensicsError
from ..positions import Position, default_aux_positions

ENGINES = ("vllm", "sglang", "trtllm")
_FAMILY_OF_MODEL_TYPE = {
    "llama": "llama", "qwen2": "llama", "qwen3": "llama", "qwen3_moe": "llama", "mistral": "llama",
    "deepseek_v2": "deepseek", "deepseek_v3": "deepseek", "kimi_k2": "deepseek",
    "gpt_oss": "gpt_oss",
}
MODEL_TYPES = tuple(_FAMILY_OF_MODEL_TYPE)
_NESTED_KEY = "eagle_config.eagle_aux_hidden_state_layer_ids"
_TOP_KEY = "eagle_aux_hidden_state_layer_ids"
_YAML_KEY = "speculative_config.eagle3_layers_to_capture"


@dataclass(frozen=True)
class Target:
    """One engine convention: which engine/family/versions it covers and where ids are read."""

    label: str
    engine: str
    family: str
    min_version: str | None
    max_version: str | None  # inclusive
    description: str
    id_key: str


@dataclass(frozen=True)
class CaptureOutcome:
    """What one configured id makes the engine capture; ``position`` None when nothing usable."""

    id: int
    position: Position | None
    note: str | None = None


@dataclass(frozen=True)
class IdPlan:
    """The id list that captures given positions in order, or None with the reasons why not."""

    ids: list[int] | None
    reasons: list[str]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Rule:
    """One row of the rules table, for docs and reports; ``source`` says where it was read."""

    label: str
    engine: str
    family: str
    versions: str
    id_k_captures: str
    default: str
    id_key: str
    source: str
    unverified: str | None = None


VLLM = Target("vllm", "vllm", "any", "0.33", None,
              "vLLM (EagleModelMixin style): id k -> p=k; 0 = embedding, N = raw last layer",
              f"{_TOP_KEY} (top level), then {_NESTED_KEY}")
SGLANG = Target("sglang", "sglang", "llama", None, None,
                "SGLang Llama/Qwen family: id k -> p=k+1; p=0 and p=N unreachable", _NESTED_KEY)
SGLANG_DS_OLD = Target("sglang-deepseek<0.5.13", "sglang", "deepseek", "0.5.5", "0.5.12",
                       "SGLang DeepSeek-V2/V3/Kimi-K2 0.5.5-0.5.12: id k -> p=k+1 always", _NESTED_KEY)
SGLANG_DS_NEW = Target("sglang-deepseek>=0.5.13", "sglang", "deepseek", "0.5.13", None,
                       "SGLang DeepSeek-V2/V3/Kimi-K2 >= 0.5.13: p=k+1 if ids[0]==1 else p=k",
                       _NESTED_KEY)
SGLANG_GPT_OSS = Target("sglang-gpt-oss", "sglang", "gpt_oss", None, None,
                        "SGLang gpt-oss: p=k if max(ids)==N else p=k+1 (unverified)", _NESTED_KEY)
TRTLLM = Target("trtllm", "trtllm", "any", None, None,
                "TensorRT-LLM PyTorch backend: id k -> p=k+1; -1 = final state after the norm",
                f"YAML {_YAML_KEY}")

ENGINE_TARGETS: tuple[Target, ...] = (VLLM, SGLANG, SGLANG_DS_OLD, SGLANG_DS_NEW, TRTLLM)
ALL_TARGETS: tuple[Target, ...] = ENGINE_TARGETS + (SGLANG_GPT_OSS,)

_SGL_LOOP = ("sglang models/llama.py LlamaModel.forward: capture check before layer i, "
             "i in range(start_layer, end_layer)")
RULES: list[Rule] = [
    Rule("vllm", "vllm", "any", ">= 0.33", "p=k (0 = embedding, N = raw last layer, pre-norm)",
         "ids (2, N//2, N-3) = p [2, N//2, N-3]", VLLM.id_key,
         "vllm model_executor/models/interfaces.py EagleModelMixin._maybe_add_hidden_state; "
         "v1/worker/gpu_model_runner.py _get_eagle3_aux_layers_from_config; "
         "models/llama.py get_eagle3_aux_hidden_state_layers",
         "id 0 = embedding read from the mixin's callers in the vLLM docs, not in llama.py "
         "itself; older llama.py failed on id 0 and ignored id N"),
    Rule("sglang", "sglang", "llama", "all", "p=k+1; id N-1 (p=N) captures nothing; id -1 fails",
         "layers_to_capture [2, N//2, N-3] unshifted = p [2, N//2, N-3]", SGLANG.id_key,
         "sglang models/llama.py set_eagle3_layers_to_capture; " + _SGL_LOOP +
         "; layers/logits_processor.py _check_aux_hidden_states (comment, per conventions.md); "
         "spec_aux_hidden_state.py _resolve_eagle_aux_hidden_state (nested key, conventions.md)"),
    Rule("sglang-deepseek<0.5.13", "sglang", "deepseek", "0.5.5 - 0.5.12", "p=k+1 always",
         "p [2, N//2, N-3]", SGLANG_DS_OLD.id_key,
         "sglang models/deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture "
         "(unconditional +1), DeepseekV2Model.forward (same capture loop)"),
    Rule("sglang-deepseek>=0.5.13", "sglang", "deepseek", ">= 0.5.13",
         "p=k+1 if ids[0]==1 else p=k", "p [2, N//2, N-3]", SGLANG_DS_NEW.id_key,
         "sglang PR #25454, models/deepseek_v2.py set_eagle3_layers_to_capture",
         "seen in an annotated copy of deepseek_v2.py, not in sgl-project/sglang's stored file"),
    Rule("sglang-gpt-oss", "sglang", "gpt_oss", "unknown", "p=k if max(ids)==N else p=k+1",
         "p [2, N//2, N-3]", SGLANG_GPT_OSS.id_key, "shared/reference/conventions.md",
         "stored sglang models/gpt_oss.py (e914904) has the unconditional +1; "
         "the max(ids)==N rule and capture of p=N are unverified"),
    Rule("trtllm", "trtllm", "any", "PyTorch backend", "p=k+1; -1 = final state after the norm",
         "ids {1, N//2-1, N-4} = p [2, N//2, N-3] (N <= 5: error)", TRTLLM.id_key,
         "tensorrt_llm _torch/speculative/eagle3.py Eagle3SpecMetadata.__post_init__ and "
         "maybe_capture_hidden_states; _torch/models/modeling_speculative.py "
         "SpecDecOneEngineForCausalLM.forward (layer_idx -1); llmapi/llm_args.py"),
]
_RULE_BY_LABEL = {r.label: r for r in RULES}


def describe_rules() -> list[dict]:
    """The rules table as plain dicts, for docs and reports."""
    return [asdict(r) for r in RULES]


def rule_for(target: Target) -> Rule:
    """The rules-table row behind ``target``."""
    return _RULE_BY_LABEL[target.label]


def parse_version(version: str) -> tuple[int, ...]:
    """'0.5.13rc1' -> (0, 5, 13): leading numeric parts only, no packaging dependency."""
    parts: list[int] = []
    for chunk in str(version).strip().lstrip("vV").split("."):
        m = re.match(r"\d+", chunk)
        if m is None:
            break
        parts.append(int(m.group()))
        if m.end() != len(chunk):
            break
    if not parts:
        raise ForensicsError(f"version {version!r} is not of the form X.Y.Z")
    return tuple(parts)


def _version_lt(a: str, b: str) -> bool:
    va, vb = parse_version(a), parse_version(b)
    width = max(len(va), len(vb))
    return va + (0,) * (width - len(va)) < vb + (0,) * (width - len(vb))


def family_of(model_type: str | None) -> str:
    """Map an HF ``model_type`` to a rule family (llama, deepseek, gpt_oss)."""
    if model_type is None:
        return "llama"
    key = str(model_type).strip().lower()
    if key not in _FAMILY_OF_MODEL_TYPE:
        raise ForensicsError(
            f"unknown model_type {model_type!r}; known: {', '.join(MODEL_TYPES)}")
    return _FAMILY_OF_MODEL_TYPE[key]


def resolve_target(engine: str, model_type: str | None = None, version: str | None = None) -> Target:
    """The convention ``engine`` applies to ``model_type`` at ``version`` (None: newest known)."""
    eng = str(engine).strip().lower()
    if eng not in ENGINES:
        raise ForensicsError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    family = family_of(model_type)
    if version is not None:
        parse_version(version)  # reject junk early, whatever the engine
    if eng == "vllm":
        return VLLM
    if eng == "trtllm":
        return TRTLLM
    if family == "deepseek":
        if version is not None and _version_lt(version, SGLANG_DS_NEW.min_version or "0"):
            return SGLANG_DS_OLD
        return SGLANG_DS_NEW
    return SGLANG_GPT_OSS if family == "gpt_oss" else SGLANG


def _check_layers(num_layers: int) -> int:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ForensicsError(f"num_layers must be a positive integer, got {num_layers!r}")
    return num_layers


def _check_ints(values: Sequence[int], what: str) -> list[int]:
    out = list(values)
    if any(isinstance(v, bool) or not isinstance(v, int) for v in out):
        raise ForensicsError(f"{what} must be a list of integers, got {out!r}")
    return out


def _sglang_shift(target: Target, ids: Sequence[int], n: int) -> int:
    """How much SGLang adds to every id for this list (the rule can depend on the whole list)."""
    if target is SGLANG_DS_NEW:
        return 1 if ids and ids[0] == 1 else 0
    if target is SGLANG_GPT_OSS:
        return 0 if ids and max(ids) == n else 1
    return 1


def _sglang_outcome(k: int, p: int, n: int, shift: int) -> CaptureOutcome:
    if p == 0:
        return CaptureOutcome(k, None, (
            "layer index 0 is checked before the first layer, where SGLang's residual is still "
            "None (llama.py/deepseek_v2.py add hidden_states + residual): no usable embedding "
            "capture (some models guard it; unverified)"))
    if p == n and shift == 1:
        return CaptureOutcome(k, None, (
            f"id {k} asks for layer index {n}, which SGLang's capture loop (layers 0..{n - 1}) "
            "never reaches: captures nothing (layers/logits_processor.py::_check_aux_hidden_states)"))
    if p == n:
        return CaptureOutcome(k, Position(n), "raw last-layer output via max(ids)==N (unverified)")
    if not 0 < p < n:
        return CaptureOutcome(k, None, f"id {k} is outside 0..{n - 1 - shift}: captures nothing")
    return CaptureOutcome(k, Position(p))


def _one_outcome(target: Target, k: int, n: int, shift: int) -> CaptureOutcome:
    if target.engine == "vllm":
        if 0 <= k <= n:
            note = ("embedding output (captured before the first layer)" if k == 0 else
                    "raw last-layer output, before the final norm" if k == n else None)
            return CaptureOutcome(k, Position(k), note)
        return CaptureOutcome(k, None, f"id {k} is outside 0..{n}: vLLM never matches it")
    if target.engine == "trtllm":
        if k == -1:
            return CaptureOutcome(k, Position(n, normed=True),
                                  "-1 = final state after the norm, always concatenated last")
        if 0 <= k < n:
            note = "raw last-layer output, before the final norm" if k == n - 1 else None
            return CaptureOutcome(k, Position(k + 1), note)
        return CaptureOutcome(k, None, f"id {k} is outside -1..{n - 1}: TRT-LLM never matches it")
    return _sglang_outcome(k, k + shift, n, shift)


def positions_for_ids(target: Target, ids: Sequence[int], num_layers: int) -> list[CaptureOutcome]:
    """What ``target`` captures for each id, in the order given (duplicates capture once)."""
    n = _check_layers(num_layers)
    id_list = _check_ints(ids, "ids")
    shift = _sglang_shift(target, id_list, n) if target.engine == "sglang" else 0
    seen: set[int] = set()
    out: list[CaptureOutcome] = []
    for k in id_list:
        if k in seen:
            out.append(CaptureOutcome(k, None, f"duplicate id {k}: the layer is captured once"))
            continue
        seen.add(k)
        out.append(_one_outcome(target, k, n, shift))
    return out


def concat_order(outcomes: Sequence[CaptureOutcome]) -> list[Position]:
    """The captured positions in the order the engine concatenates them: by layer, post-norm last."""
    return sorted({o.position for o in outcomes if o.position is not None},
                  key=lambda q: (q.normed, q.p))


def default_ids(target: Target, num_layers: int) -> list[int]:
    """Ids, in ``target``'s own convention, equal to what the engine does when none are set.

    vLLM: (2, N//2, N-3). TRT-LLM: (1, N//2-1, N-4). SGLang assigns its literal default
    [2, N//2, N-3] to ``layers_to_capture`` unshifted, which in SGLang's id convention is
    [1, N//2-1, N-4]. All three capture positions [2, N//2, N-3].
    """
    n = _check_layers(num_layers)
    if target.engine == "trtllm" and n <= 5:
        raise ForensicsError(f"TensorRT-LLM has no default capture for {n} layers (needs N > 5)")
    positions = default_aux_positions(n)
    return positions if target.engine == "vllm" else [p - 1 for p in positions]


def _order_reasons(pos: list[int], n: int) -> list[str]:
    reasons: list[str] = []
    bad = [p for p in pos if not 0 <= p <= n]
    if bad:
        reasons.append(f"positions {bad} are outside 0..{n} for a {n}-layer model")
    if len(set(pos)) != len(pos):
        reasons.append(f"duplicate positions in {pos}: every engine captures each layer once")
    if any(a > b for a, b in zip(pos, pos[1:])):
        reasons.append(
            f"positions {pos} are not in ascending order: every engine concatenates captured "
            "states in ascending layer order (SGLang's layer loop, vLLM's layer loop over its "
            "id tuple, TRT-LLM's sorted ids), so no id list reproduces this slot order; "
            "reorder the training slots or retrain")
    return reasons


def _engine_reasons(target: Target, pos: list[int], n: int) -> list[str]:
    reasons: list[str] = []
    if 0 in pos and target.engine != "vllm":
        how = ("TRT-LLM captures only at the end of a decoder layer (id k -> p=k+1) or the "
               "post-norm final (-1)") if target.engine == "trtllm" else (
               "SGLang would need id -1 (layer index 0), where the residual is still None")
        reasons.append(f"the embedding output (p=0) cannot be captured: {how}")
    if n in pos and target.engine == "sglang" and target is not SGLANG_GPT_OSS:
        reasons.append(
            f"p={n} (last layer output) cannot be captured by {target.label}: it needs layer "
            f"index {n}, which the capture loop over layers 0..{n - 1} never reaches")
    if target is SGLANG_DS_NEW and pos and pos[0] == 1:
        reasons.append(
            "no id list captures p=1 first on SGLang DeepSeek >= 0.5.13: ids starting with 1 "
            "get +1 (p=2 first) and ids starting with 0 are taken verbatim (p=0 first)")
    return reasons


def ids_for_positions(target: Target, positions: Sequence[int], num_layers: int) -> IdPlan:
    """The id list making ``target`` capture exactly ``positions`` in this order, or why none does."""
    n = _check_layers(num_layers)
    pos = _check_ints(positions, "positions")
    reasons = _order_reasons(pos, n) + _engine_reasons(target, pos, n)
    if not pos:
        reasons.append("no positions given")
    if reasons:
        return IdPlan(None, reasons)
    notes: list[str] = []
    if target.engine == "vllm":
        ids = list(pos)
    elif target is SGLANG_DS_NEW and pos[0] != 2:
        ids = list(pos)  # taken verbatim because ids[0] != 1
        notes.append(f"ids mean p=k only on SGLang >= 0.5.13; 0.5.5-0.5.12 would capture "
                     f"{[p + 1 for p in pos]}")
    elif target is SGLANG_GPT_OSS and n in pos:
        ids = list(pos)  # verbatim because max(ids) == N (unverified rule)
        notes.append("relies on the unverified gpt-oss rule p=k when max(ids)==N")
    else:
        ids = [p - 1 for p in pos]
        if target.family == "deepseek" and ids[0] == 1:
            notes.append("ids start with 1, so they mean the same on SGLang 0.5.5-0.5.12 "
                         "and >= 0.5.13")
        elif target.family == "deepseek":
            notes.append(f"on SGLang >= 0.5.13 these ids would be taken verbatim (p={ids})")
    got = [o.position.p if o.position is not None and not o.position.normed else None
           for o in positions_for_ids(target, ids, n)]
    if got != pos:  # the rules above and positions_for_ids must agree
        return IdPlan(None, [f"internal: ids {ids} would capture {got}, not {pos}"])
    return IdPlan(ids, [], notes)


def trainer_final_expectation(trainer: str) -> str:
    """Which kind of final state a trainer's loss expects: post-norm or raw (pre-norm)."""
    key = str(trainer).strip().lower()
    if key == "specforge":
        return ("post-norm: SpecForge applies only lm_head to the stored final state, so it "
                "expects the state after the final norm (shared/reference/conventions.md; "
                "SpecForge source not re-read)")
    if key == "speculators":
        return ("raw/pre-norm: speculators computes targets as verifier_lm_head(verifier_norm("
                "verifier_last_hidden_states)), so it expects the last layer output before "
                "the norm (vllm-project/speculators models/eagle3 core forward)")
    raise ForensicsError(f"unknown trainer {trainer!r}; choose specforge or speculators")
