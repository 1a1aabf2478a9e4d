"""Drafting deeper than the drafter was trained for (docs/causes.md row 32).

``depth-past-trained``: the served depth (SGLang ``speculative_num_steps``, vLLM ``num_speculative_tokens``,
from the arguments line) against the drafter's trained horizon (``engines.blockconfig.trained_horizon``: a
training-time-test length in its config or a trainer's arguments file, speculators'
``speculative_tokens``), or against the target's MTP layer count when the target drafts with its own MTP head.
Positions past the horizon were never trained: acceptance there is near zero while each step still costs a
draft forward (drafters trained at depth 4 served at 1 or deeper, xorbitsai/inference#5241; speculators configs
naming 5 tokens for drafters evaluated at 3, vllm-project/speculators#146). Engines run every MTP step past the
layer count with layer 0 (vllm-project/vllm#35607, #52688; TRT-LLM DeepSeek-R1 MTP 2.83 at depth 3, 3.01 at 7,
NVIDIA/TensorRT-LLM#4762): an info line, since serving a one-layer MTP head deeper is the engines' documented
use. Warning for a trained horizon exceeded; info for a config's count or MTP layer reuse. ``replay``'s reach@k
says where the drafter stops paying on a capture. Block drafters: ``checks.blockdrafter``. Cause: the serving
configuration.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..engines.blockconfig import block_kind, mtp_layers, trained_horizon
from ..errors import ForensicsError, printable
from ..io.modeldir import read_config
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register

SOURCE = ("vllm-project/vllm#35607, vllm-project/vllm#52688, NVIDIA/TensorRT-LLM#4762, xorbitsai/inference#5241, "
          "vllm-project/speculators#146 (docs/causes.md row 32)")
CAUSE = "the serving configuration"
MTP = ("mtp", "nextn")


def _draft_cfg(art: Artifacts) -> dict[str, Any] | None:
    if not art.available("draft_config"):
        return None
    try:
        return art.draft_config
    except ForensicsError:  # a drafter directory without weights still has the config to read
        if art.inputs.draft_config is None and art.inputs.drafter is not None:
            try:
                return read_config(str(Path(art.inputs.drafter) / "config.json"), "drafter config")
            except ForensicsError:
                return None
        return None


def run(art: Artifacts) -> CheckResult:
    """Compare the served depth with the trained horizon."""
    args = art.server_args
    if args is None:
        return CheckResult(skipped="the log has no arguments line (the served depth is read from it)")
    if not args.speculative or not args.num_steps:
        return CheckResult((), "no served depth on the arguments line", {})
    served = args.num_steps
    data: dict[str, Any] = {"served_steps": served, "cause": CAUSE}
    if args.algorithm in MTP or (args.algorithm in ("eagle", "eagle3") and args.draft is None):
        layers = mtp_layers(art.target.config) if art.available("target") else None
        data["mtp_layers"] = layers
        if layers is None:
            return CheckResult((), f"MTP served at depth {served}; the MTP layer count needs --target", data)
        if served <= layers:
            return CheckResult((), f"MTP depth {served} within the target's {layers} MTP layer(s)", data)
        msg = (f"the target's own MTP head ({layers} layer(s), num_nextn_predict_layers) drafts {served} steps: "
               f"every step past {layers} reuses a layer trained to look {layers} token(s) ahead, so acceptance "
               "gains little there while each step costs a forward (NVIDIA/TensorRT-LLM#4762: 2.83 at depth 3, "
               "3.01 at 7). Plan prices the depth from the log.")
        return CheckResult((Finding("depth-past-trained", "info", printable(msg), source=SOURCE, impact="low"),),
                           f"MTP {layers} layer(s) at depth {served}", data)
    cfg = _draft_cfg(art)
    if cfg is None:
        return CheckResult((), f"served depth {served}; the trained horizon needs --drafter or --draft-config", data)
    if block_kind(cfg):
        return CheckResult((), "a block drafter (the block-drafter row compares its block size)", data)
    horizon = trained_horizon(cfg, art.inputs.drafter)
    if horizon is None:
        return CheckResult((), f"served depth {served}; the drafter's config names no trained horizon", data)
    data.update(horizon=horizon.steps, horizon_from=horizon.where, horizon_kind=horizon.kind)
    if served <= horizon.steps:
        return CheckResult((), f"served depth {served} within the trained horizon {horizon.steps} ({horizon.where})",
                           data)
    fix = (f"Serve at most {horizon.steps} steps (speculative_num_steps / num_speculative_tokens), or train with a "
           f"longer horizon; replay's reach@k on a capture shows where extra steps stop paying.")
    if horizon.kind == "trained":
        msg = (f"the server drafts {served} steps but the drafter was trained {horizon.steps} steps ahead "
               f"({horizon.where}): positions {horizon.steps + 1}-{served} were never trained, accept almost "
               "nothing and still cost a draft forward each.")
        return CheckResult((Finding("depth-past-trained", "warning", printable(msg), fix=fix, source=SOURCE,
                                    impact="medium"),), f"depth {served} past {horizon.steps}", data)
    msg = (f"the server drafts {served} steps; the drafter's config names {horizon.steps} ({horizon.where}), "
           "which speculators writes as the count to serve, not always the trained one (vllm-project/speculators"
           "#146).")
    return CheckResult((Finding("depth-past-trained", "info", printable(msg), fix=fix, source=SOURCE, impact="low"),),
                       f"depth {served} past the config's {horizon.steps}", data)


CHECK = register(Check("depth", "drafting deeper than the drafter was trained for (--log)", ("depth-past-trained",),
                       ("log",), run, order=66))
