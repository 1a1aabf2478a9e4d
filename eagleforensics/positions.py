"""Residual-stream positions: the one coordinate every id list is translated into.

Position p is the index into HF transformers' ``output_hidden_states``: p = 0 is the
embedding output, p = k the output of decoder layer k-1, p = N the last layer's
output; ``normed=True`` marks the state after the final norm (what the lm_head reads).
See docs/conventions.md, "The one coordinate".
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Position:
    """A capture point in the residual stream (``p``) and whether the final norm was applied."""

    p: int
    normed: bool = False

    @property
    def label(self) -> str:
        """Short human label: ``p3``, ``p12 post-norm``."""
        return f"p{self.p} post-norm" if self.normed else f"p{self.p}"

    def describe(self, num_layers: int | None = None) -> str:
        """What this position holds, in words."""
        if self.normed:
            return f"final state after the norm (p={self.p})"
        if self.p == 0:
            return "embedding output (p=0, input of layer 0)"
        if num_layers is not None and self.p == num_layers:
            return f"last layer output before the final norm (p={self.p})"
        return f"output of layer {self.p - 1} (p={self.p}, input of layer {self.p})"


def default_aux_positions(num_layers: int) -> list[int]:
    """Positions every engine captures when no ids are configured: [2, N//2, N-3]."""
    n = num_layers
    return [2, n // 2, n - 3]
