"""Per engine, the snippet to write so it captures what the training record holds (or why none does).

The verdict (``eagleforensics.verdict``) needs, for every engine id list the alignment planned,
whether the engine's default already captures those positions and, if not, the exact text
to paste: JSON in the key the engine reads from the draft's config.json (``crosscheck``'s
keys and ``snippet``), YAML for TensorRT-LLM. With a serving check, only that engine's fix.
"""
from __future__ import annotations

import json

from ..errors import ForensicsError
from ..positions import Position
from ..records import MISMATCH, WRITE_WHERE, CrossCheck, EngineAdvice
from . import rules
from .crosscheck import snippet


def yaml_snippet(key: str, ids: list[int]) -> str:
    """'a.b', [1, 2] -> 'a:\\n  b: [1, 2]': the dotted key as nested YAML (a flow list)."""
    parts = key.split(".")
    lines = [f"{'  ' * i}{p}:" for i, p in enumerate(parts[:-1])]
    lines.append(f"{'  ' * (len(parts) - 1)}{parts[-1]}: {json.dumps(list(ids))}")
    return "\n".join(lines)


def text_for(rule: rules.Rule, ids: list[int]) -> tuple[str | None, str | None, str]:
    """(key, snippet, syntax) to write so ``rule``'s engine reads ``ids``; no key when it reads none."""
    key = rule.write_key
    if key is None:
        return None, None, "json"
    if rule.engine == "trtllm":
        return key, yaml_snippet(key, ids), "yaml"
    return key, snippet(key, ids), "json"


def _default_positions(rule: rules.Rule, n: int) -> list[Position] | None:
    try:
        return rules.served_positions(rule, rules.default_ids(rule, n), n)
    except ForensicsError:  # e.g. TensorRT-LLM has no default for very shallow models
        return None


def engine_advice(engine_ids: dict[str, list[int] | None], engine_notes: dict[str, list[str]],
                  trained: list[Position] | None, n: int, model_type: str | None = None) -> list[EngineAdvice]:
    """One ``EngineAdvice`` per engine in ``engine_ids`` order, each by its newest rule for ``model_type``."""
    out = []
    for engine, ids in engine_ids.items():
        rule = rules.resolve(engine, model_type)
        notes = list(engine_notes.get(engine, []))
        where = WRITE_WHERE[engine]
        at_default = trained is not None and _default_positions(rule, n) == list(trained)
        key, text, syntax = (None, None, "json") if ids is None else text_for(rule, ids)
        if ids is not None and text is None:
            notes.append(f"{rule.label} reads no ids from any config: it always serves its default layers")
        out.append(EngineAdvice(engine, None if text is None else list(ids or []), key, where, text, syntax,
                                at_default, notes))
    return out


def serving_advice(check: CrossCheck) -> list[EngineAdvice]:
    """The serving check's fix, when the engine will capture other positions and an id list fixes it."""
    if check.status != MISMATCH:
        return []
    where = WRITE_WHERE[check.engine]
    if check.fix_ids is None or check.fix_key is None:
        return [EngineAdvice(check.engine, None, None, where, None, notes=list(check.fix_notes))]
    syntax = "yaml" if check.engine == "trtllm" else "json"
    text = yaml_snippet(check.fix_key, check.fix_ids) if syntax == "yaml" else check.fix_snippet
    return [EngineAdvice(check.engine, list(check.fix_ids), check.fix_key, where, text, syntax, False,
                         list(check.fix_notes))]
