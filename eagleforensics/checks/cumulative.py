"""SGLang's average accept length is cumulative since the server started (docs/causes.md row 8).

``cumulative-accept-length``: a log with ``avg_spec_accept_length=X`` lines (printed when the internal state is
updated; the same figure ``/get_server_info`` returns as ``avg_spec_accept_length``) holds an average over every
verify round since start or the last reset (``engines.acceptlines.cumulative_lines``), while the ``Decode batch``
lines average one logging interval. The cumulative figure hides a recent fall (a cache filling, a switch turned on)
and mixes traffic of every kind; the finding states both figures. Info only: a metric read with another
definition, not a defect (SafeAILab/EAGLE#132, #191, z-lab/dflash#3).
"""
from __future__ import annotations

from typing import Any

from ..engines.acceptlines import cumulative_lines, decode_points
from ..errors import printable
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register

SOURCE = ("sglang 0.5.9 sglang/srt/managers/scheduler.py, 0.5.23 sglang/srt/managers/scheduler_components/"
          "internal_state.py _average_accept_length; SafeAILab/EAGLE#132, z-lab/dflash#3 (docs/causes.md row 8)")


def run(art: Artifacts) -> CheckResult:
    """State each cumulative figure beside the per-interval lines after it."""
    if art.engine != "sglang":
        return CheckResult((), "not an SGLang log", {})
    found = cumulative_lines(art.inputs.log)
    if not found:
        return CheckResult((), "no avg_spec_accept_length line", {})
    line, value = found[-1]
    points = decode_points(art.server_log)
    recent = points[points["line"] < line].tail(8)
    data: dict[str, Any] = {"line": line, "cumulative": value, "lines": len(found)}
    said = ""
    if len(recent):
        med = float(recent["accept"].median())
        data["recent_median"] = med
        said = f"; the {len(recent)} Decode batch lines before it read a median of {med:.2f} per interval"
    msg = (f"avg_spec_accept_length={value:g} (line {line}) is SGLang's average over every verify round since the "
           f"server started or its statistics were last reset, not the current rate{said}. Compare interval "
           "figures (the Decode batch lines, logs / plan) between runs, not this one.")
    return CheckResult((Finding("cumulative-accept-length", "info", printable(msg), source=SOURCE, impact="low"),),
                       f"cumulative average {value:g}", data)


CHECK = register(Check("cumulative-average", "SGLang's cumulative average accept length (--log)",
                       ("cumulative-accept-length",), ("log",), run, order=70))
