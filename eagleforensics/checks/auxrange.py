"""An aux layer id equal to (or past) the target's layer count (docs/causes.md row 1, vllm-project/vllm#46788).

``aux-id-past-layers``: vLLM reads the draft config's top-level ``eagle_aux_hidden_state_layer_ids`` and, for a
DeepSeek-architecture target (DeepSeek-V2/V3, Kimi-K2/K2.5), appends the state entering layer ``idx`` inside the
layer loop only: vllm 0.14.1 vllm/model_executor/models/deepseek_v2.py ``DeepseekV2Model.forward``, so an id equal
to the layer count (the last layer's output) is never captured and the drafter gets fewer states than it was built
for, without an error. vllm 0.25.0, 0.29.0, 0.33.0, 0.34.0 append it after the loop (``self.end_layer in
self.aux_hidden_state_layers``); 0.10.0 - 0.12.0 capture no aux states for the architecture at all; releases 0.15
- 0.24 were not read. An id past the layer count is never captured by any release. Error where the release is
known to drop it, warning where the release is not known (or not read), info for an engine that is not vLLM.
Cause: the aux-layer wiring.
"""
from __future__ import annotations

from typing import Any

from ..engines.rules import family_of, parse_version
from ..errors import ForensicsError, printable
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .drafterfacts import target_facts
from .registry import register

SOURCE = "vllm-project/vllm#46788 (docs/causes.md row 1)"
LOOP_ONLY = "vllm 0.14.1 vllm/model_executor/models/deepseek_v2.py DeepseekV2Model.forward (captures inside the loop)"
AFTER_LOOP = ("vllm 0.25.0 - 0.34.0 vllm/model_executor/models/deepseek_v2.py (self.end_layer in "
              "self.aux_hidden_state_layers, after the loop)")
FIXED_BY = "0.25.0"  # first release read that captures id = layer count (0.15 - 0.24 not read)


def run(art: Artifacts) -> CheckResult:
    """The draft config's vLLM ids against the target's layer count."""
    cfg = art.draft_config
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    if not (isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        return CheckResult((), "no top-level eagle_aux_hidden_state_layer_ids (what vLLM reads)", {})
    facts = target_facts(art.target.config)
    n = facts.num_layers
    if not n:
        return CheckResult((), "the target's config has no layer count", {})
    try:
        family = family_of(facts.model_type) if facts.model_type else None
    except ForensicsError:
        family = None
    data: dict[str, Any] = {"ids": ids, "num_layers": n, "family": family}
    past = [i for i in ids if i > n]
    engine, version = art.engine, art.engine_version
    fix = (f"Write ids below {n} (the state entering each layer), or serve on vLLM >= {FIXED_BY}, which captures "
           f"the last layer's output for id {n}.")
    if past:
        return CheckResult((Finding("aux-id-past-layers", "warning", printable(
            f"eagle_aux_hidden_state_layer_ids {ids} name {past}, past the target's {n} layers: no engine release "
            "read captures a state there, so the drafter is fed fewer states than its fc expects."), fix=fix,
            source=SOURCE, impact="collapse"),), f"ids {ids} past {n} layers", data)
    if n not in ids or family != "deepseek":
        return CheckResult((), f"ids {ids} within the target's {n} layers", data)
    if engine not in (None, "vllm"):
        return CheckResult((Finding("aux-id-past-layers", "info", printable(
            f"eagle_aux_hidden_state_layer_ids {ids} include {n}, the layer count: vLLM before {FIXED_BY} captures "
            f"nothing there for this architecture ({LOOP_ONLY}); {engine} does not read this key."), source=SOURCE,
            impact="low"),), f"id {n} = layer count", data)
    if version is not None and parse_version(version) >= parse_version(FIXED_BY):
        return CheckResult((), f"id {n} = layer count, captured after the loop by vLLM {version} ({AFTER_LOOP})",
                           data)
    known_drop = version is not None and parse_version("0.14.0") <= parse_version(version) <= parse_version("0.14.1")
    lead = "" if known_drop else (f"if your vLLM release is before {FIXED_BY} (0.14.1 read; 0.15 - 0.24 not read"
                                  + ("" if version is None else f"; {version} given") + "), then ")
    msg = (f"eagle_aux_hidden_state_layer_ids {ids} include {n}, the target's layer count: {lead}vLLM captures aux "
           f"states inside the layer loop only ({LOOP_ONLY}), so id {n} captures nothing and the drafter gets "
           f"{len(ids) - 1} states where it was built for {len(ids)}, silently.")
    return CheckResult((Finding("aux-id-past-layers", "error" if known_drop else "warning", printable(msg), fix=fix,
                                source=f"{LOOP_ONLY}; {AFTER_LOOP}; {SOURCE}", impact="collapse"),),
                       f"id {n} = layer count", data)


CHECK = register(Check("aux-range", "an aux layer id at or past the target's layer count", ("aux-id-past-layers",),
                       ("draft_config", "target"), run, order=68))
