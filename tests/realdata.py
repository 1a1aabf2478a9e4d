"""Real forward passes of tiny transformers models, cached per session.

Every hidden state the tests match comes from the library's own modeling code
(``eagleforensics.testing.tinymodels``), never from hand-made random tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from eagleforensics.io.sweep import sweep
from eagleforensics.testing.tinymodels import build_model, prompt_ids

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data_samples"
N = 8
H = 64


@dataclass(frozen=True)
class Run:
    """One forward pass: HF hidden_states (last = post-norm), the raw last layer, the ids."""

    family: str
    ids: torch.Tensor
    hs: tuple[torch.Tensor, ...]  # each [T, H]; hs[N] is post-norm as HF returns it
    raw_last: torch.Tensor  # p = N before the final norm
    sweep: dict[str, torch.Tensor]

    @property
    def n(self) -> int:
        return len(self.hs) - 1

    def p(self, pos: int) -> torch.Tensor:
        """Raw residual-stream state at position ``pos`` (p = N is the raw last layer)."""
        return self.raw_last if pos == self.n else self.hs[pos]


@lru_cache(maxsize=None)
def _model(family: str, seed: int) -> torch.nn.Module:
    return build_model(family, num_layers=N, hidden=H, seed=seed)


@lru_cache(maxsize=None)
def forward(family: str = "llama", model_seed: int = 0, prompt_seed: int = 0, length: int = 32) -> Run:
    """A cached real forward pass of a tiny ``family`` model on a seeded prompt."""
    model = _model(family, model_seed)
    ids = prompt_ids(length, seed=prompt_seed)
    with torch.no_grad():
        hs = model(ids[None], output_hidden_states=True).hidden_states
    sw = sweep(model, ids)
    return Run(family, ids, tuple(h[0] for h in hs), sw[f"hidden.{len(hs) - 1}"], sw)
