"""eagleforensics: find which residual-stream position each EAGLE-3 training slot really holds.

>>> import eagleforensics as ef
>>> result = ef.align("data_samples/record_layer_outputs.pt", "data_samples/capture.pt")
>>> [m.position.label for m in result.matches]
['p3', 'p7', 'p10', 'p12 post-norm']

Heavy modules load on first use, so ``import eagleforensics`` stays cheap.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

from .errors import ForensicsError
from .positions import Position, default_aux_positions

__version__ = "0.1.0"

_LAZY = {
    "align": "eagleforensics.alignment",
    "AlignmentResult": "eagleforensics.alignment",
    "SlotMatch": "eagleforensics.alignment",
    "load_training": "eagleforensics.training",
    "TrainingRecord": "eagleforensics.training",
    "load_capture": "eagleforensics.capture",
    "Capture": "eagleforensics.capture",
    "sweep": "eagleforensics.sweep",
    "write_capture": "eagleforensics.sweep",
    "Finding": "eagleforensics.findings",
}

__all__ = ["ForensicsError", "Position", "default_aux_positions", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'eagleforensics' has no attribute {name!r}")
