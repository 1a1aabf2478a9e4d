"""RoPE and context length: the draft's rotary settings against the target's, its max positions against the served length.

``rope-mismatch`` (warning): the draft's ``rope_theta``, rope type, scaling factor or original max
positions differ from the target's (a converter that drops ``rope_scaling``, a YaRN target whose
drafter falls back to llama3 or default, a theta read from the wrong key under transformers 5:
NVIDIA-NeMo/Automodel#2399, wejoncy/sfllm#32, sgl-project/sglang#6783). Trainers that build the
draft config from the target's (SpecForge, speculators) write the target's RoPE, so a difference is
an export or conversion mistake, and its cost grows with the position.
``max-positions-short``: the draft's ``max_position_embeddings`` is below the served length (the
``--served-len``, the log's, else the target's own ``max_position_embeddings``, the engines' default
context length). What it costs depends on the engine (``engine_rope_rule``): an engine that applies
the draft's value clamps or wraps the drafter's positions past it, and acceptance falls with context
(2.3 at 2k to 1.08 at 20k in vllm-project/speculators#684; NVIDIA-NeMo/RL#3960).
Config keys read: transformers 4 (``rope_theta``, ``rope_scaling``) and 5 (``rope_parameters``).
"""
from __future__ import annotations

import math
from typing import Any

from ..io.modeldir import text_config
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .drafterfacts import draft_facts, positive_int, target_facts
from .registry import register

ROPE_SOURCE = "NVIDIA-NeMo/Automodel#2399, wejoncy/sfllm#32, sgl-project/sglang#6783 (docs/causes.md row 7)"
MAXPOS_SOURCE = "vllm-project/speculators#684, NVIDIA-NeMo/RL#3960, vllm-project/speculators#574 (catalogue row 7)"
# the scaling fields that change the rotary frequencies, by name as transformers writes them
SCALING_FIELDS = ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor", "beta_fast",
                  "beta_slow", "mscale", "mscale_all_dim", "attention_factor")
DEFAULT_THETA = 10000.0


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else None


def rope_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rotary settings of a (text) config, normalised: ``theta``, ``type`` and the scaling fields present."""
    params = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling")
    theta = _number(cfg.get("rope_theta"))
    out: dict[str, Any] = {}
    source: dict[str, Any] = {}
    if isinstance(scaling, dict):  # transformers 4
        source = dict(scaling)
    if isinstance(params, dict):  # transformers 5: theta and scaling in one object, which wins
        theta = _number(params.get("rope_theta")) or theta
        source = {**source, **params}
    kind = source.get("rope_type", source.get("type", "default"))
    out["theta"] = theta if theta is not None else DEFAULT_THETA
    out["type"] = kind if isinstance(kind, str) else "default"
    if out["type"] != "default":
        for key in SCALING_FIELDS:
            value = _number(source.get(key))
            if value is not None:
                out[key] = value
    return out


def _differ(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) > 1e-6 * max(abs(a), abs(b), 1.0)
    return a != b


def rope_differences(draft: dict[str, Any], target: dict[str, Any]) -> list[str]:
    """One phrase per rotary setting that differs (a field only one side states counts when it changes frequencies)."""
    out = []
    for key in ("theta", "type", *SCALING_FIELDS):
        a, b = draft.get(key), target.get(key)
        if a is None and b is None:
            continue
        if key in SCALING_FIELDS and (a is None or b is None) and draft.get("type") != target.get("type"):
            continue  # the type differs: said once, not once per field
        if a is None or b is None or _differ(a, b):
            name = {"theta": "rope_theta", "type": "rope type"}.get(key, key)
            out.append(f"{name} {_show(a)} against the target's {_show(b)}")
    return out


def _show(v: Any) -> str:
    if v is None:
        return "unset"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def served_length(art: Artifacts) -> tuple[int | None, str]:
    """The served context length and where it came from: --served-len / the log, else the target's max positions."""
    if art.served_len is not None:
        return art.served_len, "served length" if art.inputs.served_len is not None else "served context length (the log)"
    if art.available("target"):
        n = target_facts(art.target.config).max_positions
        if n is not None:
            return n, "target's max_position_embeddings"
    return None, ""


_DEFAULT_HINT = {"target's max_position_embeddings": " (the engines' default context length; --served-len says yours)"}


def engine_rope_rule(art: Artifacts) -> tuple[str, str, str]:
    """What the served engine does with a draft's max positions below the served length.

    ``(effect, text, source)``: effect ``applies`` (the draft's value limits the drafter's positions),
    ``raises`` (the engine lifts it to the served length), or ``unknown``.
    """
    from .engineembed import draft_max_positions_rule

    return draft_max_positions_rule(art)


def check_rope(art: Artifacts) -> tuple[list[Finding], str, dict[str, Any]]:
    d = draft_facts(art.draft_config)
    draft, target = rope_of(d.layer), rope_of(text_config(art.target.config))
    diffs = rope_differences(draft, target)
    data = {"draft_rope": draft, "target_rope": target}
    if not diffs:
        return [], f"RoPE agrees with the target's ({_describe(target)})", data
    if modelopt_export_rope(art.draft_config, draft):
        data["modelopt_export_rope"] = True
        msg = ("the draft config's RoPE is not the target's: " + "; ".join(diffs) + ". This is ModelOpt's own export "
               "default, not a conversion mistake: ModelOpt trains the drafter with plain RoPE and, at export, writes "
               "its eagle_export_rope_scaling (YaRN, factor 32 from 2048 positions, unless set to {}) into the "
               "config for long contexts, so the drafter is served with rotary frequencies and an attention scale "
               "it was not trained with; what that costs here, replay on a capture measures.")
        return [Finding("rope-mismatch", "warning", msg,
                        fix="Re-export with eagle_export_rope_scaling={} to serve the RoPE the drafter was trained "
                            "with, or keep the YaRN scaling where contexts past 2048 tokens matter more.",
                        source=MODELOPT_ROPE_SOURCE, impact="medium")], "", data
    msg = ("the draft config's RoPE is not the target's: " + "; ".join(diffs) + ". The trainers build the draft "
           "config from the target's, so this is an export or conversion mistake; unless the drafter was trained with "
           "exactly these settings, every rotated position is off, more so the longer the context.")
    return [Finding("rope-mismatch", "warning", msg,
                    fix="Write the target's rope_theta and rope_scaling / rope_parameters into the draft config "
                        "(the settings the drafter was trained with).", source=ROPE_SOURCE, impact="high")], "", data


# ModelOpt's EAGLE export: the rope_scaling it injects when the drafter trained with the default RoPE
MODELOPT_EXPORT_ROPE = {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 2048.0}
MODELOPT_ROPE_SOURCE = ("nvidia-modelopt 0.47.0 modelopt/torch/speculative/config.py EagleConfig."
                        "eagle_export_rope_scaling (default yarn, factor 32, original_max_position_embeddings 2048); "
                        "modelopt/torch/export/plugins/hf_spec_export.py EagleExporter._export_config (injected when "
                        "the training rope_type is default); modelopt/torch/export/plugins/hf_spec_configs.py "
                        "(the exported eagle_config keys)")
# keys only ModelOpt's exported eagle_config carries (hf_spec_configs.py llama_eagle_template_config)
MODELOPT_EAGLE_KEYS = ("use_input_layernorm_in_first_layer", "use_mtp_layernorm", "next_layer_regular",
                       "parallel_draft_step", "parallel_draft_heads_num_layers")


def modelopt_export_rope(cfg: dict[str, Any], draft_rope: dict[str, Any]) -> bool:
    """True when a ModelOpt-exported draft config carries ModelOpt's default export YaRN scaling."""
    eagle = cfg.get("eagle_config")
    if not isinstance(eagle, dict) or not any(k in eagle for k in MODELOPT_EAGLE_KEYS):
        return False
    return all(not _differ(draft_rope.get(k), v) for k, v in MODELOPT_EXPORT_ROPE.items())


def _describe(r: dict[str, Any]) -> str:
    extra = f" factor {_show(r['factor'])}" if "factor" in r else ""
    return f"theta {_show(r['theta'])}, {r['type']}{extra}"


def check_max_positions(art: Artifacts) -> tuple[list[Finding], str, dict[str, Any]]:
    d = draft_facts(art.draft_config)
    mine = positive_int(d.layer.get("max_position_embeddings"))
    served, how = served_length(art)
    data = {"draft_max_positions": mine, "served_len": served, "served_len_from": how}
    if mine is None or served is None:
        return [], ("the draft config states no max_position_embeddings" if mine is None else
                    "no served length known (pass --served-len or --target)"), data
    if mine >= served:
        return [], f"draft max_position_embeddings {mine} covers the {how} {served}" + _DEFAULT_HINT.get(how, ""), data
    effect, rule, source = engine_rope_rule(art)
    data["engine_rule"] = effect
    head = f"the draft config's max_position_embeddings is {mine}, the {how} is {served}" + _DEFAULT_HINT.get(how, "")
    fix = f"Set max_position_embeddings in the draft config to the target's ({served} or more)."
    src = f"{source}; {MAXPOS_SOURCE}" if source else MAXPOS_SOURCE
    if effect == "raises":
        return [Finding("max-positions-short", "info", f"{head}; {rule}, so it costs nothing there.",
                        fix=fix, source=src, impact="low")], "", data
    if effect == "refuses":
        return [Finding("max-positions-short", "warning", f"{head}; {rule}.", fix=fix, source=src, impact="high")], \
            "", data
    if effect == "caps":
        return [Finding("max-positions-short", "warning", f"{head}; {rule}: requests past {mine} tokens are refused "
                        "or cut.", fix=fix, source=src, impact="medium")], "", data
    tail = (f"; {rule}: past position {mine} acceptance falls with context" if effect == "applies" else
            (f"; {rule}" if rule else "") + f"; engines that apply the draft's value (pass --engine and "
            f"--engine-version to know yours) get the drafter's positions wrong past {mine}, and acceptance falls "
            "with context")
    return [Finding("max-positions-short", "warning", head + tail + ".", fix=fix, source=src, impact="high")], "", data


def run_rope(art: Artifacts) -> CheckResult:
    findings, note, data = check_rope(art)
    return CheckResult(tuple(findings), note, data)


def run_max_positions(art: Artifacts) -> CheckResult:
    findings, note, data = check_max_positions(art)
    return CheckResult(tuple(findings), note, data)


ROPE = register(Check("rope", "the draft's RoPE against the target's", ("rope-mismatch",),
                      ("draft_config", "target"), run_rope, order=50))
MAX_POSITIONS = register(Check("max-positions", "the draft's max positions against the served length",
                               ("max-positions-short",), ("draft_config", "served_len|target"), run_max_positions,
                               order=51))
