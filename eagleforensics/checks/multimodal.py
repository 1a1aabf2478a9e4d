"""Multimodal targets served with a text drafter: image-token states and M-RoPE positions the drafter never saw.

``multimodal-target``: the target's config carries a vision (or audio) tower or M-RoPE
(``mrope_section``). On text-only requests M-RoPE's three position streams coincide and the
drafter sees what it was trained on; on image requests the aux states over image tokens and the
multimodal positions are new to a drafter trained on text (Qwen-VL accept length about 1:
sgl-project/SpecForge#310; vision embeddings not passed to the draft: vllm-project/vllm#36097).
With ``--train`` the records are searched for the config's image / video token ids. Error where
the engine release has no EAGLE-3 capture for the architecture (``engines.targetrules``), else info.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..arrays import as_array
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .hybrid import support_line, unsupported
from .registry import register
from .targetkind import architecture, multimodal_layout

MM_SOURCE = ("sgl-project/SpecForge#310, vllm-project/vllm#36097, vllm-project/vllm#22872, sgl-project/sglang#8801 "
             "(docs/causes.md row 24)")


def records_with_tokens(art: Artifacts, ids: set[int]) -> tuple[int, int]:
    """(records holding any of ``ids``, records with input ids) over the records the doctor reads."""
    hit = seen = 0
    for rec in art.records:
        if rec.input_ids is None:
            continue
        seen += 1
        arr = np.asarray(as_array(rec.input_ids)).reshape(-1)
        if np.isin(arr, np.fromiter(ids, dtype=np.int64)).any():
            hit += 1
    return hit, seen


MEDIA_PARTS = {"image_url", "image", "input_image", "video", "video_url", "audio_url", "input_audio", "audio"}


def served_with_media(art: Artifacts, ids: set[int]) -> tuple[int, int]:
    """(served requests carrying an image / video / audio part or token, requests read) of ``--served-prompts``."""
    hit = 0
    prompts = art.served_prompts
    for p in prompts:
        media = False
        for m in p.messages or []:
            content = m.get("content")
            if isinstance(content, list):
                media |= any(isinstance(part, dict) and part.get("type") in MEDIA_PARTS for part in content)
        if p.ids is not None and ids:
            media |= any(i in ids for i in p.ids)
        hit += media
    return hit, len(prompts)


def run(art: Artifacts) -> CheckResult:
    """The target's multimodal layout, the engine's EAGLE-3 support for it, and image tokens in the records."""
    cfg = art.target.config
    layout = multimodal_layout(cfg)
    if layout is None:
        return CheckResult(note="text-only target (no vision / audio tower or M-RoPE declared)")
    arch = architecture(cfg)
    line, status, sources = support_line(arch)
    data: dict[str, Any] = {**layout, "architecture": arch, "eagle3_support": status}
    parts = [f"tower {', '.join(layout['towers'])}"] if layout["towers"] else []
    if layout["mrope_section"] is not None:
        parts.append(f"M-RoPE mrope_section {layout['mrope_section']}")
    head = f"the target is multimodal ({'; '.join(parts)})"
    src = f"{sources}; {MM_SOURCE}" if sources else MM_SOURCE
    engine = art.engine
    if engine in status:
        refused = unsupported(art, "multimodal-target", head, arch, line, src, data)
        if refused is not None:
            return refused
    ids = set(layout["token_ids"].values())
    trained, hit = "", None
    if ids and art.available("train"):
        hit, seen = records_with_tokens(art, ids)
        data.update(records_with_image_tokens=hit, records_read=seen)
        trained = (f" {hit} of {seen} training records read hold image / video tokens "
                   f"({', '.join(f'{k} {v}' for k, v in layout['token_ids'].items())})"
                   + ("." if hit else ": the drafter was trained on text only."))
    elif not art.available("train"):
        trained = " Pass --train to see whether the records hold image tokens."
    served = ""
    media = None
    if art.available("served_prompts"):
        media, asked = served_with_media(art, ids)
        data.update(served_with_media=media, served_read=asked)
        served = f" {media} of {asked} served requests carry images, video or audio."
    else:
        served = " Pass --served-prompts to see whether the served requests carry images."
    msg = (f"{head}. Text-only requests reach the drafter as in training (M-RoPE's three position streams "
           "coincide on text); requests with images feed it states over image tokens and multimodal positions a "
           "text drafter never saw, so acceptance on them falls (docs/causes.md row 24: vision embeddings not "
           "passed to the draft, vllm-project/vllm#36097; Qwen-VL near accept length 1, sgl-project/SpecForge#310)."
           f"{trained}"
           f" {line}.")
    msg += served
    if media and hit == 0:
        return CheckResult((Finding("multimodal-target", "warning", msg + " The served traffic carries media the "
                                    "text-trained drafter never saw: acceptance on those requests falls.",
                                    fix="Train the drafter on multimodal records of this target (its image tokens "
                                        "and positions), or measure acceptance on text and media requests apart.",
                                    source=src, impact="medium"),), "", data)
    return CheckResult((Finding("multimodal-target", "info", msg, fix="Measure acceptance on text and image requests "
                                "apart; for image traffic, train the drafter on multimodal records of this target.",
                                source=src, impact="low"),), "", data)


CHECK = register(Check("multimodal-target", "a multimodal target (vision tower, M-RoPE) beside a text drafter",
                       ("multimodal-target",), ("target",), run, order=16))
