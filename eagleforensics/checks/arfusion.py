"""TP > 1 with the all-reduce fused into the next RMSNorm: aux states read as per-rank partial sums (docs/causes.md
row 20; sgl-project/sglang#28343, vllm-project/vllm#47270).

``ar-fusion-partial-aux``: the arguments line of an EAGLE-3 SGLang server with ``enable_flashinfer_allreduce_fusion``
(printed after SGLang resolves it: it switches itself on for DeepSeek-V3 and Kimi-K2.5 on Hopper / Blackwell with TP
> 1) and ``tp_size`` > 1 on a DeepSeek-architecture target, against the release rows (``engines.runtimerules``
topic ``ar-fusion``): SGLang 0.5.8 - 0.5.12 capture before the deferred all-reduce, 0.5.14 on after it. Error where
release and family are known, warning where the log's format leaves the release open or the family unknown, info
where the release captures after the all-reduce. vLLM: not read (vllm-project/vllm#47270 reports it). Cause: an
engine bug in the serving path.
"""
from __future__ import annotations

from typing import Any

from ..engines.rules import family_of
from ..engines.runtimerules import release_span, runtime_rules_between
from ..engines.servingargs import _get, _truthy
from ..errors import ForensicsError, printable
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register

SOURCE = "sgl-project/sglang#28343, vllm-project/vllm#47270 (docs/causes.md row 20)"


def run(art: Artifacts) -> CheckResult:
    """Read the fusion setting and TP size against the release rows."""
    args = art.server_args
    if args is None:
        return CheckResult(skipped="the log has no arguments line (the fusion setting is read from it)")
    if args.engine != "sglang" or args.algorithm != "eagle3":
        return CheckResult((), "not an SGLang EAGLE-3 server (vLLM not read for this)", {})
    _, fused = _get(args, "enable_flashinfer_allreduce_fusion")
    tp = args.tp or 1
    data: dict[str, Any] = {"fusion": _truthy(fused), "tp": tp}
    if not _truthy(fused) or tp <= 1:
        return CheckResult((), f"all-reduce fusion {'on' if _truthy(fused) else 'off'}, tp_size={tp}", data)
    try:
        family = family_of(art.model_type) if art.model_type else None
    except ForensicsError:
        family = "other"
    if family not in (None, "deepseek"):
        return CheckResult((), f"all-reduce fusion with tp_size={tp} on a {family} target (the rows read are for "
                           "DeepSeek-architecture models)", data)
    first, last, exact = release_span(args, art.inputs.engine_version)
    rows = runtime_rules_between("ar-fusion", "sglang", first, last)
    bad = [r for r in rows if r.outcome == "partial-sums"]
    data["rows"] = [{"span": r.span(), "outcome": r.outcome} for r in rows]
    if not bad:
        src = rows[-1].source if rows else "not read for this release"
        return CheckResult((Finding("ar-fusion-partial-aux", "info", printable(
            f"all-reduce fusion with tp_size={tp}: this release takes the aux states after the fused all-reduce "
            f"({src})."), source=SOURCE, impact="low"),), f"fusion, tp_size={tp}", data)
    rule = bad[0]
    certain = (exact or len(bad) == len(rows)) and family == "deepseek"
    needs = []
    if not (exact or len(bad) == len(rows)):
        needs.append(f"your release is one of SGLang {rule.span()} (pass --engine-version)")
    if family is None:
        needs.append("the target is a DeepSeek-architecture model (pass --target or --model-type)")
    lead = "" if certain else "if " + " and ".join(needs) + ", then "
    msg = (f"SGLang with enable_flashinfer_allreduce_fusion=True and tp_size={tp}: {lead}{rule.detail} "
           f"({rule.source}): the drafter is fed states no training record holds, and acceptance falls with no error.")
    return CheckResult((Finding("ar-fusion-partial-aux", "error" if certain else "warning", printable(msg),
                                fix="Upgrade SGLang to >= 0.5.14, or start with "
                                    "--enforce-disable-flashinfer-allreduce-fusion (or TP 1) on this release.",
                                source=f"{rule.source}; {SOURCE}", impact="high"),), f"fusion, tp_size={tp}", data)


CHECK = register(Check("ar-fusion", "TP > 1 with the all-reduce fused into the next norm: aux states as partial sums "
                       "(--log)", ("ar-fusion-partial-aux",), ("log",), run, order=71))
