"""The align and capture commands: readable table, JSON contract, exit codes 0/1/2."""
from __future__ import annotations

import json

import numpy as np
import torch
from click.testing import CliRunner

from eagleforensics.cli import main

from .realdata import SAMPLES, N, _model, forward


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_table_names_positions_and_engine_ids():
    res = invoke("align", str(SAMPLES / "record_layer_outputs.pt"), str(SAMPLES / "capture.pt"))
    assert res.exit_code == 1, res.output  # ACTION: placed, but not at the engines' default layers
    assert "VERDICT: ACTION: all 4 slots placed" in res.output
    assert "output of layer 2 (p=3" in res.output
    assert "final state after the norm (p=12)" in res.output
    assert "sglang                     [2, 6, 9]" in res.output


def test_json_contract_for_every_slot():
    res = invoke("align", "--json", str(SAMPLES / "record_wrong_fix.pt"), str(SAMPLES / "capture.pt"))
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert [(m["key"], m["index"], m["position"], m["post_norm"], m["confident"]) for m in doc["mapping"]] == [
        ("hidden_states", 0, 0, False, True), ("hidden_states", 1, 2, False, True),
        ("hidden_states", 2, 6, False, True), ("hidden_states", 3, 12, True, True)]
    assert doc["engine_ids"]["vllm"] == [0, 2, 6] and doc["engine_ids"]["trtllm"] is None
    assert any(f["code"] == "embedding-included" and f["severity"] == "error" for f in doc["findings"])


def test_unmatched_slot_exits_1_and_says_no_confident_match(tmp_path):
    run, other = forward("llama", model_seed=0), forward("llama", model_seed=3)
    torch.save({"hidden_states": list(run.hs), "input_ids": run.ids.clone()}, tmp_path / "cap.pt")
    torch.save({"hidden_states": [other.p(2), other.hs[N]], "input_ids": other.ids.clone()}, tmp_path / "rec.pt")
    res = invoke("align", str(tmp_path / "rec.pt"), str(tmp_path / "cap.pt"))
    assert res.exit_code == 1
    assert "no confident match" in res.output.lower()


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    res = invoke("align", str(tmp_path / "missing.pt"), str(SAMPLES / "capture.pt"))
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing.pt" in lines[0] and "Traceback" not in res.output


def test_hidden_size_mismatch_names_the_file(tmp_path):
    run = forward("llama")  # H = 64; the samples have H = 128
    torch.save({"hidden_states": [run.p(2), run.hs[N]]}, tmp_path / "small.pt")
    res = invoke("align", str(tmp_path / "small.pt"), str(SAMPLES / "capture.pt"))
    assert res.exit_code == 2
    assert "small.pt" in res.stderr and "hidden size 128" in res.stderr


def test_unknown_option_value_is_a_usage_error():
    res = invoke("align", "--capture-convention", "tgi", str(SAMPLES / "data_0.ckpt"), str(SAMPLES / "capture.pt"))
    assert res.exit_code == 2


def test_min_score_override_is_applied():
    res = invoke("align", "--json", "--min-score", "0.5", str(SAMPLES / "data_0.ckpt"), str(SAMPLES / "capture.pt"))
    assert json.loads(res.stdout)["thresholds"]["min_score"] == 0.5


def test_capture_command_writes_a_full_sweep_from_a_local_model_dir(tmp_path):
    model = _model("llama", 0)
    model.save_pretrained(tmp_path / "model")
    run = forward("llama")
    ids = ",".join(str(int(i)) for i in run.ids)
    out = tmp_path / "out" / "sweep.safetensors"
    res = invoke("capture", str(tmp_path / "model"), "--input-ids", ids, "-o", str(out))
    assert res.exit_code == 0, res.output
    from eagleforensics.io.capture import load_capture
    from eagleforensics.positions import Position

    cap = load_capture(out)
    assert cap.num_layers == N and np.array_equal(cap.input_ids, run.ids.numpy())
    np.testing.assert_allclose(cap.read(Position(N)), run.raw_last.numpy(), atol=1e-5)
    np.testing.assert_allclose(cap.read(Position(N, True)), run.hs[N].numpy(), atol=1e-5)


def test_capture_command_needs_a_prompt_or_ids(tmp_path):
    res = invoke("capture", str(tmp_path), "-o", str(tmp_path / "x.safetensors"))
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
