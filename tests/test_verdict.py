"""Verdict levels on the real samples: OK (served as trained), ACTION (write these ids), PROBLEM (miswired).

Every record here comes from real forward passes (data_samples/); the expected ids are
the positions the samples were written at, translated by each engine's rule by hand.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eagleforensics.alignment import align
from eagleforensics.cli import main
from eagleforensics.engines.advice import yaml_snippet
from eagleforensics.verdict import ACTION, OK, PROBLEM, by_severity

from .test_crosscheck import _specforge, _trtllm_yaml

SAMPLES = Path(__file__).resolve().parents[1] / "data_samples"
CAPTURE = SAMPLES / "capture.pt"
INCIDENT, WRONG_FIX, DEFAULT = (SAMPLES / n for n in ("record_layer_outputs.pt", "record_wrong_fix.pt", "data_0.ckpt"))


@pytest.fixture(scope="module")
def incident():
    return align(INCIDENT, CAPTURE)


def test_default_layers_are_ok_exit_0() -> None:
    """A record at p=[2, 6, 9] is what every engine captures by default: nothing to do."""
    r = align(DEFAULT, CAPTURE)
    v = r.judge()
    assert (v.level, v.exit_code, r.exit_code) == (OK, 0, 0) and not v.actions and not v.todo
    assert r.verdict.startswith("OK: all 4 slots placed") and all(a.at_default for a in r.advice)


def test_incident_is_action_with_a_snippet_per_engine(incident) -> None:
    """p=[3, 7, 10]: placed, but each engine must be told; the snippet is what it reads, in its syntax."""
    v = incident.judge()
    assert v.level == ACTION and incident.exit_code == 1
    snippets = {a.engine: (a.syntax, a.snippet) for a in v.actions}
    assert snippets["vllm"] == ("json", '{"eagle_aux_hidden_state_layer_ids": [3, 7, 10]}')
    assert snippets["sglang"] == ("json", '{"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}}')
    assert snippets["trtllm"] == ("yaml", "speculative_config:\n  eagle3_layers_to_capture: [2, 6, 9]")
    doc = incident.to_dict()
    assert doc["level"] == "ACTION" and doc["verdict"].startswith("ACTION: ")
    assert {a["engine"]: a["ids"] for a in doc["actions"]}["sglang"] == [2, 6, 9]


def test_wrong_fix_is_problem_with_what_to_do() -> None:
    """The embedding in an aux slot: TRT-LLM cannot capture it; vLLM (id 0) and the newest SGLang (id -1 on
    Llama, from 0.5.22) can, and the verdict says so while still calling the record miswired."""
    r = align(WRONG_FIX, CAPTURE)
    v = r.judge()
    assert v.level == PROBLEM and r.exit_code == 1 and "embedding" in v.summary
    assert {a.engine: a.ids for a in v.actions} == {"vllm": [0, 2, 6], "sglang": [-1, 1, 5]}
    assert any("Only vllm, sglang can serve" in t for t in v.todo)


def test_serving_match_is_ok_and_mismatch_is_action(tmp_path: Path) -> None:
    """With an engine, only that engine counts: its right ids -> OK; one layer off -> ACTION with its fix."""
    ok = align(INCIDENT, CAPTURE, engine="sglang", draft_config=_specforge(tmp_path, [2, 6, 9]))
    assert ok.level == OK and ok.exit_code == 0 and "serves them as trained" in ok.verdict
    off = align(INCIDENT, CAPTURE, engine="sglang", draft_config=_specforge(tmp_path, [3, 7, 10], "off"))
    assert off.level == ACTION and [(a.engine, a.ids) for a in off.judge().actions] == [("sglang", [2, 6, 9])]
    trt = align(INCIDENT, CAPTURE, engine="trtllm", draft_config=_trtllm_yaml(tmp_path, [3, 7, 10]))
    assert trt.level == ACTION and trt.judge().actions[0].snippet == yaml_snippet(
        "speculative_config.eagle3_layers_to_capture", [2, 6, 9])


def test_engine_default_on_the_incident_is_action(incident) -> None:
    """No draft config: the engine's default is judged; for the incident it is one layer off."""
    r = align(INCIDENT, CAPTURE, engine="vllm")
    assert r.level == ACTION and r.judge().actions[0].snippet == '{"eagle_aux_hidden_state_layer_ids": [3, 7, 10]}'


def test_cli_text_puts_snippets_and_sorted_findings_under_the_verdict() -> None:
    out = CliRunner().invoke(main, ["align", str(INCIDENT), str(CAPTURE)]).output
    lines = out.splitlines()
    v = next(i for i, x in enumerate(lines) if x.startswith("VERDICT: ACTION"))
    assert lines[v + 2].strip() == "vllm: write into the draft's config.json:"
    assert out.index("findings:") < out.index("slot ")  # findings before the table
    severities = [x.split("]")[0].strip(" [") for x in lines if x.startswith("  [")]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)


def test_json_levels_and_exit_codes_agree() -> None:
    for path, level, code in ((DEFAULT, "OK", 0), (INCIDENT, "ACTION", 1), (WRONG_FIX, "PROBLEM", 1)):
        res = CliRunner().invoke(main, ["align", "--json", str(path), str(CAPTURE)])
        doc = json.loads(res.stdout)
        assert (doc["level"], doc["exit_code"], res.exit_code) == (level, code, code)


def test_by_severity_is_stable(incident) -> None:
    ordered = by_severity(list(reversed(incident.findings)))
    assert [f.severity for f in ordered] == sorted((f.severity for f in ordered),
                                                    key=["error", "warning", "info"].index)
