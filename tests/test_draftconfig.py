"""Tests for eagleforensics.engines.draftconfig and the ``config`` command, on configs written as producers write them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from eagleforensics.cli.config import config as config_cmd
from eagleforensics.engines.draftconfig import NESTED_KEY, TOP_KEY, YAML_KEY, audit_config
from eagleforensics.errors import ForensicsError
from eagleforensics.positions import Position

from .drafts import specforge_draft as _specforge
from .drafts import speculators_draft as _speculators
from .drafts import trtllm_yaml as _trtllm_yaml


def _target(tmp: Path, n: int, model_type: str, nested: bool = False) -> Path:
    """A target model dir; ``nested`` puts the text model under text_config (Kimi-K2.5 style)."""
    d = tmp / f"target_{model_type}"
    d.mkdir()
    text = {"num_hidden_layers": n, "model_type": model_type, "hidden_size": 7168}
    cfg = {"model_type": "kimi_k25", "text_config": text} if nested else text
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _codes(audit) -> set[str]:
    return {f.code for f in audit.findings}


def _ps(audit) -> list[int | None]:
    return [q.p if q is not None else None for q in audit.positions]


# --- done-when cases ------------------------------------------------------------------------------

def test_deepseek_n61_positions_move_across_sglang_0_5_13(tmp_path):
    """N=61 deepseek_v3 [2,30,58]: p 3,31,59 on SGLang 0.5.12, p 2,30,58 on 0.5.13."""
    draft = _specforge(tmp_path, [2, 30, 58])
    target = _target(tmp_path, 61, "deepseek_v3")
    old = audit_config(draft, "sglang", engine_version="0.5.12", target_path=target)
    new = audit_config(draft, "sglang", engine_version="0.5.13", target_path=target)
    assert (old.num_layers, old.model_type, old.key_read) == (61, "deepseek_v3", NESTED_KEY)
    assert _ps(old) == [3, 31, 59] and old.rule == "sglang 0.5.12 deepseek"
    assert _ps(new) == [2, 30, 58] and new.rule == "sglang 0.5.13 deepseek"
    assert "version-dependent" in _codes(old) and not old.has_warnings
    rows = {r["versions"]: r["served"] for r in old.by_version}
    assert rows == {"0.4.10 - 0.5.4.post1": [], "0.5.4.post2 - 0.5.12.post1": ["p3", "p31", "p59"],
                    ">= 0.5.13": ["p2", "p30", "p58"]}


def test_deepseek_without_version_warns(tmp_path):
    """Unknown SGLang version + DeepSeek ids whose meaning changes at 0.5.13: a warning."""
    audit = audit_config(_specforge(tmp_path, [2, 30, 58]), "sglang",
                         model_type="deepseek_v3", num_layers=61)
    f = [f for f in audit.findings if f.code == "version-dependent"][0]
    assert f.severity == "warning" and "p3" in f.message and "p2" in f.message


def test_deepseek_ids_starting_with_one_are_version_stable(tmp_path):
    """[1,29,57] means p 2,30,58 on both sides of 0.5.13: only 'no capture before 0.5.4.post2'."""
    audit = audit_config(_specforge(tmp_path, [1, 29, 57]), "sglang",
                         model_type="kimi_k2", num_layers=61)
    assert _ps(audit) == [2, 30, 58]
    f = [f for f in audit.findings if f.code == "version-dependent"][0]
    assert f.severity == "info" and "no EAGLE-3 capture" in f.message


def test_kimi_target_with_text_config(tmp_path):
    """N and model_type are read from a nested text_config (multimodal wrapper)."""
    audit = audit_config(_specforge(tmp_path, [2, 30, 58]), "sglang", engine_version="0.5.12",
                         target_path=_target(tmp_path, 61, "deepseek_v3", nested=True))
    assert (audit.num_layers, audit.model_type) == (61, "deepseek_v3")
    assert _ps(audit) == [3, 31, 59]


@pytest.mark.parametrize("engine,version,first,code", [
    ("sglang", "0.5.21", None, "negative-id"),  # Llama: index 0 meets residual None and raises
    ("sglang", "0.5.22", Position(0), None),    # Llama from 0.5.22: -1 -> embedding
    ("vllm", None, None, "negative-id"),        # vLLM never matches -1
    ("trtllm", None, Position(32, normed=True), None),  # post-norm final, concatenated FIRST
])
def test_minus_one_per_engine_and_version(tmp_path, engine, version, first, code):
    """[-1,2,30]: what -1 reaches depends on the engine and version (docs/conventions.md)."""
    if engine == "trtllm":
        draft = _trtllm_yaml(tmp_path, [-1, 2, 30])
    elif engine == "vllm":
        draft = _speculators(tmp_path, [-1, 2, 30])
    else:
        draft = _specforge(tmp_path, [-1, 2, 30])
    audit = audit_config(draft, engine, model_type="llama", num_layers=32, engine_version=version)
    assert audit.ids_read == [-1, 2, 30] and audit.positions[0] == first
    if code is not None:
        assert [f.severity for f in audit.findings if f.code == code] == ["warning"]
    if engine == "trtllm":
        assert [q.label for q in audit.served] == ["p32 post-norm", "p3", "p31"]
        assert "order-differs" not in _codes(audit)  # one-model: -1 first, as listed


def test_a_qwen_moe_id_below_minus_one_counts_from_the_end(tmp_path):
    """SGLang 0.5.4.post2 marks self.layers[id + 1] on Qwen-MoE: id -2 is layer N-1's input (p N-1), said as a
    warning; on 0.5.4.post1 (and on Llama) it captures nothing."""
    draft = _specforge(tmp_path, [-2, 2, 30])
    new = audit_config(draft, "sglang", model_type="qwen3_moe", num_layers=48, engine_version="0.5.4.post2")
    assert new.positions[0] == Position(47)
    assert any(f.code == "negative-id" and "counted from the end" in f.message for f in new.findings)
    old = audit_config(draft, "sglang", model_type="qwen3_moe", num_layers=48, engine_version="0.5.4.post1")
    assert old.positions[0] is None and "negative-id" in _codes(old)


def test_speculators_top_level_ignored_by_sglang_read_by_vllm(tmp_path):
    """Top-level ids: SGLang falls back to its default (flagged); vLLM reads them (p=k)."""
    draft = _speculators(tmp_path, [2, 16, 29, 32])
    sgl = audit_config(draft, "sglang", model_type="llama", num_layers=32)
    assert sgl.ids_read is None and {"top-level-ignored", "default-fallback"} <= _codes(sgl)
    assert _ps(sgl) == [2, 16, 29]
    vll = audit_config(draft, "vllm", model_type="llama", num_layers=32, engine_version="0.33.0")
    assert vll.key_read == TOP_KEY and vll.ids_read == [2, 16, 29, 32]
    assert _ps(vll) == [2, 16, 29, 32] and not vll.has_warnings
    # before 0.18.0 id N captured nothing: without a version that is a warning
    assert "version-dependent" in {f.code for f in audit_config(
        draft, "vllm", model_type="llama", num_layers=32).findings if f.severity == "warning"}


# --- other traps ----------------------------------------------------------------------------------

def test_keys_disagree(tmp_path):
    """Both keys with different lists: SGLang reads nested, vLLM reads top-level."""
    draft = _specforge(tmp_path, [1, 15, 28], eagle_aux_hidden_state_layer_ids=[2, 16, 29])
    sgl = audit_config(draft, "sglang", num_layers=32)
    vll = audit_config(draft, "vllm", num_layers=32)
    assert sgl.ids_read == [1, 15, 28] and vll.ids_read == [2, 16, 29]
    assert _ps(sgl) == _ps(vll) == [2, 16, 29]
    assert "keys-disagree" in _codes(sgl) and "keys-disagree" in _codes(vll)
    assert "model-type-assumed" in _codes(sgl)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_no_ids_falls_back_to_default(tmp_path, engine):
    """No ids anywhere: the engine silently uses its default positions [2, N//2, N-3]."""
    audit = audit_config(_specforge(tmp_path, None), engine, num_layers=32)
    assert audit.ids_read is None and "default-fallback" in _codes(audit)
    assert _ps(audit) == [2, 16, 29]


def test_trtllm_ignores_draft_json(tmp_path):
    """TRT-LLM reads only the YAML: ids in config.json are ignored; hint gives the YAML ids."""
    audit = audit_config(_specforge(tmp_path, [2, 16, 29]), "trtllm", num_layers=32)
    assert {"draft-ids-ignored", "default-fallback"} <= _codes(audit)
    assert _ps(audit) == [2, 16, 29]
    assert "[2, 16, 29]" in [f for f in audit.findings if f.code == "draft-ids-ignored"][0].message


def test_trtllm_yaml_read(tmp_path):
    """TRT-LLM YAML ids: id k -> p=k+1, no warning when ascending and in range."""
    audit = audit_config(_trtllm_yaml(tmp_path, [1, 15, 28]), "trtllm", num_layers=32)
    assert audit.key_read == YAML_KEY and _ps(audit) == [2, 16, 29] and not audit.has_warnings


def test_sglang_last_layer_id_captures_nothing(tmp_path):
    """SGLang Llama id N-1 (p=N) captures nothing: flagged with the reason."""
    audit = audit_config(_specforge(tmp_path, [1, 15, 31]), "sglang",
                         model_type="qwen3", num_layers=32)
    assert audit.positions[2] is None
    f = [f for f in audit.findings if f.code == "id-captures-nothing"][0]
    assert "never reaches" in f.message


def test_descending_and_duplicate_ids(tmp_path):
    """Listed order differs from the ascending concatenation; duplicates capture once."""
    audit = audit_config(_speculators(tmp_path, [29, 2, 16]), "vllm", num_layers=32)
    assert "order-differs" in _codes(audit)
    dup = audit_config(_speculators(tmp_path, [2, 2, 16], name="dup"), "vllm", num_layers=32)
    assert "duplicate-id" in _codes(dup)


def test_fc_width_mismatch(tmp_path):
    """A drafter whose fc takes 3 x H features, served with 4 ids: flagged (vLLM #54526)."""
    draft = _speculators(tmp_path, [2, 16, 29, 32])
    cfg = json.loads((draft / "config.json").read_text())
    cfg["transformer_layer_config"]["hidden_size"] = 16
    (draft / "config.json").write_text(json.dumps(cfg))
    save_file({"fc.weight": torch.zeros(16, 3 * 16)}, str(draft / "model.safetensors"))
    audit = audit_config(draft, "vllm", num_layers=32)
    assert "fc-width-mismatch" in _codes(audit)
    ok = audit_config(draft, "sglang", num_layers=32)  # default: 3 states, matches
    assert "fc-width-mismatch" not in _codes(ok)


def test_no_width_info_skips_the_check(tmp_path):
    """Without weights there is nothing to compare: no width finding."""
    audit = audit_config(_speculators(tmp_path, [2, 16, 29, 32]), "vllm", num_layers=32)
    assert "fc-width-mismatch" not in _codes(audit)


# --- malformed input --------------------------------------------------------------------------

@pytest.mark.parametrize("text,match", [
    ("{not json", "bad JSON"),
    ("[1, 2]", "mapping"),
    ('{"eagle_aux_hidden_state_layer_ids": [1, "2"]}', "list of integers"),
    ('{"eagle_aux_hidden_state_layer_ids": 3}', "list of integers"),
    ('{"eagle_config": [1, 2]}', "must be a mapping"),
])
def test_malformed_draft_json(tmp_path, text, match):
    """Each malformed draft is a ForensicsError naming the file and the problem."""
    p = tmp_path / "config.json"
    p.write_text(text)
    with pytest.raises(ForensicsError, match=match) as err:
        audit_config(p, "vllm", num_layers=32)
    assert err.value.path == str(p)


def test_malformed_yaml_and_wrong_engine(tmp_path):
    """Bad YAML, or a TRT-LLM YAML given to another engine, is a ForensicsError."""
    p = tmp_path / "bad.yaml"
    p.write_text("speculative_config: [unclosed\n")
    with pytest.raises(ForensicsError, match="bad YAML"):
        audit_config(p, "trtllm", num_layers=32)
    with pytest.raises(ForensicsError, match="only read by --engine trtllm"):
        audit_config(_trtllm_yaml(tmp_path, [1, 2, 3]), "sglang", num_layers=32)


def test_missing_layers_and_missing_file(tmp_path):
    """No N anywhere, or no config file at all: errors that say what to pass."""
    with pytest.raises(ForensicsError, match="--num-layers"):
        audit_config(_specforge(tmp_path, [1, 2, 3]), "sglang")
    with pytest.raises(ForensicsError, match="no such file"):
        audit_config(tmp_path / "nowhere", "sglang", num_layers=32)
    bad_target = tmp_path / "t"
    bad_target.mkdir()
    (bad_target / "config.json").write_text('{"num_hidden_layers": "61"}')
    with pytest.raises(ForensicsError, match="positive integer"):
        audit_config(_specforge(tmp_path, [1, 2, 3], name="d2"), "vllm", target_path=bad_target)


# --- CLI ------------------------------------------------------------------------------------------

def test_cli_table_and_exit_codes(tmp_path):
    """Clean config exits 0 with a table; a warning exits 1."""
    runner = CliRunner()
    ok = runner.invoke(config_cmd, [str(_speculators(tmp_path, [2, 16, 29])), "--engine", "vllm",
                                    "--num-layers", "32"])
    assert ok.exit_code == 0, ok.output
    assert "p16" in ok.output and "ok: no warnings" in ok.output
    warn = runner.invoke(config_cmd, [str(_specforge(tmp_path, [2, 30, 58])), "--engine", "sglang",
                                      "--model-type", "deepseek_v3", "--num-layers", "61"])
    assert warn.exit_code == 1 and "[version-dependent]" in warn.output


def test_cli_json(tmp_path):
    """--json prints one JSON object carrying ids, positions and findings."""
    res = CliRunner().invoke(config_cmd, [str(_specforge(tmp_path, [2, 30, 58])), "--engine",
                                          "sglang", "--engine-version", "0.5.12",
                                          "--target", str(_target(tmp_path, 61, "deepseek_v3")),
                                          "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert [q["p"] for q in data["positions"]] == [3, 31, 59]
    assert data["rule"] == "sglang 0.5.12 deepseek" and data["ok"] is True
    assert data["version_assumed"] is False and len(data["by_version"]) == 3


def test_cli_bad_input_exits_2_with_one_line(tmp_path):
    """Bad input prints one 'eagleforensics: error:' line and exits 2."""
    p = tmp_path / "config.json"
    p.write_text("{oops")
    res = CliRunner().invoke(config_cmd, [str(p), "--engine", "vllm", "--num-layers", "32"])
    assert res.exit_code == 2
    err = [line for line in res.output.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("eagleforensics: error:") and str(p) in err[0]
