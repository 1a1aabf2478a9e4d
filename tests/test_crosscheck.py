"""Tests for eagleforensics.engines.crosscheck and ``align --draft-config/--engine``, on the real data samples.

``record_layer_outputs.pt`` holds p=[3, 7, 10] (+ post-norm final) of a 12-layer tiny Llama whose
forward pass is ``capture.pt``; ``data_0.ckpt`` holds the default p=[2, 6, 9]; ``record_wrong_fix.pt``
holds p=[0, 2, 6] (the embedding included). Draft configs are written as SpecForge, speculators
and TensorRT-LLM write them.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eagleforensics.alignment import AlignmentResult, align
from eagleforensics.cli import main
from eagleforensics.engines.crosscheck import crosscheck, default_audit, snippet
from eagleforensics.engines.draftconfig import NESTED_KEY, TOP_KEY, YAML_KEY, audit_config
from eagleforensics.errors import ForensicsError
from eagleforensics.positions import Position

from .drafts import specforge_draft, speculators_draft, trtllm_yaml
from .realdata import SAMPLES

RECORD = SAMPLES / "record_layer_outputs.pt"
CAPTURE = SAMPLES / "capture.pt"
TRAINED = [Position(3), Position(7), Position(10)]


@pytest.fixture(scope="session")
def result() -> AlignmentResult:
    """The plain alignment of the off-by-one sample (no engine): p=[3, 7, 10]."""
    return align(RECORD, CAPTURE)


def _specforge(tmp: Path, ids: list[int] | None, name: str = "specforge") -> Path:
    return specforge_draft(tmp, ids, name, hidden=128)


def _speculators(tmp: Path, ids: list[int], name: str = "speculators") -> Path:
    return speculators_draft(tmp, ids, name, hidden=128)


def _trtllm_yaml(tmp: Path, ids: list[int], name: str = "extra_llm_api.yaml") -> Path:
    return trtllm_yaml(tmp, ids, name=name)


def _cli(*args: object):
    return CliRunner().invoke(main, ["align", str(RECORD), str(CAPTURE), *map(str, args)])


def _codes(check) -> set[str]:
    return {f.code for f in check.findings}


class TestLibrary:
    """crosscheck(result, audit): served vs trained, the fix in the key the engine reads."""

    def test_sglang_right_config_matches(self, result, tmp_path):
        """SpecForge nested [2,6,9] on SGLang captures p=k+1 = [3,7,10]: what was trained."""
        check = crosscheck(result, audit_config(_specforge(tmp_path, [2, 6, 9]), "sglang", num_layers=12))
        assert check.match and check.status == "match"
        assert check.positions_served == TRAINED == check.positions_trained
        assert check.fix_ids is None and "serving-match" in _codes(check)

    def test_sglang_one_off_config_gets_exact_fix(self, result, tmp_path):
        """The vLLM-style list [3,7,10] on SGLang captures [4,8,11]; fix [2,6,9] in the nested key."""
        check = crosscheck(result, audit_config(_specforge(tmp_path, [3, 7, 10]), "sglang", num_layers=12))
        assert not check.match and check.status == "mismatch"
        assert check.positions_served == [Position(4), Position(8), Position(11)]
        assert (check.fix_ids, check.fix_key) == ([2, 6, 9], NESTED_KEY)
        assert json.loads(check.fix_snippet) == {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}}
        err = [f for f in check.findings if f.code == "serving-mismatch"][0]
        assert err.severity == "warning" and "[2, 6, 9]" in err.message  # a snippet fixes it: ACTION, not PROBLEM

    def test_speculators_top_level_ignored_by_sglang(self, result, tmp_path):
        """Top-level [3,7,10]: SGLang ignores it, uses its default p=[2,6,9]: mismatch, same fix."""
        check = crosscheck(result, audit_config(_speculators(tmp_path, [3, 7, 10]), "sglang", num_layers=12))
        assert check.key_read is None and check.positions_served == [Position(2), Position(6), Position(9)]
        assert {"top-level-ignored", "default-fallback", "serving-mismatch"} <= _codes(check)
        assert (check.fix_ids, check.fix_key) == ([2, 6, 9], NESTED_KEY)

    def test_vllm_reads_top_level(self, result, tmp_path):
        """vLLM reads the top-level [3,7,10] as p=k: match."""
        check = crosscheck(result, audit_config(_speculators(tmp_path, [3, 7, 10]), "vllm", num_layers=12))
        assert check.match and check.key_read == TOP_KEY

    def test_vllm_on_sglang_ids_is_off_by_one(self, result, tmp_path):
        """The SGLang-correct nested [2,6,9] means p=[2,6,9] on vLLM (PR #43671): fix at the top level."""
        check = crosscheck(result, audit_config(_specforge(tmp_path, [2, 6, 9]), "vllm", num_layers=12))
        assert not check.match
        assert (check.fix_ids, check.fix_key) == ([3, 7, 10], TOP_KEY)
        assert json.loads(check.fix_snippet) == {"eagle_aux_hidden_state_layer_ids": [3, 7, 10]}

    def test_trtllm_yaml(self, result, tmp_path):
        """TRT-LLM YAML: [2,6,9] (k+1) matches; [3,7,10] gets the fix in speculative_config."""
        ok = crosscheck(result, audit_config(_trtllm_yaml(tmp_path, [2, 6, 9]), "trtllm", num_layers=12))
        bad = crosscheck(result, audit_config(_trtllm_yaml(tmp_path, [3, 7, 10], "b.yaml"), "trtllm",
                                              num_layers=12))
        assert ok.match and ok.key_read == YAML_KEY
        assert (bad.fix_ids, bad.fix_key) == ([2, 6, 9], YAML_KEY)
        assert json.loads(bad.fix_snippet) == {"speculative_config": {"eagle3_layers_to_capture": [2, 6, 9]}}

    def test_trtllm_ignores_draft_json(self, result, tmp_path):
        """Right ids in config.json do not reach TRT-LLM: default served, trap carried, fix in the YAML."""
        check = crosscheck(result, audit_config(_specforge(tmp_path, [2, 6, 9]), "trtllm", num_layers=12))
        assert not check.match and {"draft-ids-ignored", "default-fallback"} <= _codes(check)
        assert check.fix_key == YAML_KEY

    def test_deepseek_version_moves_the_verdict(self, result, tmp_path):
        """DeepSeek nested [2,6,9]: p=k+1 on SGLang 0.5.12 (match), verbatim on 0.5.13 (fix [3,7,10])."""
        draft = _specforge(tmp_path, [2, 6, 9])
        old = crosscheck(result, audit_config(draft, "sglang", engine_version="0.5.12",
                                              model_type="deepseek_v3", num_layers=12))
        new = crosscheck(result, audit_config(draft, "sglang", engine_version="0.5.13",
                                              model_type="deepseek_v3", num_layers=12))
        assert old.match and old.rule == "sglang 0.5.12 deepseek"
        assert not new.match and new.fix_ids == [3, 7, 10]
        # the fix works on the version asked about
        assert new.fix_key == NESTED_KEY

    def test_default_audit_mismatch_and_match(self, result):
        """No config: the engine default p=[2,6,9] is judged; the SpecForge sample (default layers) matches."""
        off = crosscheck(result, default_audit("sglang", 12))
        assert not off.match and off.fix_ids == [2, 6, 9] and "no-draft-config" in _codes(off)
        default_sample = align(SAMPLES / "data_0.ckpt", CAPTURE, engine="vllm")
        assert default_sample.serving.match
        pin = [f for f in default_sample.serving.findings if f.code == "serving-match"][0]
        assert '{"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}' in pin.message

    def test_unservable_training_layout(self, tmp_path):
        """Embedding in the aux slots: SGLang Llama < 0.5.22 has no fix (says why); 0.5.22 uses -1; vLLM id 0."""
        wrong = align(SAMPLES / "record_wrong_fix.pt", CAPTURE)
        sgl = crosscheck(wrong, default_audit("sglang", 12, engine_version="0.5.21", model_type="llama"))
        new = crosscheck(wrong, default_audit("sglang", 12, engine_version="0.5.22", model_type="llama"))
        vll = crosscheck(wrong, default_audit("vllm", 12))
        assert sgl.status == "mismatch" and sgl.fix_ids is None
        assert any("embedding" in n for n in sgl.fix_notes)
        assert new.fix_ids == [-1, 1, 5]
        assert vll.fix_ids == [0, 2, 6]

    def test_unplaced_slots_cannot_be_judged(self, tmp_path):
        """Two tokens are too few to place any slot: no verdict, never a guessed fix."""
        weak = align(RECORD, CAPTURE, max_tokens=2, engine="sglang",
                     draft_config=_specforge(tmp_path, [3, 7, 10]))
        assert weak.serving.status == "cannot-judge" and weak.serving.fix_ids is None
        assert weak.serving.positions_trained is None and weak.exit_code == 1
        assert "serving-unjudged" in {f.code for f in weak.findings}

    def test_num_layers_disagree(self, result, tmp_path):
        """An audit for a 32-layer target against a 12-layer capture: an error, no verdict."""
        check = crosscheck(result, audit_config(_specforge(tmp_path, [2, 6, 9]), "sglang", num_layers=32))
        assert check.status == "cannot-judge" and not check.match
        f = [f for f in check.findings if f.code == "num-layers-disagree"][0]
        assert f.severity == "error" and "N=12" in f.message and "N=32" in f.message

    def test_snippet(self):
        """A dotted key becomes nested JSON."""
        assert snippet("a.b", [1, 2]) == '{"a": {"b": [1, 2]}}'


class TestAlignIntegration:
    """align(..., draft_config, engine): the check rides on the result, its findings and exit code."""

    def test_without_engine_nothing_changes(self, result):
        assert result.serving is None and result.to_dict()["serving"] is None and result.exit_code == 1
        assert result.level == "ACTION"  # the incident record: every engine must be told its ids

    def test_mismatch_joins_findings_and_exit(self, tmp_path):
        r = align(RECORD, CAPTURE, draft_config=_specforge(tmp_path, [3, 7, 10]), engine="sglang")
        assert r.exit_code == 1 and "serving-mismatch" in {f.code for f in r.findings}
        assert "MISMATCH" in r.to_text() and r.to_dict()["serving"]["fix"]["ids"] == [2, 6, 9]

    @pytest.mark.parametrize("kwargs", [{"draft_config": "x.json"}, {"engine_version": "0.5.12"},
                                        {"model_type": "llama"}])
    def test_options_without_engine_rejected(self, kwargs):
        with pytest.raises(ForensicsError, match="without an engine"):
            align(RECORD, CAPTURE, **kwargs)


class TestCli:
    """eagleforensics align --draft-config/--engine: verdict, exit code, JSON, bad combos."""

    def test_match_exit_0(self, tmp_path):
        res = _cli("--draft-config", _specforge(tmp_path, [2, 6, 9]), "--engine", "sglang")
        assert res.exit_code == 0 and "MATCH" in res.output and "MISMATCH" not in res.output

    def test_one_off_exit_1_with_fix(self, tmp_path):
        res = _cli("--draft-config", _specforge(tmp_path, [3, 7, 10]), "--engine", "sglang")
        assert res.exit_code == 1
        assert '{"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}}' in res.output

    def test_speculators_on_sglang_exit_1(self, tmp_path):
        res = _cli("--draft-config", _speculators(tmp_path, [3, 7, 10]), "--engine", "sglang")
        assert res.exit_code == 1 and "top-level-ignored" in res.output and "[2, 6, 9]" in res.output

    def test_vllm_and_trtllm_match(self, tmp_path):
        assert _cli("--draft-config", _speculators(tmp_path, [3, 7, 10]), "--engine", "vllm").exit_code == 0
        assert _cli("--draft-config", _trtllm_yaml(tmp_path, [2, 6, 9]), "--engine", "trtllm").exit_code == 0

    def test_json_has_serving(self, tmp_path):
        res = _cli("--draft-config", _specforge(tmp_path, [3, 7, 10]), "--engine", "sglang",
                   "--engine-version", "0.5.12", "--json")
        serving = json.loads(res.output)["serving"]
        assert res.exit_code == 1 and serving["status"] == "mismatch" and serving["version"] == "0.5.12"
        assert serving["positions_served"] == ["p4", "p8", "p11"]
        assert serving["positions_trained"] == ["p3", "p7", "p10"]
        assert serving["fix"]["key"] == NESTED_KEY and serving["fix"]["ids"] == [2, 6, 9]

    def test_engine_alone_judges_default(self):
        res = _cli("--engine", "vllm")
        assert res.exit_code == 1 and "engine default" in res.output
        assert '{"eagle_aux_hidden_state_layer_ids": [3, 7, 10]}' in res.output

    @pytest.mark.parametrize("args", [["--draft-config", "cfg"], ["--engine-version", "0.5.12"],
                                      ["--engine", "sglang", "--model-type", "nosuch"],
                                      ["--engine", "sglang", "--draft-config", "missing_dir"]])
    def test_bad_combos_one_line_exit_2(self, tmp_path, args):
        res = _cli(*[str(tmp_path / a) if a in ("cfg", "missing_dir") else a for a in args])
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
        assert res.stderr.startswith("eagleforensics: error:") and "Traceback" not in res.output

    def test_yaml_for_sglang_exit_2(self, tmp_path):
        res = _cli("--draft-config", _trtllm_yaml(tmp_path, [2, 6, 9]), "--engine", "sglang")
        assert res.exit_code == 2 and "only read by --engine trtllm" in res.stderr
