"""A Kimi-K2.5-shaped doctor case on disk: drafter, target (a partial download), training records, a capture.

* drafter: SpecForge's ``configs/kimi-k25-eagle3.json`` (sgl-project/SpecForge, read at commit 3f9b5fc: hidden
  7168, 64 heads of 128, MLP 18432, one layer, draft vocabulary 32000 over 163840, aux ids [2, 30, 58]) and
  random bf16 weights of the shapes SpecForge's ``llama3_eagle.py`` writes (``fc``, ``midlayer.*``, ``norm``,
  ``lm_head`` over the draft vocabulary, ``embed_tokens`` = the target's, ``d2t`` / ``t2d``);
* target: a Kimi-K2 text config (61 layers, hidden 7168, vocabulary 163840, YaRN factor 64 over 4096 original
  positions, 262144 positions, FP8 block quantisation declared) and only the files a user debugging on one box
  has: the config, the first shard (embedding) and the last (final norm, lm_head), with the full FP8 shard index
  listing every tensor (139,583 names over 64 shards; ``tests/test_partial_target.py`` builds the same names);
* a 62-position capture and ``records`` SpecForge ``.ckpt`` records at T tokens (``benchmarks/synth.py``).

Random weights of real shapes: this measures time and memory, not findings. Every large tensor is streamed
to its file a block at a time, never held whole.
"""
from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

import synth  # benchmarks/synth.py (this folder is on sys.path when a benchmark runs)

H, VOCAB, DRAFT_VOCAB, LAYERS = 7168, 163840, 32000, 61
HEADS, HEAD_DIM, MLP = 64, 128, 18432
FP8_ENTRIES, SHARDS = 139_583, 64
BLOCK = 4096  # rows generated and written at once

DRAFTER_CONFIG = {  # SpecForge configs/kimi-k25-eagle3.json, as released
    "architectures": ["LlamaForCausalLMEagle3"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 163584, "draft_vocab_size": DRAFT_VOCAB, "dtype": "bfloat16",
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": True},
    "eos_token_id": 163585, "head_dim": HEAD_DIM, "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02,
    "intermediate_size": MLP, "max_position_embeddings": 131072, "max_window_layers": 48, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": HEADS, "num_hidden_layers": 1, "num_key_value_heads": HEADS,
    "pretraining_tp": 1, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "sliding_window": None, "tie_word_embeddings": False, "transformers_version": "4.57.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": VOCAB}

TARGET_CONFIG = {  # Kimi-K2 (DeepSeek-V3 architecture) text config, 262144 positions with YaRN
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "vocab_size": VOCAB, "hidden_size": H,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": LAYERS,
    "num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 384, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-06, "rope_theta": 50000.0,
    "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                     "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 163584, "eos_token_id": 163585,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]}}


def shard_name(i: int) -> str:
    return f"model-{i:05d}-of-{SHARDS:05d}.safetensors"


def fp8_weight_map() -> dict[str, str]:
    """Tensor names as a Kimi-K2 FP8 checkpoint's index lists them (weights and their block scales; 61 layers, the
    first dense, 384 experts), trimmed or padded to the real count (139,583); embedding first, head last."""
    body: dict[str, str] = {}
    for layer in range(LAYERS):
        shard = shard_name(2 + layer * (SHARDS - 3) // LAYERS)
        pre = f"model.layers.{layer}."
        names = [pre + n for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                   "self_attn.q_a_layernorm.weight", "self_attn.kv_a_layernorm.weight")]
        for part in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
            names += [f"{pre}self_attn.{part}.weight", f"{pre}self_attn.{part}.weight_scale_inv"]
        for e in range(0 if layer == 0 else 384):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                names += [f"{pre}mlp.experts.{e}.{proj}.weight", f"{pre}mlp.experts.{e}.{proj}.weight_scale_inv"]
        for proj in ("gate_proj", "up_proj", "down_proj"):
            kind = "mlp" if layer == 0 else "mlp.shared_experts"
            names += [f"{pre}{kind}.{proj}.weight", f"{pre}{kind}.{proj}.weight_scale_inv"]
        if layer:
            names += [f"{pre}mlp.gate.weight", f"{pre}mlp.gate.e_score_correction_bias"]
        body.update(dict.fromkeys(names, shard))
    room = FP8_ENTRIES - 3
    items = list(body.items())[:room]
    items += [(f"model.layers.{LAYERS - 1}.extra.{i}.weight", shard_name(SHARDS - 1)) for i in range(room - len(items))]
    wmap = {"model.embed_tokens.weight": shard_name(1), **dict(items),
            "model.norm.weight": shard_name(SHARDS), "lm_head.weight": shard_name(SHARDS)}
    assert len(wmap) == FP8_ENTRIES
    return wmap


Tensor = tuple[str, str, tuple[int, ...], Callable[[], Iterator[torch.Tensor]]]


def write_safetensors(path: Path, tensors: list[Tensor]) -> None:
    """A safetensors file whose tensors are written block by block (name, dtype code, shape, blocks())."""
    sizes = {"BF16": 2, "F32": 4, "I64": 8, "BOOL": 1}
    header: dict[str, object] = {}
    offset = 0
    for name, code, shape, _ in tensors:
        n = sizes[code]
        for d in shape:
            n *= d
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for _name, _code, _shape, blocks in tensors:
            for b in blocks():
                fh.write(b.contiguous().view(torch.uint8).numpy().tobytes())


GEN_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # a GPU draws the 5 GB of weights in seconds


def random_rows(rows: int, cols: int, seed: int, scale: float) -> Callable[[], Iterator[torch.Tensor]]:
    """bf16 normal(0, scale) rows, the same for the same seed (and generating device), a block at a time."""
    def blocks() -> Iterator[torch.Tensor]:
        for a in range(0, rows, BLOCK):
            gen = torch.Generator(GEN_DEVICE).manual_seed(seed * 1_000_003 + a)
            x = torch.randn(min(BLOCK, rows - a), cols, generator=gen, device=GEN_DEVICE) * scale
            yield x.to(torch.bfloat16).cpu()
    return blocks


def one(t: torch.Tensor) -> Callable[[], Iterator[torch.Tensor]]:
    return lambda: iter([t])


def write_target(out: Path, seed: int, gain: torch.Tensor) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / shard_name(1), [("model.embed_tokens.weight", "BF16", (VOCAB, H),
                                             random_rows(VOCAB, H, seed + 1, 0.02))])
    write_safetensors(out / shard_name(SHARDS), [
        ("model.norm.weight", "BF16", (H,), one(gain.to(torch.bfloat16))),
        ("lm_head.weight", "BF16", (VOCAB, H), random_rows(VOCAB, H, seed + 2, 1.0 / H ** 0.5))])
    index = {"metadata": {"total_size": 1_029_174_386_688}, "weight_map": fp8_weight_map()}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (out / "config.json").write_text(json.dumps(TARGET_CONFIG, indent=2))  # last: the directory is complete


def write_drafter(out: Path, seed: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    keep = torch.randperm(VOCAB, generator=gen)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[keep] = True
    q = HEADS * HEAD_DIM
    mats = [("fc.weight", H, 3 * H), ("midlayer.self_attn.q_proj.weight", q, 2 * H),
            ("midlayer.self_attn.k_proj.weight", q, 2 * H), ("midlayer.self_attn.v_proj.weight", q, 2 * H),
            ("midlayer.self_attn.o_proj.weight", H, q), ("midlayer.mlp.gate_proj.weight", MLP, H),
            ("midlayer.mlp.up_proj.weight", MLP, H), ("midlayer.mlp.down_proj.weight", H, MLP),
            ("lm_head.weight", DRAFT_VOCAB, H)]
    tensors: list[Tensor] = [("embed_tokens.weight", "BF16", (VOCAB, H), random_rows(VOCAB, H, seed + 1, 0.02))]
    tensors += [(n, "BF16", (o, i), random_rows(o, i, seed + 10 + k, 1.0 / i ** 0.5)) for k, (n, o, i) in enumerate(mats)]
    tensors += [(n, "BF16", (H,), one(torch.ones(H, dtype=torch.bfloat16))) for n in (
        "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
        "norm.weight")]
    tensors += [("d2t", "I64", (DRAFT_VOCAB,), one(keep - torch.arange(DRAFT_VOCAB))), ("t2d", "BOOL", (VOCAB,), one(t2d))]
    write_safetensors(out / "model.safetensors", tensors)
    (out / "config.json").write_text(json.dumps(DRAFTER_CONFIG, indent=2))  # last: the directory is complete


def write_records(sweep: synth.Sweep, out: Path, records: int) -> None:
    """``records`` SpecForge .ckpt records: the sweep's, each rolled by a few tokens, the first 20% a prompt."""
    out.mkdir(parents=True, exist_ok=True)
    base = torch.load(sweep.record_ckpt, weights_only=True)
    t = base["input_ids"].shape[0]
    for r in range(records):
        k = 7 * r
        mask = torch.ones(t, dtype=torch.int64)
        mask[: t // 5] = 0
        torch.save({"input_ids": base["input_ids"].roll(k), "loss_mask": mask,
                    "hidden_state": base["hidden_state"].roll(k, 1).clone(),
                    "aux_hidden_state": base["aux_hidden_state"].roll(k, 1).clone()}, out / f"data_{r}.ckpt")


def write_case(folder: Path, tokens: int, records: int, seed: int = 0) -> dict[str, Path]:
    """The whole case under ``folder`` (reused when its marker says it was written with these sizes)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"drafter": folder / "drafter", "target": folder / "target", "train": folder / f"train-T{tokens}-R{records}"}
    marker = folder / f"case-T{tokens}-R{records}.done"
    sweep = synth.write_sweep(folder, "kimi-k2", tokens, seed)
    paths["capture"] = sweep.capture
    paths["record"] = paths["train"] / "data_0.ckpt"
    if marker.exists():
        return paths
    gain = 1.0 + 0.5 * torch.randn(H, generator=torch.Generator().manual_seed(seed))
    for key, write in (("target", lambda p: write_target(p, seed, gain)), ("drafter", lambda p: write_drafter(p, seed))):
        if not (paths[key] / "config.json").exists():
            shutil.rmtree(paths[key], ignore_errors=True)
            write(paths[key])
    write_records(sweep, paths["train"], records)
    marker.write_text("ok\n")
    return paths
