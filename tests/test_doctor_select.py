"""``doctor --skip CHECK`` / ``--only CHECK``: documented names, unknown ones refused in one line, skipped rows said."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.checks.registry import all_checks
from eagleforensics.cli import main
from eagleforensics.doctor import diagnose
from eagleforensics.errors import ForensicsError

SAMPLES = Path(__file__).resolve().parents[1] / "data_samples"
FULL = dict(drafter=str(SAMPLES / "drafter"), target=str(SAMPLES / "target"),
            train=str(SAMPLES / "record_layer_outputs.pt"), capture=str(SAMPLES / "capture.pt"))


def _rows(report) -> dict:
    return {o.name: o for o in report.outcomes}


def test_skip_leaves_the_named_rows_out_and_keeps_the_others_answers() -> None:
    full = _rows(diagnose(DoctorInputs(**FULL)))
    part = diagnose(DoctorInputs(**FULL, skip=("replay", "data-origin")))
    rows = _rows(part)
    assert rows["replay"].status == "not-run" and rows["replay"].reason == "skipped (--skip replay)"
    assert rows["data-origin"].status == "not-run" and "--skip data-origin" in rows["data-origin"].reason
    assert part.replay is None
    for name in ("sizes", "vocab-map", "embedding", "rope", "wiring", "data-shape"):
        assert (rows[name].status, rows[name].findings) == (full[name].status, full[name].findings), name
    assert part.inputs.given()["skip"] == ["replay", "data-origin"]


def test_only_runs_the_named_rows() -> None:
    report = diagnose(DoctorInputs(**FULL, only=("sizes", "wiring")))
    ran = {o.name for o in report.outcomes if not o.reason.startswith("skipped")}
    assert ran == {"sizes", "wiring"}
    assert {o.name for o in report.outcomes} == {c.name for c in all_checks()} | {"wiring", "replay"}
    assert report.exit_code == 1 and report.findings[0].finding.code == "off-by-default"


def test_unknown_names_are_bad_input_in_one_line() -> None:
    with pytest.raises(ForensicsError, match="--skip: no doctor check named 'sizez'; known: launch, sizes"):
        diagnose(DoctorInputs(**FULL, skip=("sizez",)))
    out = CliRunner().invoke(main, ["doctor", "--drafter", FULL["drafter"], "--only", "sizes,nope"])
    assert out.exit_code == 2 and out.output.count("\n") == 1 and "--only: no doctor check named 'nope'" in out.output


def test_cli_accepts_repeats_and_commas_and_the_readme_documents_the_options() -> None:
    out = CliRunner().invoke(main, ["doctor", "--drafter", FULL["drafter"], "--target", FULL["target"],
                                    "--skip", "embedding", "--skip", "rope,sizes", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    skipped = {c["name"] for c in doc["checks"] if c["reason"].startswith("skipped")}
    assert skipped == {"embedding", "rope", "sizes"} and doc["inputs"]["skip"] == ["embedding", "rope", "sizes"]
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "--skip CHECK" in readme and "--only CHECK" in readme and "--device cuda" in readme


def test_the_report_runs_the_doctor_with_the_same_skip_only_and_device(tmp_path: Path) -> None:
    """doctor --report executes notebooks/doctor.ipynb: it must receive --skip / --only / --device (papermill said
    'Passed unknown parameter' and the page's doctor ran every check), as a process, with a timeout."""
    import subprocess
    import sys

    from eagleforensics.report.provenance import read_report

    out = tmp_path / "doctor.html"
    proc = subprocess.run([sys.executable, "-m", "eagleforensics", "doctor", "--drafter", FULL["drafter"], "--target",
                           FULL["target"], "--skip", "replay", "--report", str(out)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    assert "unknown parameter" not in proc.stderr
    rows = {r["name"]: r for r in read_report(out)["summary"]["checks"]}
    assert rows["replay"]["status"] == "not-run" and "--skip replay" in rows["replay"]["reason"]


def test_the_capture_greedy_tokens_are_computed_once_and_replay_answers_as_when_it_computes_them(monkeypatch) -> None:
    """One pass over the target's lm_head for the capture's greedy tokens, whichever check makes it first
    (drafter-baseline's replay, else the coverage check): replay reads them (no second pass) and answers as when
    it computes them itself."""
    from eagleforensics import replay as replay_mod
    from eagleforensics.checks import nexttokens

    import inspect

    real, real_cov = replay_mod._greedy_tokens, nexttokens.greedy
    calls: list[str] = []

    def capture_pass(*a, **k):  # replay's pass over the lm_head for the capture (not a record's own rows)
        if inspect.stack()[1].function == "target_next_tokens":
            calls.append("replay")
        return real(*a, **k)
    monkeypatch.setattr(replay_mod, "_greedy_tokens", capture_pass)
    monkeypatch.setattr(nexttokens, "greedy", lambda *a, **k: calls.append("coverage") or real_cov(*a, **k))
    runs = {}
    for skip, want in (((), ["replay", "coverage"]), (("drafter-baseline",), ["coverage"]),
                       (("drafter-baseline", "vocab-coverage"), ["replay"])):
        calls.clear()
        runs[skip] = diagnose(DoctorInputs(**FULL, skip=skip)).replay
        assert calls == want, (skip, calls)  # "replay": drafter-baseline's pass, or replay's own when it is alone
    first = runs[()]
    for rep in runs.values():
        assert rep["wirings"] == first["wirings"] and rep["greedy_share"] == first["greedy_share"]
