"""The doctor pipeline and its registry: rows per check, ranking, levels, exit codes, bad input."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from eagleforensics.checks.base import Artifacts, Check, CheckResult, DoctorInputs
from eagleforensics.checks.registry import all_checks, all_codes
from eagleforensics.cli import main
from eagleforensics.doctor import diagnose, run_check
from eagleforensics.errors import ForensicsError
from eagleforensics.results import Finding

SAMPLES = Path(__file__).resolve().parents[1] / "data_samples"


@pytest.fixture()
def drafter_copy(tmp_path: Path) -> Path:
    out = tmp_path / "drafter"
    shutil.copytree(SAMPLES / "drafter", out)
    return out


def _edit_config(d: Path, **changes: object) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def test_clean_sample_drafter_is_ok_and_lists_what_did_not_run() -> None:
    report = diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter"), target=str(SAMPLES / "target")))
    assert report.level == "OK" and report.exit_code == 0
    rows = {o.name: o for o in report.outcomes}
    assert rows["sizes"].status == "clean"
    assert rows["wiring"].status == "not-run" and "--train" in rows["wiring"].reason and "--capture" in rows["wiring"].reason
    assert not [r for r in report.findings if r.finding.severity in ("error", "warning")]


def test_when_no_check_can_run_the_doctor_does_not_say_ok() -> None:
    """A capture alone runs no check: 'OK' with exit 0 vouched for nothing. It is ACTION (exit 1: give the
    inputs the 'not run' rows name), and one check that runs clean is OK again (a target alone runs the
    target-side checks of issue 34)."""
    capture = str(SAMPLES / "capture_sweep.safetensors")
    report = diagnose(DoctorInputs(capture=capture))
    assert all(o.status == "not-run" for o in report.outcomes)
    assert report.level == "ACTION" and report.exit_code == 1
    assert report.verdict.startswith("ACTION: no check could run with these inputs: nothing was checked")
    out = CliRunner().invoke(main, ["doctor", "--capture", capture, "--json"])
    assert out.exit_code == 1 and json.loads(out.stdout)["level"] == "ACTION"
    assert diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter"))).level == "OK"
    assert diagnose(DoctorInputs(target=str(SAMPLES / "target"))).level == "OK"


def test_planted_size_mismatch_is_found_with_its_code_only(drafter_copy: Path) -> None:
    _edit_config(drafter_copy, target_hidden_size=256)  # the fc would read 3 x 256, the target is 128 wide
    report = diagnose(DoctorInputs(drafter=str(drafter_copy), target=str(SAMPLES / "target")))
    flagged = [r.finding.code for r in report.findings if r.finding.severity in ("error", "warning")]
    assert flagged == ["size-mismatch"]
    assert report.level == "PROBLEM" and report.exit_code == 1
    f = report.findings[0].finding
    assert "256" in f.message and "128" in f.message and f.fix and f.source and f.impact == "collapse"


def test_wiring_row_carries_aligns_verdict() -> None:
    report = diagnose(DoctorInputs(train=str(SAMPLES / "record_layer_outputs.pt"), capture=str(SAMPLES / "capture.pt")))
    row = next(o for o in report.outcomes if o.name == "wiring")
    assert row.status == "found" and row.note.startswith("ACTION:")
    assert report.level == "ACTION" and report.align is not None and report.align["level"] == "ACTION"
    assert report.findings[0].finding.code == "off-by-default" and "[2, 6, 9]" in report.findings[0].finding.fix


def test_ranking_puts_errors_then_costlier_impacts_first() -> None:
    def emit(art: Artifacts) -> CheckResult:
        return CheckResult((Finding("b-low", "warning", "m", impact="low"), Finding("a-info", "info", "m"),
                            Finding("c-collapse", "warning", "m", impact="collapse"),
                            Finding("d-error", "error", "m", impact="low")))
    check = Check("fake", "fake", ("a-info", "b-low", "c-collapse", "d-error"), ("drafter",), emit)
    report = diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter")), checks=[check], pipelines=())
    assert [r.finding.code for r in report.findings] == ["d-error", "c-collapse", "b-low", "a-info"]


def test_a_code_outside_the_checks_contract_is_a_bug() -> None:
    check = Check("liar", "liar", ("ok-code",), ("drafter",),
                  lambda art: CheckResult((Finding("other-code", "warning", "m"),)))
    with pytest.raises(RuntimeError, match="outside its contract"):
        run_check(check, Artifacts(DoctorInputs(drafter=str(SAMPLES / "drafter"))))


def test_registry_codes_are_unique_and_every_check_documents_them() -> None:
    checks = all_checks()
    codes = [c for check in checks for c in check.codes]
    assert len(codes) == len(set(codes)) == len(all_codes())
    page = (Path(__file__).resolve().parents[1] / "docs" / "doctor.md").read_text()
    assert [c for c in codes if f"`{c}`" not in page] == []


@pytest.mark.parametrize("args, needle", [
    ([], "give at least one of"),
    (["--drafter", "no/such/dir"], "no such file or directory"),
    (["--drafter", str(SAMPLES / "capture.pt")], "expects a directory"),
    (["--log", str(SAMPLES)], "expects a file"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    res = CliRunner().invoke(main, ["doctor", *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output and len(res.output.strip().splitlines()) == 1


def test_cli_json_is_one_object_with_the_documented_keys() -> None:
    res = CliRunner().invoke(main, ["doctor", "--drafter", str(SAMPLES / "drafter"), "--target",
                                    str(SAMPLES / "target"), "--json"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.output)
    assert {"schema", "verdict", "level", "exit_code", "todo", "findings", "checks", "align", "replay",
            "inputs"} <= set(obj)
    assert obj["verdict"].startswith("OK:") and obj["exit_code"] == 0


def test_a_drafter_directory_without_weights_is_bad_input(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"hidden_size": 128}))
    with pytest.raises(ForensicsError, match="no model.safetensors"):
        diagnose(DoctorInputs(drafter=str(d), target=str(SAMPLES / "target")))
