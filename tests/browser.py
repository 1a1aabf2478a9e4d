"""Headless Chromium for the report tests: the page's own network requests, a layout probe, a screenshot.

Networking is off (every host fails to resolve, any proxied request goes nowhere), and
``--log-net-log`` records every request the browser starts. The page's requests are told
from Chromium's own background traffic (update checks, account pings) by their network
isolation key, which names the top-level site: ``file://`` for a report opened from disk.
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TIMEOUT_S = 180
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         '--host-resolver-rules=MAP * ~NOTFOUND', "--proxy-server=http://127.0.0.1:9",
         "--proxy-bypass-list=<-loopback>", "--virtual-time-budget=15000"]
# Reads where the verdict and its snippets sit once the page has laid out (window 1280 x 900), and
# clicks the first copy button. The clipboard is a stand-in installed before the click: Chromium's own
# clipboard answers over IPC in real time while --virtual-time-budget races the page's timers ahead, so
# waiting on it was flaky (CI: the label still read "copy"). The stand-in either takes the text
# (``CLIP`` = resolve) or refuses it (reject), which sends the page to its selection fallback; both
# settle within microtasks, so the label is read right after a single timer tick.
_PROBE = """<script>window.addEventListener('load', function () {
  var v = document.querySelector('.ef-verdict'), b = v && v.querySelector('b');
  var out = {verdict: b ? b.textContent : null, verdict_bottom: b ? b.getBoundingClientRect().bottom : null,
             snippets: [].map.call(document.querySelectorAll('.ef-snippet'), function (p) {
               return [p.textContent, p.getBoundingClientRect().bottom]; }),
             clipboard: null};
  var stand_in = {writeText: function (t) {
    out.clipboard = t; return CLIP === 'resolve' ? Promise.resolve() : Promise.reject(new Error('refused')); }};
  Object.defineProperty(navigator, 'clipboard', {value: stand_in, configurable: true});
  var btn = document.querySelector('.ef-copy');
  if (btn) { btn.click(); }
  setTimeout(function () {
    out.copy_button = btn ? btn.textContent : null;
    out.selection = String(window.getSelection());
    var d = document.createElement('pre'); d.id = 'ef-probe'; d.textContent = JSON.stringify(out);
    document.body.appendChild(d); }, 0); });</script>"""


def run(page: Path, *extra: str, netlog: Path | None = None) -> str:
    """Open ``page`` with networking off; return stdout (the DOM with --dump-dom)."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    log = [f"--log-net-log={netlog}"] if netlog is not None else []
    with tempfile.TemporaryDirectory(prefix="ef-chromium-") as profile:
        # its own process group: on a timeout the renderer and GPU children, which hold the output
        # pipes open, are killed too (subprocess.run's timeout kills only the parent, then waits on them)
        proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *log, *extra, page.as_uri()],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"chromium did not finish {page.name} in {TIMEOUT_S} s")
    assert proc.returncode == 0, err[-2000:]
    return out


def page_requests(page: Path) -> list[str]:
    """Every URL the page itself asked for (scripts, images, fonts, fetches), by the browser's net log."""
    with tempfile.TemporaryDirectory(prefix="ef-netlog-") as tmp:
        log = Path(tmp) / "net.json"
        run(page, "--dump-dom", netlog=log)
        text = log.read_text(encoding="utf-8")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:  # a log cut short at exit lacks its closing brackets
        doc = json.loads(text.rstrip().rstrip(",") + "]}")
    start = doc["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [e["params"]["url"] for e in doc["events"]
            if e["type"] == start and str(e.get("params", {}).get("network_isolation_key", "")).startswith("file://")]


def probe(page: Path, tmp: Path, clipboard: str = "resolve") -> dict[str, Any]:
    """Where the verdict and the snippets are on a 1280 x 900 window (a copy of the page with a probe script).

    ``clipboard`` is what the stand-in clipboard does with the copy button's text: "resolve" takes it,
    "reject" refuses it (the page should then select the snippet instead).
    """
    if clipboard not in ("resolve", "reject"):
        raise ValueError(f"clipboard must be 'resolve' or 'reject', not {clipboard!r}")
    copy = tmp / f"probe-{clipboard}-{page.name}"
    text = page.read_text(encoding="utf-8")
    at = text.rfind("</body>")
    script = _PROBE.replace("CLIP", repr(clipboard))
    copy.write_text(text[:at] + script + text[at:], encoding="utf-8")
    dom = run(copy, "--window-size=1280,900", "--dump-dom")
    found = re.search(r'<pre id="ef-probe">(.*?)</pre>', dom, re.S)
    assert found, "the probe did not run"
    return json.loads(html.unescape(found.group(1)))


def screenshot(page: Path, out: Path, height: int = 900) -> Path:
    """A 1280 x ``height`` screenshot of the top of the page."""
    run(page, f"--window-size=1280,{height}", f"--screenshot={out}")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return out


def colour_bar_height(png: Path, colour: str) -> int:
    """The tallest vertical run of pixels of exactly ``colour`` (#rrggbb) in any column of the image."""
    from PIL import Image
    import numpy as np

    rgb = np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)
    want = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
    hit = (np.abs(rgb - want).sum(axis=-1) <= 6)
    best = 0
    for col in np.nonzero(hit.any(axis=0))[0]:
        run_len = 0
        for v in hit[:, col]:
            run_len = run_len + 1 if v else 0
            best = max(best, run_len)
    return best
