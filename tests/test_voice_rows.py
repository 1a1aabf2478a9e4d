"""Rows that say why: the data-origin row on a flat target, ``config`` when every version serves the same positions."""
from __future__ import annotations

import json

from click.testing import CliRunner

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.cli import main
from eagleforensics.doctor import diagnose
from eagleforensics.testing.defects import SAMPLES


def test_the_data_origin_row_says_the_target_is_flat_in_the_row() -> None:
    """The sample target is near uniform on the record's tokens (6.21 nats of ln 512 = 6.24): agreement 0.0% says
    nothing, and the row itself says so, not only the context line."""
    report = diagnose(DoctorInputs(target=str(SAMPLES / "target"), train=str(SAMPLES / "record_layer_outputs.pt")))
    row = next(o for o in report.outcomes if o.name == "data-origin")
    assert row.status == "clean" and "agreement 0.0%" in row.note
    assert "cannot tell" in row.note and "flat" in row.note and row.data["flat_target"] is True
    line = next(x for x in report.to_text().splitlines() if x.strip().startswith("data-origin"))
    assert "flat" in line


def test_a_sharp_target_is_not_called_flat() -> None:
    from eagleforensics.checks.dataorigin import flat_target

    assert flat_target(2.0, 151_936) == ""  # a real LLM: ~2 nats of ln(152k) = 11.9
    assert flat_target(None, 512) == "" and flat_target(6.0, None) == ""
    assert "flat" in flat_target(6.21, 512)


def test_config_says_the_same_for_every_version_when_the_positions_do_not_change() -> None:
    res = CliRunner().invoke(main, ["config", str(SAMPLES / "drafter"), "--engine", "vllm", "--num-layers", "12"])
    assert "by version (the same for every version: p2, p6, p9;" in res.output, res.output
    assert "the answer changes" not in res.output
    doc = json.loads(CliRunner().invoke(main, ["config", str(SAMPLES / "drafter"), "--engine", "vllm",
                                               "--num-layers", "12", "--json"]).output)
    f = next(f for f in doc["findings"] if f["code"] == "version-dependent")
    assert f["severity"] == "info" and f["message"].startswith("the same for every version: p2, p6, p9")
