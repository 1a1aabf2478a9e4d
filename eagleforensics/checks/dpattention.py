"""DP attention / expert parallelism: aux states gathered over the wrong group (docs/causes.md row 20).

``dp-attention``: the arguments line runs DP attention (SGLang ``enable_dp_attention`` with
``dp_size`` > 1) with an all-to-all MoE backend (``moe_a2a_backend`` deepep / mooncake) on a
DeepSeek-architecture target (DeepSeek-V2/V3, Kimi-K2), on a release that all-gathers the aux
hidden states over the whole tensor-parallel group instead of the attention-TP group (SGLang 0.5.7
- 0.5.9, fixed by sgl-project/sglang#20492; ``engines.servingrules`` topic ``dp-attention``): the
drafter is fed states of other ranks' tokens. Error where the release, family and backend are
known; warning where the log's format leaves the release open (pass ``--engine-version``) or the
family unknown (pass ``--target``); info where DP attention runs on a release with the right group.
No vLLM release read has such a rule (the catalogue's vLLM thread, vllm-project/vllm#9565, is a V0
performance report, not a gather-group bug). Cause (for
the grouping of findings): an engine bug in the serving path.
"""
from __future__ import annotations

from typing import Any

from ..engines.modelclasses import arch_for_model_type, family_between, is_read
from ..engines.rules import family_of, parse_version
from ..engines.servingargs import dp_setting
from ..engines.servingrules import rules_between, serving_rule
from ..errors import ForensicsError, printable
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register
from .targetkind import architecture

SOURCE = "sgl-project/sglang#20492, vllm-project/vllm#9565 (docs/causes.md row 20)"
CAUSE = "engine bug in the serving path"
A2A = ("deepep", "mooncake")


ROOT = "DeepseekV2ForCausalLM"  # the model class whose forward holds the gather (srt/models/deepseek_v2.py)


def _family(art: Artifacts, lo: str, hi: str | None) -> tuple[str | None, str]:
    """``deepseek`` when the target's class descends from SGLang's DeepseekV2ForCausalLM in the releases read in
    ``lo`` .. ``hi`` (its model registry and class bases, ``engines.modelclasses``), ``other`` when it does not,
    None when unknown; and what the answer was read from."""
    arch = architecture(art.target.config) if art.available("target") else None
    mtype = art.model_type
    if arch is None and mtype:
        arch = arch_for_model_type("sglang", mtype)
    if arch is not None:
        inside, row = family_between("sglang", arch, ROOT, lo, hi)
        if inside is not None and row is not None:
            return ("deepseek" if inside else "other"), row.cite() + (f" subclasses {ROOT}" if inside else "")
    unread = lo == hi and not is_read("sglang", lo)
    if not mtype:
        return None, ""
    try:
        return family_of(mtype), f"model_type {mtype}"
    except ForensicsError:
        if unread:
            return None, f"sglang {lo}: not read for this release (its model registry decides the family)"
        return "other", f"model_type {mtype}"


def run(art: Artifacts) -> CheckResult:
    """Place this server's DP-attention settings against the release rows for the aux gather group."""
    args = art.server_args
    if args is None:
        return CheckResult(skipped="the log has no arguments line (DP attention is read from it)")
    s = dp_setting(args)
    data: dict[str, Any] = {"setting": s.describe(), "cause": CAUSE}
    if args.engine != "sglang":
        dp = f"data_parallel_size={args.dp}" + (f", enable_expert_parallel={s.expert_parallel}"
                                                if s.expert_parallel is not None else "")
        return CheckResult((), f"{dp}: no vLLM release read gathers aux states over a wrong group", data)
    if not s.dp_attention or not (args.dp or 1) > 1:
        return CheckResult((), f"no DP attention ({s.describe()})", data)
    if args.algorithm != "eagle3":
        return CheckResult((), f"DP attention, but the server runs {args.algorithm_raw or 'no speculation'}", data)
    exact = art.inputs.engine_version or args.version
    if exact:
        lo, hi = exact, exact
    elif args.version_range:
        lo, hi = args.version_range
    else:
        lo, hi = "0.4.0", None
    family, family_basis = _family(art, lo, hi)
    data["family_read_from"] = family_basis
    rows = rules_between("dp-attention", "sglang", lo, hi, "deepseek_v3")
    wrong = [r for r in rows if r.outcome == "wrong-group"]
    data.update({"family": family, "releases": f"{lo} - {hi or 'newest'}",
                 "rows": [{"span": r.span(), "outcome": r.outcome} for r in rows]})
    a2a = s.a2a_backend in A2A
    if not wrong or family not in (None, "deepseek") or not a2a:
        why = (f"the target is not a DeepSeek-V2-family model ({family_basis})" if family not in (None, "deepseek") else
               f"moe_a2a_backend={s.a2a_backend or 'none'} (the wrong gather needs deepep or mooncake)" if not a2a
               else f"releases {lo} - {hi or 'newest'} gather over the attention-TP group")
        row = serving_rule("dp-attention", "sglang", hi, "deepseek_v3")
        src = f"; {row.source}" if row is not None and row.outcome == "right-group" else ""
        return CheckResult((Finding("dp-attention", "info", printable(
            f"DP attention with EAGLE-3 ({s.describe()}): the aux states reach the drafter from the right group "
            f"here ({why}{src})."), source=SOURCE, impact="low"),), f"DP attention: {s.describe()}", data)
    rule = wrong[0]
    certain_release = bool(exact) and parse_version(rule.since) <= parse_version(exact) <= \
        parse_version(rule.until or exact)
    certain = certain_release and family == "deepseek"
    needs = []
    if not certain_release:
        needs.append(f"your release is one of SGLang {rule.span()} (the log's format says "
                     f"{str(args.version_hint).replace('sglang ', '')}; pass --engine-version)")
    if family is None:
        needs.append("the target is a DeepSeek-architecture model (pass --target or --model-type)")
    lead = "" if certain else "if " + " and ".join(needs) + ", then "
    hint = str(args.version_hint or "release unknown").replace("sglang ", "")
    fam = f" The target's class: {family_basis}." if family == "deepseek" and family_basis else ""
    msg = (f"SGLang {exact or hint} runs DP attention with EAGLE-3 ({s.describe()}): {lead}{rule.detail} "
           f"({rule.source}).{fam} Expect acceptance far below the drafter's offline figure.")
    fix = ("Upgrade SGLang to >= 0.5.10 (the gather uses the attention-TP group), or serve without DP attention "
           "(or with moe_a2a_backend none) on this release.")
    severity, impact = ("error", "high") if certain else ("warning", "high")
    source = f"{rule.source}; {SOURCE}"
    return CheckResult((Finding("dp-attention", severity, printable(msg), fix=fix, source=source, impact=impact),),
                       f"DP attention: {s.describe()}", data)


CHECK = register(Check("dp-attention", "DP attention / expert parallelism gathering aux states over the wrong "
                       "group (--log)", ("dp-attention",), ("log",), run, order=62))
