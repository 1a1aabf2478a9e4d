"""Hybrid targets: Mamba / linear-attention (GDN) layers, whose recurrent state must be rolled back after a rejection.

``hybrid-target``: the target's config declares recurrent layers (``layer_types`` with linear
attention or Mamba, Nemotron-H's ``hybrid_override_pattern``, ``layers_block_type``, Jamba's
``attn_layer_period``). A KV cache is rolled back by dropping entries; a recurrent state must be
restored to the last accepted token, and engines that get it wrong accept near nothing or report
inflated rates (vllm-project/tpu-inference#3178, ml-explore/mlx-lm#1456, vllm-project/vllm#57721).
Severity from the engine's release (``engines.modelclasses``, read per release): error where the
release has no EAGLE-3 capture for the architecture (it raises at start); warning where the release
was not read; info where it captures it, where the engine is unknown, or where no release is given
(the line says which releases read capture it).
"""
from __future__ import annotations

from ..engines.rules import ENGINE_NAMES
from ..engines.modelclasses import releases
from ..engines.targetrules import eagle3_history, eagle3_support
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register
from .targetkind import architecture, hybrid_layout

HYBRID_SOURCE = ("vllm-project/tpu-inference#3178, ml-explore/mlx-lm#1456, vllm-project/vllm#57721, "
                 "vllm-project/vllm#51771 (docs/causes.md row 27)")


def support_line(arch: str | None) -> tuple[str, dict[str, str], str]:
    """What each engine's releases read support for EAGLE-3 on ``arch``: (text, status at the newest release read
    per engine, sources)."""
    status, sources, parts = {}, [], []
    for engine in ("vllm", "sglang"):
        s, src = eagle3_support(engine, arch)
        status[engine] = s
        if src:
            sources.append(src)
        parts.append(f"{ENGINE_NAMES[engine]}: {eagle3_history(engine, arch)}")
    return "; ".join(parts), status, "; ".join(sources)


def launch_support(art: Artifacts, arch: str | None) -> tuple[str, str, str]:
    """``(status, release, source)`` for the engine of this run: at its release when that release was read,
    ``unread`` when it was not, and at the newest release read when no release is known (said in the release)."""
    engine = art.engine
    assert engine is not None
    version = art.engine_version
    if version is None:
        read = releases(engine)
        said = {v: eagle3_support(engine, arch, v)[0] for v in read}
        refused = [v for v in read if said[v] in ("no", "unregistered")]
        status, src = eagle3_support(engine, arch)
        if status != "unknown":
            status = "no" if len(refused) == len(read) else "varies" if refused else "yes"
        return status, f"(release not given; every release read, {read[0]} - {read[-1]})", src
    status, src = eagle3_support(engine, arch, version)
    return status, version, src


def unsupported(art: Artifacts, code: str, head: str, arch: str | None, line: str, src: str,
                data: dict) -> CheckResult | None:
    """The finding for an engine release whose model class for ``arch`` has no EAGLE-3 capture (error) or a release
    not read (warning); None where the release captures it, or where no release is given (the info line then says
    which releases read capture it)."""
    engine = art.engine
    assert engine is not None
    status, release, row_src = launch_support(art, arch)
    data["engine_release_assumed"] = release
    data["engine_support"] = status
    name = ENGINE_NAMES[engine]
    fix = f"Serve this target on an engine release whose {arch} class captures aux states ({line})."
    source = f"{row_src}; {src}" if row_src else src
    if status in ("no", "unregistered"):
        what = "has no EAGLE-3 capture for" if status == "no" else "does not register"
        return CheckResult((Finding(code, "error", f"{head}. {name} {release} {what} {arch}: it raises at start when "
                                    "EAGLE-3 is asked for.", fix=fix, source=source, impact="collapse"),), "", data)
    if status == "unread":
        return CheckResult((Finding(code, "warning", f"{head}. {name} {release}: not read for this release, so whether "
                                    f"its {arch} class captures aux states is not known here ({line}).",
                                    fix=f"Pass a release that was read, or check the release's model class. {fix}",
                                    source=source, impact="collapse"),), "", data)
    return None


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
    if engine in status:
        refused = unsupported(art, "hybrid-target", head, arch, line, src, data)
        if refused is not None:
            return refused
    tail = ("; engines that restore it inexactly accept near nothing (smaller engines and MTP paths in the threads); "
            f"{line}.")
    return CheckResult((Finding("hybrid-target", "info", head + tail, fix="If acceptance is far below the "
                                "drafter's offline replay, compare with an attention-only target of the family or "
                                "another engine release.", source=src, impact="low"),), "", data)


CHECK = register(Check("hybrid-target", "Mamba / linear-attention layers in the target and EAGLE-3 support for them",
                       ("hybrid-target",), ("target",), run, order=15))
