"""Issue 40: one check's refusal never refuses the run.

``doctor --engine vllm --engine-version 0.9.2`` (or a log of vLLM 0.10.0) exited 2, "older than the embedding
rules table", because the flags check's rule lookup escaped the check runner. Now that row is "not run" with the
reason and every other check answers. A bad input file is still one line, exit 2, for the whole run.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .test_hardening import run_process

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data_samples"
DRAFTER, TARGET = SAMPLES / "drafter", SAMPLES / "target"


def _rows(out: str) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(out)["checks"]}


@pytest.mark.parametrize("version", ["0.9.2", "0.10.0"])
def test_an_engine_release_older_than_one_rules_table_leaves_that_check_not_run(version: str, tmp_path: Path) -> None:
    code, out, err, _ = run_process(["doctor", "--drafter", DRAFTER, "--target", TARGET, "--engine", "vllm",
                                     "--engine-version", version, "--json"], tmp_path, timeout=300)
    assert code in (0, 1) and "Traceback" not in err, (code, err[-1500:])
    rows = _rows(out)
    assert rows["flags"]["status"] == "not-run" and "older than the embedding rules table" in rows["flags"]["reason"]
    assert rows["sizes"]["status"] == "clean" and rows["rope"]["status"] == "clean"


def test_a_log_of_vllm_0_10_0_leaves_only_the_flags_check_not_run(tmp_path: Path) -> None:
    from eagleforensics.testing.defects import vllm_log

    spec = {"method": "eagle3", "model": str(DRAFTER), "num_speculative_tokens": 3}
    log = vllm_log(tmp_path / "server.log", "0.10.0", TARGET, spec)
    code, out, err, _ = run_process(["doctor", "--drafter", DRAFTER, "--target", TARGET, "--log", log, "--json"],
                                    tmp_path, timeout=300)
    assert code in (0, 1) and "Traceback" not in err, (code, err[-1500:])
    rows = _rows(out)
    assert rows["flags"]["status"] == "not-run" and "0.10.0" in rows["flags"]["reason"]
    assert rows["launch"]["status"] in ("clean", "found")


def test_the_replay_row_runs_when_the_flags_table_stops_short(tmp_path: Path) -> None:
    """The replay row asks the flags table what the engine drops; a refusal there is replay as trained only."""
    code, out, err, _ = run_process(["doctor", "--drafter", DRAFTER, "--capture", SAMPLES / "capture.pt",
                                     "--engine", "vllm", "--engine-version", "0.9.2", "--only", "replay", "--json"],
                                    tmp_path, timeout=300)
    assert code in (0, 1) and "Traceback" not in err, (code, err[-1500:])
    assert _rows(out)["replay"]["status"] in ("clean", "found", "not-run")


def test_drafter_baseline_judges_the_checkpoint_when_the_flags_table_stops_short(tmp_path: Path) -> None:
    """drafter-baseline asks the flags table what the engine drops; a refusal there is judged as the checkpoint."""
    code, out, err, _ = run_process(["doctor", "--drafter", DRAFTER, "--target", TARGET, "--capture",
                                     SAMPLES / "capture.pt", "--engine", "vllm", "--engine-version", "0.9.2",
                                     "--only", "drafter-baseline", "--json"], tmp_path, timeout=300)
    assert code in (0, 1) and "Traceback" not in err, (code, err[-1500:])
    assert _rows(out)["drafter-baseline"]["status"] in ("clean", "found"), _rows(out)["drafter-baseline"]


def test_a_bad_input_file_still_refuses_the_run(tmp_path: Path) -> None:
    """A drafter config.json that is no JSON is read inside a check: still one line naming it, exit 2."""
    drafter = shutil.copytree(DRAFTER, tmp_path / "drafter")
    (drafter / "config.json").write_text("{not json")
    code, out, err, _ = run_process(["doctor", "--drafter", drafter, "--target", TARGET, "--engine", "vllm",
                                     "--engine-version", "0.9.2"], tmp_path, timeout=300)
    assert code == 2 and err.count("\n") == 1 and "config.json" in err, (code, err[-1500:])


def test_only_errors_that_name_no_input_are_a_checks_refusal() -> None:
    from eagleforensics.checks.base import Artifacts, DoctorInputs, is_refusal
    from eagleforensics.errors import ForensicsError

    assert is_refusal(ForensicsError("vLLM 0.9.2 is older than the embedding rules table"))
    assert not is_refusal(ForensicsError("is not valid JSON", path="x/config.json"))
    art = Artifacts(DoctorInputs(log=str(SAMPLES / "does-not-exist.log")))
    with pytest.raises(ForensicsError) as info:
        art.server_log
    assert not is_refusal(info.value)
