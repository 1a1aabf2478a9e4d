"""Small transformers models with real-looking residual streams, for samples, tests and demos.

Random initialisation alone gives a residual stream unlike a trained model's: neighbouring
layers at cosine 0.6-0.9, no massive activations, norm gains of exactly 1 (so a post-norm
state is a plain rescale of the raw one). ``build_model`` fixes the three things matching
depends on, using only the library's own modeling code:

* norm gains are randomised, so post-norm states are not rescaled raw states;
* each layer's writes into the stream (attention ``o_proj``, MLP ``down_proj``) are damped,
  so neighbouring positions sit at cosine 0.9+ as in trained models;
* one MLP neuron of layer 1 fires only on the BOS token and writes a large value into two
  dimensions, the "massive activation" of the first token seen in real LLMs.

Needs ``transformers`` (the ``capture`` extra). Nothing is downloaded.
"""
from __future__ import annotations

from typing import Any

import torch

FAMILIES = ("llama", "qwen3", "deepseek_v3")
BOS_ID = 1
MASSIVE_DIMS = (3, 17)


# each family's long-context RoPE (llama3 factor 8, YaRN factor 4) over a tiny 128-position original context
SCALED_ROPE: dict[str, dict[str, Any]] = {
    "llama": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "original_max_position_embeddings": 128,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "qwen3": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 128},
    "deepseek_v3": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
                    "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
}


def _config(family: str, num_layers: int, hidden: int, vocab: int, rope: dict[str, Any] | None = None,
            max_positions: int = 512) -> Any:
    import transformers as tf

    common = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=num_layers, num_attention_heads=4, max_position_embeddings=max_positions,
        bos_token_id=BOS_ID, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    )
    if rope is not None:  # transformers 5's rope_parameters (theta and scaling in one object)
        common["rope_parameters"] = dict(rope)
    if family == "llama":
        return tf.LlamaConfig(num_key_value_heads=2, **common)
    if family == "qwen3":
        return tf.Qwen3Config(num_key_value_heads=2, head_dim=hidden // 4, **common)
    if family == "deepseek_v3":
        return tf.DeepseekV3Config(
            num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8,
            qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=hidden, first_k_dense_replace=1, n_group=2, topk_group=1,
            **common,
        )
    raise ValueError(f"unknown model family {family!r}; choose one of {', '.join(FAMILIES)}")


def build_model(
    family: str = "llama", *, num_layers: int = 12, hidden: int = 128, vocab: int = 512,
    seed: int = 0, damping: float = 0.25, massive: float = 100.0, rope: dict[str, Any] | None = None,
    max_positions: int = 512,
) -> torch.nn.Module:
    """A seeded, eval-mode causal LM of ``family`` with the realism tweaks above (float32, CPU).

    ``rope`` (``rope_parameters``, e.g. ``{"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
    "original_max_position_embeddings": 128}``) and ``max_positions`` vary the rotary settings."""
    import transformers as tf

    torch.manual_seed(seed)
    config = _config(family, num_layers, hidden, vocab, rope, max_positions)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and param.dim() == 1:
                param.copy_(1.0 + 0.5 * torch.randn(param.shape, generator=gen))
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                param.mul_(damping)
        _plant_massive_activation(model, massive)
    return model


def _plant_massive_activation(model: torch.nn.Module, scale: float) -> None:
    """Make neuron 0 of layer 1's MLP fire on BOS only and write about ``scale`` into two dims.

    Dimension 0 of the stream is reserved for BOS: only BOS's embedding has it, and no
    earlier write (layer 0, layer 1 attention) touches it, so the neuron that reads it
    is silent on every other token.
    """
    emb = model.get_input_embeddings().weight
    emb[:, 0] = 0.0
    emb[BOS_ID, 0] = 1.0
    layers = model.model.layers
    for layer in layers[:2]:
        layer.self_attn.o_proj.weight[0, :] = 0.0
    mlp0 = layers[0].mlp if hasattr(layers[0].mlp, "down_proj") else layers[0].mlp.shared_experts
    mlp0.down_proj.weight[0, :] = 0.0
    mlp = layers[1].mlp if hasattr(layers[1].mlp, "gate_proj") else layers[1].mlp.shared_experts
    layers[1].post_attention_layernorm.weight[0] = 1.0
    direction = torch.zeros(emb.shape[1])
    direction[0] = 1.0
    mlp.gate_proj.weight[0].copy_(direction)
    mlp.up_proj.weight[0].copy_(direction)
    mlp.down_proj.weight[:, 0] = 0.0
    # BOS's normalised dim 0 is about 11 for hidden=128, so the neuron outputs silu(11)*11 ~ 121
    for dim in MASSIVE_DIMS:
        mlp.down_proj.weight[dim, 0] = scale / 121.0


def prompt_ids(length: int = 40, *, seed: int = 0, vocab: int = 512) -> torch.Tensor:
    """A seeded prompt that starts with BOS, as a chat-templated prompt does: shape [length]."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (length,), generator=gen)
    ids[0] = BOS_ID
    return ids


def mid_layer_states(model: torch.nn.Module, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """Every decoder layer's residual after attention, before the MLP: the input of its
    ``post_attention_layernorm``, which is what a fused add-norm returns as ``residual`` (a state
    that sits between two residual-stream positions). Layer index -> [T, H] in the model's dtype."""
    grabbed: dict[int, torch.Tensor] = {}
    hooks = [layer.post_attention_layernorm.register_forward_pre_hook(
        lambda _m, args, i=i: grabbed.__setitem__(i, args[0][0].detach().clone()))
        for i, layer in enumerate(model.model.layers)]
    try:
        with torch.no_grad():
            model(ids[None], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return grabbed
