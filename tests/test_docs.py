"""The README and docs/ hold together: every link and citation resolves inside the repository, the README stays a
five-minute read without development history, and the causes page names only codes the tool emits."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", page.read_text(), re.M)}


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file is missing or whose #anchor names no heading of it."""
    bad = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(target)
    return bad


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_checker_catches_a_missing_file_and_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [file](nothing.md) [anchor](#no-such-heading) [web](https://x.org)\n")
    assert broken_links(page) == ["nothing.md", "#no-such-heading"]


def test_readme_is_short_and_has_no_development_history() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "dated entries belong in docs/"
    assert not re.search(r"\b[Ii]ssue \d+", text), "issue numbers belong in docs/ or the history"


def _sources() -> str:
    files = [*sorted((ROOT / "eagleforensics").rglob("*.py")), *sorted((ROOT / "scripts").glob("*.py")), README, *PAGES]
    return "\n".join(f.read_text() for f in files)


def test_no_citation_points_outside_the_repository() -> None:
    """The references the tool was built from are not shipped: the code cites the docs pages written from them."""
    text = _sources()
    assert "shared/reference" not in text
    assert not re.search(r"failure catalogue row", text, re.I)


def test_every_causes_row_cited_exists() -> None:
    rows = {int(m) for m in re.findall(r"^\| (\d+) \|", (ROOT / "docs" / "causes.md").read_text(), re.M)}
    assert rows == set(range(1, len(rows) + 1)) and len(rows) >= 30
    cited = set()
    for m in re.finditer(r"causes\.md\)? rows? ([\d, and]+)", _sources()):
        cited |= {int(n) for n in re.findall(r"\d+", m.group(1))}
    assert cited and cited <= rows, sorted(cited - rows)


def test_the_causes_page_names_only_codes_the_tool_documents() -> None:
    """Each code in the causes page's 'checked by' column is a documented finding code or a command."""
    table = [line.split("|") for line in (ROOT / "docs" / "causes.md").read_text().splitlines()
             if re.match(r"\| \d+ \|", line)]
    named = {code for cells in table for code in re.findall(r"`([a-z0-9][a-z0-9*-]+)`", cells[-2])}
    documented = set()
    for page in PAGES:
        if page.name in ("causes.md", "glossary.md"):
            continue
        first_cells = [line.split("|")[1] for line in page.read_text().splitlines() if line.startswith("| `")]
        documented |= set(re.findall(r"`([a-z0-9][a-z0-9-]+)`", "\n".join(first_cells)))
    commands = {"align", "config", "replay", "logs", "plan", "scan", "probe", "doctor"}
    unknown = {c for c in named - documented - commands
               if not (c.endswith("-*") and any(d.startswith(c[:-1]) for d in documented))}
    assert unknown == set()


def test_glossary_defines_the_terms_the_readme_links() -> None:
    glossary = anchors(ROOT / "docs" / "glossary.md")
    linked = {t.partition("#")[2] for t in LINK.findall(README.read_text()) if t.startswith("docs/glossary.md#")}
    assert linked and linked <= glossary
