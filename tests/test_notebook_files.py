"""The notebooks in notebooks/ are templates kept without outputs, and JupyterLab runs working copies of them.

A run-and-saved align.ipynb is several MB (plotly.js and every figure); committing one would put
that in git. ``scripts/lab.sh`` opens copies in git-ignored ``notebooks/work/`` instead
(``eagleforensics.report.lab``), and this file fails on any template that has outputs, so CI
refuses such a commit.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest

from eagleforensics.report import lab

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CLEAR = "clear them (JupyterLab: Edit > Clear Outputs of All Cells; or jupyter nbconvert --clear-output --inplace {})"


def output_problems(nb: Any) -> list[str]:
    """What a template must not carry: outputs, execution counts, saved widget state."""
    problems = [f"cell {i}: {len(c.outputs)} outputs" for i, c in enumerate(nb.cells)
                if c.cell_type == "code" and c.outputs]
    problems += [f"cell {i}: execution count {c.execution_count}" for i, c in enumerate(nb.cells)
                 if c.cell_type == "code" and c.execution_count is not None]
    if "widgets" in nb.metadata:
        problems.append("metadata.widgets (saved widget state)")
    return problems


def test_the_notebooks_are_found() -> None:
    assert {"align.ipynb", "explore.ipynb", "runs.ipynb", "scan.ipynb"} <= {p.name for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_template_has_no_outputs(path: Path) -> None:
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    problems = output_problems(nb)
    assert not problems, f"notebooks/{path.name}: {'; '.join(problems)}; " + CLEAR.format(f"notebooks/{path.name}")
    assert path.stat().st_size < 64 * 1024, f"notebooks/{path.name} is {path.stat().st_size:,} bytes"


def test_the_check_sees_outputs_and_counts() -> None:
    """The check fails on a template that was run: one output, one execution count, saved widget state."""
    nb = nbformat.read(str(NOTEBOOKS[0]), as_version=4)
    assert output_problems(nb) == []
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\n")]
    code.execution_count = 1
    nb.metadata["widgets"] = {}
    assert len(output_problems(nb)) == 3


def test_working_copies_are_made_once_and_never_overwritten(tmp_path: Path) -> None:
    templates, work = tmp_path / "notebooks", tmp_path / "notebooks" / "work"
    templates.mkdir()
    for p in NOTEBOOKS[:2]:
        shutil.copyfile(p, templates / p.name)
    copied, stale = lab.working_copies(work, templates)
    assert [p.name for p in copied] == [p.name for p in NOTEBOOKS[:2]] and stale == []
    mine = work / NOTEBOOKS[0].name
    mine.write_text(mine.read_text().replace('"cells"', '"cells" ', 1))  # the user's edits
    edited = mine.read_bytes()
    copied, stale = lab.working_copies(work, templates)
    assert copied == [] and stale == [] and mine.read_bytes() == edited
    later = mine.stat().st_mtime + 10  # the template changes after the copy was made
    os.utime(templates / NOTEBOOKS[0].name, (later, later))
    copied, stale = lab.working_copies(work, templates)
    assert copied == [] and stale == [mine] and mine.read_bytes() == edited


def test_working_copies_are_git_ignored() -> None:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    rel = lab.WORK_DIR.relative_to(ROOT) / "align.ipynb"
    done = subprocess.run(["git", "check-ignore", "-q", str(rel)], cwd=ROOT)
    assert done.returncode == 0, f"{rel} is not ignored by git"


def test_lab_command_and_missing_jupyterlab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The server is this interpreter's JupyterLab rooted at the copies; without JupyterLab: one line, exit 2."""
    cmd = lab.lab_command(tmp_path, ["--no-browser"])
    assert cmd[:2] == [sys.executable, "-I"] and "run_module('jupyterlab'" in cmd[3]  # isolated
    assert cmd[4:] == [f"--ServerApp.root_dir={tmp_path}", "--no-browser"]
    monkeypatch.setitem(sys.modules, "jupyterlab", None)  # import jupyterlab now raises ImportError
    with pytest.raises(SystemExit) as info:
        lab.main([f"--work-dir={tmp_path / 'w'}"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "JupyterLab is not installed" in err and "scripts/lab.sh" in err
    assert not (tmp_path / "w").exists()
