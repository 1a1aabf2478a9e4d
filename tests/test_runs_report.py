"""The runs report: runs.ipynb through ``eagleforensics logs ... --report``, its recorded summary, its offline HTML.

One papermill run (session fixture, a few seconds) on the three SGLang fixture logs with a
baseline and a hostile title; every expected number is recomputed here from the fixture
lines with its own regex, not taken from ``eagleforensics.engines.logs``.
"""
from __future__ import annotations

import html
import re
from pathlib import Path
from statistics import median
from typing import Any

import nbformat
import pytest
from click.testing import CliRunner

from eagleforensics.report import nbview

from eagleforensics.report import pipeline as report

from eagleforensics.report import runs as runs_report
from eagleforensics.cli.logs import logs as logs_cmd
from eagleforensics.errors import ForensicsError

FIX = Path(__file__).parent / "fixtures" / "logs"
LOGS = {"baseline": FIX / "sglang_0.4_baseline.log", "broken": FIX / "sglang_0.5.5_broken.log",
        "fixed": FIX / "sglang_0.5.23_fixed.log"}
TITLE = "</title><script>alert(5)</script> runs"
_FIELD = {"len": r"accept len: ([0-9.]+)", "rate": r"accept rate: ([0-9.]+)",
          "tok_s": r"gen throughput \(token/s\): ([0-9.]+)"}

from .reportrun import ReportRun


def _medians(path: Path) -> dict[str, float | None]:
    """Median of each field over the log's 'Decode batch' lines (all fixtures have running requests)."""
    rows = [line for line in path.read_text().splitlines() if "Decode batch" in line and not line.startswith("#")]
    out: dict[str, float | None] = {}
    for key, pattern in _FIELD.items():
        values = [float(m.group(1)) for m in (re.search(pattern, r) for r in rows) if m]
        out[key] = median(values) if values else None
    out["n"] = len(rows)
    return out


EXPECTED = {label: _medians(path) for label, path in LOGS.items()}


def _args() -> list[str]:
    return [f"{label}={path}" for label, path in LOGS.items()] + ["--baseline", "baseline"]


@pytest.fixture(scope="session")
def runs_run(tmp_path_factory: pytest.TempPathFactory) -> ReportRun:
    out = tmp_path_factory.mktemp("runs-report") / "runs.html"
    res = CliRunner().invoke(logs_cmd, _args() + ["--report", str(out), "--keep-notebook", "--title", TITLE],
                             catch_exceptions=False)
    return ReportRun(res.exit_code, res.output, out, out.with_suffix(".ipynb"), runs_report.RUNS_SCHEMA)


class TestRecordedSummary:
    """The notebook records each run's medians and speed-up, and a verdict that names them."""

    def test_medians_and_speedups(self, runs_run: ReportRun) -> None:
        assert runs_run.exit_code == 0, runs_run.output
        s = runs_run.summary
        assert s["baseline"] == "baseline" and s["exit_code"] == 0
        assert [r["run"] for r in s["runs"]] == list(LOGS)
        base = EXPECTED["baseline"]["tok_s"]
        for r in s["runs"]:
            want = EXPECTED[r["run"]]
            assert r["n_lines"] == want["n"] and r["path"] == str(LOGS[r["run"]])
            assert r["median_accept_length"] == (None if want["len"] is None else pytest.approx(want["len"]))
            assert r["median_accept_rate"] == (None if want["rate"] is None else pytest.approx(want["rate"]))
            assert r["median_tok_s"] == pytest.approx(want["tok_s"])
            assert r["speedup"] == pytest.approx(want["tok_s"] / base)
        assert s["runs"][0]["median_accept_length"] is None  # no speculation, no accept length

    def test_verdict_sentence(self, runs_run: ReportRun) -> None:
        v = runs_run.summary["verdict"]
        fixed, broken, base = EXPECTED["fixed"], EXPECTED["broken"], EXPECTED["baseline"]["tok_s"]
        assert v.startswith(f"fixed: accept length {fixed['len']:.2f}, {fixed['tok_s']:.1f} tok/s, "
                            f"{fixed['tok_s'] / base:.2f}x the baseline; broken: ")
        assert f"{broken['tok_s'] / base:.2f}x the baseline (slower)" in v
        assert v.endswith(f"baseline: {base:.1f} tok/s.")
        assert f"VERDICT: {v}" in runs_run.output and f"report: {runs_run.html}" in runs_run.output

    def test_cli_prints_the_table_too(self, runs_run: ReportRun) -> None:
        lines = runs_run.output.splitlines()
        assert lines[0].split()[:3] == ["run", "engine", "n_lines"] and lines[3].split()[0] == "fixed"

    def test_other_schema_is_not_found(self, runs_run: ReportRun) -> None:
        with pytest.raises(report.NotebookFailed, match="no summary of schema"):
            report.read_summary(runs_run.notebook)  # the align schema

    def test_parameters_cell_and_no_errors(self, runs_run: ReportRun) -> None:
        nb = nbformat.read(str(runs_run.notebook), as_version=4)
        assert nb.metadata["papermill"]["parameters"]["logs"] == {k: str(v) for k, v in LOGS.items()}
        outputs = [o for c in nb.cells for o in c.get("outputs", [])]
        assert outputs and not [o for o in outputs if o.output_type in ("error", "stream")]


class TestHtml:
    """One offline page: the three runs, their speed-ups, two plotly figures with plotly.js inline, escaped title."""

    def test_runs_and_speedups_shown(self, runs_run: ReportRun) -> None:
        text = runs_run.text
        base = EXPECTED["baseline"]["tok_s"]
        for label in LOGS:
            assert f"<td>{label}</td>" in text  # a row of the summary table (no index column: run is a cell)
        for label in ("broken", "fixed"):
            assert f"{EXPECTED[label]['tok_s'] / base:.2f}x" in text
        assert html.escape(runs_run.summary["verdict"], quote=False) in text
        assert "0.5.11" in text  # SGLang's accept-rate definition change is explained

    def test_self_contained(self, runs_run: ReportRun) -> None:
        text = runs_run.text
        assert "plotly.js v" in text and "window.Plotly" in text
        assert not re.search(r"<script[^>]*\ssrc\s*=", text, re.I)
        assert not re.search(r"<(link|img|iframe)[^>]*\s(href|src)\s*=\s*[\"']?(https?:)?//", text, re.I)
        assert text.count('class="plotly-graph-div"') == 2
        assert "validate_params(" not in text  # outputs only

    def test_title_escaped(self, runs_run: ReportRun) -> None:
        text = runs_run.text
        assert "alert(5)</script>" not in text and "&lt;/title&gt;&lt;script&gt;alert(5)" in text


class TestParameters:
    """Bad parameters fail before any kernel starts, in one line naming the parameter or file."""

    def test_string_form_and_order(self) -> None:
        p = runs_report.validate_params(f"fixed={LOGS['fixed']}, broken={LOGS['broken']}", "broken")
        assert list(p.logs) == ["fixed", "broken"] and p.logs["fixed"] == str(LOGS["fixed"].resolve())
        assert p.heading == "Runs: fixed, broken"

    def test_default_is_the_demo(self) -> None:
        p = runs_report.validate_params()
        assert p.logs == {k: str(v.resolve()) for k, v in LOGS.items()} and p.baseline == "baseline"

    @pytest.mark.parametrize("kwargs, message", [
        ({"logs": 12}, "parameter logs must be a dict"),
        ({"logs": {}}, "names no run"),
        ({"logs": "fixed"}, "fixed: no such file or directory"),  # a bare path, labelled by its name
        ({"logs": "=fixed"}, "expected LABEL=PATH or PATH"),
        ({"logs": {"fixed": "/no/such.log"}}, "no such file or directory"),
        ({"logs": {"fixed": str(FIX)}}, "not a regular file"),
        ({"logs": {"": str(LOGS["fixed"])}}, "labels must be non-empty"),
        ({"baseline": "nope"}, "parameter baseline 'nope' is not one of the run labels: fixed"),
        ({"title": 3}, "parameter title must be a string"),
    ])
    def test_rejected(self, kwargs: dict[str, Any], message: str) -> None:
        args = {"logs": {"fixed": str(LOGS["fixed"])}, **kwargs}
        with pytest.raises(ForensicsError, match=re.escape(message)) as info:
            runs_report.validate_params(**args)
        assert "\n" not in str(info.value)

    @pytest.mark.parametrize("extra, needle", [
        (["broken=/no/such.log"], "/no/such.log"),
        (["--baseline", "b"], "--baseline 'b'"),
        (["--report", "runs.txt"], "--report expects an .html file name"),
    ])
    def test_cli_bad_input_exit_2_one_line(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           extra: list[str], needle: str) -> None:
        monkeypatch.chdir(tmp_path)
        args = [f"fixed={LOGS['fixed']}", *extra] + ([] if "--report" in extra else ["--report", "r.html"])
        res = CliRunner().invoke(logs_cmd, args)
        assert res.exit_code == 2
        out = res.output.strip().splitlines()
        assert len(out) == 1 and out[0].startswith("eagleforensics: error: ") and needle in out[0]
        assert list(tmp_path.iterdir()) == []  # nothing written, no reports/ folder

    def test_log_without_data_is_exit_2_from_the_kernel(self, tmp_path: Path) -> None:
        empty = tmp_path / "client.log"
        empty.write_text("Accept length: 3.20\n")
        with pytest.raises(ForensicsError, match="no SGLang 'Decode batch'") as info:
            runs_report.build_runs_report({"client": str(empty)}, tmp_path / "out" / "r.html")
        assert info.value.exit_code == 2 and str(empty) in str(info.value)
        assert not (tmp_path / "out" / "r.html").exists()

    def test_refuses_to_overwrite_a_log(self, tmp_path: Path) -> None:
        log = tmp_path / "fixed.html"
        log.write_text(LOGS["fixed"].read_text())
        with pytest.raises(ForensicsError, match="would overwrite an input"):
            runs_report.build_runs_report({"fixed": str(log)}, log)

    def test_default_output_is_under_the_current_directory(self, tmp_path: Path) -> None:
        p = runs_report.validate_params({"fix ed": str(LOGS["fixed"]), "../b": str(LOGS["broken"])})
        assert runs_report.default_output(p, tmp_path) == tmp_path / "reports" / "runs-fix_ed-.._b.html"


def test_labels_and_paths_are_escaped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A label or log name holding markup is shown as text in the header, the verdict and the table."""
    hostile = "<img src=x onerror=alert(6)>"
    log = tmp_path / "<b>fixed<i>.log"
    log.write_text(LOGS["fixed"].read_text())
    shown: list[dict[str, Any]] = []
    monkeypatch.setattr(nbview, "_display", lambda data, metadata=None: shown.append(data))
    params = runs_report.validate_params({hostile: str(log), "baseline": str(LOGS["baseline"])}, "baseline")
    summary = runs_report.summarize(runs_report.load_runs(params), params)
    nbview.runs_header(params)
    nbview.runs_verdict(summary, params)
    markup = "".join(d["text/html"] for d in shown) + runs_report.display_table(summary).to_html()
    assert hostile not in markup and "<b>fixed" not in markup
    assert html.escape(hostile) in markup and "&lt;b&gt;fixed&lt;i&gt;.log" in markup


def test_runs_page_makes_no_network_request(runs_run: ReportRun) -> None:
    """Chromium's net log of the runs page: nothing requested (plotly.js inline, no CDN script)."""
    from . import browser

    assert browser.page_requests(runs_run.html) == []


def test_runs_page_embeds_its_summary_and_provenance(runs_run: ReportRun) -> None:
    from eagleforensics.report.provenance import read_report

    doc = read_report(runs_run.html)
    assert doc["summary"]["baseline"] == "baseline"
    assert {i["role"] for i in doc["provenance"]["inputs"]} == {f"log {label}" for label in LOGS}
    assert all(i["hash"].startswith("blake2b-128:") for i in doc["provenance"]["inputs"])
