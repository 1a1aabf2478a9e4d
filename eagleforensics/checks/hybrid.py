"""Hybrid targets: Mamba / linear-attention (GDN) layers, whose recurrent state must be rolled back after a rejection.

``hybrid-target``: the target's config declares recurrent layers (``layer_types`` with linear
attention or Mamba, Nemotron-H's ``hybrid_override_pattern``, ``layers_block_type``, Jamba's
``attn_layer_period``). A KV cache is rolled back by dropping entries; a recurrent state must be
restored to the last accepted token, and engines that get it wrong accept near nothing or report
inflated rates (vllm-project/tpu-inference#3178, ml-explore/mlx-lm#1456, vllm-project/vllm#57721).
Severity from the engine's table (``engines.targetrules``): error where the release has no EAGLE-3
capture for the architecture (it raises at start), info where it has or where the engine is unknown.
"""
from __future__ import annotations

from ..engines.rules import ENGINE_NAMES
from ..engines.targetrules import ENGINE_READ, eagle3_support
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register
from .targetkind import architecture, hybrid_layout

HYBRID_SOURCE = ("vllm-project/tpu-inference#3178, ml-explore/mlx-lm#1456, vllm-project/vllm#57721, "
                 "vllm-project/vllm#51771 (docs/causes.md row 27)")


def support_line(arch: str | None) -> tuple[str, dict[str, str], str]:
    """What each engine release read supports for EAGLE-3 on ``arch``: (text, status per engine, sources)."""
    status, sources, parts = {}, [], []
    for engine in ENGINE_READ:
        s, src = eagle3_support(engine, arch)
        status[engine] = s
        if src:
            sources.append(src)
        parts.append(f"{ENGINE_NAMES[engine]} {ENGINE_READ[engine]}: "
                     + {"yes": "EAGLE-3 capture implemented", "no": "no EAGLE-3 capture (raises at start)",
                        "unknown": "not in the tables read"}[s])
    return "; ".join(parts), status, "; ".join(sources)


def unsupported(art: Artifacts, code: str, head: str, arch: str | None, line: str, src: str,
                data: dict) -> CheckResult:
    """The finding for an engine whose model class for ``arch`` has no EAGLE-3 capture: error at the release read,
    warning for another release of that engine (the tables were read at one release)."""
    engine = art.engine
    assert engine is not None
    version = art.engine_version
    read = ENGINE_READ[engine]
    same = version is None or version == read
    data["engine_version_read"] = read
    msg = (f"{head}. {ENGINE_NAMES[engine]} {read} has no EAGLE-3 capture for {arch}: it raises at start when EAGLE-3 "
           "is asked for" + ("." if same else f" (read at {read}; {version} was not read, so this is the nearest "
                                                  "release's answer)."))
    return CheckResult((Finding(code, "error" if same else "warning", msg, fix=f"Serve this target on an engine "
                                f"release whose {arch} class captures aux states ({line}).", source=src,
                                impact="collapse"),), "", data)


def run(art: Artifacts) -> CheckResult:
    """Hybrid layers in the target's config, with each engine's EAGLE-3 support for its architecture."""
    cfg = art.target.config
    layout = hybrid_layout(cfg)
    if layout is None:
        return CheckResult(note="attention-only target (no Mamba / linear-attention layers declared)")
    arch = architecture(cfg)
    line, status, sources = support_line(arch)
    data = {**layout, "architecture": arch, "eagle3_support": status}
    count = f"{layout['layers']} of {layout['of']} layers" if layout["layers"] else "recurrent layers"
    head = (f"the target is hybrid: {count} are {', '.join(layout['kinds'])} ({layout['from']}); their state must "
            "be rolled back exactly to the last accepted token after every rejected draft")
    engine = art.engine
    src = f"{sources}; {HYBRID_SOURCE}" if sources else HYBRID_SOURCE
    if engine in status and status[engine] == "no":
        return unsupported(art, "hybrid-target", head, arch, line, src, data)
    tail = ("; engines that restore it inexactly accept near nothing (smaller engines and MTP paths in the threads); "
            f"{line}.")
    return CheckResult((Finding("hybrid-target", "info", head + tail, fix="If acceptance is far below the "
                                "drafter's offline replay, compare with an attention-only target of the family or "
                                "another engine release.", source=src, impact="low"),), "", data)


CHECK = register(Check("hybrid-target", "Mamba / linear-attention layers in the target and EAGLE-3 support for them",
                       ("hybrid-target",), ("target",), run, order=15))
