"""Drafter features an engine may ignore when it serves an EAGLE-3 drafter: the names replay and doctor share.

The names are those of ``engines.flagrules`` (which engine release honours which feature), so doctor can
replay exactly what a ruling drops; the value says what
serving the drafter WITHOUT it means, i.e. what ``drafter.replay.DraftForward(drop=...)`` and
``replay --served-without NAME`` run. Dropping a feature the drafter does not use changes nothing.
Torch-free, so the CLI can offer the names without importing torch.
"""
from __future__ import annotations

NORM_BEFORE_FC = "norm_before_fc"
FC_NORM = "fc_norm"
NORM_OUTPUT = "norm_output"
NORM_BEFORE_RESIDUAL = "norm_before_residual"
OWN_EMBEDDING = "own_embedding"
EXTRA_LAYERS = "extra_layers"
SLIDING_WINDOW = "sliding_window"

SERVED_FEATURES: dict[str, str] = {
    NORM_BEFORE_FC: "no RMSNorm over the concatenated aux states before fc (input_norm.weight skipped)",
    FC_NORM: "no per-aux-state RMSNorm before fc (fc_norm.{i} skipped)",
    NORM_OUTPUT: "the engines' default head: final norm before lm_head, the raw state fed back to the next step "
                 "(whatever the drafter's norm_output says)",
    NORM_BEFORE_RESIDUAL: "the first layer's residual is the raw fc output, not its hidden_norm",
    OWN_EMBEDDING: "the target's embedding instead of the drafter's own (needs the target)",
    EXTRA_LAYERS: "only the first decoder layer runs; the extra layers are skipped",
    SLIDING_WINDOW: "every layer attends to the whole prefix (no sliding window)",
}
