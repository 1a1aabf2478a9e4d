"""Drafter flags the served engine version ignores or refuses: the drafter runs, but not as trained.

``flag-ignored``: the features the drafter uses (``engines.flagrules.drafter_features``: config
switches and the tensors in its safetensors headers) against the per-engine-version table
(``engines.flagtable.FLAG_RULES``, each row citing the wheel and file it was read from). An ignored
feature is a warning (the engine serves another function than the one trained: the replay row's
"as served" variant puts a number on it); a refused one is an error (the server does not start
with this drafter). Whose embedding and head are used is the embedding row's business, so
``own_embedding`` / ``own_lm_head`` are left to it. An ambiguous ``norm_output`` (SpecForge <= 0.2.0
meant another thing by the key) is info. Sources: vllm-project/vllm#27732, sgl-project/sglang#32334,
vllm-project/vllm#43482, vllm-project/vllm#40656 (docs/causes.md row 2).
"""
from __future__ import annotations

from typing import Any

from ..engines.flagrules import (
    drafter_arch,
    drafter_features,
    drafter_layout,
    ignored_features,
    norm_output_meaning,
)
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .engineembed import engine_label
from .registry import register

THREADS = "vllm-project/vllm#27732, sgl-project/sglang#32334, vllm-project/vllm#43482 (docs/causes.md row 2)"
LEFT_TO_EMBEDDING = ("own_embedding", "own_lm_head")


def features_of(art: Artifacts) -> set[str]:
    """The drafter features the served drafter carries: its draft config and, with --drafter, its tensor names."""
    names = set(art.drafter.names) if art.available("drafter") else set()
    return drafter_features(dict(art.draft_config), names)


def blanket_refusal(art: Artifacts, version: str, runner: str | None, arch: str, layout: str):  # noqa: ANN201
    """The table's "this engine cannot load such a drafter at all" row (feature ``*``) as a ruling, or None."""
    probe = ignored_features(art.engine, version, runner, ["extra_layers"], model_type=arch, layout=layout)[0]
    return probe if probe.status == "refused" and probe.rule.split(" ")[1:2] == ["*"] else None


def served_without(art: Artifacts) -> frozenset[str]:
    """The features (``engines.flagrules.FEATURES`` names) the served engine drops, own embedding included: what
    replay's "as served" variant leaves out. Empty without an engine (or for TensorRT-LLM, not read)."""
    if art.engine is None or art.engine == "trtllm":
        return frozenset()
    version, runner, _ = engine_label(art)
    cfg = dict(art.draft_config)
    rulings = ignored_features(art.engine, version, runner, features_of(art), model_type=drafter_arch(cfg),
                               layout=drafter_layout(cfg))
    return frozenset(r.feature for r in rulings if r.status == "ignored")


def run(art: Artifacts) -> CheckResult:
    """Rule on every feature the drafter uses for the given engine and version."""
    cfg = dict(art.draft_config)
    version, runner, name = engine_label(art)
    feats = features_of(art)
    layout, arch = drafter_layout(cfg), drafter_arch(cfg)
    data: dict[str, Any] = {"engine": art.engine, "version": version, "runner": runner, "layout": layout,
                            "arch": arch, "features": sorted(feats)}
    rulings = ignored_features(art.engine, version, runner, feats, model_type=arch, layout=layout) if feats else []
    blanket = blanket_refusal(art, version, runner, arch, layout) if art.engine != "trtllm" else None
    if blanket is not None:
        rulings = [r for r in rulings if r.status != "refused"] + [blanket]
    data["rulings"] = [r.to_dict() for r in rulings]
    ignored = [r for r in rulings if r.status == "ignored" and r.feature not in LEFT_TO_EMBEDDING]
    refused = [r for r in rulings if r.status == "refused"]
    unknown = [r for r in rulings if r.status == "unknown" and r.feature not in LEFT_TO_EMBEDDING]
    findings: list[Finding] = []
    if refused:
        findings.append(Finding(
            "flag-ignored", "error",
            f"{name} refuses this drafter: " + "; ".join(
                r.consequence if r is blanket else f"{r.feature} ({r.consequence})" for r in refused) + ".",
            fix="Serve it on an engine release that loads these features (see the table in the README), or "
                "re-export without them.",
            source="; ".join(dict.fromkeys(r.source for r in refused)) + "; " + THREADS, impact="collapse"))
    if ignored:
        findings.append(Finding(
            "flag-ignored", "warning",
            f"{name} ignores what this drafter was trained with: "
            + "; ".join(f"{r.feature}: {r.consequence}" for r in ignored)
            + ". The drafter loads and runs, but computes another function than the one trained "
              "(the replay row's 'as served' variant measures the cost).",
            fix="Serve on an engine release that honours " + ", ".join(r.feature for r in ignored)
                + " (README: what each engine honours), or retrain without "
                + ("it" if len(ignored) == 1 else "them") + ".",
            source="; ".join(dict.fromkeys(r.source for r in ignored)) + "; " + THREADS, impact="high"))
    if unknown:
        findings.append(Finding(
            "flag-ignored", "info",
            f"not established for {name}: " + ", ".join(r.feature for r in unknown) + " (the rules table has no row).",
            source=THREADS, impact="low"))
    meaning = norm_output_meaning(cfg)
    if meaning.ambiguous:
        findings.append(Finding(
            "flag-ignored", "info",
            f"norm_output is {str(meaning.value).lower()}: engines read it as '{meaning.engines}'; "
            f"the writer may have meant '{meaning.trainer}'.", source=meaning.source, impact="low"))
    honoured = [r.feature for r in rulings if r.status == "honoured" and r.feature not in LEFT_TO_EMBEDDING]
    note = (f"{name} honours every feature this drafter uses ({', '.join(sorted(honoured))})" if honoured else
            "the drafter uses none of the features engines differ on (engines.flagrules.FEATURES)")
    return CheckResult(tuple(findings), "" if (ignored or refused) else note, data)


CHECK = register(Check("flags", "drafter flags the served engine version honours", ("flag-ignored",),
                       ("draft_config", "engine"), run, order=45))
