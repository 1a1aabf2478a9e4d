"""Which drafter features each engine version honours, ignores or refuses, and the queries on them.

A drafter can carry features beyond the plain EAGLE-3 layer (a norm before ``fc``, per-state
``fc_norm``, post-norm feedback, its own embedding or head, more layers, a sliding window, a
Qwen3 attention with q/k norms, ...). An engine release that does not implement one either
*ignores* it (loads, runs, silently serves another function than the one trained), *refuses*
it (an error at load) or *honours* it. ``FLAG_RULES`` (in ``flagtable``) holds one row per (engine, feature,
version range, drafter model file, config layout), each citing the wheel version and file it
was read from (``pip download --no-deps``; every SGLang release 0.4.10 - 0.5.23 and every vLLM
release 0.10.1.1 - 0.33.0 was unpacked and the boundary releases read; 0.34.0 read for every row reaching 0.33.0).

* ``drafter_features(config, tensor_names)``: the features a drafter uses, from its config.json
  and the tensor names in its safetensors headers. The names are a contract shared with
  ``replay``'s "as served" variant: see ``FEATURES``.
* ``ignored_features(engine, version, runner, features, model_type=None, layout=None)``: one
  ``FlagRuling`` per feature (status honoured / ignored / refused / unknown, what it does to
  the served drafter, the source).

Whose embedding and head an engine uses (``own_embedding`` / ``own_lm_head``) is answered from
``embedrules.EMBED_RULES``; whether ``use_aux_hidden_state: false`` is read, from
``rules.KEY_RULES``: one fact, one table. TensorRT-LLM was not read: every row says unknown.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ForensicsError
from .embedrules import embed_rule
from .flagtable import ARCHS, FLAG_RULES, LAYOUTS, STATUSES, FlagRow
from .rules import (
    ENGINE_NAMES,
    ENGINES,
    KEY_RULES,
    NEWEST,
    RUNNERS,
    TRT_MAIN,
    check_vllm_runner,
    default_runner,
    parse_version,
    row_at,
)

__all__ = ["ARCHS", "FEATURES", "FLAG_RULES", "LAYOUTS", "STATUSES", "FlagRow", "FlagRuling",
           "NormOutputMeaning", "describe_flag_rules", "drafter_arch", "drafter_features",
           "drafter_layout", "ignored_features", "norm_output_meaning"]

# The feature names (shared with replay's "as served" wiring) and what each means.
FEATURES: dict[str, str] = {
    "norm_before_fc": "one RMSNorm (input_norm) over the concatenated aux states before fc",
    "fc_norm": "one RMSNorm per aux state (fc_norm.i) before fc (EAGLE-3.1)",
    "norm_output": "the post-norm state norm(h) is fed to the next draft step (EAGLE-3.1 "
                   "meaning of the key; see norm_output_meaning for SpecForge <= 0.2.0)",
    "norm_before_residual": "the residual is hidden_norm(fc output), not the raw fc output",
    "own_embedding": "the drafter ships its own embed_tokens",
    "own_lm_head": "the drafter ships its own lm_head",
    "extra_layers": "more than one decoder layer (num_hidden_layers > 1)",
    "sliding_window": "sliding-window attention in the drafter (layer_types sliding_attention)",
    "aux_hidden_state_off": "eagle_config.use_aux_hidden_state false (no aux states, no fc)",
    "qk_norm": "Qwen3-style attention with q_norm / k_norm",
}

_FC_NORM = re.compile(r"(^|\.)(fc_norm\.\d+|aux_norm_(low|mid|high))\.weight$")
_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")


# --- what a drafter uses ------------------------------------------------------------------------

def drafter_layout(config: Mapping[str, Any]) -> str:
    """'speculators' for a speculators config (nested ``transformer_layer_config``), else 'flat'."""
    _check_config(config)
    if "transformer_layer_config" in config or config.get("speculators_model_type") is not None:
        return "speculators"
    return "flat"


def _inner(config: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = config.get("transformer_layer_config")
    return inner if isinstance(inner, Mapping) else config


def drafter_arch(config: Mapping[str, Any]) -> str:
    """Which drafter model file engines build: 'llama', 'qwen3' or 'deepseek'.

    Engines pick the file by architecture name (vLLM turns ``X`` into ``Eagle3X``;
    speculators configs by ``transformer_layer_config.model_type`` from vLLM 0.24.0).
    """
    _check_config(config)
    archs = [str(a) for a in config.get("architectures") or [] if isinstance(a, str)]
    inner_type = str(_inner(config).get("model_type", "")).lower()
    if any("Deepseek" in a or "Kimi" in a for a in archs) or inner_type in (
            "deepseek_v2", "deepseek_v3", "kimi_k2"):
        return "deepseek"
    qwen3_names = {"Qwen3ForCausalLM", "Eagle3Qwen3ForCausalLM", "PeagleQwen3ForCausalLM"}
    if any(a in qwen3_names for a in archs) or (
            drafter_layout(config) == "speculators" and inner_type == "qwen3"):
        return "qwen3"
    return "llama"


def _flag(config: Mapping[str, Any], key: str) -> Any:
    nested = config.get("eagle_config")
    if isinstance(nested, Mapping) and key in nested:
        return nested[key]
    return config.get(key)


def drafter_features(config: dict, tensor_names: set[str]) -> set[str]:
    """The ``FEATURES`` this drafter uses, read from its config.json and its tensor names.

    A feature counts when its config switch is on or its tensors are present (a norm whose
    weights ship without the switch is still trained into the drafter).
    """
    _check_config(config)
    if not isinstance(tensor_names, (set, frozenset)) or any(
            not isinstance(n, str) for n in tensor_names):
        raise ForensicsError("tensor_names must be a set of tensor name strings")
    inner = _inner(config)
    names = {n for n in tensor_names if not n.startswith(("verifier", "model.verifier"))}
    out: set[str] = set()
    if _flag(config, "norm_before_fc") is True or any(
            n in ("input_norm.weight", "model.input_norm.weight") for n in names):
        out.add("norm_before_fc")
    if _flag(config, "fc_norm") is True or _flag(config, "use_aux_norm") is True or any(
            _FC_NORM.search(n) for n in names):
        out.add("fc_norm")
    if _flag(config, "norm_output") is True:
        out.add("norm_output")
    if _flag(config, "norm_before_residual") is True:
        out.add("norm_before_residual")
    if any(n in ("embed_tokens.weight", "model.embed_tokens.weight") for n in names):
        out.add("own_embedding")
    if "lm_head.weight" in names:
        out.add("own_lm_head")
    layers = inner.get("num_hidden_layers", 1)
    if (isinstance(layers, int) and not isinstance(layers, bool) and layers > 1) or any(
            (m := _LAYER.search(n)) and int(m.group(2)) > 0 for n in names):
        out.add("extra_layers")
    types = inner.get("layer_types")
    if (isinstance(types, list) and "sliding_attention" in types) or inner.get(
            "use_sliding_window") is True:
        out.add("sliding_window")
    if _flag(config, "use_aux_hidden_state") is False:
        out.add("aux_hidden_state_off")
    if any(n.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")) for n in names) or (
            not names and str(inner.get("model_type", "")).lower() == "qwen3"):
        out.add("qk_norm")
    return out


@dataclass(frozen=True)
class NormOutputMeaning:
    """What ``norm_output`` in this config means to the engines and to the trainer that wrote it."""

    value: bool | None  # the key as written (None: absent)
    engines: str  # what SGLang >= 0.5.12 / vLLM >= 0.22.0 (flat) do with it
    trainer: str  # what the writer meant, as far as the layout tells
    ambiguous: bool  # True when a SpecForge <= 0.2.0 writer meant something else
    source: str


def norm_output_meaning(config: Mapping[str, Any]) -> NormOutputMeaning:
    """Read ``norm_output`` the way engines do, and say where a SpecForge <= 0.2.0 writer differs.

    Engines (and speculators, and SpecForge after sgl-project/SpecForge#879) read ``true`` as
    "feed norm(h) to the next step" and always put the final norm before the head. SpecForge
    0.2.0 read the same key as "norm before lm_head" (default true), feeding the raw state back.
    """
    _check_config(config)
    value = config.get("norm_output")
    value = value if isinstance(value, bool) else None
    src = ("specforge 0.2.0 specforge/modeling/draft/llama3_eagle.py compute_logits (norm_output "
           "default True: head on norm(h), raw h fed back; False: head on raw h); speculators "
           "0.9.0 speculators/models/eagle3/config.py norm_output (post-norm feedback); "
           "sgl-project/SpecForge#879 aligned SpecForge to the engines' meaning after 0.2.0")
    engines = ("norm(h) fed back to the next draft step; head reads norm(h)" if value else
               "raw h fed back; head reads norm(h) (the EAGLE-3 default)")
    if drafter_layout(config) == "speculators" or value is None:
        return NormOutputMeaning(value, engines, engines, False, src)
    if value:
        trainer = ("EAGLE-3.1 post-norm feedback, or (SpecForge <= 0.2.0) only 'norm before the "
                   "head' with the raw state fed back: engines that honour the key then feed "
                   "back a state the drafter never saw")
    else:
        trainer = ("the EAGLE-3 default, or (SpecForge <= 0.2.0) 'lm_head reads the raw state': "
                   "every engine puts the norm before the head")
    return NormOutputMeaning(value, engines, trainer, True, src)


@dataclass(frozen=True)
class FlagRuling:
    """One feature on one engine version: status, what it does to the served drafter, source."""

    feature: str
    status: str
    consequence: str
    source: str
    rule: str = ""  # the row label (or the table the answer came from)

    def to_dict(self) -> dict[str, str]:
        """Plain, JSON-ready dict."""
        return asdict(self)


def describe_flag_rules() -> list[dict]:
    """Every FLAG_RULES row as a plain dict with its label (for docs and reports)."""
    return [{"label": r.label, **asdict(r)} for r in FLAG_RULES]


# --- queries ------------------------------------------------------------------------------------

def _check_config(config: Any) -> None:
    if not isinstance(config, Mapping):
        raise ForensicsError(f"a drafter config must be a JSON object, got {type(config).__name__}")


def _arch_of(model_type: str | None) -> str:
    if model_type is None:
        return "llama"
    key = str(model_type).strip().lower()
    if key in ARCHS:
        return key
    if key in ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25"):
        return "deepseek"
    return "llama"


def _row_for(engine: str, feature: str, version: str, arch: str, layout: str) -> FlagRow | None:
    rows = [r for r in FLAG_RULES if r.engine == engine and r.arch in (arch, None)
            and (r.layout is None or r.layout == layout)]
    blanket = row_at([r for r in rows if r.feature == "*"], version)
    if blanket is not None:  # the engine cannot load this drafter at all
        return blanket
    own = [r for r in rows if r.feature == feature]
    return row_at([r for r in own if r.arch == arch], version) or row_at(
        [r for r in own if r.arch is None], version)


def _vllm_qwen3_file(version: str) -> bool:
    return parse_version(version) >= parse_version("0.24.0")


def _one(engine: str, version: str, runner: str | None, feature: str, arch: str,
         layout: str) -> FlagRuling:
    name = ENGINE_NAMES[engine]
    if engine == "trtllm":
        return FlagRuling(feature, "unknown", "TensorRT-LLM's drafter code was not read for this "
                          "table", "not read (TensorRT-LLM main source; no wheel read)", "trtllm")
    if feature == "own_embedding":
        rule = embed_rule(engine, version, runner, arch)
        used = rule.embedding_used(has_own=True)
        status = "honoured" if used == "draft" else "ignored"
        return FlagRuling(feature, status, f"{name} {version} uses the {used}'s embedding when "
                          f"the drafter ships one ({rule.embed_note})", rule.source, rule.label)
    if feature == "own_lm_head":
        rule = embed_rule(engine, version, runner, arch)
        used = rule.lm_head_used(has_own=True)
        status = "honoured" if used == "draft" else "ignored"
        return FlagRuling(feature, status, f"{name} {version} uses the {used}'s lm_head when the "
                          f"drafter ships one ({rule.head_note})", rule.source, rule.label)
    if feature == "aux_hidden_state_off":
        return _aux_off(engine, version, runner)
    use_arch = arch
    note = ""
    if engine == "vllm" and arch == "qwen3" and not _vllm_qwen3_file(version):
        use_arch, note = "llama", " (before 0.24.0 vLLM builds a Qwen3-arch drafter as Llama)"
    if engine == "sglang" and arch == "qwen3":
        use_arch, note = "llama", " (SGLang has no Qwen3 EAGLE-3 file: built as Llama)"
    row = _row_for(engine, feature, version, use_arch, layout)
    if row is None:
        return FlagRuling(feature, "unknown", f"not established for {name} {version} "
                          f"({use_arch} drafter file)" + note, "no row", "")
    return FlagRuling(feature, row.status, row.consequence + note, row.source, row.label)


def _aux_off(engine: str, version: str, runner: str | None) -> FlagRuling:
    rows = [k for k in KEY_RULES if k.engine == engine and (engine != "vllm" or k.runner == runner)]
    row = row_at(rows, version)
    if row is None:
        return FlagRuling("aux_hidden_state_off", "unknown", "no key rule for this runner/version",
                          "rules.KEY_RULES", "")
    if row.use_aux_off:
        return FlagRuling("aux_hidden_state_off", "honoured", "aux capture switched off; the "
                          "drafter is fed the final state only", row.source, row.label)
    return FlagRuling("aux_hidden_state_off", "ignored", "use_aux_hidden_state is not read: the "
                      "engine still captures and feeds the aux states", row.source, row.label)


def ignored_features(engine: str, version: str, runner: str | None, features: Iterable[str],
                     model_type: str | None = None, layout: str | None = None
                     ) -> list[FlagRuling]:
    """One ``FlagRuling`` per feature (sorted by name) for ``engine`` at ``version``.

    ``runner``: vLLM 'v1'/'v2' (used for aux_hidden_state_off and whose head/embedding; None
    takes the runner a plain ``vllm serve`` of a Llama target picks, and says so); ``model_type``: the drafter's file (llama, qwen3, deepseek or an HF model_type;
    None: llama); ``layout``: 'flat' or 'speculators' (``drafter_layout``; None: the flat
    layout is assumed where the two differ, and the consequence says so and gives the other).
    """
    eng = str(engine).strip().lower()
    if eng not in ENGINES:
        raise ForensicsError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    feats = sorted(set(features))
    bad = [f for f in feats if f not in FEATURES]
    if bad:
        raise ForensicsError(f"unknown drafter feature(s) {bad}; known: {', '.join(FEATURES)}")
    if runner is not None and (eng != "vllm" or runner not in RUNNERS):
        raise ForensicsError(f"runner {runner!r} applies to vLLM only (v1 or v2)")
    if layout is not None and layout not in LAYOUTS:
        raise ForensicsError(f"unknown config layout {layout!r}; choose flat or speculators")
    ver = TRT_MAIN if eng == "trtllm" else str(parse_version(version or NEWEST[eng]))
    run, assumed = (runner, False) if eng == "vllm" else (None, False)
    if eng == "vllm" and runner is None:
        run, assumed = default_runner(ver, None)[0], True
    elif eng == "vllm":
        check_vllm_runner(ver, runner)
    arch = _arch_of(model_type)
    out: list[FlagRuling] = []
    for f in feats:
        if layout is not None:
            out.append(_note_runner(_one(eng, ver, run, f, arch, layout), assumed, run))
            continue
        a, b = (_one(eng, ver, run, f, arch, lay) for lay in LAYOUTS)
        if (a.status, a.source) == (b.status, b.source):
            out.append(a)
        else:  # assume the flat layout every engine reads natively, and say so
            out.append(FlagRuling(f, a.status, f"{a.consequence} [flat config layout assumed; "
                                  f"a speculators config: {b.status}, {b.consequence}]",
                                  a.source, a.rule))
        out[-1] = _note_runner(out[-1], assumed, run)
    return out


_RUNNER_FEATURES = ("own_embedding", "own_lm_head", "aux_hidden_state_off")


def _note_runner(ruling: FlagRuling, assumed: bool, runner: str | None) -> FlagRuling:
    """Say when the vLLM runner was assumed for a feature whose answer depends on it."""
    if not assumed or ruling.feature not in _RUNNER_FEATURES:
        return ruling
    return FlagRuling(ruling.feature, ruling.status, f"{ruling.consequence} [vLLM runner not "
                      f"given: {runner}, the one a plain `vllm serve` of a Llama target picks, "
                      "was assumed]", ruling.source, ruling.rule)
