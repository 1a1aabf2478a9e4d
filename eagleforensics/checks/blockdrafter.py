"""Block drafters (DFlash / DSpark / P-EAGLE) whose settings disagree between trainer and engine (docs/causes.md
row 33).

``block-drafter-settings``, from the drafter's config (``engines.blockconfig``), the target's config and the
arguments line:

* ``mask_token_id`` equal to the target's pad or EOS id: a trainer that fell back to them trained the block's
  masked slots as that token, which the engine also feeds at every end of text; missing: SGLang resolves
  ``mask_token`` (``<|MASK|>``) in the target's tokenizer and adds it when absent, so the id served need not be
  the trained one (sgl-project/SpecForge#455, #473; NVIDIA-NeMo/Automodel#2461).
* ``block_size`` both nested and top-level with different values: both engines read the nested one.
* the served block against the trained one: DFlash B means B - 1 drafted tokens, passed as
  ``num_speculative_tokens`` = B - 1 on vLLM and ``speculative_num_draft_tokens`` (``--speculative-dflash-block-size``)
  = B on SGLang; DSpark's block is the drafted count on both (NVIDIA/Model-Optimizer#2313 review).
* a P-EAGLE drafter for a vLLM release that does not serve it (``engines.peaglerules``: refused from 0.34.0,
  absent in 0.14.1); the release is the one given or logged, else the newest read (said so, info).

SpecForge-trained DFlash served at 1.29 of 4 reached 3.6 after these fixes (sgl-project/SpecForge#455). Warning
for each disagreement; info when the block drafter's settings agree. Cause: the drafter's config.
"""
from __future__ import annotations

from typing import Any

from ..engines.blockconfig import block_facts
from ..engines.peaglerules import peagle_on_vllm
from ..engines.rules import NEWEST
from ..errors import printable
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register

SOURCE = "sgl-project/SpecForge#455, sgl-project/SpecForge#473, NVIDIA-NeMo/Automodel#2461, NVIDIA/Model-Optimizer#2313 " \
         "(docs/causes.md row 33)"
CAUSE = "the drafter's config disagrees with what the engine reads"
ENGINE_SRC = {"sglang": "sglang 0.5.23 sglang/srt/speculative/dflash_utils.py parse_dflash_draft_config, "
                        "arg_groups/fields/spec.py speculative_dflash_block_size / speculative_dspark_block_size",
              "vllm": "vllm 0.34.0 vllm/config/speculative.py _get_nested_config_value, "
                      "vllm/model_executor/models/qwen3_dflash.py"}


def _ids(cfg: dict[str, Any], key: str) -> set[int]:
    value = cfg.get(key)
    values = value if isinstance(value, list) else [value]
    return {v for v in values if isinstance(v, int) and not isinstance(v, bool)}


def _served_drafted(art: Artifacts, kind: str) -> tuple[int | None, str]:
    """Tokens drafted per round as the arguments line sets them, and the field read."""
    args = art.server_args
    if args is None or not args.speculative:
        return None, ""
    if args.engine == "vllm" and args.num_steps:
        return args.num_steps, f"num_speculative_tokens={args.num_steps}"
    if args.engine == "sglang" and args.num_draft_tokens:
        return args.num_draft_tokens - 1, f"speculative_num_draft_tokens={args.num_draft_tokens} (a verify window " \
                                          f"of {args.num_draft_tokens}: {args.num_draft_tokens - 1} drafted)"
    return None, ""


def run(art: Artifacts) -> CheckResult:
    """Read the block drafter's settings and compare them with the target and the launch."""
    facts = block_facts(art.draft_config)
    if facts is None:
        return CheckResult((), "not a block drafter", {})
    data: dict[str, Any] = {"kind": facts.kind, "block_size": facts.block_size, "nested_block": facts.nested_block,
                            "top_block": facts.top_block, "mask_token_id": facts.mask_token_id, "cause": CAUSE}
    findings = []
    engine = art.engine
    src = f"{ENGINE_SRC[engine]}; {SOURCE}" if engine in ENGINE_SRC else SOURCE
    if art.available("target"):
        tcfg = art.target.config
        pad, eos = _ids(tcfg, "pad_token_id"), _ids(tcfg, "eos_token_id")
        if facts.mask_token_id is not None and facts.mask_token_id in pad | eos:
            which = "pad" if facts.mask_token_id in pad else "EOS"
            findings.append(Finding("block-drafter-settings", "warning", printable(
                f"the {facts.kind} drafter's mask_token_id ({facts.mask_token_id}, {facts.mask_where}) is the "
                f"target's {which} id: a trainer that fell back to it trained the masked block slots as {which}, a "
                "token the target also writes, so the drafter cannot tell a masked slot from a real one."),
                fix="Train (or re-export) with a dedicated mask token (the engines' default is '<|MASK|>') and write "
                    "its id as dflash_config.mask_token_id.", source=src, impact="high"))
    if facts.mask_token_id is None:
        findings.append(Finding("block-drafter-settings", "warning", printable(
            f"the {facts.kind} drafter's config has no mask_token_id (nested or top-level): SGLang resolves the "
            "mask token '<|MASK|>' in the target's tokenizer and adds it when absent, so the id served need not "
            "be the one the trainer used (a pad or EOS fallback)."),
            fix="Write the trainer's mask token id as dflash_config.mask_token_id.", source=src, impact="high"))
    if facts.nested_block is not None and facts.top_block is not None and facts.nested_block != facts.top_block:
        findings.append(Finding("block-drafter-settings", "warning", printable(
            f"block_size is {facts.nested_block} nested and {facts.top_block} top-level: both engines read the "
            f"nested {facts.nested_block}; a trainer or exporter that reads the top-level key disagrees."),
            fix="Keep one block_size (nested in dflash_config) equal to the trained block.", source=src,
            impact="high"))
    if facts.kind == "peagle" and engine == "vllm":
        findings += _peagle_on_vllm(art)
    served, field = _served_drafted(art, facts.kind)
    data["served_drafted"] = served
    if served is not None and facts.drafted is not None and served != facts.drafted:
        args = art.server_args
        want = (f"num_speculative_tokens={facts.drafted}" if args.engine == "vllm" else
                f"speculative_num_draft_tokens={facts.drafted + 1}")
        findings.append(Finding("block-drafter-settings", "warning", printable(
            f"the server drafts {served} tokens a round ({field}) but the {facts.kind} drafter's block_size "
            f"{facts.block_size} means {facts.drafted} drafted tokens (DFlash counts the anchor in its block; "
            f"vLLM takes the drafted count, SGLang the verify window). Pass {want}."),
            fix=f"Launch with {want}.", source=src, impact="high"))
    if findings:
        return CheckResult(tuple(findings), f"{facts.kind} drafter: {len(findings)} disagreement(s)", data)
    return CheckResult((), f"{facts.kind} drafter: block_size {facts.block_size}, mask_token_id "
                       f"{facts.mask_token_id} agree with what the engines read", data)


def _peagle_on_vllm(art: Artifacts) -> list[Finding]:
    """A P-EAGLE drafter on a vLLM release that refuses it or has no P-EAGLE: warning (info when the release is
    assumed, the newest read); nothing where it is served or the release was not read."""
    version = art.engine_version or NEWEST["vllm"]
    row = peagle_on_vllm(version)
    if row is None or row.status == "served":
        return []
    assumed = "" if art.engine_version else " (no release given or logged: the newest read was assumed)"
    what = ("refuses it: a speculators P-EAGLE config fails at start ('not supported'), a Peagle* architecture is "
            "not in its model registry, and an EAGLE-3 checkpoint's mask_hidden is skipped with a warning, so the "
            "drafter drafts one token at a time" if row.status == "refused" else "has no P-EAGLE: it does not know "
            "the peagle speculators algorithm or the Peagle* architectures")
    return [Finding("block-drafter-settings", "info" if assumed else "warning", printable(
        f"this is a P-EAGLE (parallel drafting) drafter and vLLM {version}{assumed} {what}."),
        fix="Serve it on a vLLM release with P-EAGLE (0.25.0 - 0.33.0 read), or train and export a plain "
            "(sequential) EAGLE-3 drafter for this release.", source=f"{row.source}; {SOURCE}", impact="high")]


CHECK = register(Check("block-drafter", "block drafters (DFlash / DSpark / P-EAGLE) whose settings disagree "
                       "between trainer and engine", ("block-drafter-settings",), ("draft_config",), run, order=67))
