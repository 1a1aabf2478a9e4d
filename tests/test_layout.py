"""The house stays as drawn: every import inside the package points down (or within its own room).

Each module's imports are read from its source with ``ast`` (function-level imports included;
blocks under ``if TYPE_CHECKING:`` are skipped, since they name types for checkers and never run).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "eagleforensics"

# room -> the rooms it may import besides itself (the bottom three are open to everyone above them)
BOTTOM = {"arrays", "errors", "interrupts", "positions", "process", "results", "verdict"}
ALLOWED: dict[str, set[str]] = {
    "arrays": set(),
    "errors": set(),
    "interrupts": set(),
    "positions": set(),
    "process": set(),
    "results": {"arrays", "errors", "positions", "verdict"},
    "verdict": {"arrays", "errors", "positions", "results"},
    "io": BOTTOM,
    "evidence": BOTTOM | {"io"},
    "engines": BOTTOM | {"io"},
    "scan": BOTTOM | {"io", "evidence"},
    "testing": BOTTOM | {"io"},
    "checks": BOTTOM | {"io", "evidence", "engines", "scan"},
    "alignment": BOTTOM | {"io", "evidence", "engines"},
    "replay": BOTTOM | {"io", "evidence", "engines", "alignment"},
    "doctor": BOTTOM | {"io", "evidence", "engines", "scan", "checks", "alignment", "replay"},
    "plan": BOTTOM | {"io", "evidence", "engines"},
    "probe": BOTTOM | {"io", "evidence", "engines"},
    "report": BOTTOM | {"io", "evidence", "engines", "scan", "checks", "alignment", "replay", "doctor", "plan"},
    "cli": BOTTOM | {"io", "evidence", "engines", "scan", "checks", "alignment", "replay", "doctor", "plan", "probe",
                     "report"},
    "__init__": BOTTOM,
    "__main__": {"cli"},
}


def room_of(module: str) -> str:
    """``eagleforensics.io.capture`` -> ``io``; ``eagleforensics.alignment`` -> ``alignment``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skip.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return skip


def package_imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) for every runtime import of this package's own modules in ``path``."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    skip = _type_checking_lines(tree)
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "eagleforensics" or target.startswith("eagleforensics."):
                if target == "eagleforensics":  # from . import x: x is the module imported
                    out += [(node.lineno, f"eagleforensics.{a.name}") for a in node.names]
                else:
                    out.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("eagleforensics.")]
    return out


def upward_imports(path: Path, source: str | None = None) -> list[str]:
    """Every import in ``path`` (or in ``source`` as if it were that file) that leaves its room for one it may not use."""
    room = room_of(module_name(path)) if path.name != "__init__.py" or path.parent != PKG else "__init__"
    bad = []
    for line, target in package_imports(path, source):
        other = room_of(target)
        if other != room and other not in ALLOWED[room]:
            bad.append(f"{path.relative_to(PKG.parent)}:{line} ({room}) imports {target} ({other})")
    return bad


MODULES = sorted(PKG.rglob("*.py"))


def test_every_module_belongs_to_a_known_room() -> None:
    rooms = {room_of(module_name(p)) if p != PKG / "__init__.py" else "__init__" for p in MODULES}
    assert rooms <= set(ALLOWED), rooms - set(ALLOWED)
    assert {"io", "evidence", "engines", "report", "scan", "results", "alignment"} <= rooms


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_point_down(path: Path) -> None:
    assert upward_imports(path) == []


@pytest.mark.parametrize("where, source, culprit", [
    ("io/capture.py", "from ..report import pipeline\nfrom ..errors import ForensicsError\n", "eagleforensics.report"),
    ("results.py", "def f():\n    from .alignment import align\n", "eagleforensics.alignment"),
    ("evidence/match.py", "import eagleforensics.engines.rules\n", "eagleforensics.engines.rules"),
    ("engines/rules.py", "from .. import alignment\n", "eagleforensics.alignment"),
])
def test_the_checker_catches_an_upward_import(where: str, source: str, culprit: str) -> None:
    """A planted upward import (module level, in a function, absolute, or ``from .. import x``) is reported."""
    bad = upward_imports(PKG / where, source)
    assert len(bad) == 1 and culprit in bad[0], bad


def test_type_checking_imports_are_not_edges() -> None:
    """``results`` names pipeline types for type checkers only; that is allowed and must stay so."""
    assert upward_imports(PKG / "results.py") == []
    assert any("TYPE_CHECKING" in line for line in (PKG / "results.py").read_text().splitlines())


def test_each_room_says_what_it_is_for() -> None:
    for room in ("io", "evidence", "engines", "report", "scan", "testing", "cli"):
        doc = ast.get_docstring(ast.parse((PKG / room / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 8, room
