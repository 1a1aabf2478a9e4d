"""Serving vs training: does what the engine will capture equal what the drafter was trained on?

Joins the two halves of the workbench: an ``AlignmentResult`` says which residual-stream
positions the training record's aux slots hold; a ``ConfigAudit`` says which positions an
engine will capture for a draft config. ``crosscheck`` compares them slot for slot (engines
concatenate in ascending layer order, see ``rules.concat_order``) and, when they differ,
plans the ids with ``rules.ids_for_positions`` and writes them into the one key that
engine reads, as a JSON snippet to paste. Every engine rule comes from ``conventions``; every
key name from ``draftconfig``.

Decisions:

* N: the audit's (the engine serves that model). The positions were measured in the capture,
  so when ``result.num_layers`` differs from the audit's N there is no verdict, only an error.
* No draft config (``default_audit``): judge the engine's default, i.e. what a draft whose
  config carries no ids gets -- the silent fallback is what such a deployment really serves.
* Aux slots not all confidently placed, or no aux slots at all: no verdict ("cannot-judge").
* The fix is written in the key the engine asked about reads first (``Rule.write_key``: SGLang
  the nested key, vLLM the top-level key, which wins in both runners), with
  ``use_aux_hidden_state: true`` when the draft switched capture off. ``fix_all`` is one draft
  config with both keys (plus the TensorRT-LLM YAML) that serves the trained positions on every
  engine at the version asked (the others at their newest release), naming any it cannot.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ForensicsError
from ..positions import Position
from ..records import (CANNOT_JUDGE, MATCH, MISMATCH, WRITE_WHERE, CrossCheck, Finding,
                       join_positions)
from . import rules
from .draftconfig import INFO, USE_AUX_KEY, ConfigAudit, audit_config
from .rules import NESTED_KEY, TOP_KEY, YAML_KEY, Rule

if TYPE_CHECKING:  # pragma: no cover
    from ..results import AlignmentResult

def snippet(key: str, ids: list[int], use_aux: bool = False) -> str:
    """'a.b', [1, 2] -> '{"a": {"b": [1, 2]}}': the dotted key as nested JSON to paste."""
    return json.dumps(_nest({key: list(ids), **({USE_AUX_KEY: True} if use_aux else {})}))


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """{'a.b': 1, 'a.c': 2, 'd': 3} -> {'a': {'b': 1, 'c': 2}, 'd': 3}."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def rule_of(audit: ConfigAudit) -> Rule:
    """The rule the audit applied (engine, model type, version, runner or mode)."""
    return rules.resolve(audit.engine, audit.model_type, audit.version, audit.runner, audit.mode)


def _carried(audit: ConfigAudit) -> list[Finding]:
    """The audit's trap findings, in the alignment's finding type (codes and severities kept)."""
    return [Finding(f.code, f.severity, f"draft config ({audit.engine}): {f.message}") for f in audit.findings]


def trained_positions(result: "AlignmentResult") -> tuple[list[Position] | None, str]:
    """The aux slots' positions in slot order, or None and why they cannot be judged."""
    aux = [m for m in result.matches if m.role == "aux"]
    if not aux:
        return None, "the training record has no aux slots (EAGLE-1/2 layout?): no id list applies"
    loose = [m.name for m in aux if m.position is None]
    if loose:
        return None, (f"aux slot(s) {', '.join(loose)} have no confident match, so what the drafter "
                      "was trained on is unknown; fix the alignment first")
    return [m.position for m in aux if m.position is not None], ""


def plan_ids(rule: Rule, trained: list[Position], n: int) -> tuple[list[int] | None, list[str]]:
    """Ids that make ``rule``'s engine capture ``trained`` (raw positions), or why none do."""
    if any(q.normed for q in trained):
        return None, ["an aux slot holds a post-norm state; only TRT-LLM's -1 captures one and this "
                      "tool does not plan it: check by hand"]
    if rule.write_key is None:
        return None, [f"{rule.label} reads no ids from any config ({rule.keys.source}): it always "
                      "serves its default layers; upgrade (vLLM reads the top-level key from 0.11.1) "
                      "or retrain on the default positions"]
    plan = rules.ids_for_positions(rule, [q.p for q in trained], n)
    return plan.ids, list(plan.reasons) + list(plan.notes)


def fix_for_all(trained: list[Position], n: int, asked: Rule) -> dict[str, Any]:
    """One draft config (both keys) plus the TensorRT-LLM YAML serving ``trained`` everywhere.

    The engine asked about is judged at its version/runner; the others at their newest release
    with the runner vLLM picks by default. ``cannot`` names every engine no id list satisfies.
    """
    flat: dict[str, Any] = {}
    yaml = None
    cannot: dict[str, str] = {}
    used: dict[str, str] = {}
    for eng in rules.ENGINES:
        rule = asked if eng == asked.engine else rules.resolve(eng, asked.model_type)
        used[eng] = rule.label
        ids, why = plan_ids(rule, trained, n)
        if ids is None:
            cannot[eng] = "; ".join(why)
        elif eng == "trtllm":
            yaml = _nest({YAML_KEY: ids})
        else:
            flat[TOP_KEY if eng == "vllm" else NESTED_KEY] = ids
    if NESTED_KEY in flat or TOP_KEY in flat:
        flat[USE_AUX_KEY] = True
    if TOP_KEY not in flat and "vllm" not in cannot:
        cannot["vllm"] = "no top-level ids, so vLLM's default runner falls back to its default"
    return {"config_json": _nest(flat), "trtllm_yaml": yaml, "rules": used, "cannot": cannot}


def crosscheck(result: "AlignmentResult", audit: ConfigAudit) -> CrossCheck:
    """Compare what ``audit``'s engine captures with what ``result``'s aux slots hold."""
    rule = rule_of(audit)
    n = audit.num_layers
    served = list(audit.served)
    trained, why = trained_positions(result)
    found = _carried(audit)
    base = dict(engine=audit.engine, version=audit.version, target=audit.target, num_layers=n,
                draft_path=audit.path, ids_used=list(audit.ids_used), key_read=audit.key_read,
                positions_served=served, positions_trained=trained, rule=rule.label)
    if result.num_layers != n:
        found.append(Finding("num-layers-disagree", "error", (
            f"the capture has N={result.num_layers} layers ({result.num_layers_source}) but the engine audit "
            f"assumed N={n}: positions from different models cannot be compared; capture the served target "
            "or pass the same N to both")))
        return CrossCheck(status=CANNOT_JUDGE, findings=found, **base)
    if trained is None:
        found.append(Finding("serving-unjudged", "warning", f"cannot say whether {rule.label} serves "
                             f"what was trained: {why}"))
        return CrossCheck(status=CANNOT_JUDGE, findings=found, **base)
    if served == trained:
        msg = (f"{rule.label} captures {join_positions(served)}, exactly what the training aux slots hold")
        if audit.key_read is None and rule.write_key is not None:
            ids = rules.ids_for_positions(rule, [q.p for q in served], n).ids or audit.ids_used
            msg += f"; it gets there through its default, so pin it: {snippet(rule.write_key, ids)}"
        found.append(Finding("serving-match", INFO, msg))
        return CrossCheck(status=MATCH, findings=found, **base)
    ids, notes = plan_ids(rule, trained, n)
    everywhere = fix_for_all(trained, n, rule)
    key = rule.write_key
    if ids is None or key is None:
        found.append(Finding("serving-mismatch", "error", (
            f"{rule.label} will capture {join_positions(served)} but the training aux slots hold {join_positions(trained)}, and "
            f"no id list fixes it: {'; '.join(notes)}")))
        return CrossCheck(status=MISMATCH, fix_notes=notes, findings=found, fix_all=everywhere, **base)
    text = snippet(key, ids, use_aux=audit.capture_off)
    # a snippet fixes it: something to write (warning, ACTION), not something broken (error, PROBLEM)
    found.append(Finding("serving-mismatch", "warning", (
        f"{rule.label} will capture {join_positions(served)} but the training aux slots hold {join_positions(trained)}: "
        f"set {key} to {ids} in {WRITE_WHERE[audit.engine]}: {text}")))
    return CrossCheck(status=MISMATCH, fix_ids=ids, fix_key=key, fix_snippet=text, fix_notes=notes,
                      findings=found, fix_all=everywhere, **base)


def default_audit(engine: str, num_layers: int, *, engine_version: str | None = None,
                  model_type: str | None = None, vllm_runner: str | None = None) -> ConfigAudit:
    """What ``engine`` captures for a draft whose config carries no ids: its default list."""
    eng = str(engine).strip().lower()
    rule = rules.resolve(eng, model_type, engine_version, vllm_runner)
    served = rules.served_positions(rule, None, num_layers)
    ids = rules.default_ids(rule, num_layers) if rule.supported else []
    outcomes = rules.positions_for_ids(rule, ids, num_layers)
    findings = [Finding("no-draft-config", INFO, (
        f"no draft config given: judged {rule.label}'s default (positions {join_positions(served)}), which is "
        "what it serves a draft whose config carries no ids (a silent fallback)"))]
    findings += [Finding("version-assumed" if note.startswith("no engine") else "model-type-assumed"
                         if note.startswith("model type") else "version-outside-table", INFO, note)
                 for note in rule.notes]
    if not rule.supported:
        findings.append(Finding("engine-cannot-serve", "warning", (
            f"{rule.capture.label}: no EAGLE-3 capture for the {rule.family} family; serving fails")))
    return ConfigAudit(engine=eng, version=engine_version, model_type=rule.model_type,
                       num_layers=num_layers, ids_read=None, key_read=None,
                       positions=[o.position for o in outcomes], findings=findings, target=eng,
                       ids_used=ids, notes=[o.note for o in outcomes], path="", rule=rule.label,
                       runner=rule.runner, mode=rule.capture.mode,
                       version_assumed=engine_version is None, served=served)


def check_request(draft_config: str | Path | None, engine: str | None, engine_version: str | None,
                  model_type: str | None, vllm_runner: str | None = None) -> None:
    """Reject option combinations that cannot mean anything, before any file is read."""
    if engine is None:
        given = [name for name, v in (("draft-config", draft_config), ("engine-version", engine_version),
                                      ("model-type", model_type), ("vllm-runner", vllm_runner))
                 if v is not None]
        if given:
            raise ForensicsError(f"{', '.join(given)} given without an engine: add --engine (engine=) one of "
                                 f"{', '.join(rules.ENGINES)}, the engine whose reading of the config to check")
        return
    eng = str(engine).strip().lower()
    if eng not in rules.ENGINES:
        raise ForensicsError(f"unknown engine {engine!r}; choose one of {', '.join(rules.ENGINES)}")
    if engine_version is not None:
        rules.parse_version(engine_version)
    if model_type is not None:
        rules.family_of(model_type)
    if vllm_runner is not None and eng != "vllm":
        raise ForensicsError(f"--vllm-runner applies to --engine vllm only, not {eng}")
    if draft_config is not None and not Path(draft_config).exists():
        raise ForensicsError("no such file or directory (expected the draft's config.json, its directory, "
                             "or a TensorRT-LLM YAML)", path=draft_config)


def serving_audit(draft_config: str | Path | None, engine: str, num_layers: int, *,
                  engine_version: str | None = None, model_type: str | None = None,
                  vllm_runner: str | None = None) -> ConfigAudit:
    """The audit of ``draft_config`` for ``engine`` at N, or of the engine default when none is given."""
    if draft_config is None:
        return default_audit(engine, num_layers, engine_version=engine_version, model_type=model_type,
                             vllm_runner=vllm_runner)
    return audit_config(draft_config, engine, engine_version=engine_version, model_type=model_type,
                        num_layers=num_layers, vllm_runner=vllm_runner)
