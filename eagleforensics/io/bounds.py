"""The largest value each integer of a model config or a server launch may take, checked where the file is read.

A number in the user's file sizes work: ``num_nextn_predict_layers`` = 10^9 built a billion tensor names and
``pipeline_parallel_size`` = 10^9 a billion pipeline stages. Each bound is what the engines accept or, where they
set none, far past the largest published model (docs/security.md lists them). Only the upper end is checked
here: a zero or negative value keeps meaning what each reader already makes of it (unset, -1 = auto).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..errors import ForensicsError
from .physical import MAX_ENGINE_STEPS

# Decoder layers: 126 in Llama-3.1-405B, 61 in DeepSeek-V3 and Kimi-K2 (their config.json); no engine caps it.
MAX_LAYERS = 1024
# Model width: 16384 in Llama-3.1-405B, 18432 in Nemotron-4-340B; a head dimension is smaller still.
MAX_HIDDEN = 1 << 17
# Vocabulary: 262,144 in Gemma 3, 256,000 in Gemma 2, 151,936 in Qwen3; 64 times the largest.
MAX_VOCAB = 1 << 24
# Context length: 10,485,760 (10M) in Llama 4 Scout, the longest published; about 12 times it.
MAX_POSITIONS = 1 << 27
# Attention heads: 128 in DeepSeek-V3 and Llama-3.1-405B. vLLM refuses a tensor-parallel size that does not
# divide the head count (vllm 0.33.0, 0.34.0 vllm/config/model.py "must be divisible by tensor parallel size").
MAX_HEADS = 1 << 14
# MTP / next-n layers: 1 in DeepSeek-V3, GLM-4.5 and MiMo; the engines run at most one per draft step.
MAX_MTP_LAYERS = MAX_ENGINE_STEPS
# Draft tree width (SGLang speculative_eagle_topk): published launches use 1 to 10; a cap of ours, as for steps.
MAX_TOPK = 64
MAX_DRAFT_TOKENS = MAX_ENGINE_STEPS * MAX_TOPK + 1  # a tree of MAX_TOPK branches per step, plus the root
# Data-parallel replicas: each needs at least one GPU; the largest published clusters hold ~10^5 GPUs.
MAX_REPLICAS = 1 << 20

# config.json field -> (bound, what the bound is)
CONFIG_INTS: dict[str, tuple[int, str]] = {
    "num_hidden_layers": (MAX_LAYERS, "decoder layers; the largest published models have 61 to 126"),
    "hidden_size": (MAX_HIDDEN, "the largest published width is 18,432"),
    "target_hidden_size": (MAX_HIDDEN, "the largest published width is 18,432"),
    "head_dim": (MAX_HIDDEN, "the largest published width is 18,432"),
    "vocab_size": (MAX_VOCAB, "the largest published vocabulary is 262,144"),
    "draft_vocab_size": (MAX_VOCAB, "the largest published vocabulary is 262,144"),
    "max_position_embeddings": (MAX_POSITIONS, "the longest published context is 10M tokens"),
    "num_attention_heads": (MAX_HEADS, "the most published attention heads is 128"),
    "num_key_value_heads": (MAX_HEADS, "the most published attention heads is 128"),
}
# The MTP keys a target may declare: bounded by the MTP check itself, whose row is "not run" past it.
MTP_WHY = f"the engines run at most one MTP layer per draft step, and steps stop at {MAX_ENGINE_STEPS}"
# ServerArgs field -> (bound, what the bound is)
LAUNCH_INTS: dict[str, tuple[int, str]] = {
    "num_steps": (MAX_ENGINE_STEPS, "published EAGLE-3 launches use 1 to 10 draft steps"),
    "topk": (MAX_TOPK, "published launches use a tree width of 1 to 10"),
    "num_draft_tokens": (MAX_DRAFT_TOKENS, f"a tree of {MAX_TOPK} branches over {MAX_ENGINE_STEPS} steps"),
    "tp": (MAX_HEADS, "the engines split attention heads over tensor-parallel ranks; the most published is 128"),
    "pp": (MAX_LAYERS, "each pipeline stage holds at least one decoder layer; the most published is 126"),
    "dp": (MAX_REPLICAS, "each replica needs its own GPUs"),
    "max_len": (MAX_POSITIONS, "the longest published context is 10M tokens"),
}


def past_bound(value: Any, bound: tuple[int, str], unit: str = "") -> str | None:
    """Why an integer ``value`` is past ``bound`` (``(largest, why)``), or None (within it, or not an integer)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= bound[0]:
        return None
    shown = str(value) if value < 10 ** 30 else f"about 10^{int(value.bit_length() * 0.30103)}"  # str() stops at 4300 digits
    return f"{shown}{' ' + unit if unit else ''}, past the cap of {bound[0]:,} ({bound[1]})"


def check_config_ints(cfg: Any, path: str | Path, *, _at: str = "", _depth: int = 0) -> None:
    """Every ``CONFIG_INTS`` field of a config (nested configs too: text_config, eagle_config, ...) within its bound;
    past one, one line naming the file and the field (exit 2)."""
    if not isinstance(cfg, Mapping) or _depth > 8:
        return
    for key, value in cfg.items():
        name = f"{_at}{key}"
        if isinstance(value, Mapping):
            check_config_ints(value, path, _at=f"{name}.", _depth=_depth + 1)
        elif key in CONFIG_INTS:
            why = past_bound(value, CONFIG_INTS[key])
            if why:
                raise ForensicsError(f"{str(name)[:120]} is {why}: not a model any engine serves", path=path)
