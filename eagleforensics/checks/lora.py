"""LoRA adapters on the target with one unadapted drafter (docs/causes.md row 25).

``lora-target``: the arguments line enables LoRA (SGLang ``--enable-lora`` / ``--lora-paths``, vLLM
``--enable-lora`` / ``--lora-modules``). Every engine release read applies the adapter to the
target only (``engines.servingrules`` topic ``lora``): the drafter keeps predicting the base
model while the adapted target verifies, so requests served through an adapter accept less
(sgl-project/sglang#9756, #28395, #34337, sgl-project/SpecForge#138). How much depends on how far
the adapter moves the target; a capture from the adapted target replayed with ``replay``
measures it. Cause (for the grouping of findings): the served target differs from the one the
drafter was trained on.
"""
from __future__ import annotations

from typing import Any

from ..engines.servingargs import lora_setting
from ..engines.servingrules import serving_rule
from ..errors import printable
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .engineembed import engine_label
from .registry import register

SOURCE = ("sgl-project/sglang#9756, sgl-project/sglang#28395, sgl-project/sglang#34337, sgl-project/SpecForge#138 "
          "(docs/causes.md row 25)")
CAUSE = "the served target differs from the drafter's training target"


def run(art: Artifacts) -> CheckResult:
    """Read the LoRA arguments; adapters named at launch are a warning, LoRA enabled without names an info."""
    args = art.server_args
    if args is None:
        return CheckResult(skipped="the log has no arguments line (LoRA is read from it)")
    setting = lora_setting(args)
    data: dict[str, Any] = {"enabled": setting.enabled, "adapters": list(setting.adapters), "field": setting.field,
                            "cause": CAUSE}
    if not setting.enabled:
        said = "LoRA off" if setting.enabled is False else "the arguments line does not say whether LoRA is on"
        return CheckResult((), said, data)
    if not args.speculative:
        return CheckResult((), "LoRA on, but the server does not speculate", data)
    rule = serving_rule("lora", args.engine, art.engine_version)
    _, _, name = engine_label(art)
    how = f" ({rule.detail})" if rule else ""
    source = f"{rule.source}; {SOURCE}" if rule else SOURCE
    data["rule"] = None if rule is None else {"span": rule.span(), "outcome": rule.outcome, "source": rule.source}
    fix = ("Train the drafter on the adapted target (merge the adapter and regenerate the data and hidden states), "
           "one drafter per adapter, or serve the merged model; replay a capture from the adapted target to see "
           "what this drafter loses there.")
    if setting.adapters:
        shown = ", ".join(setting.adapters[:5]) + (f" and {len(setting.adapters) - 5} more"
                                                   if len(setting.adapters) > 5 else "")
        msg = (f"{name} serves the target through LoRA adapters ({shown}) while the drafter is not adapted{how}: "
               "requests that use an adapter are verified by a model the drafter was not trained on and accept "
               "less, by an amount that grows with how far the adapter moves the target. Requests to the base "
               "model are unaffected.")
        finding = Finding("lora-target", "warning", printable(msg), fix=fix, source=source, impact="medium")
    else:
        msg = (f"{name} has LoRA enabled but names no adapter at launch; adapters loaded at run time are "
               f"applied to the target only{how}, so requests through them accept less than base-model ones.")
        finding = Finding("lora-target", "info", printable(msg), fix=fix, source=source, impact="low")
    return CheckResult((finding,), f"LoRA on, {len(setting.adapters)} adapter(s) named", data)


CHECK = register(Check("lora-target", "LoRA adapters on the target, none on the drafter (--log)", ("lora-target",),
                       ("log",), run, order=61))
