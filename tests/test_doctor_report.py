"""``doctor --report OUT.html``: doctor.ipynb through papermill -> nbconvert, one row per check, everything escaped.

One notebook run on a planted RoPE defect whose rope type is HTML (it reaches a finding's message)
and whose directory name is HTML (it reaches the header); the align report's Doctor section is
checked on the rendered align notebook of ``test_report`` through the library call it makes.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.cli import main
from eagleforensics.report import doctorreport
from eagleforensics.report.provenance import read_report
from eagleforensics.testing.defects import SAMPLES, edit_config

HOSTILE = "<img src=x onerror=alert(7)>"


@pytest.fixture(scope="session")
def hostile_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    import shutil

    root = tmp_path_factory.mktemp("doctor-report")
    drafter = root / "drafter<b onmouseover=alert(8)>"
    shutil.copytree(SAMPLES / "drafter", drafter)
    edit_config(drafter, rope_scaling={"rope_type": HOSTILE, "factor": 2.0})
    return drafter, root


@pytest.fixture(scope="session")
def hostile_run(hostile_case: tuple[Path, Path]):  # noqa: ANN201
    drafter, root = hostile_case
    out = root / "out" / "doctor.html"
    res = CliRunner().invoke(main, ["doctor", "--drafter", str(drafter), "--target", str(SAMPLES / "target"),
                                    "--report", str(out), "--title", "</title><script>alert(9)</script>"])
    return res, out


def test_report_exit_code_verdict_and_rows(hostile_run) -> None:  # noqa: ANN001
    res, out = hostile_run
    assert res.exit_code == 1, res.output
    assert res.output.startswith("VERDICT: ACTION: 1 likely cause of low acceptance: rope-mismatch")
    assert f"report: {out}" in res.output
    summary = read_report(out)["summary"]
    assert summary["schema"] == "eagleforensics-doctor-v1" and summary["exit_code"] == 1
    assert [f["code"] for f in summary["findings"] if f["severity"] in ("error", "warning")] == ["rope-mismatch"]
    tables = re.findall(r"<table[^>]*ef-table[^>]*>(.*?)</table>", out.read_text(), re.S)
    assert len(tables) == 2, "no causes table and checks table in the page"

    def body(table: str) -> list[list[str]]:
        rows = [[html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row,
                                                                                        re.S)]
                for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)]
        return [r for r in rows if r]
    # the causes table: the same causes, severity and cost label as the JSON the page records
    assert [c[:3] for c in body(tables[0])] == [[c["key"], c["severity"], c["impact"]] for c in summary["causes"]]
    cells = body(tables[1])
    assert cells[0][:2] == ["rope", "found"]  # the most severe row first
    tiers = [{"found": 0, "clean": 1, "not run": 2}[c[1]] for c in cells]
    assert tiers == sorted(tiers) and len(cells) == len(summary["checks"])


def test_everything_from_the_inputs_is_escaped(hostile_run) -> None:  # noqa: ANN001
    _, out = hostile_run
    text = out.read_text()
    assert "onerror=alert(7)" in html.unescape(text)  # the rope type is shown...
    assert HOSTILE not in text and "<b onmouseover" not in text and "<script>alert(9)" not in text  # ...escaped


def test_json_with_report_prints_the_doctor_object(hostile_case: tuple[Path, Path], tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["doctor", "--target", str(SAMPLES / "target"), "--draft-config",
                                    str(SAMPLES / "drafter" / "config.json"), "--report", str(tmp_path / "r.html"),
                                    "--json"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.output)
    assert obj["verdict"].startswith("OK:") and {c["name"] for c in obj["checks"]} >= {"rope", "max-positions"}


def test_bad_input_stops_before_the_kernel(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["doctor", "--drafter", str(SAMPLES / "capture.pt"), "--report",
                                    str(tmp_path / "r.html")])
    assert res.exit_code == 2 and "expects a directory" in res.output and not (tmp_path / "r.html").exists()


def test_checks_table_is_most_severe_first_and_says_why_not_run() -> None:
    from eagleforensics.doctor import diagnose

    report = diagnose(DoctorInputs(train=str(SAMPLES / "record_wrong_fix.pt"), capture=str(SAMPLES / "capture.pt"),
                                   drafter=str(SAMPLES / "drafter")))
    df = doctorreport.checks_table(report)
    assert df["status"].tolist()[0] == "found" and df["check"].tolist()[0] == "wiring"
    assert df["severity"].tolist()[0] == "error"
    not_run = df[df["status"] == "not run"]
    needs = dict(zip(not_run["check"], not_run["what"]))
    assert "--log" in needs.pop("launch") and "--train DIR" in needs.pop("data-size")  # one record file: no dataset
    for name in ("sampling-penalty", "lora-target", "dp-attention", "benchmark-prompts",  # the serving side
                 "drafter-cache", "spec-off", "batch-dependence", "depth", "cumulative-average", "ar-fusion"):
        what = needs.pop(name)
        assert "--log" in what or "--served-prompts" in what
    assert needs and all("--target" in w or "--engine" in w for w in needs.values())
    tiers = [{"found": 0, "clean": 1, "not run": 2}[s] for s in df["status"]]
    assert tiers == sorted(tiers)


def test_the_align_reports_doctor_section_reuses_the_alignment() -> None:
    from eagleforensics.alignment import align
    from eagleforensics.report import pipeline

    params = pipeline.validate_params(str(SAMPLES / "record_layer_outputs.pt"), str(SAMPLES / "capture.pt"),
                                      drafter=str(SAMPLES / "drafter"), target=str(SAMPLES / "target"))
    result = align(params.shard, params.capture)
    report = doctorreport.align_doctor(params, result)
    assert report.align == result.to_dict()
    assert {o.name: o.status for o in report.outcomes}["sizes"] == "clean"
