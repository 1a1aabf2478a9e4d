"""JupyterLab as a person uses it: a real server, align.ipynb and explore.ipynb run from the UI in headless Chromium.

One server per module, started the way ``scripts/lab.sh`` starts it (``python -m
eagleforensics.report.lab``) on a temporary working-copy folder: 127.0.0.1, a free port, a random
token, settings and runtime files in temporary folders, shut down through its API at the end.
Playwright drives Debian's Chromium (no browser download) and aborts every request that is not
for that server. Each notebook is opened, run with the menu's "Run > Run All Cells" and checked
in the page: the verdict, the plotly figures drawn as SVG, the widgets drawn as widgets and a
figure that changes when a slider is dragged. Skips only where JupyterLab, Playwright or
Chromium is missing (``bash scripts/test.sh`` installs the first two, ``.ci/run`` the third).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from eagleforensics.report import explore
from eagleforensics.report import pipeline as report

from .browser import CHROMIUM

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data_samples"
START_S = 90  # server start and kernel start, each; a cold start on a loaded 2-core machine
RUN_S = 180  # one notebook's "Run All Cells"
IDLE = re.compile(r"Python 3 \(ipykernel\) \| Idle")
NB = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook"  # the notebook in the current tab
LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to 127.0.0.1, whatever *_proxy says
WIDGETS = f"{NB} .jp-OutputArea-output:has(> .jupyter-widgets)"  # an output drawn by the widget manager


def _require() -> None:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    for module, what in (("jupyterlab", "JupyterLab"), ("playwright", "Playwright")):
        try:
            __import__(module)
        except ImportError:
            pytest.skip(f"{what} is not installed (pip install -e '.[test]', as scripts/test.sh does)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Lab:
    """A running JupyterLab server and the folder it serves."""

    base: str
    token: str
    root: Path
    log: Path
    blocked: list[str] = field(default_factory=list)

    def url(self, path: str, query: str = "") -> str:
        return f"{self.base}/{path}?{query}token={self.token}"


def _settings(folder: Path) -> None:
    """User settings of the throw-away profile: every cell in the DOM (no windowing), no news fetch."""
    for plugin, value in (("notebook-extension/tracker", {"windowingMode": "none"}),
                          ("apputils-extension/notification", {"fetchNews": "false"})):
        f = folder / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(value))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    _require()
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "work"
    inputs = root / "inputs"  # user files next to the notebooks, named by a relative path in the first cell
    inputs.mkdir(parents=True)
    for name in ("record_layer_outputs.pt", "capture.pt"):
        shutil.copyfile(SAMPLES / name, inputs / name)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_SETTINGS_DIR",
                "JUPYTERLAB_WORKSPACES_DIR", "IPYTHONDIR"):
        env[var] = str(tmp / var.lower())
    _settings(Path(env["JUPYTERLAB_SETTINGS_DIR"]))
    port, token = _free_port(), secrets.token_hex(24)
    log = tmp / "server.log"
    args = [sys.executable, "-m", "eagleforensics.report.lab", f"--work-dir={root}", "--no-browser",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}", "--ServerApp.allow_root=True",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.extension_manager=readonly"]
    with open(log, "w") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    server = Lab(f"http://127.0.0.1:{port}", token, root, log)
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert proc.poll() is None, f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            try:
                with LOCAL.open(server.url("api/status"), timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, f"JupyterLab not up in {START_S} s:\n{log.read_text()[-3000:]}"
                time.sleep(0.3)
        yield server
    finally:
        try:  # the API shuts the kernels down with the server
            LOCAL.open(urllib.request.Request(server.url("api/shutdown"), method="POST"), timeout=10)
        except OSError:
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the server and the kernels it started
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def browser(lab: Lab) -> Iterator[Any]:
    """Headless Chromium with a context that lets through only requests for the lab server (others are recorded)."""
    from playwright.sync_api import sync_playwright

    def route(r: Any) -> None:
        if r.request.url.startswith(lab.base + "/"):
            r.continue_()
        else:
            lab.blocked.append(r.request.url)
            r.abort()

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
        context = chromium.new_context(viewport={"width": 1400, "height": 1000})
        context.route("**/*", route)
        try:
            yield context
        finally:
            context.close()
            chromium.close()


def _wait_kernel(page: Any) -> None:
    """Until the notebook's kernel is idle; a "Select Kernel" dialog is answered as a user would (Select)."""
    deadline = time.monotonic() + START_S
    while not IDLE.search(page.inner_text("#jp-main-statusbar")):
        select = page.locator(".jp-Dialog button.jp-mod-accept")
        if select.count():
            select.first.click()
        assert time.monotonic() < deadline, f"kernel not idle in {START_S} s: {page.inner_text('#jp-main-statusbar')}"
        page.wait_for_timeout(300)


def _open(page: Any, lab: Lab, notebook: str) -> None:
    page.goto(lab.url(f"lab/tree/{notebook}", "reset&"))  # reset: a fresh layout with only this notebook open
    page.wait_for_selector(f"{NB} .jp-CodeCell", timeout=START_S * 1000)
    _wait_kernel(page)


def _run_all(page: Any) -> float:
    """Run > Run All Cells from the menu bar; wait until every code cell has its execution count. Returns seconds."""
    t0 = time.monotonic()
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    page.wait_for_function(
        """nb => { const p = [...document.querySelectorAll(nb + ' .jp-CodeCell .jp-InputArea-prompt')];
                   return p.length > 0 && p.every(e => /\\[\\d+\\]/.test(e.textContent)); }""",
        arg=NB, timeout=RUN_S * 1000)
    _wait_kernel(page)
    return time.monotonic() - t0


def _outputs(page: Any, mime: str) -> Any:
    return page.locator(f"{NB} .jp-OutputArea-output[data-mime-type='{mime}']")


def _errors(page: Any) -> list[str]:
    """Tracebacks and stderr: JupyterLab draws both as the stderr mimetype."""
    return _outputs(page, "application/vnd.jupyter.stderr").all_inner_texts()


def _drawn(page: Any, scope: str = NB) -> list[dict[str, Any]]:
    """Every plotly figure under ``scope`` as drawn: its trace names and the SVG elements plotly made for them."""
    return page.eval_on_selector_all(f"{scope} .js-plotly-plot", """els => els.map(el => ({
        title: (el.layout && el.layout.title && el.layout.title.text) || '',
        names: (el.data || []).map(t => t.name || ''),
        svgs: el.querySelectorAll('svg.main-svg').length,
        drawn: el.querySelectorAll('.trace, .hm, image').length }))""")


def test_align_notebook_from_the_ui(lab: Lab, browser: Any) -> None:
    """Set the inputs in the first cell by a path relative to the notebook, Run All from the menu, save: verdict and figures."""
    template = report.find_notebook("align.ipynb")
    before = _sha(template)
    assert sorted(p.name for p in lab.root.glob("*.ipynb")) == sorted(p.name for p in template.parent.glob("*.ipynb"))
    page = browser.new_page()
    _open(page, lab, "align.ipynb")
    # what a user does: type the inputs at the end of the parameters cell
    page.locator(f"{NB} .jp-CodeCell .cm-content").first.click()
    page.keyboard.press("Control+End")
    page.keyboard.press("Enter")
    page.keyboard.insert_text('shard, capture = "inputs/record_layer_outputs.pt", "inputs/capture.pt"')
    took = _run_all(page)
    text = page.inner_text(NB)
    assert not _errors(page), _errors(page)
    params = report.validate_params(str(lab.root / "inputs" / "record_layer_outputs.pt"),
                                    str(lab.root / "inputs" / "capture.pt"))
    result, _, _ = report.run_alignment(params)
    v = result.judge()  # the page shows "Verdict: LEVEL" then the summary the library computes
    assert f"Verdict: {v.level} {' '.join(v.summary.split())}" in " ".join(text.split()), text[:3000]
    assert "Findings" in text
    figures = _drawn(page)
    assert len(figures) == 2 + len(result.matches)  # heatmap, norm profile, one per-token figure per slot
    assert all(f["svgs"] and f["names"] and f["drawn"] for f in figures), figures
    assert page.locator(f"{NB} .jp-OutputArea-output.jp-RenderedPlotly").count() == len(figures)  # JupyterLab's plotly renderer
    # save: the working copy holds the outputs, the template does not change
    saved = lab.root / "align.ipynb"
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')", timeout=30000)
    nb = json.loads(saved.read_text())
    assert any(c.get("outputs") for c in nb["cells"]) and "inputs/capture.pt" in "".join(nb["cells"][0]["source"])
    assert _sha(template) == before
    page.screenshot(path=str(lab.root.parent / "align.png"))  # kept in pytest's temporary folder, to look at
    assert lab.blocked == []
    print(f"align.ipynb: Run All {took:.1f} s, {len(figures)} figures, saved copy {saved.stat().st_size:,} bytes")
    page.close()


def test_explore_widgets_from_the_ui(lab: Lab, browser: Any) -> None:
    """explore.ipynb: the explorer is drawn as widgets over three figures, and dragging a slider redraws one."""
    page = browser.new_page()
    _open(page, lab, "explore.ipynb")
    took = _run_all(page)
    try:  # the widget manager draws the views after the cell has finished
        page.wait_for_function("area => document.querySelectorAll(area + ' .js-plotly-plot svg.main-svg').length >= 3",
                               arg=WIDGETS, timeout=30000)
    except Exception:
        pytest.fail(f"no widget view with three figures:\n{page.inner_text(NB)[:3000]}")
    text = page.inner_text(NB)
    assert not _errors(page), _errors(page)
    assert not re.search(r"\b(IntSlider|IntRangeSlider|Dropdown|VBox|HBox|Output)\(|Explorer object", text), text[:3000]
    assert page.locator(WIDGETS).count() == 1
    area = WIDGETS
    assert page.locator(f"{area} .widget-dropdown select").count() == 2
    assert page.locator(f"{area} .widget-slider .noUi-handle").count() == 3  # a range slider (two handles) and a slider
    figures = _drawn(page, area)
    assert len(figures) == 3 and all(f["svgs"] and f["names"] and f["drawn"] for f in figures), figures
    # what the library draws for the default selection and for the slider at its maximum
    params = report.validate_params()
    explorer = explore.Explorer(report.run_alignment(params)[0], draw=False)
    expected_before = [t.name for t in explorer.figures["per_token"].data]
    explorer.neighbours.value = explorer.neighbours.max
    expected_after = [t.name for t in explorer.figures["per_token"].data]
    assert len(expected_after) > len(expected_before)
    assert figures[2]["names"] == expected_before
    slider = page.locator(f"{area} .widget-slider", has=page.locator(".widget-label", has_text="neighbours"))
    handle, track = slider.locator(".noUi-handle").first, slider.locator(".noUi-target").first
    h, t = handle.bounding_box(), track.bounding_box()
    assert h and t
    page.mouse.move(h["x"] + h["width"] / 2, h["y"] + h["height"] / 2)
    page.mouse.down()
    page.mouse.move(t["x"] + t["width"] + 20, t["y"] + t["height"] / 2, steps=8)  # past the end: the maximum
    page.mouse.up()
    assert slider.locator(".widget-readout").inner_text().strip() == str(explorer.neighbours.max)
    page.wait_for_function(
        """([area, names]) => { const els = document.querySelectorAll(area + ' .js-plotly-plot');
                                return els.length === 3 && JSON.stringify((els[2].data || []).map(t => t.name || ''))
                                                            === JSON.stringify(names); }""",
        arg=[area, expected_after], timeout=30000)
    after = _drawn(page, area)
    assert after[2]["svgs"] and after[2]["drawn"] >= len(expected_after)
    page.screenshot(path=str(lab.root.parent / "explore.png"), full_page=True)
    assert lab.blocked == []
    print(f"explore.ipynb: Run All {took:.1f} s; per-token traces {expected_before} -> {expected_after} after the drag")
    page.close()
