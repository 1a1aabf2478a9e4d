"""Audit a drafter's serving config: which ids each engine reads, what they capture, and the traps.

Reads a draft ``config.json`` as SpecForge writes it (``eagle_config.eagle_aux_hidden_state_layer_ids``)
or as speculators writes it (top-level ``eagle_aux_hidden_state_layer_ids``), or a TensorRT-LLM
extra-API YAML (``speculative_config.eagle3_layers_to_capture``), and applies the rule of the
chosen engine, version and (vLLM) model runner from ``rules``: which keys it reads and in what
order, what an empty list or ``eagle_config.use_aux_hidden_state: false`` does, what each id
captures. Without a version it answers for the newest release the rules know and lists the
versions where the answer differs. Findings carry stable codes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ForensicsError
from ..io.bounds import check_config_ints
from ..io.guards import load_yaml, parse_json, read_regular
from ..io.formats import read_safetensors_header
from ..positions import Position, default_aux_positions
from ..records import Finding
from .rules import (
    ENGINE_NAMES,
    MODEL_TYPES,
    NESTED_KEY,
    NESTED_LAYER_IDS_KEY,
    TOP_KEY,
    YAML_KEY,
    V1_REMOVED,
    Rule,
    answers_by_version,
    default_ids,
    ids_for_positions,
    model_type_of_arch,
    parse_version,
    positions_for_ids,
    resolve,
    served_positions,
)

USE_AUX_KEY = "eagle_config.use_aux_hidden_state"
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
    rule: str = ""
    runner: str | None = None
    mode: str | None = None
    version_assumed: bool = False
    served: list[Position] = field(default_factory=list)
    by_version: list[dict[str, Any]] = field(default_factory=list)
    capture_off: bool = False

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
            "ok": not self.has_warnings, "rule": self.rule, "runner": self.runner,
            "mode": self.mode, "version_assumed": self.version_assumed,
            "served": [q.label for q in self.served], "capture_off": self.capture_off,
            "by_version": self.by_version,
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
    layer_ids: list[int] | None = None  # eagle_config.layer_ids (read by vLLM's V2 runner >= 0.28)
    use_aux: bool | None = None  # eagle_config.use_aux_hidden_state
    one_model: bool = True  # speculative_config.eagle3_one_model (TensorRT-LLM's default: true)
    trt_arch: str | None = None  # speculative_config.eagle3_model_arch

    def ids_at(self, key: str) -> list[int] | None:
        """The id list the draft holds at one of the keys engines read."""
        return {TOP_KEY: self.top, NESTED_KEY: self.nested, NESTED_LAYER_IDS_KEY: self.layer_ids,
                YAML_KEY: self.yaml_ids}[key]


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
    check_config_ints(data, path)  # layer counts, widths, vocabularies within what any engine serves
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
        one = _get(data, "speculative_config.eagle3_one_model", path)
        arch = _get(data, "speculative_config.eagle3_model_arch", path)
        return _Draft(path, True, yaml_ids=_ids_at(data, YAML_KEY, path), model_dir=model_dir,
                      one_model=one is not False, trt_arch=arch if isinstance(arch, str) else None)
    hidden = _int_at(data, ("target_hidden_size", "hidden_size",
                            "transformer_layer_config.hidden_size"), path)
    use_aux = _get(data, USE_AUX_KEY, path)
    if use_aux is not None and not isinstance(use_aux, bool):
        raise ForensicsError(f"'{USE_AUX_KEY}' must be true or false, got {use_aux!r}", path=path)
    return _Draft(path, False, top=_ids_at(data, TOP_KEY, path),
                  nested=_ids_at(data, NESTED_KEY, path), hidden=hidden, model_dir=path.parent,
                  layer_ids=_ids_at(data, NESTED_LAYER_IDS_KEY, path), use_aux=use_aux)


def read_target(target_path: str | Path) -> tuple[int | None, str | None, int | None]:
    """(num_hidden_layers, model_type, hidden_size) of a target model's config.json."""
    path = _config_file(target_path)
    data = _read_mapping(path)
    layers = _int_at(data, ("text_config.num_hidden_layers", "num_hidden_layers"), path)
    hidden = _int_at(data, ("text_config.hidden_size", "hidden_size"), path)
    # a multimodal wrapper keeps the text model under text_config: its type decides the family
    types = [t for t in (_get(data, "text_config.model_type", path), data.get("model_type"))
             if isinstance(t, str)]
    for arch_key in ("text_config.architectures", "architectures"):
        archs = _get(data, arch_key, path)
        if isinstance(archs, list):
            types += [t for t in (model_type_of_arch(a) for a in archs if isinstance(a, str)) if t]
    known = [t for t in types if t in MODEL_TYPES]
    return layers, (known or types or [None])[0], hidden


def fc_in_features(model_dir: Path | None) -> int | None:
    """In-features of the drafter's ``fc.weight`` from safetensors headers (no tensor is read)."""
    if model_dir is None or not model_dir.is_dir():
        return None
    for file in sorted(model_dir.glob("*.safetensors")):
        header = read_safetensors_header(file)  # opened through the regular-file guard; every claim checked
        for name, meta in header.items():
            if name != "__metadata__" and (name == "fc.weight" or name.endswith(".fc.weight")):
                shape = meta["shape"]  # a list of whole numbers: checked with the header
                if len(shape) == 2:
                    return int(shape[1])
    return None


def _key_findings(rule: Rule, draft: _Draft, key_read: str | None, n: int) -> list[Finding]:
    """Keys the draft sets that this engine ignores or shadows, and what that costs."""
    out: list[Finding] = []
    name = f"{ENGINE_NAMES[rule.engine]} ({rule.label})"
    top, nested = draft.top, draft.nested
    if top is not None and nested is not None and top != nested:
        out.append(Finding("keys-disagree", WARNING, (
            f"the draft config has two different lists: top-level {top} (read first by vLLM "
            f">= 0.11.1) and nested {nested} (the only one SGLang reads)")))
    if rule.engine == "trtllm":
        if top or nested:
            hint = (f"{nested} (same k+1 meaning as SGLang's nested list)" if nested else
                    f"{[k - 1 for k in top or []]} (vLLM's top-level id k is p=k; TRT-LLM adds 1)")
            out.append(Finding("draft-ids-ignored", WARNING, (
                f"TensorRT-LLM ignores ids in the draft config; it reads only {YAML_KEY} from "
                f"the extra-API YAML: to keep the same layers set it to {hint}")))
        return out
    for key in (TOP_KEY, NESTED_KEY, NESTED_LAYER_IDS_KEY):
        ids = draft.ids_at(key)
        if not ids or key == key_read or key in rule.keys.keys:
            continue
        code = {TOP_KEY: "top-level-ignored", NESTED_KEY: "nested-ignored"}.get(key, "key-ignored")
        if not rule.keys.keys:
            what = "this version reads no ids at all: the model's default is always used"
        else:
            what = f"it reads only {' then '.join(rule.keys.keys)}"
        hint = ""
        if key == NESTED_KEY and rule.engine == "vllm" and TOP_KEY in rule.keys.keys:
            sgl = resolve("sglang", rule.model_type)
            want = served_positions(sgl, ids, n)
            plan = ids_for_positions(rule, [q.p for q in want], n) if want else None
            if plan is not None and plan.ids:
                hint = (f"; for vLLM to capture what {sgl.label} captures from it, add the top-level "
                        f"key {TOP_KEY} = {plan.ids}")
        out.append(Finding(code, WARNING, f"{name} ignores {key} {ids}: {what}{hint}"))
    return out


def _choose_ids(rule: Rule, draft: _Draft) -> tuple[list[int] | None, str | None, list[Finding]]:
    """The list ``rule``'s engine reads from the draft (first non-empty key in its order)."""
    out: list[Finding] = []
    if draft.is_yaml != (rule.engine == "trtllm"):
        if draft.is_yaml:
            raise ForensicsError(f"a TensorRT-LLM YAML is only read by --engine trtllm; pass the "
                                 f"draft config.json for {rule.engine}", path=draft.path)
        return None, None, out
    for key in rule.keys.keys:
        ids = draft.ids_at(key)
        if ids is None:
            continue
        if ids == [] and rule.keys.empty_list == "fails":
            out.append(Finding("empty-id-list", WARNING, (
                f"{key} is an empty list: {ENGINE_NAMES[rule.engine]} passes it through, captures "
                "nothing and the drafter's forward fails; it is NOT the default (remove the key "
                "for the default, or list the ids)")))
            return [], key, out
        if ids == []:
            out.append(Finding("empty-id-list", INFO, f"{key} is an empty list, which "
                               f"{ENGINE_NAMES[rule.engine]} treats as absent"))
            continue
        return ids, key, out
    return None, None, out


def _id_findings(rule: Rule, ids: list[int], n: int) -> list[Finding]:
    """Per-id traps: raises, nothing captured, negative ids, duplicates, listed vs concat order."""
    out: list[Finding] = []
    outcomes = positions_for_ids(rule, ids, n)
    if not rule.supported:
        return out
    for o in outcomes:
        if o.id == -1 and rule.engine == "trtllm":
            out.append(Finding("negative-id", INFO, (
                f"id -1 on TensorRT-LLM is the final state AFTER the norm; {rule.capture.mode} "
                f"mode concatenates it {'FIRST' if 'FIRST' in rule.capture.order else 'last'}; an "
                "EAGLE-3 aux slot normally holds a residual-stream state")))
        elif o.id < 0 and o.position is None:
            out.append(Finding("negative-id", WARNING, f"id {o.id}: {o.note}"))
        elif o.id < -1 and o.position is not None:  # Qwen-MoE from SGLang 0.5.4.post2: a Python index
            out.append(Finding("negative-id", WARNING, f"id {o.id}: {o.note}; on other families and older "
                                                       "releases the same id captures nothing"))
        elif o.effect == "duplicate":
            out.append(Finding("duplicate-id", WARNING, o.note or ""))
        elif o.effect == "raises":
            out.append(Finding("id-raises", WARNING, f"id {o.id}: {o.note}"))
        elif o.position is None:
            out.append(Finding("id-captures-nothing", WARNING, f"id {o.id}: {o.note}"))
    listed = [o.position for o in outcomes if o.position is not None]
    concat = served_positions(rule, ids, n)
    if listed != concat and len(set(listed)) == len(listed):
        out.append(Finding("order-differs", WARNING, (
            f"{rule.label} concatenates captured states {rule.capture.order}, so the slots come out "
            f"as {[q.label for q in concat]}, not in the listed order {[q.label for q in listed]}")))
    return out


def _serve(rule: Rule, draft: _Draft, n: int) -> tuple[list[int] | None, str | None, bool, list[Position]]:
    """(ids read, key read, capture off, positions served) for one rule: the audit's core."""
    ids, key, _ = _choose_ids(rule, draft)
    off = draft.use_aux is False and rule.keys.use_aux_off
    if off or not rule.supported:
        return ids, key, off, []
    return ids, key, off, served_positions(rule, ids, n)


def _labels(ps: list[Position]) -> str:
    return ", ".join(q.label for q in ps) or "nothing"


def _by_version(rule: Rule, draft: _Draft, n: int, runner: str | None, mode: str | None,
                version_given: bool) -> tuple[list[dict[str, Any]], list[Finding]]:
    """The answer over every version range the rules know, when it is not the same everywhere."""
    def ask(r: Rule) -> tuple:
        _, key, off, served = _serve(r, draft, n)
        if not r.supported:
            return None, (), False, False
        return key, tuple(q.label for q in served), off, True

    answers = answers_by_version(rule.engine, rule.model_type, ask, runner, mode)
    if len(answers) < 2:
        return [], []
    rows = [{"versions": v, "key_read": a[0], "served": list(a[1]), "capture_off": a[2],
             "supported": a[3]} for v, a in answers]
    name = ENGINE_NAMES[rule.engine]
    parts = []
    for row in rows:
        what = ("no EAGLE-3 capture" if not row["supported"] else "no aux capture" if
                row["capture_off"] else f"{_labels_str(row['served'])} (from "
                f"{row['key_read'] or 'its default'})")
        parts.append(f"on {name} {row['versions']}: {what}")
    read = {tuple(r["served"]) for r in rows if r["key_read"] and r["supported"]}
    sev = WARNING if not version_given and len(read) > 1 else INFO
    tail = "" if version_given else " (pass --engine-version for yours)"
    if same_positions(rows):
        return rows, [Finding("version-dependent", INFO, "the same for every version: "
                              f"{_labels_str(rows[0]['served'])}; only where the ids come from changes: "
                              + "; ".join(parts))]
    return rows, [Finding("version-dependent", sev, "the answer depends on the version: "
                          + "; ".join(parts) + tail)]


def same_positions(rows: list[dict[str, Any]]) -> bool:
    """True when every version range serves the same positions (only the key they are read from differs)."""
    return len({(tuple(r["served"]), r["capture_off"], r["supported"]) for r in rows}) == 1


def _labels_str(labels: list[str]) -> str:
    return ", ".join(labels) or "nothing"


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


def _rule_findings(rule: Rule) -> list[Finding]:
    """The assumptions ``resolve`` made (newest version, Llama family, out-of-table version)."""
    out = []
    for note in rule.notes:
        code = ("model-type-assumed" if note.startswith("model type") else
                "version-assumed" if note.startswith("no engine version") else "version-outside-table")
        out.append(Finding(code, INFO, note))
    if rule.engine == "vllm" and rule.runner_row is not None and parse_version(rule.version) >= \
            parse_version(V1_REMOVED):
        out.append(Finding("vllm-runner", INFO, (
            f"vLLM {rule.version} runs the V2 model runner, its only one ({rule.runner_row.source})")))
    elif rule.engine == "vllm" and rule.runner_row is not None:
        out.append(Finding("vllm-runner", INFO, (
            f"vLLM {rule.version} runs the {rule.runner.upper() if rule.runner else ''} model runner "
            f"by default for this model ({rule.runner_row.source}); VLLM_USE_V2_MODEL_RUNNER=0/1 "
            "forces V1/V2 (pass --vllm-runner to match)")))
    return out


def audit_config(draft_path: str | Path, engine: str, *, engine_version: str | None = None,
                 model_type: str | None = None, num_layers: int | None = None,
                 target_path: str | Path | None = None, vllm_runner: str | None = None
                 ) -> ConfigAudit:
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
    if model_type is None and mtype is not None and mtype not in MODEL_TYPES:
        findings.append(Finding("model-type-assumed", INFO, f"the target's model_type {mtype!r} "
                                "has no rules: assumed the Llama rule"))
        mtype = None
    mode = None if eng != "trtllm" else ("one-model" if draft.one_model else "two-model")
    rule = resolve(eng, mtype, engine_version, vllm_runner, mode)
    return _audit(draft, rule, n, findings, t_hidden, engine_version is not None, vllm_runner, mode)


def _audit(draft: _Draft, rule: Rule, n: int, findings: list[Finding], t_hidden: int | None,
           version_given: bool, runner: str | None, mode: str | None) -> ConfigAudit:
    """Apply ``rule`` to ``draft``: ids read, positions served, every finding."""
    findings = findings + _rule_findings(rule)
    ids_read, key_read, key_findings = _choose_ids(rule, draft)
    findings += key_findings + _key_findings(rule, draft, key_read, n)
    _, _, off, served = _serve(rule, draft, n)
    if draft.trt_arch == "mistral_large3" and rule.engine == "trtllm":
        findings.append(Finding("trtllm-arch-forces-ids", WARNING, (
            "eagle3_model_arch: mistral_large3 makes TensorRT-LLM capture {-1} only (the "
            "post-norm final), whatever eagle3_layers_to_capture says")))
        ids_read, key_read = [-1], "speculative_config.eagle3_model_arch"
        served = served_positions(rule, ids_read, n)
    if not rule.supported:
        findings.append(Finding("engine-cannot-serve", WARNING, (
            f"{rule.capture.label}: no EAGLE-3 capture for the {rule.family} family "
            f"({rule.capture.source}); serving fails")))
    if off:
        findings.append(Finding("aux-capture-off", WARNING, (
            f"{USE_AUX_KEY} is false: {ENGINE_NAMES[rule.engine]} captures no aux hidden states "
            "at all, so an EAGLE-3 drafter trained on aux layers gets only the last state "
            f"(set it to true){'; the ids are not used' if ids_read else ''}")))
    elif draft.use_aux is False and rule.engine != "trtllm":
        findings.append(Finding("aux-flag-ignored", INFO, (
            f"{USE_AUX_KEY} is false, but {rule.label} does not read it ({rule.keys.source}): "
            "capture goes ahead")))
    if ids_read is None and rule.supported and not off:
        where = f"{YAML_KEY} in the YAML" if rule.engine == "trtllm" else (
            "ids it reads" if rule.keys.keys else "way to read ids")
        findings.append(Finding("default-fallback", WARNING, (
            f"{rule.label} finds no {where} and silently uses its default, positions "
            f"{default_aux_positions(n)}: a drafter trained on other layers is fed states it never saw "
            "(vLLM PR #50170 reports 1.2% acceptance there; replay measures this drafter's own cost)")))
    ids_used = list(ids_read) if ids_read is not None else []
    if ids_read:
        findings += _id_findings(rule, ids_read, n)
    outcomes = positions_for_ids(rule, ids_used, n) if ids_used else []
    if ids_read is None and rule.supported and not off:
        ids_used = default_ids(rule, n)
        outcomes = positions_for_ids(rule, ids_used, n)
    by_version, vfind = _by_version(rule, draft, n, runner, mode, version_given)
    findings += vfind
    findings += _width_finding(draft, len(served), t_hidden)
    return ConfigAudit(
        engine=rule.engine, version=rule.version if version_given else None,
        model_type=rule.model_type, num_layers=n, ids_read=ids_read, key_read=key_read,
        positions=[o.position for o in outcomes], findings=findings, target=rule.engine,
        ids_used=ids_used, notes=[o.note for o in outcomes], path=str(draft.path), rule=rule.label,
        runner=rule.runner, mode=rule.capture.mode, version_assumed=not version_given,
        served=served, by_version=by_version, capture_off=off)
