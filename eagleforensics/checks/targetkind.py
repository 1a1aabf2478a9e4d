"""What kind of target this is, read from its config: hybrid (Mamba / linear attention) and multimodal layouts.

Shared by the ``hybrid-target`` and ``multimodal-target`` checks: which config keys declare each
layout (transformers' and the model authors' own names), and the target's architecture, the key of
the engines' EAGLE-3 support tables (``engines.targetrules``).
"""
from __future__ import annotations

from typing import Any

from ..io.modeldir import text_config

ATTENTION_KINDS = {"full_attention", "sliding_attention", "attention", "chunked_attention", "global", "local",
                   "full", "sliding"}
ATTENTION_FREE = {"mamba", "mamba2", "falcon_mamba", "rwkv", "recurrent_gemma"}
RECURRENT_KEYS = ("mamba_d_state", "ssm_state_size", "mamba_expand", "linear_attn_config", "linear_num_value_heads",
                  "linear_key_head_dim", "mamba_n_heads", "conv_L_cache")
VISION_KEYS = ("vision_config", "vision_tower", "mm_vision_tower", "visual", "vision_encoder", "audio_config")
IMAGE_TOKEN_KEYS = ("image_token_id", "image_token_index", "video_token_id", "video_token_index", "audio_token_id",
                    "vision_start_token_id")


def architecture(cfg: dict[str, Any]) -> str | None:
    """The target's first ``architectures`` entry, or None."""
    archs = cfg.get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


def hybrid_layout(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The recurrent layers a config declares: ``{"kinds", "layers", "from"}``, or None for an attention-only target."""
    text = text_config(cfg)
    mtype = str(text.get("model_type", cfg.get("model_type", "")))
    types = text.get("layer_types")
    if isinstance(types, list) and types:
        other = [str(t) for t in types if str(t).lower() not in ATTENTION_KINDS]
        if other:
            return {"kinds": sorted(set(other)), "layers": len(other), "of": len(types), "from": "layer_types"}
    pattern = text.get("hybrid_override_pattern")
    if isinstance(pattern, str) and "M" in pattern:
        return {"kinds": ["mamba"], "layers": pattern.count("M"), "of": len(pattern), "from": "hybrid_override_pattern"}
    blocks = text.get("layers_block_type")
    if isinstance(blocks, list) and any("mamba" in str(b) or "hybrid" in str(b) for b in blocks):
        rec = [b for b in blocks if "mamba" in str(b) or "hybrid" in str(b)]
        return {"kinds": sorted({str(b) for b in rec}), "layers": len(rec), "of": len(blocks),
                "from": "layers_block_type"}
    kinds = text.get("attn_type_list")  # MiniMax-Text-01 / M1: 0 = linear (lightning) attention, 1 = softmax
    if isinstance(kinds, list) and 0 in kinds:
        return {"kinds": ["linear_attention"], "layers": kinds.count(0), "of": len(kinds), "from": "attn_type_list"}
    if isinstance(text.get("attn_layer_period"), int):  # Jamba: attention every period, Mamba elsewhere
        return {"kinds": ["mamba"], "layers": None, "of": text.get("num_hidden_layers"), "from": "attn_layer_period"}
    if mtype in ATTENTION_FREE:
        return {"kinds": [mtype], "layers": text.get("num_hidden_layers"), "of": text.get("num_hidden_layers"),
                "from": "model_type"}
    keys = [k for k in RECURRENT_KEYS if k in text]
    if keys:
        return {"kinds": ["recurrent"], "layers": None, "of": text.get("num_hidden_layers"), "from": ", ".join(keys)}
    return None


def _rope_dicts(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for where in (cfg, text_config(cfg)):
        for key in ("rope_scaling", "rope_parameters"):
            if isinstance(where.get(key), dict):
                out.append(where[key])
    return out


def multimodal_layout(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """What makes a config multimodal: ``{"towers", "mrope_section", "token_ids"}``, or None for a text target."""
    towers = [k for k in VISION_KEYS if isinstance(cfg.get(k), (dict, str)) and cfg.get(k)]
    mrope = next((r.get("mrope_section") for r in _rope_dicts(cfg) if r.get("mrope_section")), None)
    ids: dict[str, int] = {}
    for where in (cfg, text_config(cfg)):
        for key in IMAGE_TOKEN_KEYS:
            value = where.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                ids.setdefault(key, value)
    if not towers and mrope is None:
        return None  # token ids alone (a text model's spare ids) do not make a target multimodal
    return {"towers": towers, "mrope_section": mrope, "token_ids": ids}
