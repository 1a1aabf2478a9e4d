"""Plant one defect at a time into copies of a drafter and its target, for the doctor's tests and the README.

Each ``Defect`` copies the clean drafter and target (``data_samples/drafter`` and ``data_samples/target``
by default) into its own directory, changes exactly one thing the way the public threads describe
it, and says which finding code the doctor must raise for it and which extra doctor inputs (an
engine, a server log, a served length) make it visible. ``scripts/plant_defects.py`` writes them all.
Nothing here decides anything: the doctor has to find each defect on its own.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

SAMPLES = Path(__file__).resolve().parents[2] / "data_samples"


@dataclass(frozen=True)
class Planted:
    """Where a planted case lives and the doctor inputs that show it (besides --drafter and --target)."""

    name: str
    code: str
    drafter: Path
    target: Path
    inputs: dict[str, Any] = field(default_factory=dict)  # DoctorInputs keyword arguments (engine, log, ...)


@dataclass(frozen=True)
class Defect:
    """One defect: the code the doctor must find, what is changed, how, and whether replay can price it."""

    name: str
    code: str
    what: str
    plant: Callable[[Path, Path, Path], dict[str, Any]]  # (drafter copy, target copy, case dir) -> extra inputs
    priced: bool = False  # replay on the sample capture puts a number on its cost (a lower accept length)


# ---------------------------------------------------------------- file edits
def edit_config(d: Path, drop: tuple[str, ...] = (), **changes: Any) -> None:
    """Change keys of ``d/config.json`` (and drop ``drop``), keeping the rest as written."""
    cfg = json.loads((d / "config.json").read_text())
    for key in drop:
        cfg.pop(key, None)
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def edit_weights(d: Path, fn: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]) -> None:
    """Rewrite ``d/model.safetensors`` with ``fn(tensors)``."""
    path = d / "model.safetensors"
    tensors = fn(load_file(str(path)))
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(path), metadata={"format": "pt"})


def _target_embedding(target: Path) -> torch.Tensor:
    index = json.loads((target / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.embed_tokens.weight"
    return load_file(str(target / index[name]))[name]


def _target_tensor(target: Path, name: str) -> torch.Tensor:
    index = json.loads((target / "model.safetensors.index.json").read_text())["weight_map"]
    return load_file(str(target / index[name]))[name]


# ---------------------------------------------------------------- server logs, in the engines' own formats
SGLANG_ARGS = {  # the launch fields of SGLang 0.5.23's server_args dict (entrypoints/engine.py, resolved_dict)
    "tp_size": 1, "pp_size": 1, "dp_size": 1, "context_length": None, "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
    "disable_cuda_graph": False, "disable_radix_cache": False, "decode_log_interval": 40}


def sglang_log(path: Path, target: Path, drafter: Path | None, accept_lens: tuple[float, ...] = (), **fields: Any
               ) -> Path:
    """A SGLang 0.5.23 server log: the arguments line (``server_args={...}``, engine.py) and one ``Decode batch``
    line per accept length (scheduler_components/metrics_reporter.py format)."""
    args = {"model_path": str(target), "tokenizer_path": str(target), **SGLANG_ARGS,
            "speculative_draft_model_path": None if drafter is None else str(drafter), **fields}
    lines = [f"[2026-11-29 11:58:30] server_args={args!r}",
             "[2026-11-29 11:59:02] The server is fired up and ready to roll!"]
    for i, acc in enumerate(accept_lens):
        rate = (acc - 1) / max(1, args["speculative_num_steps"] or 1)
        lines.append(f"[2026-11-29 12:00:{i + 1:02d}.100 TP0] Decode batch, #running-req: 1, #token: {640 + 64 * i}, "
                     f"token usage: 0.01, accept len: {acc:.2f}, accept rate: {rate:.2f}, cuda graph: True, "
                     f"gen throughput (token/s): {40 * acc:.2f}, #queue-req: 0")
    path.write_text("\n".join(lines) + "\n")
    return path


def vllm_log(path: Path, version: str, target: Path, spec: dict[str, Any], **args: Any) -> Path:
    """A vLLM server log of a 0.10.1.1 - 0.14 release: the version line and the non-default args line
    (vllm/entrypoints/utils.py ``log_non_default_args``)."""
    non_default = {"model_tag": str(target), "model": str(target), "speculative_config": spec, **args}
    path.write_text(f"INFO 11-29 12:57:58 [api_server.py:1896] vLLM API server version {version}\n"
                    f"INFO 11-29 12:58:00 [utils.py:233] non-default args: {non_default!r}\n")
    return path


# ---------------------------------------------------------------- the defects
def _d2t_absolute(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # target ids written where offsets belong: d2t = arange + offsets
    edit_weights(d, lambda w: {**w, "d2t": torch.arange(w["d2t"].shape[0]) + w["d2t"]})
    return {}


def _d2t_missing(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # the map kept in a side file, not the checkpoint (vllm-project/vllm#18909)
    def drop(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        torch.save(w["d2t"].clone(), d / "d2t.pt")
        return {k: v for k, v in w.items() if k != "d2t"}
    edit_weights(d, drop)
    return {}


def _d2t_duplicate(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # draft id 1 sent to draft id 0's target id
    def dup(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        d2t = w["d2t"].clone()
        d2t[1] = d2t[0] - 1
        return {**w, "d2t": d2t}
    edit_weights(d, dup)
    return {}


def _d2t_short(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # one offset fewer than draft_vocab_size (SafeAILab/EAGLE#248)
    edit_weights(d, lambda w: {**w, "d2t": w["d2t"][:-1].clone()})
    return {}


def _vocab_narrow(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # a draft vocabulary pruned on other text: here the 256 ids the clean one left out (a valid map, a poor vocabulary)
    def narrow(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        t2d = ~w["t2d"]
        keep = torch.nonzero(t2d).flatten()
        return {**w, "t2d": t2d, "d2t": keep - torch.arange(keep.shape[0])}
    edit_weights(d, narrow)
    return {"capture": str(SAMPLES / "capture_sweep.safetensors")}


def _embedding_random(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # a fresh nn.Embedding exported after a strict=False load: N(0, 0.02), transformers' initializer_range
    ref = _target_embedding(t)
    gen = torch.Generator().manual_seed(1234)
    fresh = (torch.randn(ref.shape, generator=gen) * 0.02).to(torch.bfloat16)
    edit_weights(d, lambda w: {**w, "embed_tokens.weight": fresh})
    return {}


def _embedding_other_model(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # the embedding of another model of the same shape (a tiny Llama of another seed)
    from .tinymodels import build_model

    ref = _target_embedding(t)
    other = build_model("llama", num_layers=2, hidden=ref.shape[1], vocab=ref.shape[0], seed=11)
    emb = other.get_input_embeddings().weight.detach().to(torch.bfloat16).clone()
    edit_weights(d, lambda w: {**w, "embed_tokens.weight": emb})
    return {}


def _flag_ignored(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # a drafter trained with norm_before_fc (one RMSNorm over the concatenated aux states, gain g), served on
    # SGLang 0.5.12, which skips input_norm (honoured from 0.5.17). Made from the sample drafter so that, as
    # trained, it computes nearly what the sample does: fc' = fc * c / g with c the median RMS of the aux
    # states the sample was trained on, so fc'(g * x / rms(x)) = fc(c * x / rms(x)) ~ fc(x); served without
    # the norm, fc'(x) = fc(x / r) with r = g / c a per-feature spread, the loss a real ignored norm causes.
    record = torch.load(SAMPLES / "record_layer_outputs.pt", weights_only=True)
    aux = torch.cat([h.float()[0] if h.dim() == 3 else h.float() for h in record["hidden_states"][:3]], -1)
    c = float(aux.pow(2).mean(-1).sqrt().median())
    gen = torch.Generator().manual_seed(77)
    r = torch.exp(0.5 * torch.randn(aux.shape[-1], generator=gen))

    def add_norm(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        fc = w["fc.weight"].float() / r  # fc * c / g, g = c * r
        return {**w, "fc.weight": fc.to(w["fc.weight"].dtype), "input_norm.weight": (c * r).to(torch.bfloat16)}
    edit_weights(d, add_norm)
    edit_config(d, norm_before_fc=True)
    return {"engine": "sglang", "engine_version": "0.5.12"}


def _algorithm_eagle(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # the EAGLE-3 drafter launched as EAGLE (sgl-project/sglang#21272); the server has just started
    return {"log": str(sglang_log(case / "server.log", t, d, speculative_algorithm="EAGLE"))}


def _draft_path_missing(d: Path, t: Path, case: Path) -> dict[str, Any]:
    return {"log": str(sglang_log(case / "server.log", t, None))}


def _draft_is_target(d: Path, t: Path, case: Path) -> dict[str, Any]:
    return {"log": str(sglang_log(case / "server.log", t, t))}


def _pp_drops_aux(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # pipeline parallelism 2 on vLLM 0.14.0, whose non-last stages drop their aux states (vllm-project/vllm#36151)
    spec = {"method": "eagle3", "model": str(d), "num_speculative_tokens": 3}
    return {"log": str(vllm_log(case / "server.log", "0.14.0", t, spec, pipeline_parallel_size=2))}


def _accept_len_one(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # a correct launch whose decode lines all say accept len 1.00 (the structural symptom, cause unknown here)
    return {"log": str(sglang_log(case / "server.log", t, d, accept_lens=(1.0,) * 12))}


def _rope_mismatch(d: Path, t: Path, case: Path) -> dict[str, Any]:
    edit_config(d, rope_theta=500000.0)
    return {}


def _max_positions_short(d: Path, t: Path, case: Path) -> dict[str, Any]:
    edit_config(d, max_position_embeddings=16)
    return {}


def _size_mismatch(d: Path, t: Path, case: Path) -> dict[str, Any]:
    edit_config(d, target_hidden_size=256)
    return {}


def _dtype_fp16(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # a float16 export of a drafter whose target serves in bfloat16 (the target's config declares it)
    edit_weights(d, lambda w: {k: v.to(torch.float16) if v.is_floating_point() else v for k, v in w.items()})
    edit_config(d, torch_dtype="float16")
    edit_config(t, torch_dtype="bfloat16")
    return {}


def to_speculators_layout(d: Path, verifier: str = "target") -> None:
    """Rewrite a SpecForge-layout drafter in speculators' layout (config nesting and ``layers.0.`` names)."""
    cfg = json.loads((d / "config.json").read_text())
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    layer = {k: v for k, v in cfg.items() if k not in ("architectures", "eagle_config", "draft_vocab_size",
                                                       "torch_dtype")}
    new = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.9.0",
           "draft_vocab_size": cfg["draft_vocab_size"], "norm_before_residual": False, "norm_output": False,
           "transformer_layer_config": layer, "eagle_aux_hidden_state_layer_ids": ids, "torch_dtype": "bfloat16",
           "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": verifier}}}
    (d / "config.json").write_text(json.dumps(new, indent=2, sort_keys=True) + "\n")
    edit_weights(d, lambda w: {k.replace("midlayer.", "layers.0.", 1): v for k, v in w.items()})


def _lm_head_not_target(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # a speculators drafter (whose trainer copies and freezes the target's head rows) with another head
    to_speculators_layout(d)
    return {}


# ---------------------------------------------------------------- the target's own defects (issue 34)
FP8_CONFIG = {  # an FP8 w8a8 compressed-tensors export as llm-compressor writes it, lm_head left out
    "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {"targets": ["Linear"],
                                  "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                                  "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}}}
SPINQUANT_R1 = {  # SpinQuant's mergeable R1 rotation as llm-compressor declares it (transform_config)
    "config_groups": {"R1": {"type": "hadamard", "apply": [
        {"targets": ["re:.*embed_tokens$", "re:.*o_proj$", "re:.*down_proj$"], "location": "weight_output"},
        {"targets": ["re:.*q_proj$", "re:.*k_proj$", "re:.*v_proj$", "re:.*up_proj$", "re:.*gate_proj$"],
         "location": "weight_input", "inverse": True}]}}}


def _target_quantized(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # an FP8 target on vLLM 0.11.0, which builds the unquantized drafter with the target's quant config
    edit_config(t, quantization_config=FP8_CONFIG)
    return {"engine": "vllm", "engine_version": "0.11.0"}


def _target_rotated(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # a W4A16 export with SpinQuant's R1 rotation of the residual stream; the drafter was trained unrotated
    q = {**FP8_CONFIG, "format": "pack-quantized", "transform_config": SPINQUANT_R1,
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int"}}}}
    edit_config(t, quantization_config=q)
    return {}


def _hybrid_unsupported(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # a Nemotron-H-style hybrid (Mamba layers by hybrid_override_pattern) on SGLang 0.5.23, whose NemotronH class
    # has no EAGLE-3 capture
    edit_config(t, architectures=["NemotronHForCausalLM"], hybrid_override_pattern="M-M-M*-M-M-")
    return {"engine": "sglang", "engine_version": "0.5.23"}


def _multimodal_unsupported(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # a Qwen2-VL-style target (vision tower, M-RoPE) on SGLang 0.5.23, whose Qwen2VL class has no EAGLE-3 capture
    cfg = json.loads((t / "config.json").read_text())
    rope = {**cfg.get("rope_parameters", {}), "mrope_section": [4, 6, 6]}
    edit_config(t, architectures=["Qwen2VLForConditionalGeneration"], rope_parameters=rope,
                vision_config={"depth": 2, "embed_dim": 64}, image_token_id=500)
    return {"engine": "sglang", "engine_version": "0.5.23"}


def _too_little_data(d: Path, t: Path, case: Path) -> dict[str, Any]:
    # the whole training set is one directory of a single record (the threads: 5k-50k records against 300k-600k)
    data = case / "data"
    data.mkdir()
    shutil.copy(SAMPLES / "data_0.ckpt", data / "data_0.ckpt")
    return {"train": str(data)}


DEFECTS: tuple[Defect, ...] = (
    # replay refuses a map that sends ids out of range (here: 256 + 511 > 512) or a reduced vocabulary without d2t
    Defect("d2t-absolute", "d2t-absolute", "d2t holds target ids (arange + offsets) instead of offsets",
           _d2t_absolute),
    Defect("d2t-missing", "d2t-missing", "d2t dropped from the checkpoint (kept in a side file d2t.pt)",
           _d2t_missing),
    Defect("d2t-duplicate", "d2t-invalid", "d2t sends draft id 1 to draft id 0's target id", _d2t_duplicate),
    Defect("d2t-short", "d2t-invalid", "d2t one entry shorter than draft_vocab_size", _d2t_short),
    Defect("vocab-narrow", "vocab-coverage", "the draft vocabulary is the 256 ids the clean one left out (capture given)",
           _vocab_narrow, priced=True),
    Defect("embedding-random", "embedding-random", "an embed_tokens of N(0, 0.02) added to the drafter",
           _embedding_random, priced=True),
    Defect("embedding-other-model", "embedding-not-target", "another tiny Llama's embed_tokens added to the drafter",
           _embedding_other_model, priced=True),
    Defect("flag-ignored", "flag-ignored", "a drafter trained with norm_before_fc served on SGLang 0.5.12 (which skips "
           "input_norm)", _flag_ignored, priced=True),
    Defect("algorithm-eagle", "algorithm-mismatch", "the EAGLE-3 drafter launched with SGLang's EAGLE (log)",
           _algorithm_eagle),
    Defect("draft-path-missing", "draft-path-missing", "EAGLE3 launched without a draft model path (log)",
           _draft_path_missing),
    Defect("draft-is-target", "draft-is-target", "the target's path given as the draft model path (log)",
           _draft_is_target),
    Defect("pp-drops-aux", "pp-drops-aux", "pipeline_parallel_size 2 on vLLM 0.14.0 (log)", _pp_drops_aux),
    Defect("accept-len-one", "accept-len-one", "a log whose 12 decode lines all say accept len 1.00",
           _accept_len_one),
    Defect("rope-mismatch", "rope-mismatch", "draft rope_theta 500000 (target 10000)", _rope_mismatch, priced=True),
    Defect("max-positions-short", "max-positions-short", "draft max_position_embeddings 16 (served 512)",
           _max_positions_short),
    Defect("size-mismatch", "size-mismatch", "draft target_hidden_size 256 (target 128)", _size_mismatch),
    Defect("dtype-fp16", "dtype-mismatch", "drafter exported in float16 beside a bfloat16 target", _dtype_fp16),
    Defect("lm-head-not-target", "lm-head-not-target", "a speculators drafter whose lm_head is not the target's rows",
           _lm_head_not_target),
    Defect("target-quantized", "target-quantized", "an FP8 target on vLLM 0.11.0 (the drafter gets its quant config)",
           _target_quantized),
    Defect("target-rotated", "target-rotated", "a target with SpinQuant's R1 rotation (transform_config)",
           _target_rotated),
    Defect("hybrid-target", "hybrid-target", "a Nemotron-H hybrid target on SGLang 0.5.23 (no EAGLE-3 capture)",
           _hybrid_unsupported),
    Defect("multimodal-target", "multimodal-target", "a Qwen2-VL target on SGLang 0.5.23 (no EAGLE-3 capture)",
           _multimodal_unsupported),
    Defect("too-little-data", "too-little-data", "a training directory of one record", _too_little_data),
)


# ---------------------------------------------------------------- issue 34, the serving side
def _requests(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sampling_penalty(d: Path, t: Path, case: Path) -> dict[str, Any]:
    chat = {"messages": [{"role": "user", "content": "Explain the bonus token."}], "repetition_penalty": 1.5}
    return {"log": str(sglang_log(case / "server.log", t, d)), "served_prompts": str(_requests(case / "p.jsonl",
                                                                                                [chat] * 4))}


def _lora_target(d: Path, t: Path, case: Path) -> dict[str, Any]:
    return {"log": str(sglang_log(case / "server.log", t, d, enable_lora=True,
                                  lora_paths=["sql=/adapters/sql", "chat=/adapters/chat"]))}


def _dp_attention(d: Path, t: Path, case: Path) -> dict[str, Any]:
    """SGLang 0.5.8's ``server_args=ServerArgs(...)`` line (the dataclass repr of 0.4.3 - 0.5.18) with DP attention
    over 8 ranks and the deepep all-to-all backend, for a DeepSeek-V3 target (``--model-type``)."""
    fields = {"model_path": str(t), **SGLANG_ARGS, "speculative_draft_model_path": str(d), "tp_size": 8,
              "dp_size": 8, "enable_dp_attention": True, "moe_a2a_backend": "deepep", "ep_size": 8}
    line = "server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"
    (case / "server.log").write_text(f"[2026-11-29 11:58:30] {line}\n")
    return {"log": str(case / "server.log"), "engine_version": "0.5.8", "model_type": "deepseek_v3"}


def _benchmark_prompts(d: Path, t: Path, case: Path) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    rows = [{"prompt_token_ids": rng.integers(0, 128256, 256).tolist(), "ignore_eos": True} for _ in range(6)]
    return {"served_prompts": str(_requests(case / "p.jsonl", rows))}


DEFECTS += (
    Defect("sampling-penalty", "sampling-penalty", "served requests at repetition penalty 1.5 on SGLang 0.5.23",
           _sampling_penalty),
    Defect("lora-target", "lora-target", "two LoRA adapters in SGLang's lora_paths (log)", _lora_target),
    Defect("dp-attention", "dp-attention", "DP attention 8 with deepep on SGLang 0.5.8, DeepSeek-V3 (log)",
           _dp_attention),
    Defect("benchmark-prompts", "benchmark-prompts", "random token ids with ignore_eos as the served prompts",
           _benchmark_prompts),
)


def plant(defect: Defect, out: Path, *, drafter: Path = SAMPLES / "drafter", target: Path = SAMPLES / "target"
          ) -> Planted:
    """Copy ``drafter`` and ``target`` into ``out/<name>/`` and plant ``defect`` there."""
    case = out / defect.name
    if case.exists():
        shutil.rmtree(case)
    d, t = case / "drafter", case / "target"
    shutil.copytree(drafter, d)
    shutil.copytree(target, t)
    inputs = defect.plant(d, t, case)
    return Planted(defect.name, defect.code, d, t, inputs)


def plant_all(out: Path, **where: Path) -> list[Planted]:
    """Every defect, each in its own copy under ``out``."""
    return [plant(defect, out, **where) for defect in DEFECTS]
