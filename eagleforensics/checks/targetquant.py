"""Quantized and rotated targets: what the target's ``quantization_config`` declares and what the engine does with it.

``target-quantized``: the target is served quantized (FP8, w8a8, NVFP4, AWQ/GPTQ, ...). Its aux
states drift a little from the bf16 states a drafter is usually trained on; the harm the threads
report comes from the engine quantizing the unquantized drafter with the target's method (an FP8
target with an fp16 drafter: acceptance 0, vllm-project/vllm#9534). Severity follows the engine's
rule (``engines.targetrules.QUANT_RULES``): warning where the drafter is run through the target's
method, info where it keeps its own precision or the engine is not known.
``target-rotated``: the quantization declares a rotation of the residual stream (QuaRot,
SpinQuant R1): aux states and the embedding arrive in a basis the drafter never saw, acceptance
near 0 (vllm-project/vllm-ascend#5974, #6445), unless the engine folds the rotation into the
drafter's fc and embedding at load (vllm-ascend from #6914; no vLLM or SGLang release read does).
"""
from __future__ import annotations

import re
from typing import Any

from ..engines.rules import ENGINE_NAMES
from ..engines.targetrules import QUANT_RULES, quant_rule, rotation_rule
from ..errors import ForensicsError
from ..io.modeldir import read_config, text_config
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register

QUANT_SOURCE = "vllm-project/vllm#9534, vllm-project/vllm#24505, vllm-project/vllm#26590 (docs/causes.md row 10)"
ROTATION_SOURCE = ("vllm-project/vllm-ascend#5974, vllm-project/vllm-ascend#6445, vllm-project/vllm-ascend#6914, "
                   "vllm-project/vllm#36223 (docs/causes.md row 10)")
IGNORE_KEYS = ("ignore", "modules_to_not_convert", "exclude_modules", "ignored_layers", "ignore_layers")
SIDE_FILES = ("hf_quant_config.json", "quant_model_description.json")  # ModelOpt's and ModelSlim's descriptions
_ROTATION = re.compile(r"quarot|spinquant|rotat", re.I)
_HADAMARD = re.compile(r"hadamard", re.I)


def quantization_of(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The target's ``quantization_config`` (top level, else the text config's), or None."""
    for where in (cfg, text_config(cfg)):
        q = where.get("quantization_config")
        if isinstance(q, dict) and q:
            return q
    return None


def _scheme(args: Any) -> str:
    if not isinstance(args, dict):
        return ""
    bits, kind = args.get("num_bits"), args.get("type")
    return f"{kind or ''}{bits or ''}".replace("float", "fp").replace("int", "int")


def describe(q: dict[str, Any]) -> dict[str, Any]:
    """Method, format and ignore list of a ``quantization_config`` in a few plain fields."""
    method = str(q.get("quant_method") or q.get("quant_algo") or "unknown")
    fmt = q.get("format") or q.get("fmt") or q.get("quant_algo")
    if method == "unknown" and isinstance(q.get("group_size"), int) and isinstance(q.get("bits"), int):
        # mlx-lm's own layout: {group_size, bits[, mode]} with no quant_method, "affine" when no mode is written
        # (mlx-lm 0.32.2 utils.py quantize_model writes it as "quantization" and copies it to quantization_config)
        method, fmt = "mlx", f"{q.get('mode') or 'affine'}, group {q['group_size']}"
    inner = q.get("quantization")
    if isinstance(inner, dict) and inner.get("quant_algo"):  # ModelOpt's hf_quant_config layout
        fmt = inner["quant_algo"]
    schemes = []
    groups = q.get("config_groups")
    if isinstance(groups, dict):  # compressed-tensors: weights / input_activations per group
        for g in groups.values():
            if isinstance(g, dict):
                w, a = _scheme(g.get("weights")), _scheme(g.get("input_activations"))
                schemes.append(f"w:{w}" + (f" a:{a}" if a else ""))
    for key in ("bits", "w_bit"):
        if isinstance(q.get(key), int):
            schemes.append(f"{q[key]}-bit weights")
    ignore: list[str] = []
    for key in IGNORE_KEYS:
        value = q.get(key) if key in q else (inner or {}).get(key) if isinstance(inner, dict) else None
        if isinstance(value, list):
            ignore += [str(v) for v in value]
    return {"method": method, "format": None if fmt is None else str(fmt), "schemes": sorted(set(schemes)),
            "ignore": ignore, "lm_head_kept": any("lm_head" in i for i in ignore)}


def _walk(obj: Any, path: str = "") -> list[tuple[str, Any]]:
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((f"{path}.{k}" if path else str(k), v))
            out += _walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _walk(v, f"{path}[{i}]")
    return out


def _residual_transform(tc: Any) -> tuple[bool, bool]:
    """A compressed-tensors ``transform_config``: (any transform, one that rotates the residual stream).

    The residual stream is rotated when the embedding's output is (SpinQuant's R1: ``embed_tokens`` at
    ``weight_output``); transforms applied inside a layer only (QuIP's, R3/R4) leave it as it was."""
    if not isinstance(tc, dict):
        return False, False
    groups = tc.get("config_groups") or tc.get("transform_groups") or {}
    any_t = residual = False
    for scheme in (groups.values() if isinstance(groups, dict) else []):
        for app in (scheme.get("apply") or []) if isinstance(scheme, dict) else []:
            if not isinstance(app, dict):
                continue
            any_t = True
            targets = app.get("targets") or []
            targets = [targets] if isinstance(targets, str) else targets
            if app.get("location") == "weight_output" and any("embed_tokens" in str(t) for t in targets):
                residual = True
    return any_t, residual


def rotation_of(art: Artifacts, q: dict[str, Any] | None) -> dict[str, Any] | None:
    """The rotation the target declares: ``{"where", "what", "residual"}``, or None."""
    if q is not None:
        any_t, residual = _residual_transform(q.get("transform_config"))
        if any_t:
            return {"where": "quantization_config.transform_config", "residual": residual,
                    "what": "a SpinQuant-style R1 rotation (embed_tokens at weight_output)" if residual else
                            "transforms inside layers only (no embed_tokens rotation)"}
    sources: list[tuple[str, Any]] = [("quantization_config", q)] if q is not None else []
    for name in SIDE_FILES:
        path = art.target.path / name
        if path.is_file():
            try:
                sources.append((name, read_config(path, name)))
            except ForensicsError:
                continue
    for where, obj in sources:
        for key, value in _walk(obj):
            hit = key.rsplit(".", 1)[-1]
            text = value if isinstance(value, str) else hit
            if _ROTATION.search(str(hit)) and value not in (False, None, 0, "", [], {}) or \
                    isinstance(value, str) and _ROTATION.search(value):
                return {"where": f"{where}: {key}", "residual": True, "what": f"{text!s:.60}"}
    for where, obj in sources:  # a Hadamard transform named without saying where it acts: residual unknown
        for key, value in _walk(obj):
            if _HADAMARD.search(key.rsplit(".", 1)[-1]) and value not in (False, None, 0, "", [], {}):
                return {"where": f"{where}: {key}", "residual": None, "what": "a Hadamard transform"}
    return None


def _span(since: str, until: str | None) -> str:
    return since if until == since else f"{since} and later" if until is None else f"{since} - {until}"


def _engine(art: Artifacts) -> tuple[str | None, str | None]:
    engine = art.engine
    return engine, art.engine_version if engine else None


MISSING = object()  # the arguments line has no speculative_draft_model_quantization field


def draft_effect(flag: Any, draft_q: Any) -> str:
    """``target`` when SGLang loads the drafter with the target's quantization, else ``own``, from the arguments line
    as the server prints it: after resolution (``targetrules`` QUANT_RULES sglang row), where a missing draft value
    has taken ``quantization`` and ``unquant`` has become None. So None beside a ``quantization`` is the user's
    ``unquant`` (own precision), and the draft's value equal to the target's is the inherited (or repeated) one."""
    if flag in (None, "unquant"):
        return "own"
    if draft_q is MISSING:  # an arguments line without the field: the default, which takes the target's
        return "target"
    if draft_q in (None, "unquant"):
        return "own"
    return "target" if draft_q == flag else "own"


def _quant_finding(art: Artifacts, d: dict[str, Any]) -> tuple[Finding, dict[str, Any]]:
    what = f"{d['method']}" + (f" ({d['format']})" if d["format"] and d["format"] != d["method"] else "")
    if d["schemes"]:
        what += ", " + ", ".join(d["schemes"])
    kept = f"; {len(d['ignore'])} modules left unquantized" + (" (lm_head among them)" if d["lm_head_kept"] else "") \
        if d["ignore"] else ""
    head = f"the target is quantized: {what}{kept}."
    engine, version = _engine(art)
    rule = quant_rule(engine, version)
    data: dict[str, Any] = {"engine": engine, "engine_version": version, "rule": None if rule is None else rule.effect}
    fix_own = ("Nothing to change for the drafter; to measure what quantization costs, capture from the served "
               "quantized target and run replay on it.")
    if rule is None:
        known = "; ".join(f"{ENGINE_NAMES[r.engine]} {_span(r.since, r.until)}: {r.text}" for r in QUANT_RULES)
        tail = (f" {ENGINE_NAMES.get(engine, engine)} {version} is not among the releases read." if engine else
                " Pass --engine / --engine-version (or --log) to know what the engine does with the drafter.")
        return Finding("target-quantized", "info", head + " A drafter trained on unquantized states sees slightly "
                       "drifted aux states; the loss the threads report comes from the engine running the drafter "
                       f"through the target's method. Releases read: {known}." + tail, fix=fix_own,
                       source=QUANT_SOURCE, impact="low"), data
    name = f"{ENGINE_NAMES[engine]} {version or rule.since + '+'}"
    effect = rule.effect
    if effect == "launch":
        args = art.server_args
        flag = args.raw.get("quantization") if args is not None else None
        draft_q = args.raw.get("speculative_draft_model_quantization", MISSING) if args is not None else None
        data.update(launch_quantization=flag, draft_quantization=None if draft_q is MISSING else draft_q)
        if args is None:
            return Finding("target-quantized", "info", f"{head} On {name} {rule.text}; without the server's "
                           "arguments line it is not known whether the launch passes --quantization (pass --log).",
                           fix="Launch with --speculative-draft-model-quantization unquant when the drafter is "
                               "unquantized.", source=f"{rule.source}; {QUANT_SOURCE}", impact="low"), data
        explicit = args.raw.get("_speculative_draft_quantization_explicitly_set")
        data["draft_quantization_explicit"] = explicit
        effect = draft_effect(flag, draft_q)
    if effect == "target":
        return Finding("target-quantized", "warning", f"{head} {name}: {rule.text}. A drafter trained in bf16 "
                       "run through a quantized path it never saw accepted nothing in vllm-project/vllm#9534 "
                       "(FP8 target, fp16 drafter).",
                       fix=("Upgrade vLLM to 0.11.1 or later (the drafter keeps its own precision)" if engine == "vllm"
                            else "Launch with --speculative-draft-model-quantization unquant") +
                           ", or train the drafter on the quantized target.",
                       source=f"{rule.source}; {QUANT_SOURCE}", impact="high"), data
    return Finding("target-quantized", "info", f"{head} {name}: the drafter keeps its own precision ({rule.text}); "
                   "the aux states drift a little from bf16 ones, a setup reported working "
                   "(vllm-project/vllm#24505).", fix=fix_own, source=f"{rule.source}; {QUANT_SOURCE}",
                   impact="low"), data


def modelopt_config(art: Artifacts) -> dict[str, Any] | None:
    """ModelOpt's ``hf_quant_config.json`` beside a config without ``quantization_config`` (older exports), or None."""
    path = art.target.path / "hf_quant_config.json"
    if not path.is_file():
        return None
    obj = read_config(path, "hf_quant_config.json")
    inner = obj.get("quantization")
    return {"quant_method": "modelopt", **obj} if isinstance(inner, dict) and inner.get("quant_algo") else None


def run_quantized(art: Artifacts) -> CheckResult:
    """Read the target's quantization_config and the engine's rule for the drafter beside it."""
    q = quantization_of(art.target.config) or modelopt_config(art)
    if q is None:
        return CheckResult(note="the target declares no quantization (config.json quantization_config, "
                                "hf_quant_config.json): served in its own dtype")
    d = describe(q)
    finding, data = _quant_finding(art, d)
    return CheckResult((finding,), "", {**d, **data})


def run_rotated(art: Artifacts) -> CheckResult:
    """A declared rotation of the residual stream, against the engine's rule for folding it into the drafter."""
    q = quantization_of(art.target.config)
    rot = rotation_of(art, q)
    if rot is None:
        return CheckResult(note="no rotation declared (quantization_config, " + ", ".join(SIDE_FILES) + ")")
    data = dict(rot)
    if rot["residual"] is None:
        return CheckResult((Finding("target-rotated", "info", f"the target's {rot['where']} declares {rot['what']} "
                                    "without saying where it acts: weak evidence. Applied to the residual stream "
                                    "(QuaRot's R1) it would reach the drafter's aux states and embedding rotated; "
                                    "inside layers only (online Hadamard on heads or before down_proj) it would "
                                    "not.", fix="If acceptance is near 0 on this target, capture from the served "
                                    "target and align it against the training records: rotated states match no "
                                    "layer.", source=ROTATION_SOURCE, impact="low"),), "", data)
    if not rot["residual"]:
        return CheckResult((Finding("target-rotated", "info", f"the target's {rot['where']} declares "
                                    f"{rot['what']}: the residual stream, which the drafter reads, is not rotated.",
                                    source=ROTATION_SOURCE, impact="low"),), "", data)
    engine, version = _engine(art)
    rule = rotation_rule(engine, version)
    head = (f"the target declares a rotation of its residual stream ({rot['where']}: {rot['what']}): the aux states "
            "and the embedding arrive rotated, in a basis a drafter trained on the unrotated target never saw "
            "(acceptance near 0 in vllm-project/vllm-ascend#5974, #6445)")
    fix = ("Fold the rotation into the drafter's fc (each aux block) and embed_tokens before serving, serve where the "
           "engine folds it (vllm-ascend from #6914), or train the drafter on the rotated target.")
    if rule is not None and not rule.folds:
        data["engine_folds"] = False
        return CheckResult((Finding("target-rotated", "error", f"{head}; {ENGINE_NAMES[engine]} "
                                    f"{version or 'newest'} does not fold it ({rule.source}). Unless this drafter was "
                                    "trained on the rotated target's states, nothing it drafts will match.", fix=fix,
                                    source=f"{rule.source}; {ROTATION_SOURCE}", impact="collapse"),), "", data)
    which = (f"{ENGINE_NAMES.get(engine, engine)} {version} was not read" if engine else "pass --engine to know "
             "yours")
    return CheckResult((Finding("target-rotated", "warning", f"{head}. No vLLM or SGLang release read folds it "
                                f"(vllm-ascend does); {which}. Unless this drafter was trained on "
                                "the rotated target's states, nothing it drafts will match.", fix=fix,
                                source=ROTATION_SOURCE, impact="collapse"),), "", data)


QUANTIZED = register(Check("target-quantized", "a quantized target and what the engine does with the drafter beside it",
                           ("target-quantized",), ("target",), run_quantized, order=12))
ROTATED = register(Check("target-rotated", "a rotated (QuaRot / SpinQuant) residual stream in the target",
                         ("target-rotated",), ("target",), run_rotated, order=13))
