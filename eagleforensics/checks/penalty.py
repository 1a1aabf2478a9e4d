"""Sampling penalties under speculation: the target is penalised, the drafter is not (docs/causes.md row 22).

``sampling-penalty``: the served requests carry a repetition, frequency or presence penalty (from
``--served-prompts`` request samples, vLLM's ``override_generation_config`` in the arguments line,
or the target's ``generation_config.json``, which both engines apply by default to requests that
set no value). Every engine release read applies the penalty to the target's verify logits and
none to the drafts (``engines.servingrules`` topic ``penalty``), so the stronger the penalty the
less often the target keeps a draft; vLLM 0.10.0 - 0.13.0 instead runs such requests without
speculation. Measured: accept length 3.23 at repetition penalty 1.0, 2.91 at 1.2 and 1.31 at 1.5
(DFlash on SGLang, sgl-project/sglang#28242); no thread gives a figure for frequency / presence
penalties. Cause (for the grouping of findings): sampling settings at serving time.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..engines.rules import ENGINE_NAMES
from ..engines.servingargs import NEUTRAL, PENALTY_KEYS, override_penalties, sampling_defaults
from ..engines.servingrules import ServingRule, rules_between, serving_rule, spans
from ..errors import ForensicsError, printable
from ..io.modeldir import read_config
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register

SOURCE = ("sgl-project/sglang#28242, sgl-project/sglang#33643, sgl-project/sglang#22049, vllm-project/vllm#18902 "
          "(docs/causes.md row 22)")
CAUSE = "sampling settings at serving time"
# repetition penalty at or above: the measured losses (1.2: 3.23 -> 2.91, -10%; 1.5: -> 1.31, -59%)
REP_WARN, REP_HIGH = 1.1, 1.3
ADD_WARN = 0.5  # frequency / presence penalty at or above this is a warning (no measured figure)


def _strength(key: str, value: float) -> float:
    """How far from neutral: |ln rp| for the repetition penalty (it scales logits), |v| for the additive ones."""
    if key == "repetition_penalty":
        return abs(math.log(value)) if value > 0 else math.inf
    return abs(value)


def _level(penalties: dict[str, float]) -> tuple[str, str]:
    """(severity, impact) from the strongest penalty, against the measured figures."""
    rp = penalties.get("repetition_penalty")
    rp_s = _strength("repetition_penalty", rp) if rp is not None else 0.0
    add = max((abs(penalties.get(k, 0.0)) for k in ("frequency_penalty", "presence_penalty")), default=0.0)
    if rp_s >= math.log(REP_HIGH):
        return "warning", "high"
    if rp_s >= math.log(REP_WARN) or add >= ADD_WARN:
        return "warning", "medium"
    return "info", "low"


def _generation_config(art: Artifacts, keys: tuple[str, ...] = PENALTY_KEYS) -> tuple[dict[str, float], str]:
    """The non-neutral penalties (of ``keys``: those the engine reads) of the target's ``generation_config.json``
    and a note on it."""
    if not art.available("target"):
        return {}, "the target's generation_config.json not read (pass --target)"
    path = Path(art.inputs.target) / "generation_config.json"
    if not path.exists():
        return {}, "the target has no generation_config.json"
    cfg = read_config(path, "generation_config.json")
    out = {}
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ForensicsError(f"{key} is {value}", path=path)
            if float(value) != NEUTRAL[key]:
                out[key] = float(value)
    return out, ("generation_config.json sets " + ", ".join(f"{k} {v:g}" for k, v in out.items())) if out \
        else "generation_config.json sets no penalty"


def _server_defaults(art: Artifacts) -> tuple[dict[str, float], list[str], bool | None]:
    """Penalties every request gets unless it sets its own: (values, notes, whether generation_config applies)."""
    notes: list[str] = []
    args = art.server_args
    engine = art.engine
    applies: bool | None = None
    rule = serving_rule("generation-config", engine, art.engine_version) if engine is not None else None
    gen, gen_note = _generation_config(art, rule.keys if rule is not None and rule.keys else PENALTY_KEYS)
    if engine is not None:
        applies = rule is not None and rule.outcome == "applied"
        if args is not None and applies:
            key, value = sampling_defaults(args)
            if value is None and engine == "sglang" and args.engine == "sglang":
                applies = False  # SGLang prints every field: a line without it is a release that has none
                notes.append("the arguments line has no sampling_defaults (a release before it): the target's "
                             "generation_config.json is not applied")
            elif value is not None and ((engine == "sglang" and value == "openai") or
                                      (engine == "vllm" and value == "vllm")):
                applies = False
                notes.append(f"{key}={value!r}: the target's generation_config.json is not applied")
            elif value is not None and engine == "vllm" and value != "auto":
                gen, gen_note = {}, f"generation_config={value!r} (another folder; not read)"
    defaults = dict(gen) if applies is not False else {}
    if gen and applies is not False:
        notes.append(gen_note + (" (applied by default" + (f", {rule.source})" if engine and rule else ")")))
    elif gen_note and not gen:
        notes.append(gen_note)
    if args is not None and engine == "vllm":
        over = override_penalties(args)
        if over:
            defaults.update(over)
            notes.append("override_generation_config sets " + ", ".join(f"{k} {v:g}" for k, v in over.items()))
    return defaults, notes, applies


def _engine_rules(art: Artifacts) -> tuple[list[ServingRule], str]:
    """The penalty rows this server may run (one for a known release; several for a range); both engines when
    neither --engine nor --log says which."""
    engine = art.engine
    if engine is None:
        rows = [r for e in ("sglang", "vllm") for r in rules_between("penalty", e, "0.0.1", None)]
        return rows, "engine unknown (pass --engine or --log)"
    args = art.server_args
    if art.inputs.engine_version is None and args is not None and not args.version and args.version_range:
        rows = rules_between("penalty", engine, args.version_range[0], args.version_range[1])
        hint = str(args.version_hint or "")
        hint = hint.split(" ", 1)[1] if hint.lower().startswith(engine) and " " in hint else hint
        return rows, f"{ENGINE_NAMES[engine]} {hint}"
    row = serving_rule("penalty", engine, art.engine_version)
    return ([row] if row else []), f"{ENGINE_NAMES[engine]} {art.engine_version or 'newest'}"


def run(art: Artifacts) -> CheckResult:
    """Which requests carry a penalty (their own or the server's default) and what the engine does with it."""
    defaults, notes, applies = _server_defaults(art)
    prompts = art.served_prompts if art.inputs.served_prompts is not None else None
    per_request: list[dict[str, float]] = []
    if prompts is not None:
        for p in prompts:
            eff = dict(defaults)
            for key in PENALTY_KEYS:
                if key in p.sampling:
                    eff[key] = float(p.sampling[key])
            per_request.append({k: v for k, v in eff.items() if v != NEUTRAL[k]})
        penalised = [r for r in per_request if r]
        n, total = len(penalised), len(per_request)
        where = f"{n} of {total} served requests"
    else:
        penalised = [defaults] if defaults else []
        n, total = (1, 1) if defaults else (0, 0)
        where = "the server's default for every request that sets no penalty of its own (no --served-prompts to " \
                "count them)"
    strongest: dict[str, float] = {}
    for r in penalised:
        for k, v in r.items():
            if k not in strongest or _strength(k, v) > _strength(k, strongest[k]):
                strongest[k] = v
    rows, engine_note = _engine_rules(art)
    data: dict[str, Any] = {"server_defaults": defaults, "generation_config_applied": applies,
                            "penalised_requests": n if prompts is not None else None,
                            "requests": total if prompts is not None else None, "strongest": strongest,
                            "rules": [{"engine": r.engine, "span": r.span(), "outcome": r.outcome} for r in rows],
                            "cause": CAUSE}
    summary = "; ".join(notes) if notes else ""
    if not strongest:
        note = ("no penalty on " + (f"any of {total} served requests" if prompts is not None else
                                    "the server's defaults")) + (f"; {summary}" if summary else "")
        return CheckResult((), note, data)
    shown = ", ".join(f"{k} {v:g}" for k, v in strongest.items())
    severity, impact = _level(strongest)
    outcomes = {r.outcome for r in rows}
    target_only = [r for r in rows if r.outcome == "target-only"]
    skipped = [r for r in rows if r.outcome == "not-speculated"]
    parts = []
    if target_only:
        parts.append(f"{spans(target_only)}: {target_only[-1].detail}")
    if skipped:
        parts.append(f"{spans(skipped)}: {skipped[-1].detail}")
    measured = ("Measured elsewhere: accept length 3.23 at repetition penalty 1.0, 2.91 at 1.2, 1.31 at 1.5 "
                "(sgl-project/sglang#28242, a DFlash drafter on SGLang)")
    if outcomes == {"not-speculated"}:
        severity = "warning"
        impact = "high" if prompts is None or n * 2 >= total else "medium"
        verb = "carry" if prompts is not None else "is"
        message = (f"{where} {verb} a penalty ({shown}) and {engine_note} does not speculate such requests: "
                   f"{parts[0]}.")
        fix = ("Upgrade to vLLM >= 0.14.0, which speculates them (the drafter still does not see the penalty), "
               "or drop the penalty where speed matters.")
    else:
        verb = "carry" if prompts is not None else "is"
        message = (f"{where} {verb} a penalty ({shown}); on {engine_note} the target's verify logits are "
                   f"penalised and the drafts are not, so the target rejects more drafts the stronger the "
                   f"penalty ({'; '.join(parts)}). {measured}.")
        if severity == "info":
            message += " This penalty is milder than the smallest one with a measured loss (1.2: -10%)."
        fix = ("Serve without the penalty (repetition_penalty 1.0, frequency/presence 0) where speed matters"
               + ("; it comes from the target's generation_config.json: launch with sampling_defaults='openai' "
                  "(SGLang) or --generation-config vllm (vLLM), or set the value per request"
                  if defaults and any(k in defaults for k in strongest) else "")
               + ". No engine release read applies penalties to the drafts, so with a penalty expect a "
                 "lower accept length.")
    if summary:
        message += f" ({summary})"
    source = "; ".join(dict.fromkeys([r.source for r in rows] + [SOURCE]))
    return CheckResult((Finding("sampling-penalty", severity, printable(message), fix=fix, source=source,
                                impact=impact),), f"penalties: {shown} on {where}", data)


CHECK = register(Check("sampling-penalty", "repetition / frequency / presence penalties the drafter never sees "
                       "(--served-prompts, --log; --target for generation_config.json)", ("sampling-penalty",),
                       ("log|served_prompts",), run, order=60))
