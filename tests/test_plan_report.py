"""The plan report: notebooks/plan.ipynb through ``eagleforensics plan ... --report``, one offline HTML page.

One papermill run (session fixture) on the README's incident after NCCL tuning, with a hostile title:
the page records the same plan as the command's JSON, draws the predicted curve with the measured runs
on it, escapes what the command line controls, and asks the network for nothing.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eagleforensics.cli.plan import plan as plan_cmd
from eagleforensics.errors import ForensicsError
from eagleforensics.report import plan as plan_report
from eagleforensics.report.provenance import read_report

INCIDENT = Path(__file__).resolve().parents[1] / "data_samples" / "incident"
TITLE = "</title><script>alert(7)</script> plan"
ARGS = [f"{n}={INCIDENT / (n + '.log')}" for n in ("baseline", "tuned", "tuned_3steps")] + \
    ["--served", "tuned", "--replay", str(INCIDENT / "replay_fixed.json")]


@pytest.fixture(scope="session")
def plan_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    out = tmp_path_factory.mktemp("plan-report") / "plan.html"
    res = CliRunner().invoke(plan_cmd, ARGS + ["--report", str(out), "--title", TITLE], catch_exceptions=False)
    return res.exit_code, res.output, out


def test_page_records_the_same_plan_as_the_json(plan_page: tuple[int, str, Path]) -> None:
    code, output, page = plan_page
    assert code == 1 and f"report: {page}" in output
    summary = read_report(page)["summary"]
    cli = json.loads(CliRunner().invoke(plan_cmd, ARGS + ["--json"]).output)
    assert summary["schema"] == "eagleforensics-plan-v1" and summary["verdict"] == cli["verdict"]
    assert summary["best"]["steps"] == cli["best"]["steps"] == 2
    assert summary["predictions"] == cli["predictions"]
    assert summary["parameters"]["served"] == "tuned"


def test_page_draws_the_curve_with_the_measured_runs(plan_page: tuple[int, str, Path]) -> None:
    text = plan_page[2].read_text(encoding="utf-8")
    assert "Predicted tok/s per step count" in text and "Cost of one round" in text
    assert "measured runs" in text and "tuned_3steps" in text
    assert TITLE not in text and "&lt;/title&gt;&lt;script&gt;alert(7)" in text


def test_page_asks_the_network_for_nothing(plan_page: tuple[int, str, Path]) -> None:
    from . import browser

    assert browser.page_requests(plan_page[2]) == []


@pytest.mark.parametrize("kwargs, message", [
    ({"logs": {"a": "nonexistent.log"}}, "no such file"),
    ({"logs": None, "verify_share": 1.5}, "verify_share"),
    ({"logs": None, "served": "nope"}, "parameter served 'nope'"),
    ({"logs": None, "launch": {"tuned": "x"}}, "STEPS[,TOPK[,DRAFT_TOKENS]]"),
])
def test_parameters_are_checked_before_the_kernel(kwargs: dict, message: str) -> None:
    with pytest.raises(ForensicsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan_report.validate_params(**kwargs)


def test_defaults_are_the_incident_after_tuning() -> None:
    params = plan_report.validate_params()
    assert list(params.logs) == ["baseline", "tuned", "tuned_3steps"] and params.served == "tuned"
    assert params.replay is not None and params.replay.endswith("replay_fixed.json")
