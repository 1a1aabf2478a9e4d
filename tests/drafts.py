"""Draft configs written the way their producers write them (SpecForge, speculators, TensorRT-LLM)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def specforge_draft(tmp: Path, ids: list[int] | None, name: str = "specforge", hidden: int = 7168,
                    **extra: Any) -> Path:
    """A SpecForge-style draft dir: ids nested under eagle_config (as SpecForge's configs/*.json)."""
    d = tmp / name
    d.mkdir()
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": hidden,
           "num_hidden_layers": 1, "draft_vocab_size": 32000, "model_type": "llama",
           "eagle_config": {"use_aux_hidden_state": True}, **extra}
    if ids is not None:
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def speculators_draft(tmp: Path, ids: list[int], name: str = "speculators", hidden: int = 4096) -> Path:
    """A speculators-style draft dir: ids at the top level, transformer_layer_config for sizes."""
    d = tmp / name
    d.mkdir()
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
           "draft_vocab_size": 32000, "transformer_layer_config": {"hidden_size": hidden},
           "eagle_aux_hidden_state_layer_ids": ids,
           "speculators_config": {"algorithm": "eagle3",
                                  "verifier": {"name_or_path": "meta-llama/Llama-3.1-8B"}}}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def trtllm_yaml(tmp: Path, ids: list[int] | None, model_dir: Path | None = None,
                name: str = "extra_llm_api.yaml") -> Path:
    """A TensorRT-LLM extra-API YAML with speculative_config (llmapi/llm_args.py field names)."""
    lines = ["speculative_config:", "  decoding_type: Eagle", "  max_draft_len: 3"]
    if model_dir is not None:
        lines.append(f"  speculative_model_dir: {model_dir}")
    if ids is not None:
        lines.append(f"  eagle3_layers_to_capture: {ids}")
    p = tmp / name
    p.write_text("\n".join(lines) + "\n")
    return p


def draft_config(tmp: Path, name: str, *, top: list[int] | None = None,
                 nested: list[int] | None = None, use_aux: bool | None = None) -> Path:
    """A draft dir with any mix of the two id keys and ``eagle_config.use_aux_hidden_state``."""
    d = tmp / name
    d.mkdir()
    cfg: dict[str, Any] = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 7168,
                           "num_hidden_layers": 1, "model_type": "llama"}
    eagle: dict[str, Any] = {}
    if nested is not None:
        eagle["eagle_aux_hidden_state_layer_ids"] = nested
    if use_aux is not None:
        eagle["use_aux_hidden_state"] = use_aux
    if eagle:
        cfg["eagle_config"] = eagle
    if top is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = top
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def trtllm_mode_yaml(tmp: Path, ids: list[int], one_model: bool, name: str) -> Path:
    """A TensorRT-LLM YAML that sets eagle3_one_model explicitly (true is TRT-LLM's default)."""
    p = trtllm_yaml(tmp, ids, name=name)
    p.write_text(p.read_text() + f"  eagle3_one_model: {'true' if one_model else 'false'}\n")
    return p
