"""The tensor names of an EAGLE-3 drafter's decoder layer, without torch: what the loader reads and the checks expect.

Kept apart from ``io.drafter`` (which loads the weights with torch) so that checks that only compare names, such as
the drafter-weights check on a target-only run, import no torch.
"""
from __future__ import annotations

LAYER_PARTS = (
    "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
)
LATER_LAYER_PARTS = tuple(p for p in LAYER_PARTS if p != "hidden_norm.weight")  # a plain decoder layer
OPTIONAL_LAYER_PARTS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
