"""Right code, right explanation: the converter's head, ModelOpt's export RoPE, vLLM 0.29.0's runner under PP.

Each fact is read from the released wheel (cited in the finding's source): speculators 0.9.0's converter keeps the
source checkpoint's lm_head; nvidia-modelopt 0.47.0 injects YaRN x32 at export (``eagle_export_rope_scaling``);
vLLM 0.29.0 runs EAGLE-3 with pipeline parallelism on the V1 runner and logs the fallback.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.doctor import diagnose
from eagleforensics.testing.defects import DEFECTS, SAMPLES, edit_config, edit_weights, plant, vllm_log


def _finding(report, code: str):  # noqa: ANN001, ANN202
    return next(r.finding for r in report.findings if r.finding.code == code)


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A SpecForge drafter rewritten in speculators' layout, as speculators' converter writes it (its own head)."""
    return plant(next(d for d in DEFECTS if d.name == "lm-head-not-target"), tmp_path_factory.mktemp("conv"))


def test_a_converted_drafters_head_is_not_said_to_be_learned_against_the_targets(converted) -> None:  # noqa: ANN001
    report = diagnose(DoctorInputs(drafter=str(converted.drafter), target=str(converted.target)))
    f = _finding(report, "lm-head-not-target")
    assert "learned against the target's head" not in f.message
    assert "converter" in f.message and "speculators 0.9.0" in f.source and f.severity == "warning"


def test_a_trained_speculators_drafter_with_another_head_is_still_an_error(converted, tmp_path: Path) -> None:  # noqa: ANN001
    """speculators' trainer saves its frozen embed_tokens beside lm_head = target rows: another head is a defect."""
    d = tmp_path / "drafter"
    shutil.copytree(converted.drafter, d)
    index = (converted.target / "model.safetensors.index.json").read_text()
    import json

    shard = json.loads(index)["weight_map"]["model.embed_tokens.weight"]
    embed = load_file(str(converted.target / shard))["model.embed_tokens.weight"]
    edit_weights(d, lambda w: {**w, "embed_tokens.weight": embed.to(torch.bfloat16).clone()})
    report = diagnose(DoctorInputs(drafter=str(d), target=str(converted.target)))
    f = _finding(report, "lm-head-not-target")
    assert f.severity == "error" and "learned against the target's head" in f.message


def test_modelopts_default_export_rope_is_not_called_a_conversion_mistake(tmp_path: Path) -> None:
    d = tmp_path / "drafter"
    shutil.copytree(SAMPLES / "drafter", d)
    edit_config(d, rope_scaling={"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 2048},
                eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 6, 9], "use_aux_hidden_state": True,
                              "use_input_layernorm_in_first_layer": True, "use_last_layernorm": False,
                              "use_mtp_layernorm": False, "next_layer_regular": True, "parallel_draft_step": 1,
                              "parallel_draft_heads_num_layers": 1})
    report = diagnose(DoctorInputs(drafter=str(d), target=str(SAMPLES / "target")))
    f = _finding(report, "rope-mismatch")
    assert "export or conversion mistake" not in f.message and "eagle_export_rope_scaling" in f.message
    assert "nvidia-modelopt 0.47.0" in f.source and "eagle_export_rope_scaling" in f.fix


def test_another_rope_on_a_specforge_drafter_keeps_its_explanation(tmp_path: Path) -> None:
    d = tmp_path / "drafter"
    shutil.copytree(SAMPLES / "drafter", d)
    edit_config(d, rope_scaling={"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 2048})
    f = _finding(diagnose(DoctorInputs(drafter=str(d), target=str(SAMPLES / "target"))), "rope-mismatch")
    assert "export or conversion mistake" in f.message


@pytest.mark.parametrize("fallback_line", [False, True])
def test_vllm_0_29_with_pp_runs_the_v1_runner_not_an_assumed_v2(tmp_path: Path, fallback_line: bool) -> None:
    spec = {"method": "eagle3", "model": str(SAMPLES / "drafter"), "num_speculative_tokens": 3}
    log = vllm_log(tmp_path / "server.log", "0.29.0", SAMPLES / "target", spec, pipeline_parallel_size=2)
    if fallback_line:  # what vllm 0.29.0 config/vllm.py use_v2_model_runner logs
        with log.open("a") as fh:
            fh.write("WARNING 11-29 12:58:01 [vllm.py:667] Model Runner V2 does not yet support EAGLE3 with pipeline "
                     "parallelism; using the V1 model runner instead.\n")
    report = diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter"), target=str(SAMPLES / "target"), log=str(log)))
    f = _finding(report, "pp-drops-aux")
    assert "v2 runner" not in f.message and "(v1 runner)" in f.message
    assert ("the log says" in f.message) == fallback_line
    assert "vllm 0.29.0 vllm/config/vllm.py" in f.message or fallback_line
