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
from eagleforensics.io.safeload import load_object

from .reportrun import ReportRun

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data_samples"
HOSTILE = "<script>alert(1)</script>"
HOSTILE_TITLE = "</title><script>alert(4)</script>"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                  # networking off: every host name fails to resolve, and any proxied request goes nowhere
                  '--host-resolver-rules=MAP * ~NOTFOUND', "--proxy-server=http://127.0.0.1:9",
                  "--proxy-bypass-list=<-loopback>", "--virtual-time-budget=15000"]


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
    obj = load_object(SAMPLES / "record_layer_outputs.pt")
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
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="ef-chromium-") as profile:
        done = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, html.as_uri()],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


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
        assert "embedding" in s["verdict"] and s["engine_ids"]["sglang"] is None

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
        assert html.escape(layout_run.summary["verdict"][len("ACTION: "):]) in text
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
    """The report's python3 kernel runs the interpreter running eagleforensics, whatever else is installed."""
    km = report.kernel_manager_class()(kernel_name=report.KERNEL_NAME)
    assert km.kernel_spec.argv[0] == sys.executable and "ipykernel_launcher" in km.kernel_spec.argv


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
