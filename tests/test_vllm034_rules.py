"""vLLM 0.34.0, the newest release the rules know: the one boundary it brings (issue 41).

0.34.0 removed the V1 model runner (vllm/platforms/interface.py refuses VLLM_USE_V2_MODEL_RUNNER=0;
vllm/v1/worker/gpu_model_runner.py is gone), so every V1 row ends at 0.33.0, a V1 question at 0.34.0 is
bad input (one line, exit 2), and a table whose default runner was V1 answers V2 there; and it refuses P-EAGLE
drafters (engines.peaglerules). Every other vLLM row that reached 0.33.0 was read again at 0.34.0 and holds (its
citation names 0.34.0: tests/test_rules_coverage.py).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.cli import main
from eagleforensics.doctor import diagnose
from eagleforensics.engines import embedrules, flagrules, roperules
from eagleforensics.engines.rules import (
    KEY_RULES,
    NEWEST,
    V1_REMOVED,
    answers_by_version,
    default_runner,
    positions_for_ids,
    resolve,
)
from eagleforensics.errors import ForensicsError

from .realdata import SAMPLES

WHEELS = Path(os.environ.get("EAGLEFORENSICS_WHEELS", "/work/wheels/src"))


def test_the_newest_vllm_release_known_is_0_34_0() -> None:
    assert NEWEST["vllm"] == "0.34.0" == V1_REMOVED
    rule = resolve("vllm", "llama")
    assert rule.version == "0.34.0" and any("answered for vLLM 0.34.0" in n for n in rule.notes)
    later = resolve("vllm", "llama", "0.35.0")
    assert any("newer than the newest release the table knows (0.34.0)" in n for n in later.notes)
    assert not any("newer than" in n for n in resolve("vllm", "llama", "0.34.0").notes)


def test_a_v1_question_at_0_34_0_is_refused_and_at_0_33_0_answered() -> None:
    assert resolve("vllm", "llama", "0.33.0", "v1").keys.label == "vllm v1 runner keys 0.22.0 - 0.33.0"
    for version in ("0.34.0", "0.35.0"):
        with pytest.raises(ForensicsError, match="has no V1 model runner"):
            resolve("vllm", "llama", version, "v1")
    with pytest.raises(ForensicsError, match="has no V1 model runner"):
        resolve("vllm", "llama", None, "v1")


def test_the_default_runner_at_0_34_0_is_v2_by_its_own_row() -> None:
    run, row = default_runner("0.34.0", "deepseek_v3")
    assert run == "v2" and row.since == "0.34.0" and "platforms/interface.py" in row.source
    assert default_runner("0.33.0", "deepseek_v3")[1].until == "0.33.0"
    # the V2 key row holds on: a nested-only SpecForge drafter gets the default layers at 0.34.0 too
    rule = resolve("vllm", "llama", "0.34.0")
    assert rule.runner == "v2" and rule.keys.runner == "v2" and rule.keys.since == "0.33.0"
    assert [o.position.p for o in positions_for_ids(rule, [2, 16, 29], 32)] == [2, 16, 29]


def test_tables_whose_default_runner_was_v1_answer_v2_from_0_34_0() -> None:
    assert embedrules.embed_rule("vllm", "0.33.0").runner == "v1"
    assert embedrules.embed_rule("vllm", "0.34.0").runner == "v2"
    assert embedrules.embed_rule("vllm").runner == "v2"
    # yarn drafts: no drafts past the draft's length on V1 (0.33.0's table default), served length capped on V2
    assert roperules.draft_rope_rule("vllm", "0.33.0", rope_type="yarn").past_max == "no-drafts"
    assert roperules.draft_rope_rule("vllm", "0.34.0", rope_type="yarn").past_max == "target-capped"
    for ask in (lambda: embedrules.embed_rule("vllm", "0.34.0", "v1"),
                lambda: roperules.draft_rope_rule("vllm", "0.34.0", "v1"),
                lambda: flagrules.ignored_features("vllm", "0.34.0", "v1", ["extra_layers"])):
        with pytest.raises(ForensicsError, match="has no V1 model runner"):
            ask()


def test_v1_answers_by_version_end_at_its_last_release() -> None:
    spans = [span for span, _ in answers_by_version("vllm", "llama", lambda r: r.keys.keys, runner="v1")]
    assert spans[-1].endswith("0.33.0") and not any(s.startswith(">=") for s in spans), spans
    assert max((r.until for r in KEY_RULES if r.runner == "v1"), key=lambda v: tuple(map(int, v.split(".")))) \
        == "0.33.0"


@pytest.mark.parametrize("version", [["--engine-version", "0.34.0"], []])
def test_config_cli_refuses_the_v1_runner_at_0_34_0_in_one_line(version: list[str]) -> None:
    res = CliRunner().invoke(main, ["config", str(SAMPLES / "drafter"), "--engine", "vllm", *version,
                                    "--vllm-runner", "v1", "--target", str(SAMPLES / "target")])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "no V1 model runner" in lines[0] and "Traceback" not in res.output
    ok = CliRunner().invoke(main, ["config", str(SAMPLES / "drafter"), "--engine", "vllm", "--engine-version",
                                   "0.33.0", "--vllm-runner", "v1", "--target", str(SAMPLES / "target")])
    assert ok.exit_code in (0, 1), ok.output


def test_doctor_refuses_the_v1_runner_at_0_34_0_before_any_check() -> None:
    base = ["doctor", "--drafter", str(SAMPLES / "drafter"), "--engine", "vllm", "--vllm-runner", "v1"]
    res = CliRunner().invoke(main, [*base, "--engine-version", "0.34.0"])
    assert res.exit_code == 2 and "no V1 model runner" in res.output and "checks:" not in res.output, res.output
    ok = CliRunner().invoke(main, [*base, "--engine-version", "0.33.0", "--only", "embedding"])
    assert ok.exit_code in (0, 1) and "no V1 model runner" not in ok.output, ok.output


def test_config_says_v2_is_the_only_runner_from_0_34_0() -> None:
    from eagleforensics.engines.draftconfig import audit_config

    def runner_note(version: str) -> str:
        audit = audit_config(SAMPLES / "drafter", "vllm", engine_version=version, model_type="llama", num_layers=12)
        (f,) = [f for f in audit.findings if f.code == "vllm-runner"]
        return f.message

    assert "its only one" in runner_note("0.34.0") and "forces V1/V2" not in runner_note("0.34.0")
    assert "by default" in runner_note("0.33.0") and "forces V1/V2" in runner_note("0.33.0")


def test_plans_runner_suspect_says_v2_is_the_only_runner_from_0_34_0() -> None:
    from dataclasses import replace

    from eagleforensics.engines.serverargs import parse_server_args_line
    from eagleforensics.engines.suspects import match_suspects

    args = parse_server_args_line(
        "(APIServer pid=1) INFO 11-29 12:58:00 [startup.py:96] non-default args: {'model_tag': 'm', "
        "'speculative_config': {'method': 'eagle3', 'model': 'd', 'num_speculative_tokens': 3}}")
    assert args is not None

    def runner(version: str) -> tuple[str, str]:
        (m,) = [m for m in match_suspects(replace(args, version=version)) if m.suspect.code == "model-runner-v2"]
        return m.status, m.this_run

    assert runner("0.34.0")[0] == "matches" and "the only one" in runner("0.34.0")[1]
    assert runner("0.33.0")[0] == "matches" and "by default" in runner("0.33.0")[1]
    (sus,) = [m.suspect for m in match_suspects(replace(args, version="0.34.0")) if m.suspect.code == "model-runner-v2"]
    assert "0.34.0 removed the V1 runner" in sus.try_  # its advice (force V1) is refused there: it says so


def _peagle(tmp_path: Path) -> Path:
    """A P-EAGLE drafter config as speculators' PEagleSpeculatorConfig writes it (speculators models/peagle/config.py),
    on the sample drafter's Llama layer."""
    layer = json.loads((SAMPLES / "drafter" / "config.json").read_text())
    cfg = {"architectures": ["PEagleSpeculator"], "speculators_model_type": "peagle", "mask_token_id": 300,
           "draft_vocab_size": layer["draft_vocab_size"], "transformer_layer_config": layer,
           "speculators_config": {"algorithm": "peagle", "default_proposal_method": "greedy",
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
                                  "verifier": {"name_or_path": str(SAMPLES / "target")}}}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def _peagle_findings(cfg: Path, **inputs: object) -> list:
    report = diagnose(DoctorInputs(draft_config=str(cfg), only=("block-drafter",), **inputs))  # type: ignore[arg-type]
    return [r.finding for r in report.findings if r.finding.code == "block-drafter-settings"
            and "P-EAGLE" in r.finding.message]


def test_a_peagle_drafter_on_vllm_0_34_0_is_found_and_on_0_33_0_not(tmp_path: Path) -> None:
    cfg = _peagle(tmp_path)
    (found,) = _peagle_findings(cfg, engine="vllm", engine_version="0.34.0")
    assert found.severity == "warning" and "refuses it" in found.message and "0.34.0" in found.source
    (assumed,) = _peagle_findings(cfg, engine="vllm")  # no release: the newest read, said so
    assert assumed.severity == "info" and "newest read was assumed" in assumed.message
    assert "0.14.1" in _peagle_findings(cfg, engine="vllm", engine_version="0.14.1")[0].source
    for quiet in ({"engine": "vllm", "engine_version": "0.33.0"}, {"engine": "vllm", "engine_version": "0.25.0"},
                  {"engine": "vllm", "engine_version": "0.20.0"}, {"engine": "sglang"}, {}):
        assert _peagle_findings(cfg, **quiet) == [], quiet


@pytest.mark.skipif(not (WHEELS / "vllm-0.34.0" / ".done").is_file() or not (WHEELS / "vllm-0.33.0" / ".done").is_file(),
                    reason="the vLLM 0.33.0 / 0.34.0 wheels are not unpacked on this machine")
def test_the_wheels_show_the_boundary() -> None:
    runner = "vllm/v1/worker/gpu_model_runner.py"
    assert (WHEELS / "vllm-0.33.0" / runner).is_file() and not (WHEELS / "vllm-0.34.0" / runner).is_file()
    platform = (WHEELS / "vllm-0.34.0" / "vllm/platforms/interface.py").read_text()
    assert "VLLM_USE_V2_MODEL_RUNNER" in platform and "Model Runner V1 has been removed" in platform
