"""The align notebook through papermill, the self-contained HTML report, its look in headless Chromium, escaping.

The notebook runs once per input pair (session fixtures, a few seconds each): the layer-outputs
and the wrong-fix records of ``data_samples/`` through the CLI, a hostile generic record
through the library. Chromium tests skip only where no ``chromium`` binary is installed
(Debian: ``apt-get install -y chromium``).
"""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import nbformat
import pytest
import torch
from click.testing import CliRunner

from eagleforensics.report import pipeline as report
from eagleforensics.io.capture import CONVENTIONS as CAPTURE_CONVENTIONS
from eagleforensics.cli.report import report as report_cmd
from eagleforensics.errors import ForensicsError

from .conftest import NOTEBOOK_CELL_TIMEOUT
from .reportrun import ReportRun

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data_samples"
HOSTILE = "<script>alert(1)</script>"
HOSTILE_TITLE = "</title><script>alert(4)</script>"


def _cli(args: list[str]) -> Any:
    return CliRunner().invoke(report_cmd, args, catch_exceptions=False)


def _cli_run(out_dir: Path, record: str) -> ReportRun:
    html = out_dir / f"{Path(record).stem}.html"
    res = _cli([str(SAMPLES / record), str(SAMPLES / "capture.pt"), "-o", str(html), "--keep-notebook"])
    return ReportRun(res.exit_code, res.output, html, html.with_suffix(".ipynb"))


@pytest.fixture(scope="session")
def layout_run(tmp_path_factory: pytest.TempPathFactory) -> ReportRun:
    return _cli_run(tmp_path_factory.mktemp("report-layout"), "record_layer_outputs.pt")


@pytest.fixture(scope="session")
def wrong_fix_run(tmp_path_factory: pytest.TempPathFactory) -> ReportRun:
    return _cli_run(tmp_path_factory.mktemp("report-wrong-fix"), "record_wrong_fix.pt")


@pytest.fixture(scope="session")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> ReportRun:
    """A generic record (real states of data_samples) whose key, metadata and file name are HTML."""
    d = tmp_path_factory.mktemp("report-hostile")
    obj = torch.load(SAMPLES / "record_layer_outputs.pt", weights_only=True)
    shard = d / "rec<b onmouseover=alert(3)>.pt"
    torch.save({HOSTILE: obj["hidden_states"][1][0].clone(), "input_ids": obj["input_ids"].clone(),
                "comment": "<img src=x onerror=alert(2)>"}, shard)
    out = report.build_report(shard, SAMPLES / "capture.pt", d / "out" / "hostile.html", title=HOSTILE_TITLE,
                              engine="sglang", keep_notebook=True)
    return ReportRun(out.exit_code, out.verdict, out.html, out.notebook)


@pytest.fixture(scope="session")
def serving_run(tmp_path_factory: pytest.TempPathFactory) -> ReportRun:
    """The layer-outputs record with a SGLang draft config whose nested ids [3, 7, 10] are one layer off."""
    d = tmp_path_factory.mktemp("report-serving")
    draft = d / "draft<i>x"  # the path is shown in the Serving section: escaped
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 128, "num_hidden_layers": 1, "model_type": "llama",
        "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [3, 7, 10]}}))
    html = d / "out" / "serving.html"
    res = _cli([str(SAMPLES / "record_layer_outputs.pt"), str(SAMPLES / "capture.pt"), "-o", str(html),
                "--keep-notebook", "--engine", "sglang", "--draft-config", str(draft), "--engine-version", "0.5.12",
                "--model-type", "llama"])
    return ReportRun(res.exit_code, res.output, html, html.with_suffix(".ipynb"))


def _chromium(html: Path, *extra: str) -> str:
    """Open ``html`` in headless Chromium with networking off; return the DOM after scripts ran."""
    from . import browser

    return browser.run(html, *extra)


class TestNotebookRecords:
    """The executed notebook records the verdict and mapping (output metadata), and the CLI mirrors the exit code."""

    def test_layer_outputs(self, layout_run: ReportRun) -> None:
        s = layout_run.summary
        assert layout_run.exit_code == s["exit_code"] == 1 and s["level"] == "ACTION"  # ids must be written
        assert [m["position"] for m in s["mapping"]] == [3, 7, 10, 12]
        assert [m["post_norm"] for m in s["mapping"]] == [False, False, False, True]
        assert all(m["confident"] for m in s["mapping"])
        assert s["engine_ids"]["sglang"] == [2, 6, 9] and s["engine_ids"]["vllm"] == [3, 7, 10]
        assert s["parameters"]["shard"] == str(SAMPLES / "record_layer_outputs.pt")
        assert s["verdict"].startswith("ACTION: all 4 slots placed") and f"VERDICT: {s['verdict']}" in layout_run.output

    def test_wrong_fix(self, wrong_fix_run: ReportRun) -> None:
        s = wrong_fix_run.summary
        assert wrong_fix_run.exit_code == s["exit_code"] == 1
        assert [m["position"] for m in s["mapping"]] == [0, 2, 6, 12]
        codes = {f["code"]: f["severity"] for f in s["findings"]}
        assert codes["embedding-included"] == "error"
        assert "embedding" in s["verdict"] and s["engine_ids"]["trtllm"] is None

    def test_no_error_or_warning_output(self, layout_run: ReportRun) -> None:
        nb = nbformat.read(str(layout_run.notebook), as_version=4)
        outputs = [o for c in nb.cells if "ef-strict" not in c.metadata.get("tags", []) for o in c.get("outputs", [])]
        assert outputs and not [o for o in outputs if o.output_type in ("error", "stream")]
        strict = [c for c in nb.cells if "ef-strict" in c.metadata.get("tags", [])]
        assert len(strict) == 1 and strict[0].outputs[0].ename == "VerdictNotOK"  # report runs it strict
        assert "injected-parameters" in [t for c in nb.cells for t in c.metadata.get("tags", [])]


class TestHtml:
    """One self-contained page: plotly.js inline, nothing fetched from the web, the verdict, no code."""

    def test_self_contained(self, layout_run: ReportRun) -> None:
        text = layout_run.text
        assert "plotly.js v" in text and "window.Plotly" in text  # the bundle itself, inline
        assert not re.search(r"<script[^>]*\ssrc\s*=", text, re.I)
        assert not re.search(r"<(link|img|iframe)[^>]*\s(href|src)\s*=\s*[\"']?(https?:)?//", text, re.I)
        assert not re.search(r"@import\s+url\(\s*[\"']?https?://", text, re.I)
        assert text.count('class="plotly-graph-div"') == 6  # heatmap, profile, four per-token plots

    def test_verdict_and_no_code(self, layout_run: ReportRun) -> None:
        text = layout_run.text
        assert layout_run.summary["verdict"][len("ACTION: "):] in html.unescape(text)  # nbconvert re-serialises entities
        assert "validate_params(" not in text and "Parameters: edit here" not in text  # --no-input
        assert "hidden_states[3]" in text and "eagle_config.eagle_aux_hidden_state_layer_ids" in text

    def test_with_input_keeps_code_but_not_parameters(self, layout_run: ReportRun) -> None:
        nb = nbformat.read(str(layout_run.notebook), as_version=4)
        text = report.to_html(nb, with_input=True)
        assert "validate_params" in text
        assert "Parameters: edit here" not in text and "record_layer_outputs.pt&quot;" not in text
        assert not re.search(r"<script[^>]*\ssrc\s*=", text, re.I)

    def test_opens_offline_in_chromium(self, layout_run: ReportRun) -> None:
        dom = _chromium(layout_run.html, "--dump-dom")
        assert 'class="heatmaplayer' in dom and 'class="hm"' in dom  # the heatmap was drawn
        assert dom.count('class="plot-container plotly"') == 6
        assert dom.count('class="main-svg"') >= 12
        shot = layout_run.html.with_suffix(".png")  # for people to look at, next to the report
        _chromium(layout_run.html, "--window-size=1280,2600", f"--screenshot={shot}")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


class TestServing:
    """engine + draft_config: the notebook checks what the engine will serve and shows the fix, escaped."""

    def test_mismatch_and_fix_recorded(self, serving_run: ReportRun) -> None:
        s = serving_run.summary
        assert serving_run.exit_code == s["exit_code"] == 1
        serving = s["serving"]
        assert serving["status"] == "mismatch" and serving["match"] is False
        assert serving["ids_used"] == [3, 7, 10] and serving["key_read"] == "eagle_config.eagle_aux_hidden_state_layer_ids"
        assert serving["positions_served"] == ["p4", "p8", "p11"] and serving["positions_trained"] == ["p3", "p7", "p10"]
        assert serving["fix"]["ids"] == [2, 6, 9]
        assert serving["fix"]["snippet"] == {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}}
        assert s["parameters"]["engine_version"] == "0.5.12" and s["parameters"]["model_type"] == "llama"
        assert s["parameters"]["draft_config"].endswith("draft<i>x")

    def test_serving_section_in_html(self, serving_run: ReportRun) -> None:
        text = serving_run.text
        assert "<h2>Serving</h2>" in text and ">MISMATCH</b>" in text
        pre = re.findall(r"<pre class=[\"']ef-fix[\"'][^>]*>([^<]*)</pre>", text)
        assert [html.unescape(x) for x in pre] == ['{"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}}']
        assert "draft<i>x" not in text and "draft&lt;i&gt;x" in text

    def test_no_serving_section_without_engine(self, layout_run: ReportRun) -> None:
        assert layout_run.summary["serving"] is None and "<h2>Serving</h2>" not in layout_run.text


class TestEscaping:
    """Anything from the inputs (keys, metadata, file names, title) appears as text, never as markup."""

    def test_html_source(self, hostile_run: ReportRun) -> None:
        text = hostile_run.text
        s = hostile_run.summary
        assert s["mapping"][0]["name"] == HOSTILE and s["mapping"][0]["position"] == 7  # real data, placed
        for raw in (HOSTILE, "<img src=x onerror", "<b onmouseover", "alert(4)</script>"):
            assert raw not in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
        assert "&lt;img src=x onerror=alert(2)&gt;" in text
        # engine="sglang": the advice names the key SGLang reads and the id for p7
        assert "set eagle_config.eagle_aux_hidden_state_layer_ids = [6]" in text

    def test_dom_after_scripts_ran(self, hostile_run: ReportRun) -> None:
        dom = _chromium(hostile_run.html, "--dump-dom")
        assert "alert(1)</script>" not in dom and "<img src=\"x\"" not in dom and "<b onmouseover" not in dom
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom  # shown as text in tables and tick labels
        assert 'class="heatmaplayer' in dom


class TestParameters:
    """Bad parameters fail before any kernel starts, with one line that names the parameter or file."""

    def test_defaults_are_the_bundled_demo(self) -> None:
        p = report.validate_params()
        assert Path(p.shard) == SAMPLES / "record_layer_outputs.pt" and Path(p.capture) == SAMPLES / "capture.pt"

    @pytest.mark.parametrize("kwargs, message", [
        ({"shard": "missing.pt"}, "no such file or directory \\(parameter shard\\)"),
        ({"shard": 12}, "parameter shard must be a path"),
        ({"capture": None}, "parameter capture is required"),
        ({"max_tokens": "10"}, "max_tokens must be a whole number"),
        ({"max_tokens": 0}, "max_tokens must be a whole number"),
        ({"max_tokens": True}, "max_tokens must be a whole number"),
        ({"device": "mps"}, "parameter device must be one of auto, cpu, cuda"),
        ({"strict": "yes"}, "parameter strict must be True or False"),
        ({"device": 3}, "parameter device must be one of"),
        ({"engine": "tgi"}, "parameter engine must be one of"),
        ({"engine": "sglang-deepseek<0.5.13"}, "parameter engine must be one of vllm, sglang, trtllm or None"),
        ({"engine_version": "0.5.12"}, "parameter engine_version needs engine"),
        ({"model_type": "llama"}, "parameter model_type needs engine"),
        ({"draft_config": str(SAMPLES)}, "parameter draft_config needs engine"),
        ({"engine": "sglang", "draft_config": "missing/config.json"}, "no such file or directory \\(parameter draft"),
        ({"engine": "sglang", "draft_config": 7}, "parameter draft_config must be a path"),
        ({"engine": "sglang", "engine_version": "latest"}, "is not of the form X.Y.Z"),
        ({"engine": "sglang", "engine_version": ["0.5"]}, "parameter engine_version must be a string"),
        ({"engine": "sglang", "model_type": "gpt2"}, "unknown model_type 'gpt2'"),
        ({"capture_convention": "HF"}, "parameter capture_convention must be one of"),
        ({"title": ["x"]}, "parameter title must be a string"),
    ])
    def test_rejected(self, kwargs: dict[str, Any], message: str) -> None:
        args = {"shard": str(SAMPLES / "record_layer_outputs.pt"), "capture": str(SAMPLES / "capture.pt"), **kwargs}
        with pytest.raises(ForensicsError, match=message) as info:
            report.validate_params(**args)
        assert "\n" not in str(info.value)

    def test_directory_shard_and_empty_file(self, tmp_path: Path) -> None:
        with pytest.raises(ForensicsError, match="not a regular file"):
            report.validate_params(tmp_path, SAMPLES / "capture.pt")
        (tmp_path / "empty.pt").write_bytes(b"")
        with pytest.raises(ForensicsError, match="is empty"):
            report.validate_params(tmp_path / "empty.pt", SAMPLES / "capture.pt")

    def test_choices_follow_the_library(self) -> None:
        from eagleforensics.cli.report import ENGINES as CLI_ENGINES
        from eagleforensics.engines.rules import ENGINES

        assert report.CONVENTIONS == tuple(CAPTURE_CONVENTIONS)
        assert report.ENGINES == tuple(ENGINES) and set(CLI_ENGINES) == set(ENGINES)

    def test_serving_parameters_accepted(self) -> None:
        p = report.validate_params(SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture.pt", engine="vllm",
                                   draft_config=SAMPLES, engine_version=0.33, model_type="qwen3")
        assert (p.engine, p.draft_config, p.engine_version, p.model_type) == ("vllm", str(SAMPLES), "0.33", "qwen3")

    def test_cli_serving_option_without_engine_is_one_line_exit_2(self, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.chdir(tmp_path)
        res = CliRunner().invoke(report_cmd, [str(SAMPLES / "record_layer_outputs.pt"), str(SAMPLES / "capture.pt"),
                                              "--engine-version", "0.5.12"])
        assert res.exit_code == 2 and res.output.strip().count("\n") == 0
        assert "parameter engine_version needs engine" in res.output and not (tmp_path / "reports").exists()

    def test_cli_bad_input_is_one_line_exit_2(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.chdir(tmp_path)
        res = CliRunner().invoke(report_cmd, ["nope.pt", str(SAMPLES / "capture.pt")])
        assert res.exit_code == 2
        assert res.output.strip().count("\n") == 0 and "nope.pt: no such file" in res.output
        assert not (tmp_path / "reports").exists()

    def test_refuses_to_overwrite_an_input(self, tmp_path: Path) -> None:
        shard = tmp_path / "rec.html"
        shutil.copyfile(SAMPLES / "record_layer_outputs.pt", shard)
        with pytest.raises(ForensicsError, match="would overwrite an input"):
            report.build_report(shard, SAMPLES / "capture.pt", shard)

    def test_default_output_is_under_the_current_directory(self, tmp_path: Path) -> None:
        p = report.validate_params(SAMPLES / "record_wrong_fix.pt", SAMPLES / "capture.pt")
        assert report.default_output(p, tmp_path) == tmp_path / "reports" / "align-record_wrong_fix.html"


class TestKernelFailures:
    """Errors inside the kernel: bad file content is exit 2 in one line; a crash is exit 3 with the notebook kept."""

    def test_bad_content_found_in_the_kernel(self, tmp_path: Path) -> None:
        junk = tmp_path / "junk.pt"
        junk.write_bytes(b"not a tensor file")
        res = CliRunner().invoke(report_cmd, [str(junk), str(SAMPLES / "capture.pt"), "-o", str(tmp_path / "r.html")])
        assert res.exit_code == 2 and "junk.pt: unknown format" in res.output
        assert not (tmp_path / "r.html").exists()

    def test_crash_is_exit_3(self, tmp_path: Path) -> None:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("shard = capture = None"),
                                             nbformat.v4.new_code_cell("raise RuntimeError('boom')")])
        nb.cells[0].metadata["tags"] = ["parameters"]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, str(tmp_path / "crash.ipynb"))
        with pytest.raises(report.NotebookFailed, match="RuntimeError: boom") as info:
            report.build_report(SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture.pt", tmp_path / "r.html",
                                notebook=tmp_path / "crash.ipynb")
        assert info.value.exit_code == 3 and (tmp_path / "r.failed.ipynb").exists()


def test_kernel_is_this_interpreter() -> None:
    """The report's python3 kernel runs the interpreter running eagleforensics, whatever else is installed,
    isolated (``tests/test_untrusted_code.py`` runs one)."""
    km = report.kernel_manager_class()(kernel_name=report.KERNEL_NAME)
    assert km.kernel_spec.argv[:2] == [sys.executable, "-I"] and "ipykernel" in km.kernel_spec.argv[3]


def test_kernel_shutdown_sends_no_interrupt() -> None:
    """jupyter_client interrupts before every shutdown; ours does not (ipykernel logged it as an ERROR)."""
    import asyncio
    import signal

    async def go() -> list[int]:
        km = report.kernel_manager_class()(kernel_name=report.KERNEL_NAME)
        sent: list[int] = []
        original = km._async_signal_kernel

        async def record(signum: int) -> None:
            sent.append(signum)
            await original(signum)

        km._async_signal_kernel = record
        await km.start_kernel()
        try:
            await km.interrupt_kernel()  # an interrupt asked for while running still goes through
        finally:
            await km.shutdown_kernel()
        return sent

    assert asyncio.run(go()) == [signal.SIGINT]


def test_explore_notebook_runs_headless(tmp_path: Path) -> None:
    """explore.ipynb executes through papermill and its three output areas hold drawn figures."""
    out = tmp_path / "explore.ipynb"
    report.execute(report.find_notebook("explore.ipynb"), out, {}, cwd=tmp_path)
    nb = nbformat.read(str(out), as_version=4)
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    areas = [m["state"].get("outputs", []) for m in state.values() if m["model_name"] == "OutputModel"]
    assert len(areas) == 3
    assert all(any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in a) for a in areas)


@pytest.fixture(scope="session")
def ok_run(tmp_path_factory: pytest.TempPathFactory) -> ReportRun:
    """SpecForge data_0.ckpt holds the engines' default layers: served as trained, verdict OK."""
    return _cli_run(tmp_path_factory.mktemp("report-ok"), "data_0.ckpt")


LEVELS = {"OK": ("ok_run", 0), "ACTION": ("layout_run", 1), "PROBLEM": ("wrong_fix_run", 1)}


class TestVerdictAtTheTop:
    """Each level's page shows its verdict (and for ACTION the ids per engine) in the first 900 px."""

    @pytest.mark.parametrize("level", list(LEVELS))
    def test_level_exit_and_screenshot(self, level: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        from . import browser
        from eagleforensics.report.nbview import LEVEL_COLOUR

        fixture, code = LEVELS[level]
        run: ReportRun = request.getfixturevalue(fixture)
        assert run.exit_code == code and run.summary["level"] == level
        assert run.output.startswith(f"VERDICT: {level}: ")
        seen = browser.probe(run.html, tmp_path)
        assert seen["verdict"] == f"Verdict: {level}" and 0 < seen["verdict_bottom"] < 900
        shot = browser.screenshot(run.html, run.html.with_suffix(".png"))  # kept next to the report for people
        assert browser.colour_bar_height(shot, LEVEL_COLOUR[level]) >= 60  # the verdict's level bar is on screen
        others = [c for lv, c in LEVEL_COLOUR.items() if lv != level]
        assert all(browser.colour_bar_height(shot, c) < 60 for c in others)
        if level == "ACTION":
            snippets = dict(seen["snippets"])
            sglang = '{"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}}'
            assert snippets[sglang] < 900 and snippets['{"eagle_aux_hidden_state_layer_ids": [3, 7, 10]}'] < 900
            assert "speculative_config:\n  eagle3_layers_to_capture: [2, 6, 9]" in snippets
            assert run.text.count('class="ef-copy"') == len(seen["snippets"]) == 3  # vllm, sglang, trtllm
            first = seen["snippets"][0][0]
            assert seen["copy_button"] == "copied" and seen["clipboard"] == first  # the clipboard got the snippet
            refused = browser.probe(run.html, tmp_path, clipboard="reject")
            # the clipboard refused: the page selects the snippet for a manual copy and still says so
            assert refused["clipboard"] == first and refused["selection"] == first
            assert refused["copy_button"] == "copied"
        if level == "PROBLEM":
            assert "embedding" in run.summary["verdict"] and "What to do" in run.text
        if level == "OK":
            assert not seen["snippets"] and run.summary["actions"] == []

    def test_findings_sorted_under_the_verdict(self, wrong_fix_run: ReportRun) -> None:
        text = wrong_fix_run.text
        block = text[text.index('class="ef-verdict'):text.index("</details>")]
        sev = re.findall(r'<b style="color:#[0-9a-f]{6}">(error|warning|info)</b>', block)
        assert sev and sev == sorted(sev, key=["error", "warning", "info"].index)
        assert "## Findings" not in text and "<h2 id=\"Findings\"" not in text  # no second list at the bottom


class TestNoNetwork:
    """Chromium's net log: the pages ask for nothing (plotly.js inline, no CDN require.js or MathJax)."""

    def test_recorder_sees_requests(self, layout_run: ReportRun, tmp_path: Path) -> None:
        """The control: nbconvert's stock HTML of the same notebook asks a CDN for require.js and MathJax."""
        from . import browser

        subprocess.run([sys.executable, "-m", "nbconvert", "--to", "html", str(layout_run.notebook),
                        "--output-dir", str(tmp_path), "--output", "stock"], check=True, capture_output=True,
                       timeout=120)
        urls = browser.page_requests(tmp_path / "stock.html")
        assert any("require" in u for u in urls) and any("mathjax" in u.lower() for u in urls)

    @pytest.mark.parametrize("fixture", ["layout_run", "wrong_fix_run", "ok_run", "serving_run"])
    def test_align_reports(self, fixture: str, request: pytest.FixtureRequest) -> None:
        from . import browser

        assert browser.page_requests(request.getfixturevalue(fixture).html) == []

    def test_nbconvert_route(self, layout_run: ReportRun, tmp_path: Path) -> None:
        """`jupyter nbconvert --to eagleforensics` (or the class name) on an executed notebook: no requests."""
        from . import browser

        done = subprocess.run([sys.executable, "-m", "nbconvert", "--to",
                               "eagleforensics.report.exporter.OfflineHTMLExporter", str(layout_run.notebook),
                               "--output-dir", str(tmp_path), "--output", "ours"], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        page = tmp_path / "ours.html"
        assert "validate_params" in page.read_text(encoding="utf-8")  # the code is there, as nbconvert keeps it
        assert browser.page_requests(page) == []

    def test_scan_report(self, tmp_path: Path) -> None:
        from . import browser
        from eagleforensics.report.plots_scan import SUMMARY_SCHEMA as SCAN_SCHEMA
        from eagleforensics.testing import scandata

        data = scandata.make_dataset(tmp_path / "data", 24)
        out = report.render(report.find_notebook("scan.ipynb"),
                            {"dataset": str(data.root), "reference": str(data.reference), "workers": 1},
                            tmp_path / "scan.html", schema=SCAN_SCHEMA, heading="scan",
                            roles=[("dataset", str(data.root)), ("reference", str(data.reference))])
        assert out.summary["overview"]["records"] >= 24
        assert browser.page_requests(out.html) == []
        assert "<table class=\"dataframe ef-table\">" in out.html.read_text(encoding="utf-8")


class TestProvenance:
    """A shared page says which files (size, hash), which versions and which command; the result reads back."""

    def test_embedded_result_reads_back(self, layout_run: ReportRun) -> None:
        from eagleforensics.report.provenance import HASH_NAME, file_hash, read_report

        doc = read_report(layout_run.html)
        assert doc["summary"]["level"] == "ACTION" and doc["summary"]["mapping"][0]["position"] == 3
        prov = doc["provenance"]
        assert prov["versions"]["eagleforensics"] and prov["versions"]["torch"].startswith(torch.__version__[:4])
        shard = SAMPLES / "record_layer_outputs.pt"
        rec = {i["role"]: i for i in prov["inputs"]}["training record"]
        assert rec["hash"] == f"{HASH_NAME}:{file_hash(shard)}" and rec["bytes"] == shard.stat().st_size
        assert prov["command"].startswith("eagleforensics report ") and "--keep-notebook" in prov["command"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", prov["created"])

    def test_no_absolute_paths_and_redaction(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Paths relative to the working directory; --redact-paths keeps names only; --no-hash skips hashing."""
        from eagleforensics.report.provenance import read_report

        monkeypatch.chdir(ROOT)
        out = tmp_path / "r.html"
        res = _cli([str(SAMPLES / "data_0.ckpt"), str(SAMPLES / "capture.pt"), "-o", str(out), "--redact-paths",
                    "--no-hash"])
        assert res.exit_code == 0, res.output
        text = out.read_text(encoding="utf-8")
        assert str(ROOT) not in text and str(tmp_path) not in text
        doc = read_report(out)
        assert [i["path"] for i in doc["provenance"]["inputs"]] == ["data_0.ckpt", "capture.pt"]
        assert all(i["hash"] is None for i in doc["provenance"]["inputs"])
        assert doc["summary"]["parameters"]["shard"] == "data_0.ckpt"
        res = _cli(["data_samples/data_0.ckpt", "data_samples/capture.pt", "-o", str(out)])
        doc = read_report(out)
        assert doc["provenance"]["inputs"][0]["path"] == "data_samples/data_0.ckpt"
        assert str(ROOT) not in out.read_text(encoding="utf-8")

    def test_embedding_cannot_close_the_script(self, tmp_path: Path) -> None:
        from eagleforensics.report.provenance import insert_embedded, read_report

        page = tmp_path / "p.html"
        hostile = {"verdict": "</script><script>alert(1)</script> & <!--"}
        page.write_text(insert_embedded("<html><body><p>x</p></body></html>", {"summary": hostile}))
        text = page.read_text()
        assert "alert(1)</script>" not in text and text.count("</script>") == 1
        assert read_report(page)["summary"] == hostile

    def test_reader_refuses_a_page_without_a_result(self, tmp_path: Path) -> None:
        from eagleforensics.report.provenance import read_report

        (tmp_path / "x.html").write_text("<html></html>")
        with pytest.raises(ForensicsError, match="holds no embedded eagleforensics result"):
            read_report(tmp_path / "x.html")


class TestStrict:
    """strict: off in JupyterLab (the notebook's default), on in `report`; papermill then fails on a verdict not OK."""

    def test_papermill_exits_non_zero_with_the_verdict_line(self, tmp_path: Path) -> None:
        args = [sys.executable, "-m", "papermill", str(ROOT / "notebooks" / "align.ipynb"), str(tmp_path / "o.ipynb"),
                "-p", "shard", str(SAMPLES / "record_wrong_fix.pt"), "-p", "capture", str(SAMPLES / "capture.pt"),
                "-k", "python3", "--no-progress-bar", "--execution-timeout", str(NOTEBOOK_CELL_TIMEOUT)]
        # the two runs at once (each kernel keeps one core busy): the suite's wall time, not what is checked
        with tempfile.TemporaryFile("w+") as e1, tempfile.TemporaryFile("w+") as e2:
            procs = [subprocess.Popen(a, stdout=subprocess.DEVNULL, stderr=e, text=True)
                     for a, e in ((args, e1), ([*args[:4], str(tmp_path / "s.ipynb"), *args[5:], "-p", "strict", "True"],
                                               e2))]
            try:
                codes = [p.wait(timeout=300) for p in procs]
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait(timeout=10)
            e1.seek(0)
            e2.seek(0)
            loose = subprocess.CompletedProcess(args, codes[0], "", e1.read())
            strict = subprocess.CompletedProcess(args, codes[1], "", e2.read())
        assert loose.returncode == 0, loose.stderr[-2000:]  # strict off: the notebook runs through
        assert strict.returncode != 0 and "VerdictNotOK: PROBLEM: miswired" in strict.stderr
        for done in (loose, strict):
            # plain papermill keeps jupyter_client's SIGINT before the kernel's shutdown: landing while the kernel
            # handles a message it logs this one line (seen under load). The report's own kernel manager sends
            # none (test_kernel_shutdown_sends_no_interrupt); anything else is an interrupt inside a cell.
            err = "\n".join(line for line in done.stderr.splitlines()
                            if not line.rstrip().endswith("[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel."))
            assert "KeyboardInterrupt" not in err and "[IPKernelApp] ERROR" not in err

    def test_strict_is_on_in_report_and_off_by_default(self, layout_run: ReportRun) -> None:
        nb = nbformat.read(str(ROOT / "notebooks" / "align.ipynb"), as_version=4)
        assert "strict = False" in nb.cells[0].source
        assert "nbview.strict_check(result, strict)" in nb.cells[-1].source and "ef-strict" in nb.cells[-1].metadata.tags
        assert layout_run.summary["parameters"]["strict"] is True
        assert "VerdictNotOK" not in layout_run.text and "papermill-error" not in layout_run.text


class TestTables:
    """Tables for people: no index column, '-' for missing, wrapped text, sensible precision, sortable headers."""

    def test_mapping_table(self, wrong_fix_run: ReportRun) -> None:
        text = wrong_fix_run.text
        tables = re.findall(r'<table class="dataframe ef-table">.*?</table>', text, re.S)
        assert len(tables) >= 3  # mapping, engine ids, first values
        for t in tables:
            assert ">None<" not in t and ">NaN<" not in t and ">nan<" not in t and "..." not in t
            assert "<th></th>" not in t  # no index column
            assert 'onclick="efSort(this)"' in t
        engines = next(t for t in tables if "none works" in t)
        assert "the embedding output (p=0) cannot be captured" in engines  # notes shown whole
        assert re.search(r"<td>1\.0000</td>", tables[0]) and "<td>-</td>" in tables[0]


def test_report_device_reaches_the_scoring(monkeypatch: pytest.MonkeyPatch) -> None:
    """report --device / the device parameter is handed to align() as align --device is (no CPU-only fallback)."""
    import eagleforensics.alignment as alignment

    seen: dict[str, Any] = {}

    def fake_align(*_a: Any, **kw: Any) -> str:
        seen.update(kw)
        return "result"

    monkeypatch.setattr(alignment, "align", fake_align)
    for device in ("cuda", "cuda:1", "cpu", "auto"):
        params = report.validate_params(SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture.pt", device=device)
        assert report.run_alignment(params)[0] == "result" and seen["device"] == device
    res = _cli([str(SAMPLES / "record_layer_outputs.pt"), str(SAMPLES / "capture.pt"), "--device", "tpu"])
    assert res.exit_code == 2 and "'tpu' is not one of" in res.output
