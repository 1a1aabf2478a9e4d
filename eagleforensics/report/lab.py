"""JupyterLab on working copies of the notebooks, so running and saving them never touches the tracked files.

``python -m eagleforensics.report.lab [--work-dir DIR] [JUPYTERLAB OPTIONS]`` (what ``scripts/lab.sh``
runs) copies each ``notebooks/*.ipynb`` of this checkout into ``notebooks/work/`` (git-ignored)
unless a copy is already there, names the copies that are older than their template, and starts
JupyterLab with that folder as its root. A notebook run and saved there keeps its outputs (several
MB: plotly.js is embedded once per notebook) and git never sees them; the templates stay the clean
ones that ``eagleforensics report`` and papermill run. The kernel starts in the notebook's folder,
so a relative path in the first cell resolves from there.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from ..process import isolated_python
from .pipeline import NOTEBOOK_DIR

WORK_DIR = NOTEBOOK_DIR / "work"
INSTALL_HINT = "bash scripts/lab.sh installs it (or: pip install -e '.[lab]')"


def working_copies(dest: Path = WORK_DIR, templates: Path = NOTEBOOK_DIR) -> tuple[list[Path], list[Path]]:
    """Copy every template notebook missing from ``dest``; return (copied, stale): stale copies are older than their template."""
    dest.mkdir(parents=True, exist_ok=True)
    copied: list[Path] = []
    stale: list[Path] = []
    for template in sorted(templates.glob("*.ipynb")):
        copy = dest / template.name
        if not copy.exists():
            shutil.copyfile(template, copy)  # a fresh mtime: the copy is as new as the moment it was made
            copied.append(copy)
        elif copy.stat().st_mtime < template.stat().st_mtime:
            stale.append(copy)
    return copied, stale


def lab_command(work_dir: Path, options: list[str]) -> list[str]:
    """The JupyterLab command line: this interpreter's JupyterLab, rooted at ``work_dir``, with the caller's options
    last. Isolated (``process.isolated_python``): nothing in the folder it starts from is imported."""
    run = "import runpy; runpy.run_module('jupyterlab', run_name='__main__', alter_sys=True)"
    return [*isolated_python(run), f"--ServerApp.root_dir={work_dir}", *options]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m eagleforensics.report.lab", description=__doc__.split("\n")[0],
                                     epilog="Every other option goes to JupyterLab (e.g. --port 8899 --no-browser).")
    parser.add_argument("--work-dir", type=Path, default=WORK_DIR,
                        help=f"folder of the working copies (default {WORK_DIR})")
    args, options = parser.parse_known_args(argv)
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        print(f"error: JupyterLab is not installed; {INSTALL_HINT}", file=sys.stderr)
        sys.exit(2)
    work_dir = args.work_dir.resolve()
    copied, stale = working_copies(work_dir)
    for copy in copied:
        print(f"copied {copy.name} to {work_dir}")
    for copy in stale:
        print(f"note: {copy} is older than notebooks/{copy.name}; delete the copy to get the new template")
    print(f"JupyterLab on {work_dir} (git-ignored working copies; the templates in {NOTEBOOK_DIR} stay untouched)")
    sys.stdout.flush()
    # the python3 kernelspec runs "python" from PATH: make it this interpreter, even from an unactivated venv
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    command = lab_command(work_dir, options)
    os.execve(command[0], command, env)


if __name__ == "__main__":
    main()
