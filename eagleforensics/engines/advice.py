"""Per engine, the snippet to write so it captures what the training record holds (or why none does).

The verdict (``eagleforensics.verdict``) needs, for every engine id list the alignment planned,
whether the engine's default already captures those positions and, if not, the exact text
to paste: JSON in the key the engine reads from the draft's config.json (``crosscheck``'s
keys and ``snippet``), YAML for TensorRT-LLM. With a serving check, only that engine's fix.
"""
from __future__ import annotations

import json
from typing import Any

from ..errors import ForensicsError
from ..verdict import EngineAdvice
from . import rules
from .crosscheck import _WRITE_KEY, _WRITE_WHERE, MISMATCH, CrossCheck, snippet


def yaml_snippet(key: str, ids: list[int]) -> str:
    """'a.b', [1, 2] -> 'a:\\n  b: [1, 2]': the dotted key as nested YAML (a flow list)."""
    parts = key.split(".")
    lines = [f"{'  ' * i}{p}:" for i, p in enumerate(parts[:-1])]
    lines.append(f"{'  ' * (len(parts) - 1)}{parts[-1]}: {json.dumps(list(ids))}")
    return "\n".join(lines)


def text_for(engine: str, ids: list[int]) -> tuple[str, str, str]:
    """(key, snippet, syntax) to write for ``engine`` (vllm, sglang, trtllm)."""
    key = _WRITE_KEY[engine]
    if engine == "trtllm":
        return key, yaml_snippet(key, ids), "yaml"
    return key, snippet(key, ids), "json"


def _default_positions(target: rules.Target, n: int) -> list[Any] | None:
    try:
        return rules.concat_order(rules.positions_for_ids(target, rules.default_ids(target, n), n))
    except ForensicsError:  # e.g. TensorRT-LLM has no default for very shallow models
        return None


def engine_advice(engine_ids: dict[str, list[int] | None], engine_notes: dict[str, list[str]],
                  trained: list[Any] | None, n: int) -> list[EngineAdvice]:
    """One ``EngineAdvice`` per planned engine target, in ``engine_ids`` order."""
    out = []
    by_label = {t.label: t for t in rules.ALL_TARGETS}
    for label, ids in engine_ids.items():
        target = by_label.get(label)
        if target is None:  # a label the rules table no longer knows: say nothing rather than guess
            continue
        notes = list(engine_notes.get(label, []))
        where = _WRITE_WHERE[target.engine]
        if ids is None:
            out.append(EngineAdvice(label, None, None, where, None, notes=notes))
            continue
        key, text, syntax = text_for(target.engine, ids)
        at_default = trained is not None and _default_positions(target, n) == list(trained)
        out.append(EngineAdvice(label, list(ids), key, where, text, syntax, at_default, notes))
    return out


def serving_advice(check: CrossCheck) -> list[EngineAdvice]:
    """The serving check's fix, when the engine will capture other positions and an id list fixes it."""
    if check.status != MISMATCH:
        return []
    where = _WRITE_WHERE[check.engine]
    if check.fix_ids is None:
        return [EngineAdvice(check.target, None, None, where, None, notes=list(check.fix_notes))]
    key, text, syntax = text_for(check.engine, check.fix_ids)
    return [EngineAdvice(check.target, list(check.fix_ids), key, where, text, syntax, False, list(check.fix_notes))]
