"""docs/causes.md's coverage table: every finding code its 'checked by' column names is emitted by the tool and
asserted by at least one test (a code nobody plants is a claim, not a check)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"align", "config", "replay", "logs", "plan", "scan", "probe", "doctor", "wiring"}


def named_codes() -> set[str]:
    table = [line.split("|") for line in (ROOT / "docs" / "causes.md").read_text().splitlines()
             if re.match(r"\| \d+ \|", line)]
    named = {code for cells in table for code in re.findall(r"`([a-z0-9][a-z0-9*-]+)`", cells[-2])}
    return {c for c in named - COMMANDS if "-" in c and not c.endswith("-*")}


def test_the_table_names_the_new_rows_codes() -> None:
    assert {"drafter-cache-lost", "depth-past-trained", "block-drafter-settings", "spec-switched-off",
            "accept-falls-with-batch"} <= named_codes()


def test_every_doctor_code_the_table_names_is_registered() -> None:
    from eagleforensics.checks.registry import all_codes

    codes = all_codes()
    emitted = set(codes)
    sources = "\n".join(p.read_text() for p in (ROOT / "eagleforensics").rglob("*.py"))
    missing = {c for c in named_codes() if c not in emitted and f'"{c}"' not in sources}
    assert missing == set(), sorted(missing)


def test_every_code_the_table_names_is_asserted_by_a_test() -> None:
    """Named in a test file's string, or planted by the defect matrix tests/test_doctor_checks.py asserts."""
    from eagleforensics.testing.defects import DEFECTS

    tests = "\n".join(p.read_text() for p in (ROOT / "tests").glob("*.py") if p.name != Path(__file__).name)
    planted = {d.code for d in DEFECTS}
    untested = {c for c in named_codes() - planted if f'"{c}"' not in tests and f"'{c}'" not in tests}
    assert untested == set(), sorted(untested)
