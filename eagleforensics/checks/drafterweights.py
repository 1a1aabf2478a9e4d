"""The drafter's own trained parts (fc, the decoder layer, lm_head): present, and not left at their initial values.

``drafter-weights-missing``: a tensor every EAGLE-3 forward needs is not in the checkpoint (``fc``, the first
decoder layer under any trainer's prefix, ``norm``, ``lm_head``): SpecForge, speculators and ModelOpt all write
them (``io.drafter``), and an engine that loads the drafter with ``strict=False`` fills a missing one with a
fresh init instead of failing (lightseekorg/TorchSpec#38, sgl-project/sglang#27908).

``drafter-weights-random``: ``fc``, ``lm_head`` or every matrix of the decoder layer sits at the statistics of
a fresh init the trainers use: transformers' ``normal(0, initializer_range)`` (``PreTrainedModel._init_weights``,
SpecForge's and speculators' drafters are ``PreTrainedModel``s) or torch's ``nn.Linear`` default
(kaiming-uniform, std ``1/sqrt(3 * fan_in)``, ModelOpt's ``EagleModule``), with i.i.d.-looking entries
(``checks.rowcompare.init_signature``). Training moves a matrix's spread away from its init value; a trained
head of SpecForge (trained from scratch) is therefore not flagged, only one that never left its init.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..engines.lmheadrules import lm_head_rule, shares_target_head
from ..engines.rules import ENGINE_NAMES
from ..io.drafternames import LAYER_PARTS
from ..process import usable_cores
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .drafterfacts import Listed, drafter_tensor, target_facts
from .registry import register
from .rowcompare import compare_rows, init_signature, sample_rows

SOURCE = ("transformers PreTrainedModel._init_weights (normal(0, initializer_range)); torch nn.Linear.reset_parameters "
          "(kaiming_uniform a=sqrt(5)); lightseekorg/TorchSpec#38, sgl-project/sglang#27908 (a strict=False load "
          "leaves a fresh init); docs/causes.md row 11")
# a matrix whose spread and shape match an init's within a few standard errors of the sample (and i.i.d.) never left it
STD_SLACK, KURT_SLACK = 0.005, 0.1  # beyond 4 SE: bf16 rounding and the sample's own noise
LAYER_MATRICES = tuple(p for p in LAYER_PARTS if p.endswith("proj.weight"))
LAYER_PREFIXES = ("midlayer.", "layers.0.", "model.layers.0.")


def layer_prefix(names: Any) -> str | None:
    """The stored prefix of the first decoder layer (SpecForge ``midlayer.``, speculators/ModelOpt ``layers.0.``)."""
    return next((p for p in LAYER_PREFIXES if any(str(k).startswith(p) for k in names)), None)


def init_stds(cfg: dict[str, Any], fan_in: int) -> dict[str, tuple[float, float]]:
    """(spread, kurtosis) of each init the trainers use, for a matrix of ``fan_in`` columns."""
    inner = cfg.get("transformer_layer_config") if isinstance(cfg.get("transformer_layer_config"), dict) else cfg
    rng = inner.get("initializer_range", cfg.get("initializer_range", 0.02))
    rng = float(rng) if isinstance(rng, (int, float)) and not isinstance(rng, bool) and rng > 0 else 0.02
    return {f"normal(0, {rng:g})": (rng, 3.0), "nn.Linear's kaiming-uniform": (1.0 / math.sqrt(3.0 * max(fan_in, 1)), 1.8)}


def at_init(rows: np.ndarray, cfg: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
    """(whether sampled ``rows`` [k, fan_in] sit at a known init, which one, the figures)."""
    sig = init_signature(rows, ())
    x = np.asarray(rows, dtype=np.float64)
    n = x.size
    z = (x - x.mean()) / max(sig.std, 1e-30)
    kurt = float((z ** 4).mean())
    std_tol, kurt_tol = STD_SLACK + 4.0 / math.sqrt(2.0 * n), KURT_SLACK + 4.0 * math.sqrt(24.0 / n)
    match = next((name for name, (std, k) in init_stds(cfg, rows.shape[1]).items()
                  if abs(sig.std / std - 1.0) < std_tol and abs(kurt - k) < kurt_tol), None)
    data = {**sig.to_dict(), "kurtosis": round(kurt, 3), "init": match}
    return bool(sig.fresh and match is not None), match or "", data


def missing_parts(art: Artifacts) -> list[str]:
    """Stored names of the tensors the drafter's forward needs but the checkpoint lacks."""
    names = Listed(art.drafter)
    out = [c for c in ("fc.weight", "norm.weight", "lm_head.weight") if drafter_tensor(names, c) is None]
    prefix = layer_prefix(names)
    if prefix is None:
        out.append("the decoder layer (midlayer.* or layers.0.*)")
    else:
        out += [prefix + p for p in LAYER_PARTS if prefix + p not in names]
    return out


def _sample(art: Artifacts, name: str) -> np.ndarray | None:
    info = Listed(art.drafter)[name]
    if len(info.shape) != 2 or info.dtype not in ("F16", "BF16", "F32", "F64") or 0 in info.shape:
        return None
    return art.drafter.rows(name, sample_rows(info.shape[0], seed=2))


def head_is_target_copy(art: Artifacts, stored: str) -> bool:
    """True when the drafter's lm_head is the target's rows at the draft ids (speculators, ModelOpt full vocabulary):
    then its statistics are the target's, not the drafter's training (a tiny random target's head is an init)."""
    if not art.available("target"):
        return False
    ref = art.target.find("lm_head")
    info = Listed(art.drafter)[stored]
    if ref is None or art.target.info(ref).shape[1:] != info.shape[1:]:
        return False
    n, vocab = info.shape[0], art.target.info(ref).shape[0]
    ids = np.arange(n)
    d2t = drafter_tensor(Listed(art.drafter), "d2t")
    if d2t is not None and Listed(art.drafter)[d2t].shape == (n,):
        ids = ids + np.asarray(art.drafter.read(d2t)).astype(np.int64)
    if ids.min() < 0 or ids.max() >= vocab:
        return False
    pick = sample_rows(n, k=64, seed=3)
    return compare_rows(art.drafter.rows(stored, pick), art.target.rows(ref, ids[pick])).copy


def random_parts(art: Artifacts) -> tuple[list[str], dict[str, Any]]:
    """The parts (``fc``, ``lm_head``, ``midlayer``) whose matrices all sit at an init, and each matrix's figures.
    Computed once per doctor run (this row and drafter-baseline's reason both ask), the matrices on threads."""
    return art.memo("drafter-random-parts", lambda: _random_parts(art))


def _random_parts(art: Artifacts) -> tuple[list[str], dict[str, Any]]:
    names, cfg = Listed(art.drafter), art.drafter.config
    parts: dict[str, list[str]] = {}
    for canon in ("fc.weight", "lm_head.weight"):
        stored = drafter_tensor(names, canon)
        if stored is not None and not (canon == "lm_head.weight" and head_is_target_copy(art, stored)):
            parts[canon.split(".")[0]] = [stored]
    prefix = layer_prefix(names)
    if prefix is not None:
        layer = [prefix + p for p in LAYER_MATRICES if prefix + p in names]
        if layer:
            parts[prefix.rstrip(".")] = layer
    every = [name for stored in parts.values() for name in stored]
    samples = {name: _sample(art, name) for name in every}  # the reads, in order
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(len(every), usable_cores()))) as pool:  # numpy frees the GIL
        figures = dict(zip(every, pool.map(lambda n: None if samples[n] is None else at_init(samples[n], cfg), every)))
    data: dict[str, Any] = {}
    flagged: list[str] = []
    for part, stored in parts.items():
        verdicts = []
        for name in stored:
            got = figures[name]
            if got is None:
                verdicts.append(False)
                continue
            fresh, _init, data[name] = got
            verdicts.append(fresh)
        if verdicts and all(verdicts):
            flagged.append(part)
    return flagged, data


def _declared_draft_vocab(cfg: dict[str, Any]) -> int | None:
    layer = cfg.get("transformer_layer_config") if isinstance(cfg.get("transformer_layer_config"), dict) else {}
    for v in (cfg.get("draft_vocab_size"), layer.get("draft_vocab_size")):
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def head_only_finding(art: Artifacts) -> tuple[Finding, dict[str, Any]]:
    """The finding for a checkpoint whose only missing part is ``lm_head``: what the engine release serves in its place
    (``engines.lmheadrules``), with the engine and release assumed."""
    engine = art.engine
    rule, release = lm_head_rule(engine, art.engine_version)
    cfg = art.draft_config
    draft_vocab = _declared_draft_vocab(cfg)
    target_vocab = target_facts(art.target.config).vocab_size if art.available("target") else None
    data: dict[str, Any] = {"engine": engine, "release_assumed": release or None,
                            "lm_head_rule": rule.outcome if rule else None, "draft_vocab_size": draft_vocab}
    base = "the drafter's checkpoint has no lm_head"
    fix = "Re-export the drafter with its trained lm_head (or train it with the target's head frozen and say so)."
    if rule is None:
        where = (f"{ENGINE_NAMES.get(engine, engine)} {release}: not read for this release" if engine else
                 "no engine given (pass --engine / --log): assumed an engine that loads the drafter's own head")
        msg = (f"{base} ({where}). SGLang with a draft_vocab_size, and vLLM <= 0.10.1.1, serve a random head in its "
               "place (sgl-project/sglang#27908); vLLM >= 0.11.1 shares the target's head (vllm-project/vllm#28549)")
        return Finding("drafter-weights-missing", "error", msg, fix=fix, source=SOURCE, impact="collapse"), data
    name = f"{ENGINE_NAMES[rule.engine]} {release}" + ("" if art.engine_version else " (the newest release read, "
                                                            "assumed: pass --engine-version or --log)")
    shares = shares_target_head(rule, draft_vocab, target_vocab)
    data["shares_target_head"] = shares
    if shares:
        msg = (f"{base}: {name} serves the target's lm_head in its place ({rule.detail}; {rule.span()}). Right "
               "when the drafter was trained against the target's head; a drafter trained with its own head drafts "
               "through a head it never saw")
        return Finding("drafter-weights-missing", "warning", msg, fix=fix, source=f"{rule.source}; {SOURCE}",
                       impact="medium"), data
    why = ("" if shares is False else "; whether the shapes match is not known without --target")
    msg = (f"{base}: {name} loads the drafter's own head ({rule.detail}; {rule.span()}), so a fresh init serves in "
           f"its place (drafts no better than chance){why}")
    return Finding("drafter-weights-missing", "error" if shares is False else "warning", msg, fix=fix,
                   source=f"{rule.source}; {SOURCE}", impact="collapse"), data


def run(art: Artifacts) -> CheckResult:
    findings: list[Finding] = []
    missing = missing_parts(art)
    head_data: dict[str, Any] = {}
    if missing == ["lm_head.weight"]:
        head, head_data = head_only_finding(art)
        findings.append(head)
    elif missing:
        findings.append(Finding(
            "drafter-weights-missing", "error",
            f"the drafter's checkpoint lacks {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}: every "
            "EAGLE-3 forward needs it, and an engine that loads with strict=False serves a fresh random init in its "
            "place (drafts no better than chance)",
            fix="Re-export the drafter from the training checkpoint with every trained tensor (fc, the decoder "
                "layer, norm, lm_head).", source=SOURCE, impact="collapse"))
    flagged, data = random_parts(art)
    if flagged:
        shown = "; ".join(f"{n}: std {d['std']:.4g} = {d['init']}, entries i.i.d. (row-norm CV {d['row_norm_cv']:.3f} "
                          f"against {d['row_norm_cv_iid']:.3f})" for n, d in data.items()
                          if d.get("init") and any(p in n for p in flagged))
        findings.append(Finding(
            "drafter-weights-random", "error",
            f"the drafter's {', '.join(flagged)} never left its initial values ({shown}): an untrained part "
            "(a checkpoint saved before training, or a tensor a strict=False load re-initialised) drafts noise",
            fix="Export the trained weights (check the checkpoint's step and that every trained tensor's name matches "
                "what the exporter writes).", source=SOURCE, impact="collapse"))
    note = ("fc, decoder layer, norm and lm_head present and moved from their init"
            if not findings else "")
    return CheckResult(tuple(findings), note, {"weights": data, "missing": missing, **({"lm_head": head_data}
                                                                                    if head_data else {})})


CHECK = register(Check("drafter-weights", "the drafter's trained parts are there and were trained",
                       ("drafter-weights-missing", "drafter-weights-random"), ("drafter",), run, order=15))
