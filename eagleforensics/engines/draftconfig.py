"""Audit a drafter's serving config: which ids each engine reads, what they capture, and the traps.

Reads a draft ``config.json`` as SpecForge writes it (``eagle_config.eagle_aux_hidden_state_layer_ids``)
or as speculators writes it (top-level ``eagle_aux_hidden_state_layer_ids``), or a TensorRT-LLM
extra-API YAML (``speculative_config.eagle3_layers_to_capture``), resolves which list the chosen
engine actually uses (``conventions`` holds the rules and their sources) and reports findings
with stable codes. Where each engine reads its ids (shared/reference/rules.md):
SGLang only the nested key; vLLM the top-level key first, then the nested one
(``gpu_model_runner.py::_get_eagle3_aux_layers_from_config``; an empty list counts as absent);
TensorRT-LLM only its YAML, never the draft checkpoint.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ForensicsError
from ..io.guards import load_yaml, open_regular, parse_json, read_regular
from ..positions import Position, default_aux_positions
from ..results import Finding
from .rules import (
    MODEL_TYPES,
    SGLANG_DS_NEW,
    SGLANG_DS_OLD,
    SGLANG_GPT_OSS,
    Target,
    concat_order,
    default_ids,
    positions_for_ids,
    resolve_target,
)

TOP_KEY = "eagle_aux_hidden_state_layer_ids"
NESTED_KEY = "eagle_config.eagle_aux_hidden_state_layer_ids"
YAML_KEY = "speculative_config.eagle3_layers_to_capture"
WARNING, INFO = "warning", "info"


@dataclass(frozen=True)
class ConfigAudit:
    """What ``engine`` does with a draft config: ids read, positions captured, findings."""

    engine: str
    version: str | None
    model_type: str | None
    num_layers: int
    ids_read: list[int] | None
    key_read: str | None
    positions: list[Position | None]
    findings: list[Finding]
    target: str = ""
    ids_used: list[int] = field(default_factory=list)
    notes: list[str | None] = field(default_factory=list)
    path: str = ""

    @property
    def has_warnings(self) -> bool:
        """True when any finding is warning-level (the CLI then exits 1)."""
        return any(f.severity == WARNING for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready dict."""
        return {
            "path": self.path, "engine": self.engine, "version": self.version,
            "target": self.target, "model_type": self.model_type, "num_layers": self.num_layers,
            "ids_read": self.ids_read, "key_read": self.key_read, "ids_used": self.ids_used,
            "positions": [None if q is None else {"p": q.p, "normed": q.normed, "label": q.label}
                          for q in self.positions],
            "notes": self.notes, "findings": [f.to_dict() for f in self.findings],
            "ok": not self.has_warnings,
        }


@dataclass(frozen=True)
class _Draft:
    """What the draft file says, before any engine rule is applied."""

    path: Path
    is_yaml: bool
    top: list[int] | None = None
    nested: list[int] | None = None
    yaml_ids: list[int] | None = None
    hidden: int | None = None
    model_dir: Path | None = None


# A config (JSON or YAML) larger than this is not a config.
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def _read_mapping(path: Path) -> dict[str, Any]:
    """Load a JSON or YAML file that must hold one mapping; every failure names the file.

    Only a regular file is opened (a FIFO would block), its size is bounded, JSON nesting is
    limited and YAML aliases may not expand past a small size (``io.guards``).
    """
    raw = read_regular(path, MAX_CONFIG_BYTES, "config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ForensicsError(f"not UTF-8 text (byte {exc.start}): not a config file", path=path) from None
    if path.suffix.lower() in (".yaml", ".yml"):
        data = load_yaml(text, path)
    else:
        try:
            data = parse_json(raw, path)
        except json.JSONDecodeError as exc:
            raise ForensicsError(f"bad JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                                 path=path) from exc
    if not isinstance(data, dict):
        raise ForensicsError(f"expected a mapping at the top level, got {type(data).__name__}",
                             path=path)
    return data


def _get(data: dict[str, Any], dotted: str, path: Path) -> Any:
    """Value at a dotted key, None when absent; a non-mapping on the way is an error."""
    node: Any = data
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if node is None:
            return None
        if not isinstance(node, dict):
            raise ForensicsError(f"'{'.'.join(parts[:i])}' must be a mapping, got "
                                 f"{type(node).__name__}", path=path)
        node = node.get(part)
    return node


def _ids_at(data: dict[str, Any], dotted: str, path: Path) -> list[int] | None:
    """The id list at ``dotted`` (None when absent); anything but a list of ints is an error."""
    value = _get(data, dotted, path)
    if value is None:
        return None
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int)
                                          for v in value):
        raise ForensicsError(f"'{dotted}' must be a list of integers, got {value!r}", path=path)
    return list(value)


def _int_at(data: dict[str, Any], keys: tuple[str, ...], path: Path) -> int | None:
    """First positive int among ``keys`` (dotted), None when none is set."""
    for key in keys:
        value = _get(data, key, path)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ForensicsError(f"'{key}' must be a positive integer, got {value!r}", path=path)
        return value
    return None


def _config_file(path: str | Path) -> Path:
    """A file path as given, or ``config.json`` inside a directory."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise ForensicsError("no such file (expected a config.json, a directory holding one, "
                             "or a TensorRT-LLM YAML)", path=p)
    return p


def read_draft(draft_path: str | Path) -> _Draft:
    """Parse a draft config.json (SpecForge or speculators form) or a TensorRT-LLM YAML."""
    path = _config_file(draft_path)
    data = _read_mapping(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        model = _get(data, "speculative_config.speculative_model_dir", path) or _get(
            data, "speculative_config.speculative_model", path)
        model_dir = Path(model) if isinstance(model, str) and Path(model).is_dir() else None
        return _Draft(path, True, yaml_ids=_ids_at(data, YAML_KEY, path), model_dir=model_dir)
    hidden = _int_at(data, ("target_hidden_size", "hidden_size",
                            "transformer_layer_config.hidden_size"), path)
    return _Draft(path, False, top=_ids_at(data, TOP_KEY, path),
                  nested=_ids_at(data, NESTED_KEY, path), hidden=hidden, model_dir=path.parent)


def read_target(target_path: str | Path) -> tuple[int | None, str | None, int | None]:
    """(num_hidden_layers, model_type, hidden_size) of a target model's config.json."""
    path = _config_file(target_path)
    data = _read_mapping(path)
    layers = _int_at(data, ("num_hidden_layers", "text_config.num_hidden_layers"), path)
    hidden = _int_at(data, ("hidden_size", "text_config.hidden_size"), path)
    types = [t for t in (data.get("model_type"), _get(data, "text_config.model_type", path))
             if isinstance(t, str)]
    known = [t for t in types if t in MODEL_TYPES]
    return layers, (known or types or [None])[0], hidden


def fc_in_features(model_dir: Path | None) -> int | None:
    """In-features of the drafter's ``fc.weight`` from safetensors headers (no tensor is read)."""
    if model_dir is None or not model_dir.is_dir():
        return None
    for file in sorted(model_dir.glob("*.safetensors")):
        try:
            with open_regular(file, "safetensors file") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                header = parse_json(fh.read(size), file, "safetensors header") if 0 < size < 100_000_000 else {}
        except (OSError, struct.error, ValueError):
            raise ForensicsError("not a readable safetensors file", path=file) from None
        if not isinstance(header, dict):
            raise ForensicsError("not a readable safetensors file (its header is not a JSON object)", path=file)
        for name, meta in header.items():
            if (name == "fc.weight" or name.endswith(".fc.weight")) and isinstance(meta, dict):
                shape = meta.get("shape") or []
                if len(shape) == 2:
                    return int(shape[1])
    return None


def _choose_ids(engine: str, draft: _Draft) -> tuple[list[int] | None, str | None, list[Finding]]:
    """Which list ``engine`` reads from this draft file, and findings about keys it ignores."""
    out: list[Finding] = []
    top, nested = draft.top, draft.nested
    if draft.is_yaml:
        if engine != "trtllm":
            raise ForensicsError(f"a TensorRT-LLM YAML is only read by --engine trtllm; pass the "
                                 f"draft config.json for {engine}", path=draft.path)
        return draft.yaml_ids or None, (YAML_KEY if draft.yaml_ids else None), out
    if top is not None and nested is not None and top != nested:
        out.append(Finding("keys-disagree", WARNING,
                           f"the draft config has two different lists: top-level {top} (read by "
                           f"vLLM first) and nested {nested} (the only one SGLang reads)"))
    if engine == "trtllm":
        if top or nested:
            top_ok = bool(top) and all(k >= 1 for k in top or [])
            hint = (f"{nested} (same k+1 convention as SGLang's nested list)" if nested else
                    f"{[k - 1 for k in top or []]} (vLLM's top-level id k is p=k; TRT-LLM adds 1)"
                    if top_ok else "ids for the layers the drafter was trained on")
            out.append(Finding("draft-ids-ignored", WARNING,
                               "TensorRT-LLM ignores ids in the draft config; it reads only "
                               f"{YAML_KEY} from the extra-API YAML: to keep the same layers "
                               f"set it to {hint}"))
        return None, None, out
    if engine == "sglang":
        if top and not nested:
            out.append(Finding("top-level-ignored", WARNING,
                               f"SGLang ignores the top-level {TOP_KEY} {top} (speculators form); "
                               f"it reads only {NESTED_KEY}"))
        return nested or None, (NESTED_KEY if nested else None), out
    if top:
        return top, TOP_KEY, out
    return nested or None, (NESTED_KEY if nested else None), out


def _id_findings(target: Target, ids: list[int], n: int) -> list[Finding]:
    """Per-id traps: nothing captured, negative ids, duplicates, listed order vs concat order."""
    out: list[Finding] = []
    outcomes = positions_for_ids(target, ids, n)
    for o in outcomes:
        if o.id < 0 and not (target.engine == "trtllm" and o.id == -1):
            out.append(Finding("negative-id", WARNING, (
                f"id {o.id} is not a layer on {target.label}; only TensorRT-LLM reads -1 (the "
                "post-norm final state), elsewhere it captures nothing usable")))
        elif o.id == -1:
            out.append(Finding("negative-id", INFO, (
                "id -1 on TensorRT-LLM is the final state AFTER the norm, concatenated after "
                "every layer id; an EAGLE-3 aux slot normally holds a residual-stream state")))
        elif o.position is None and o.note and o.note.startswith("duplicate"):
            out.append(Finding("duplicate-id", WARNING, o.note))
        elif o.position is None:
            out.append(Finding("id-captures-nothing", WARNING, f"id {o.id}: {o.note}"))
    listed = [o.position for o in outcomes if o.position is not None]
    concat = concat_order(outcomes)
    if listed != concat and len(set(listed)) == len(listed):
        out.append(Finding("order-differs", WARNING, (
            f"{target.label} concatenates captured states by layer (post-norm last), so the slots "
            f"come out as {[q.label for q in concat]}, not in the listed order "
            f"{[q.label for q in listed]}")))
    return out


def _version_findings(target: Target, ids: list[int], n: int, version: str | None) -> list[Finding]:
    """DeepSeek/Kimi ids whose meaning changes across SGLang 0.5.13; the unverified gpt-oss rule."""
    if target is SGLANG_GPT_OSS:
        return [Finding("rule-unverified", INFO, "the SGLang gpt-oss rule (p=k if max(ids)==N, "
                        "else k+1) is from rules.md and was not verified in source")]
    if target.family != "deepseek":
        return []
    old, new = ([o.position.label if o.position else None for o in positions_for_ids(t, ids, n)]
                for t in (SGLANG_DS_OLD, SGLANG_DS_NEW))
    if old == new:
        return []
    text = (f"SGLang 0.5.5-0.5.12 captures {old} from {ids}, >= 0.5.13 captures {new} "
            "(PR #25454: +1 only when ids[0]==1)")
    if version is None:
        return [Finding("version-dependent", WARNING, f"SGLang version not given: {text}; pass "
                        "--engine-version, or start the list with 1 to mean the same on both")]
    return [Finding("version-dependent", INFO, f"upgrading or downgrading across 0.5.13 moves "
                    f"these ids one layer: {text}")]


def _width_finding(draft: _Draft, count: int, target_hidden: int | None) -> list[Finding]:
    """Compare the number of captured states with the drafter's fc in-features, when known."""
    fc_in = fc_in_features(draft.model_dir)
    hidden = draft.hidden if draft.hidden is not None else target_hidden
    if fc_in is None or not hidden or fc_in % hidden:
        return []
    expected = fc_in // hidden
    if expected == count:
        return []
    return [Finding("fc-width-mismatch", WARNING, (
        f"the drafter's fc takes {fc_in} = {expected} x {hidden} features but the engine "
        f"captures {count} state(s) ({count * hidden} features): load fails or slots misalign"))]


def audit_config(draft_path: str | Path, engine: str, *, engine_version: str | None = None,
                 model_type: str | None = None, num_layers: int | None = None,
                 target_path: str | Path | None = None) -> ConfigAudit:
    """Audit what ``engine`` captures for the drafter at ``draft_path``; see the module docstring."""
    eng = str(engine).strip().lower()
    draft = read_draft(draft_path)
    findings: list[Finding] = []
    t_layers = t_type = t_hidden = None
    if target_path is not None:
        t_layers, t_type, t_hidden = read_target(target_path)
        if num_layers is not None and t_layers is not None and num_layers != t_layers:
            findings.append(Finding("num-layers-override", INFO, f"--num-layers {num_layers} "
                                    f"overrides num_hidden_layers {t_layers} of the target"))
    n = num_layers if num_layers is not None else t_layers
    if n is None:
        raise ForensicsError("number of target layers unknown: pass --num-layers N or --target "
                             "DIR holding the target's config.json (num_hidden_layers)",
                             path=draft.path)
    mtype = model_type if model_type is not None else t_type
    rule_type = mtype if eng == "sglang" or mtype in MODEL_TYPES else None
    target = resolve_target(eng, rule_type, engine_version)
    if eng == "sglang" and mtype is None:
        findings.append(Finding("model-type-assumed", INFO, "model type unknown: assumed the "
                                "SGLang Llama/Qwen rule (pass --model-type or --target)"))
    ids_read, key_read, key_findings = _choose_ids(eng, draft)
    findings += key_findings
    if ids_read is None:
        ids_used = default_ids(target, n)
        where = f"{YAML_KEY} in the YAML" if eng == "trtllm" else "ids"
        findings.append(Finding("default-fallback", WARNING, (
            f"{target.label} finds no {where} and silently uses its default, positions "
            f"{default_aux_positions(n)}; a drafter trained on other layers loses most of its "
            "acceptance (vLLM PR #50170: 1.2%)")))
    else:
        ids_used = ids_read
        findings += _id_findings(target, ids_read, n)
        findings += _version_findings(target, ids_read, n, engine_version)
    outcomes = positions_for_ids(target, ids_used, n)
    findings += _width_finding(draft, len(concat_order(outcomes)), t_hidden)
    return ConfigAudit(
        engine=eng, version=engine_version, model_type=mtype, num_layers=n, ids_read=ids_read,
        key_read=key_read, positions=[o.position for o in outcomes], findings=findings,
        target=target.label, ids_used=list(ids_used), notes=[o.note for o in outcomes],
        path=str(draft.path))
