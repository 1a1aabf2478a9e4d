"""Acceptance that falls with batch size (docs/causes.md row 35).

``accept-falls-with-batch``: accept length regressed on log2 of the running requests of each decode line
(SGLang ``Decode batch`` lines carry ``#running-req``; vLLM's come from the throughput line before each
SpecDecoding line; ``engines.acceptlines.batch_trend``) falls by at least 30% of its gain over 1 across at
least two doublings, with a rank correlation of -0.6 or lower. A healthy drafter is flat in concurrency
(sgl-project/sglang#16818); the falling ones were stale state in padded CUDA-graph slots and proposer batch
indexing (NVIDIA/TensorRT-LLM#9208, vllm-project/vllm-ascend#2794, sgl-project/sglang#18647,
vllm-project/vllm#26498). Lines a run-time switch leaves undrafted (``checks.specoff``) are left out first. Info
when the log spans enough batch sizes and acceptance is flat. Cause: an engine bug in the serving path.
"""
from __future__ import annotations

from typing import Any

from ..engines.acceptlines import batch_trend, decode_points
from ..errors import printable
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register
from .specoff import explained_lines

SOURCE = ("NVIDIA/TensorRT-LLM#9208, vllm-project/vllm-ascend#2794, sgl-project/sglang#18647, vllm-project/vllm#26498, "
          "sgl-project/sglang#16818 (docs/causes.md row 35)")
CAUSE = "engine bug in the serving path"


def run(art: Artifacts) -> CheckResult:
    """Regress the log's accept length on batch size."""
    df = art.server_log
    off = explained_lines(df, art.server_args, art.engine_version)
    points = decode_points(df[~df["line"].isin(off["line"])] if len(off) else df)
    trend = batch_trend(points)
    data: dict[str, Any] = {"cause": CAUSE, "left_out": int(len(off))}
    if trend is None:
        return CheckResult((), f"{len(points)} decode lines: too few, or too narrow a batch range (the test needs "
                           "8 lines over at least two doublings of running requests)", data)
    data["trend"] = trend.to_dict()
    said = (f"accept length {trend.start:.2f} at {trend.low:g} running requests, {trend.end:.2f} at {trend.high:g} "
            f"(fitted on log2 batch over {trend.lines} decode lines, rank correlation {trend.rho:.2f})")
    if trend.falls():
        msg = (f"{said}: {100 * trend.lost:.0f}% of the gain over 1 is lost as the batch grows. A healthy drafter "
               "is flat in concurrency; this is the engine's batched path (padded CUDA-graph slots, proposer batch "
               "indexing), not the drafter.")
        impact = "high" if trend.lost >= 0.6 else "medium"
        return CheckResult((Finding("accept-falls-with-batch", "warning", printable(msg),
                                    fix="Measure at batch 1 and at your served concurrency with the same prompts; "
                                        "report the engine release and CUDA-graph settings upstream, or try "
                                        "without CUDA graphs / another release.",
                                    source=SOURCE, impact=impact),), said, data)
    return CheckResult((Finding("accept-falls-with-batch", "info", printable(
        f"{said}: flat enough in batch size, as a healthy drafter is."), source=SOURCE, impact="low"),), said, data)


CHECK = register(Check("batch-dependence", "acceptance that falls with batch size (--log)",
                       ("accept-falls-with-batch",), ("log",), run, order=65))
