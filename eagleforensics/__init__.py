"""eagleforensics: find which residual-stream position each EAGLE-3 training slot really holds.

>>> import eagleforensics as ef
>>> result = ef.align("data_samples/record_layer_outputs.pt", "data_samples/capture.pt")
>>> [m.position.label for m in result.matches]
['p3', 'p7', 'p10', 'p12 post-norm']

Heavy modules load on first use, so ``import eagleforensics`` stays cheap.

The package is grouped in rooms by role; imports point down only (tests/test_layout.py):
``cli``, ``report`` > ``doctor`` > ``replay`` > ``alignment`` (the pipelines) > ``checks`` (the doctor's, one per cause)
> ``engines``, ``evidence``, ``scan`` > ``io``
> ``results``, ``positions``, ``errors``, ``arrays`` (numpy everywhere; torch only at the edges).
``testing`` holds tiny models for tests, not the product.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

from .errors import ForensicsError
from .positions import Position, default_aux_positions

__version__ = "0.1.0"

_LAZY = {
    "align": "eagleforensics.alignment",
    "AlignmentResult": "eagleforensics.results",
    "SlotMatch": "eagleforensics.results",
    "Finding": "eagleforensics.results",
    "Verdict": "eagleforensics.verdict",
    "load_training": "eagleforensics.io.training",
    "TrainingRecord": "eagleforensics.io.training",
    "load_capture": "eagleforensics.io.capture",
    "Capture": "eagleforensics.io.capture",
    "sweep": "eagleforensics.io.sweep",
    "write_capture": "eagleforensics.io.sweep",
    "load_drafter": "eagleforensics.io.drafter",
    "run_replay": "eagleforensics.replay",
    "diagnose": "eagleforensics.doctor",
    "DoctorInputs": "eagleforensics.checks.base",
    "DoctorReport": "eagleforensics.doctor",
    "make_plan": "eagleforensics.plan",
    "PlanInputs": "eagleforensics.plan",
    "PlanReport": "eagleforensics.plan",
    "make_probe": "eagleforensics.probe",
    "ProbeInputs": "eagleforensics.probe",
    "ProbeReport": "eagleforensics.probe",
    "find_server_args": "eagleforensics.engines.serverargs",
    "parse_server_args_line": "eagleforensics.engines.serverargs",
    "ServerArgs": "eagleforensics.engines.serverargs",
    "SERVED_FEATURES": "eagleforensics.io.served",
    "TargetAudit": "eagleforensics.scan.audit",
    "audit_records": "eagleforensics.scan.audit",
    "load_tokenizer": "eagleforensics.io.tokenizer",
    "learn_skeleton": "eagleforensics.dataaudit.templates",
}

__all__ = ["ForensicsError", "Position", "default_aux_positions", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'eagleforensics' has no attribute {name!r}")
