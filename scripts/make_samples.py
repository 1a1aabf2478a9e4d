"""Regenerate data_samples/ from real transformers forward passes of a tiny Llama (byte for byte on the CPU that
wrote them; elsewhere the float values' last bits differ, and tests/samplecheck.py compares by what matters).

The incident at small scale (N = 12): training data dumped at the OUTPUTS of layers
2, N//2, N-3 (positions 3, 7, 10) plus the post-norm final, in the list layout, beside the
capture sweep of the same prompt; a second record made the way a wrong "fix" assumed
(embedding, layer 2, layer N//2: HF hidden_states[0], [2], [N//2]); and a SpecForge-layout
record at the engines' default positions (2, 6, 9) with zero right-padding. The incident record
is also written as safetensors (same bits), the input a CPU align reads without torch.

    python scripts/make_samples.py [OUT_DIR]
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from eagleforensics.io.sweep import sweep, write_capture
from eagleforensics.testing.tinymodels import build_model, prompt_ids

N = 12
PROMPT_TOKENS = 40
RESPONSE_TOKENS = 24
PADDING = 16
SAMPLE_SEED = 7


def target_model() -> torch.nn.Module:
    """The tiny target every sample comes from (scripts/train_drafter.py trains its drafter on it)."""
    return build_model("llama", num_layers=N, hidden=128, seed=0)


def sample_ids() -> torch.Tensor:
    """The samples' one sequence: 40 prompt + 24 response tokens."""
    return prompt_ids(PROMPT_TOKENS + RESPONSE_TOKENS, seed=SAMPLE_SEED)


def main(out: Path) -> None:
    torch.use_deterministic_algorithms(True)
    out.mkdir(parents=True, exist_ok=True)
    model = target_model()
    full = sample_ids()
    prompt = full[:PROMPT_TOKENS]
    loss_mask = torch.cat([torch.zeros(PROMPT_TOKENS), torch.ones(RESPONSE_TOKENS)]).to(torch.int64)

    with torch.no_grad():
        train_hs = model(full[None], output_hidden_states=True).hidden_states  # HF: last entry is post-norm
        capture_hs = model(prompt[None], output_hidden_states=True).hidden_states

    # What `torch.save(out.hidden_states)` writes, with the prompt ids beside it.
    torch.save({"hidden_states": [h.contiguous() for h in capture_hs], "input_ids": prompt.clone()}, out / "capture.pt")
    # The capture helper's full sweep: p = 0..N raw plus the post-norm final.
    write_capture(out / "capture_sweep.safetensors", sweep(model, prompt), model)

    def bf16(i: int) -> torch.Tensor:
        return train_hs[i].to(torch.bfloat16).contiguous()

    final = bf16(N)  # post-norm, as SpecForge stores it
    layer_outputs = [bf16(3), bf16(N // 2 + 1), bf16(N - 2), final]
    torch.save({"hidden_states": layer_outputs,
                "input_ids": full.clone(), "loss_mask": loss_mask.clone()}, out / "record_layer_outputs.pt")
    # The same record as safetensors, which holds no lists: the list layout as hidden_states.0..3.
    save_file({**{f"hidden_states.{i}": h for i, h in enumerate(layer_outputs)},
               "input_ids": full.clone(), "loss_mask": loss_mask.clone()}, str(out / "record_layer_outputs.safetensors"))
    torch.save({"hidden_states": [bf16(0), bf16(2), bf16(N // 2), final],
                "input_ids": full.clone(), "loss_mask": loss_mask.clone()}, out / "record_wrong_fix.pt")

    pad = torch.zeros(1, PADDING, model.config.hidden_size, dtype=torch.bfloat16)
    aux = torch.cat([bf16(2), bf16(N // 2), bf16(N - 3)], dim=-1)
    torch.save({
        "input_ids": torch.cat([full, torch.zeros(PADDING, dtype=torch.int64)]),
        "loss_mask": torch.cat([loss_mask, torch.zeros(PADDING, dtype=torch.int64)]),
        "hidden_state": torch.cat([final, pad], dim=1),
        "aux_hidden_state": torch.cat([aux, pad.repeat(1, 1, 3)], dim=1),
    }, out / "data_0.ckpt")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "data_samples")
