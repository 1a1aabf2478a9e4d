"""LoRA adapters on the target with one unadapted drafter (docs/causes.md row 25).

``lora-target``: the arguments line enables LoRA (SGLang ``--enable-lora`` / ``--lora-paths``, vLLM
``--enable-lora`` / ``--lora-modules``). Every engine release read applies the adapter to the target only
(``engines.servingrules`` topic ``lora``): the drafter keeps predicting the base model while the adapted
target verifies, so requests served through an adapter accept less (sgl-project/sglang#9756, #28395, #34337,
sgl-project/SpecForge#138). How much depends on how far the adapter moves the target; a capture from the
adapted target replayed with ``replay`` measures it. With no adapter named at launch, adapters loaded at run
time (vLLM's "Loaded new LoRA adapter" line) and served requests naming one (SGLang ``lora_path``; a vLLM
body's ``model`` that is such an adapter, ``--served-prompts``) are a warning too. Cause (for the grouping of
findings): the served target differs from the one the drafter was trained on.
"""
from __future__ import annotations

import re
from typing import Any

from ..engines.loglines import read_lines
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


# vLLM's runtime adapter load (POST /v1/load_lora_adapter): 0.11.0 entrypoints/openai/serving_models.py,
# 0.34.0 entrypoints/openai/models/serving.py ``logger.info("Loaded new LoRA adapter: name '%s', path '%s'")``
RUNTIME_LOAD = re.compile(r"Loaded new LoRA adapter: name '([^']*)', path '([^']*)'")
RUNTIME_SOURCE = ("vllm 0.11.0 vllm/entrypoints/openai/serving_models.py, 0.34.0 vllm/entrypoints/openai/models/"
                  "serving.py (load_lora_adapter); sglang 0.5.8, 0.5.23 srt/managers/io_struct.py GenerateReqInput."
                  "lora_path")


def runtime_adapters(art: Artifacts) -> list[str]:
    """The adapter names the log shows loaded at run time (vLLM's load_lora_adapter line), in order, once each."""
    if art.inputs.log is None:
        return []
    names: list[str] = []
    for _, line in read_lines(art.inputs.log):
        m = RUNTIME_LOAD.search(line) if "LoRA adapter" in line else None
        if m and m.group(1) not in names:
            names.append(m.group(1))
    return names


def requests_through_adapters(art: Artifacts, loaded: list[str]) -> tuple[int, int, list[str]]:
    """(served requests naming an adapter, requests read, the adapters named): SGLang's ``lora_path``, or a body
    ``model`` that is an adapter loaded at run time."""
    if not art.available("served_prompts"):
        return 0, 0, []
    hit, named = 0, []
    for p in art.served_prompts:
        name = p.lora_path or (p.model if p.model in loaded else None)
        if name:
            hit += 1
            if name not in named:
                named.append(name)
    return hit, len(art.served_prompts), named


def run(art: Artifacts) -> CheckResult:
    """Read the LoRA arguments; adapters named at launch, or loaded at run time and named by the served requests, are
    a warning; LoRA enabled with no adapter seen an info."""
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
    loaded = runtime_adapters(art)
    hit, asked, named = requests_through_adapters(art, loaded)
    data.update(runtime_adapters=loaded[:20], requests_through_adapter=hit, requests_read=asked)
    if not setting.adapters and (hit or loaded):
        seen = []
        if loaded:
            seen.append(f"the log shows {len(loaded)} adapter(s) loaded at run time ({', '.join(loaded[:5])})")
        if hit:
            seen.append(f"{hit} of {asked} served requests go through an adapter "
                        f"({', '.join(named[:5])}{' ...' if len(named) > 5 else ''})")
        msg = (f"{name} has LoRA enabled with no adapter named at launch, but " + " and ".join(seen) +
               f": those requests are verified by an adapted target the drafter was not trained on{how}, and accept "
               "less, by an amount that grows with how far the adapter moves the target.")
        return CheckResult((Finding("lora-target", "warning" if hit or not asked else "info", printable(msg), fix=fix,
                                    source=f"{source}; {RUNTIME_SOURCE}", impact="medium" if hit or not asked
                                    else "low"),), f"LoRA on, adapters loaded at run time", data)
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
