"""Read the unpacked engine wheels' model registries and class bases (ast, nothing imported) into a rules table.

For every release of vLLM and SGLang unpacked under ``/work/wheels/src/<pkg>-<version>/`` (see
/work/HELPERS.md; ``pip download --no-deps`` then unzip), this writes
``eagleforensics/engines/modelclasses_data.py``: per release, the architectures the engine registers,
the model file each comes from, whether its class captures EAGLE-3 aux states, and the model-class
roots it descends from (for families such as DeepSeek-V2's, whose gather rules every subclass shares).

How each fact is read (the code of the wheel, by name, never executed):

* vLLM: the registry is the dict literals of ``vllm/model_executor/models/registry.py`` (arch ->
  (module, class)). EAGLE-3 support: from the release whose ``interfaces.py`` defines
  ``SupportsEagle3`` (a runtime-checkable protocol the model runner tests before it raises "Model does
  not support EAGLE3 interface"), the class has ``SupportsEagle3`` among its resolved bases or sets
  ``supports_eagle3``; before it, the class or a base defines ``set_aux_hidden_state_layers`` (the
  runner calls it without a test, so its absence is an AttributeError at start).
* SGLang: the registry is each ``srt/models/*.py`` file's ``EntryClass`` (a class or a list);
  support is a ``set_eagle3_layers_to_capture`` method on the class or a resolved base (the model
  runner calls it when EAGLE-3 is asked for).

Bases are resolved by name: the same file first, then the module a ``from .x import Name`` names.
Run: ``python scripts/make_model_classes.py [/work/wheels/src]``; the output is committed as data.
"""
from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "eagleforensics" / "engines" / "modelclasses_data.py"
ROOTS = ("DeepseekV2ForCausalLM",)  # model classes whose descendants the rules group into one family


@dataclass
class ClassInfo:
    name: str
    module: str
    bases: list[str]
    methods: set[str] = field(default_factory=set)
    attrs: set[str] = field(default_factory=set)


@dataclass
class Module:
    name: str
    classes: dict[str, ClassInfo]
    imports: dict[str, str]  # local name -> module it comes from (relative to the models package)
    entry: list[str]


def _base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _base_name(node.value)
    return None


def parse_module(path: Path, name: str) -> Module:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return Module(name, {}, {}, [])
    classes: dict[str, ClassInfo] = {}
    imports: dict[str, str] = {}
    entry: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            info = ClassInfo(node.name, name, [b for b in (_base_name(x) for x in node.bases) if b])
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    info.methods.add(item.name)
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    info.attrs.update(t.id for t in targets if isinstance(t, ast.Name))
            classes[node.name] = info
        elif isinstance(node, ast.ImportFrom) and node.module:
            mod = node.module.split(".")[-1]
            for alias in node.names:
                imports[alias.asname or alias.name] = mod
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass"
                                                  for t in node.targets):
            vals = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            entry += [n for n in (_base_name(v) for v in vals) if n]
    return Module(name, classes, imports, entry)


class Package:
    """The model files of one release, parsed lazily, with base resolution across them."""

    def __init__(self, models: Path, extra: dict[str, Path]):
        self.models = models
        self.extra = extra
        self.cache: dict[str, Module | None] = {}

    def module(self, name: str) -> Module | None:
        if name not in self.cache:
            path = self.extra.get(name) or self.models / f"{name}.py"
            self.cache[name] = parse_module(path, name) if path.is_file() else None
        return self.cache[name]

    def resolve(self, cls: str, mod: str, depth: int = 0) -> list[ClassInfo]:
        """The class and its ancestors (as far as they are found in the wheel), the class first."""
        m = self.module(mod)
        if m is None or depth > 30:
            return []
        info = m.classes.get(cls)
        if info is None:
            src = m.imports.get(cls)
            return self.resolve(cls, src, depth + 1) if src and src != mod else []
        out = [info]
        for b in info.bases:
            out += self.resolve(b, mod, depth + 1)
        return out


def vllm_registry(src: Path) -> dict[str, tuple[str, str]]:
    reg = src / "vllm" / "model_executor" / "models" / "registry.py"
    tree = ast.parse(reg.read_text(encoding="utf-8"))
    out: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not any(isinstance(t, ast.Name) and t.id.endswith("_MODELS") for t in targets):
                continue
            for k, v in zip(node.value.keys, node.value.values):
                if isinstance(k, ast.Constant) and isinstance(v, ast.Tuple) and len(v.elts) >= 2 and \
                        all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in v.elts[:2]):
                    out.setdefault(k.value, (v.elts[0].value, v.elts[1].value))
    return out


def read_vllm(src: Path) -> dict[str, list]:
    models = src / "vllm" / "model_executor" / "models"
    iface = models / "interfaces.py"
    protocol = iface.is_file() and re.search(r"^class SupportsEagle3\b", iface.read_text(encoding="utf-8"), re.M)
    pkg = Package(models, {})
    rows: dict[str, list] = {}
    for arch, (mod, cls) in sorted(vllm_registry(src).items()):
        chain = pkg.resolve(cls, mod)
        if not chain:
            continue
        names = {c.name for c in chain}
        if protocol:
            yes = "SupportsEagle3" in names or any("supports_eagle3" in c.attrs for c in chain)
        else:
            yes = any("set_aux_hidden_state_layers" in c.methods for c in chain)
        rows[arch] = [f"vllm/model_executor/models/{mod}.py", cls, yes, [r for r in ROOTS if r in names]]
    return rows


def read_sglang(src: Path) -> dict[str, list]:
    models = src / "sglang" / "srt" / "models"
    pkg = Package(models, {})
    rows: dict[str, list] = {}
    for path in sorted(models.glob("*.py")):
        m = pkg.module(path.stem)
        if m is None:
            continue
        for cls in m.entry:
            chain = pkg.resolve(cls, path.stem)
            if not chain:
                continue
            names = {c.name for c in chain}
            yes = any("set_eagle3_layers_to_capture" in c.methods for c in chain)
            rows.setdefault(cls, [f"sglang/srt/models/{path.name}", cls, yes, [r for r in ROOTS if r in names]])
    return rows


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def main(base: Path) -> None:
    data: dict[str, dict[str, dict[str, list]]] = {"vllm": {}, "sglang": {}}
    for d in sorted(base.iterdir()):
        m = re.fullmatch(r"(vllm|sglang)-(\d[\w.]*)", d.name)
        if not m or not d.is_dir() or not (d / ".done").is_file():
            continue
        engine, version = m.groups()
        data[engine][version] = read_vllm(d) if engine == "vllm" else read_sglang(d)
    lines = ['"""Generated by scripts/make_model_classes.py from the unpacked released wheels: do not edit.',
             "",
             "``RELEASES[engine]``: the releases read, oldest first. ``MODEL_CLASSES[engine][architecture]``: runs of",
             "consecutive releases read, ``(first, last, file, class, eagle3, roots)``: the model file each release in",
             "the run registers the architecture from, its class, whether the class captures EAGLE-3 aux states, and",
             "the model-class roots (scripts/make_model_classes.py ROOTS) among its bases. A release of the list",
             "outside every run of an architecture does not register it.",
             '"""',
             "# flake8: noqa",
             "RELEASES = {"]
    for engine in ("vllm", "sglang"):
        lines.append(f"    {engine!r}: {tuple(sorted(data[engine], key=_vkey))!r},")
    lines += ["}", "MODEL_CLASSES = {"]
    for engine in ("vllm", "sglang"):
        versions = sorted(data[engine], key=_vkey)
        lines.append(f"    {engine!r}: {{")
        for arch in sorted({a for v in versions for a in data[engine][v]}):
            runs: list[list] = []
            for v in versions:
                row = data[engine][v].get(arch)
                if row is None:
                    runs.append([])  # a gap ends a run
                    continue
                fact = (row[0], row[1], row[2], tuple(row[3]))
                if runs and runs[-1] and tuple(runs[-1][2:]) == fact:
                    runs[-1][1] = v
                else:
                    runs.append([v, v, *fact])
            cells = ", ".join(repr(tuple(r)) for r in runs if r)
            lines.append(f"        {arch!r}: ({cells},),")
        lines.append("    },")
    lines.append("}")
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for engine in data:
        for version in sorted(data[engine], key=_vkey):
            rows = data[engine][version]
            print(engine, version, len(rows), "archs,", sum(r[2] for r in rows.values()), "with EAGLE-3")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/work/wheels/src"))
