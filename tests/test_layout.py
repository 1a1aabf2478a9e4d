"""The house stays as drawn: every import inside the package points down (or within its own room), and no
module or room reaches itself again through its imports (no circles).

Each module's imports are read from its source with ``ast`` (function-level imports included). For the
upward rule, blocks under ``if TYPE_CHECKING:`` are skipped, since they name types for checkers and never
run; for circles they count: a type named from a room that imports you back is a circle a reader has to
untangle all the same.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "eagleforensics"

# room -> the rooms it may import besides itself (the bottom three are open to everyone above them)
BOTTOM = {"arrays", "errors", "interrupts", "positions", "process", "records", "results", "verdict"}
ALLOWED: dict[str, set[str]] = {
    "arrays": set(),
    "errors": set(),
    "interrupts": set(),
    "positions": set(),
    "process": set(),
    "records": {"positions"},
    "causes": BOTTOM,
    "results": {"arrays", "errors", "positions", "records", "verdict"},
    "verdict": {"arrays", "errors", "positions", "records"},
    "io": BOTTOM,
    "evidence": BOTTOM | {"io"},
    "drafter": BOTTOM | {"io", "evidence"},
    "dataaudit": BOTTOM | {"io", "evidence", "drafter"},
    "serving": BOTTOM | {"io", "evidence"},
    "engines": BOTTOM | {"io"},
    "scan": BOTTOM | {"io", "evidence", "dataaudit"},
    "testing": BOTTOM | {"io", "evidence", "drafter"},
    "checks": BOTTOM | {"io", "evidence", "drafter", "dataaudit", "serving", "engines", "scan", "alignment", "replay"},
    "alignment": BOTTOM | {"io", "evidence", "engines"},
    "replay": BOTTOM | {"io", "evidence", "drafter", "engines", "alignment"},
    "replaypool": BOTTOM | {"io", "evidence", "drafter", "engines", "alignment", "replay", "scan"},
    "doctor": BOTTOM | {"io", "evidence", "drafter", "dataaudit", "serving", "engines", "scan", "checks", "alignment",
                        "replay", "replaypool", "causes"},
    "plan": BOTTOM | {"io", "evidence", "serving", "engines"},
    "probe": BOTTOM | {"io", "evidence", "serving", "engines"},
    "report": BOTTOM | {"io", "evidence", "drafter", "dataaudit", "serving", "engines", "scan", "checks", "alignment",
                        "replay", "replaypool", "doctor", "plan", "causes"},
    "cli": BOTTOM | {"io", "evidence", "drafter", "dataaudit", "serving", "engines", "scan", "checks", "alignment",
                     "replay", "replaypool", "doctor", "plan", "probe", "report", "causes"},
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


def package_imports(path: Path, source: str | None = None, typing_too: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module) for every runtime import of this package's own modules in ``path`` (and, with
    ``typing_too``, those under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    skip = set() if typing_too else _type_checking_lines(tree)
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
                    # from .pkg import mod: the module too, where the name is one (_module_graph keeps known ones)
                    out += [(node.lineno, f"{target}.{a.name}") for a in node.names if typing_too]
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
    for room in ("io", "evidence", "drafter", "dataaudit", "serving", "engines", "report", "scan", "testing", "cli"):
        doc = ast.get_docstring(ast.parse((PKG / room / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 8, room


def _module_graph(sources: dict[Path, str] | None = None) -> dict[str, set[str]]:
    """module -> the package modules it imports (runtime and type-checking imports alike); ``sources``
    replaces the text of some files, for the checker's own test."""
    sources = sources or {}
    names = {module_name(p) for p in MODULES} | {module_name(p) for p in sources}
    graph: dict[str, set[str]] = {}
    for path in sorted(set(MODULES) | set(sources)):
        here = module_name(path)
        edges = graph.setdefault(here, set())
        for _, target in package_imports(path, sources.get(path), typing_too=True):
            while target not in names and "." in target:  # from .x import name -> the module x
                target = target.rpartition(".")[0]
            if target in names and target != here and not (path.name == "__init__.py" and target.startswith(here + ".")):
                edges.add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of ``graph`` with more than one member (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = room_of(module)
        rooms.setdefault(here, set()).update(room_of(t) for t in targets if room_of(t) != here)
    return rooms


def test_no_module_imports_itself_back() -> None:
    assert _circles(_module_graph()) == []


def test_no_room_imports_itself_back() -> None:
    assert _circles(_room_graph(_module_graph())) == []


def test_the_checker_catches_a_circle() -> None:
    """A planted back edge, type-checking or in a function, is a circle of files and of rooms."""
    planted = {PKG / "positions.py": (PKG / "positions.py").read_text() + "\nif TYPE_CHECKING:\n"
               "    from .alignment import align\n"}
    files = _circles(_module_graph(planted))
    assert any("eagleforensics.positions" in part and "eagleforensics.alignment" in part for part in files), files
    assert any({"positions", "alignment"} <= set(part) for part in _circles(_room_graph(_module_graph(planted))))
