"""The doctor judges the drafter as the named engine serves it, and says one severity on every surface (issue 43).

Defects found on the real SmolLM2 pair, reproduced here on the sample drafter and target (real forward passes of a
tiny Llama, ``data_samples/``): the baseline check judged a random embedding that SGLang replaces (a false
PROBLEM); doctor's replay priced another vLLM runner than the wiring row; the JSON carried warnings of rows that
name no cause (an OK verdict beside ``severity: warning``) that the text never showed.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.doctor import diagnose
from eagleforensics.testing.defects import DEFECTS, SAMPLES, plant

from .torchthreads import one_thread  # noqa: F401  (autouse: the tiny drafters train on one torch thread)

RECORD, CAPTURE = SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture.pt"
FLAGGED = ("error", "warning")


@pytest.fixture(scope="module")
def random_embedding(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    defect = next(d for d in DEFECTS if d.name == "embedding-random")
    return plant(defect, tmp_path_factory.mktemp("planted"))


def _doctor(case, engine: str, version: str):  # noqa: ANN001, ANN202
    return diagnose(DoctorInputs(drafter=str(case.drafter), target=str(case.target), train=str(RECORD),
                                 capture=str(CAPTURE), engine=engine, engine_version=version))


def test_a_random_embedding_sglang_replaces_is_judged_as_served(random_embedding) -> None:  # noqa: ANN001
    """SGLang 0.5.23 feeds the drafter the target's embedding: the baselines judge that drafter, which beats them."""
    report = _doctor(random_embedding, "sglang", "0.5.23")
    row = next(o for o in report.outcomes if o.name == "drafter-baseline")
    assert row.status == "clean", row.note
    assert row.data["served_without"] == ["own_embedding"] and "as sglang serves it" in row.note
    assert not row.data["pooled"]["no_better"] and all(j["diff"] > 0 for j in row.data["judgements"])
    assert report.level == "OK", report.to_text()
    assert not any(r.finding.code == "replay-accepts-nothing" for r in report.findings), report.to_text()


def test_the_same_drafter_on_vllm_keeps_its_random_embedding_and_is_found(random_embedding) -> None:  # noqa: ANN001
    """vLLM 0.33.0 keeps the drafter's own embedding: served there it accepts nothing, and the cause is named."""
    report = _doctor(random_embedding, "vllm", "0.33.0")
    assert report.level == "PROBLEM" and report.causes[0].key == "draft-embedding", report.to_text()
    row = next(o for o in report.outcomes if o.name == "drafter-baseline")
    assert row.data["served_without"] == [] and row.data["pooled"]["no_better"]


def _runner_case(tmp_path: Path) -> Path:
    """The sample drafter with its trained ids only in the nested key: vLLM 0.25.0's v1 runner reads them there,
    its v2 runner does not and falls back to its default layers."""
    drafter = tmp_path / "drafter"
    shutil.copytree(SAMPLES / "drafter", drafter)
    cfg = json.loads((drafter / "config.json").read_text())
    cfg.pop("eagle_aux_hidden_state_layer_ids", None)
    cfg.setdefault("eagle_config", {})["eagle_aux_hidden_state_layer_ids"] = [3, 7, 10]
    (drafter / "config.json").write_text(json.dumps(cfg))
    return drafter


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_doctor_replay_prices_the_runner_the_wiring_row_reads(tmp_path: Path, runner: str) -> None:
    drafter = _runner_case(tmp_path)
    report = diagnose(DoctorInputs(drafter=str(drafter), target=str(SAMPLES / "target"), train=str(RECORD),
                                   capture=str(CAPTURE), engine="vllm", engine_version="0.25.0", vllm_runner=runner,
                                   only=("wiring", "replay")))
    served = report.align["serving"]["positions_served"]
    engine_rows = [w for w in report.replay["wirings"] if "vllm" in w["source"]]
    assert engine_rows, report.replay["wirings"]
    assert engine_rows[0]["positions"] == served and f"({runner} runner)" in engine_rows[0]["source"]
    assert served == (["p3", "p7", "p10"] if runner == "v1" else ["p2", "p6", "p9"])


def test_replay_cli_takes_the_vllm_runner(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from eagleforensics.cli import main

    drafter = _runner_case(tmp_path)
    got = CliRunner().invoke(main, ["replay", str(drafter), str(CAPTURE), "--target", str(SAMPLES / "target"),
                                    "--train", str(RECORD), "--engine", "vllm", "--engine-version", "0.25.0",
                                    "--vllm-runner", "v2", "--json"])
    out = json.loads(got.output)
    engine_rows = [w for w in out["wirings"] if "vllm" in w["source"]]
    assert engine_rows[0]["positions"] == ["p2", "p6", "p9"] and "(v2 runner)" in engine_rows[0]["source"]
    bad = CliRunner().invoke(main, ["replay", str(drafter), str(CAPTURE), "--vllm-runner", "v2"])
    assert bad.exit_code == 2 and "without an engine" in bad.output


@pytest.mark.parametrize("engine, version", [("sglang", "0.5.23"), ("vllm", "0.33.0"), ("vllm", "0.25.0")])
def test_json_and_text_say_one_severity(engine: str, version: str) -> None:
    """Every error or warning in the JSON belongs to a cause; every other finding is a note, shown in the text too
    when its row's verdict made it one; an OK verdict carries no warning anywhere."""
    report = diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter"), target=str(SAMPLES / "target"),
                                   train=str(RECORD), capture=str(CAPTURE), engine=engine, engine_version=version))
    data, text = report.to_dict(), report.to_text()
    for f in data["findings"]:
        assert f["severity"] == "info" or f.get("cause"), f
    for o in report.outcomes:  # the rows' own findings say the same severities
        for f in o.findings:
            assert f.severity == "info" or any(f.code in c["codes"] for c in data["causes"]), (o.name, f)
    notes = [f for f in data["findings"] if f["message"].endswith("(a note: its row names no cause)")]
    for f in notes:
        assert f["code"] in text
    if data["level"] == "OK":
        assert all(f["severity"] == "info" for f in data["findings"])
