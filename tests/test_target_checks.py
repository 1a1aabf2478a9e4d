"""The target-side causes of issue 34, each planted into real tiny targets and checked against clean controls.

Targets are real transformers models (``testing.tinymodels``: Llama, Qwen3, DeepSeek-V3 shapes,
seeds 1-3) exported with their safetensors (``testing.drafterbuild.export_target``); each defect is
a config edit the public threads describe (an FP8 or rotated export, MTP layers declared but not
stored, a hybrid or multimodal layout, a speculators verifier for another model, a one-record
dataset). Every planted case must raise its code at the severity the engine rule gives; every
clean control, and every near miss (an FP8 target where the drafter keeps its precision, sliding
window layer types, QuIP's in-layer transforms, stored MTP layers), must flag nothing.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.checks.datasize import FEW_RECORDS
from eagleforensics.checks.registry import get_check
from eagleforensics.checks.verifier import short_name
from eagleforensics.doctor import diagnose
from eagleforensics.testing.defects import FP8_CONFIG, SAMPLES, SPINQUANT_R1, edit_config, sglang_log, vllm_log

MINE = ("target-quantized", "target-rotated", "mtp-weights", "hybrid-target", "multimodal-target", "verifier")
ARCH = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}
FAMILIES = tuple(ARCH)
SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Path]:
    """A real exported target per family and seed, with the ``architectures`` a real export writes."""
    from eagleforensics.testing.drafterbuild import export_target
    from eagleforensics.testing.tinymodels import build_model

    root = tmp_path_factory.mktemp("targets")
    out = {}
    for family in FAMILIES:
        for seed in SEEDS:
            t = export_target(build_model(family, num_layers=4, seed=seed), root / f"{family}-{seed}" / "target")
            edit_config(t, architectures=[ARCH[family]])
            out[family, seed] = t
    return out


def _copy(target: Path, tmp: Path, name: str = "target") -> Path:
    dst = tmp / name
    shutil.copytree(target, dst)
    return dst


def _speculators_drafter(target: Path, out: Path, verifier: str, archs: list[str] | None) -> Path:
    """A speculators-layout draft config naming its verifier (only the config: the verifier check reads no weight)."""
    out.mkdir(parents=True)
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.9.0",
           "transformer_layer_config": {"hidden_size": 64, "vocab_size": 512, "num_hidden_layers": 1},
           "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": verifier,
                                                                      **({"architectures": archs} if archs else {})}}}
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _run(names: tuple[str, ...] = MINE, **inputs: object):  # noqa: ANN202
    return diagnose(DoctorInputs(**inputs), checks=[get_check(n) for n in names], pipelines=())


def _codes(report, severity: tuple[str, ...] = ("error", "warning")) -> list[tuple[str, str]]:  # noqa: ANN001
    return [(r.finding.code, r.finding.severity) for r in report.findings if r.finding.severity in severity]


# ---------------------------------------------------------------- clean controls: 3 families x 3 seeds
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", SEEDS)
def test_clean_targets_raise_nothing_on_any_engine(targets: dict, tmp_path: Path, family: str, seed: int) -> None:
    t = targets[family, seed]
    drafter = _speculators_drafter(t, tmp_path / "drafter", f"org/{t.name}", [ARCH[family]])
    for engine, version in ((None, None), ("vllm", "0.11.0"), ("vllm", "0.33.0"), ("sglang", "0.5.23")):
        report = _run(target=str(t), draft_config=str(drafter / "config.json"), engine=engine, engine_version=version)
        assert _codes(report) == [], report.to_text()
        rows = {o.name: o.status for o in report.outcomes}
        assert all(rows[n] in ("clean", "found") for n in MINE), rows
    # DeepSeek-V3 declares one MTP layer its tiny export does not store: beside an EAGLE-3 drafter that is info
    report = _run(target=str(t), drafter=str(SAMPLES / "drafter"))
    mtp = [f for f in report.findings if f.finding.code == "mtp-weights-missing"]
    assert [f.finding.severity for f in mtp] == (["info"] if family == "deepseek_v3" else [])


# ---------------------------------------------------------------- planted, on every family and seed
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", SEEDS)
def test_each_target_defect_is_found_on_every_family(targets: dict, tmp_path: Path, family: str, seed: int) -> None:
    base = targets[family, seed]
    # FP8 on vLLM 0.11.0: the drafter is built with the target's quant config (warning); 0.11.1 and later: info
    t = _copy(base, tmp_path, "fp8")
    edit_config(t, quantization_config=FP8_CONFIG)
    assert _codes(_run(("target-quantized",), target=str(t), engine="vllm", engine_version="0.11.0")) == [
        ("target-quantized", "warning")]
    for version in ("0.10.1.1", "0.11.1", "0.33.0"):
        r = _run(("target-quantized",), target=str(t), engine="vllm", engine_version=version)
        assert _codes(r, ("error", "warning", "info")) == [("target-quantized", "info")], r.to_text()
    # SpinQuant R1: warning without an engine, error on an engine that does not fold it
    t = _copy(base, tmp_path, "rot")
    edit_config(t, quantization_config={**FP8_CONFIG, "transform_config": SPINQUANT_R1})
    assert _codes(_run(("target-rotated",), target=str(t))) == [("target-rotated", "warning")]
    assert _codes(_run(("target-rotated",), target=str(t), engine="sglang")) == [("target-rotated", "error")]
    # MTP declared, nothing stored: a warning without a drafter or log
    t = _copy(base, tmp_path, "mtp")
    edit_config(t, num_nextn_predict_layers=1)
    assert _codes(_run(("mtp-weights",), target=str(t))) == [("mtp-weights-missing", "warning")]
    # a hybrid layout on SGLang 0.5.23 (no EAGLE-3 capture for NemotronH), a VL target likewise
    t = _copy(base, tmp_path, "hyb")
    edit_config(t, architectures=["NemotronHForCausalLM"], hybrid_override_pattern="M-M*")
    assert _codes(_run(("hybrid-target",), target=str(t), engine="sglang")) == [("hybrid-target", "error")]
    t = _copy(base, tmp_path, "vl")
    edit_config(t, architectures=["Qwen2VLForConditionalGeneration"], vision_config={"depth": 2})
    assert _codes(_run(("multimodal-target",), target=str(t), engine="sglang")) == [("multimodal-target", "error")]
    # a speculators drafter whose verifier is another architecture
    d = _speculators_drafter(base, tmp_path / "other", "Qwen/Qwen2.5-7B-Instruct", ["Qwen2ForCausalLM"])
    assert _codes(_run(("verifier",), target=str(base), draft_config=str(d / "config.json"))) == [
        ("verifier-mismatch", "warning")]


# ---------------------------------------------------------------- near misses and the rules, case by case
def test_an_mtp_layer_stored_is_clean_and_the_launch_decides_the_severity(targets: dict, tmp_path: Path) -> None:
    from safetensors.numpy import save_file
    import numpy as np

    t = _copy(targets["deepseek_v3", 1], tmp_path)
    n = json.loads((t / "config.json").read_text())["num_hidden_layers"]
    log = sglang_log(tmp_path / "nextn.log", t, t, speculative_algorithm="EAGLE")  # how SGLang logs NEXTN
    r = _run(("mtp-weights",), target=str(t), log=str(log))
    assert _codes(r) == [("mtp-weights-missing", "error")] and "accept length 1.00" in r.findings[0].finding.message
    vlog = vllm_log(tmp_path / "v.log", "0.14.0", t, {"method": "eagle3", "model": "d", "num_speculative_tokens": 3})
    assert _codes(_run(("mtp-weights",), target=str(t), log=str(vlog)), ("error", "warning", "info")) == [
        ("mtp-weights-missing", "info")]
    index = json.loads((t / "model.safetensors.index.json").read_text())
    save_file({f"model.layers.{n}.eh_proj.weight": np.zeros((4, 8), np.float32)}, str(t / "mtp.safetensors"))
    index["weight_map"][f"model.layers.{n}.eh_proj.weight"] = "mtp.safetensors"
    (t / "model.safetensors.index.json").write_text(json.dumps(index))
    r = _run(("mtp-weights",), target=str(t))
    assert _codes(r, ("error", "warning", "info")) == [] and r.outcomes[0].data["mtp_tensors"] == 1


def test_a_config_only_target_is_not_run_for_mtp_and_read_by_the_rest(tmp_path: Path) -> None:
    t = tmp_path / "target"
    t.mkdir()
    (t / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                                               "num_hidden_layers": 61, "num_nextn_predict_layers": 1,
                                               "quantization_config": {"quant_method": "fp8",
                                                                       "weight_block_size": [128, 128]}}))
    r = _run(target=str(t))
    rows = {o.name: o for o in r.outcomes}
    assert rows["mtp-weights"].status == "not-run" and "shard index" in rows["mtp-weights"].reason
    assert rows["target-quantized"].status == "clean" and r.exit_code == 0
    assert [f.finding.code for f in r.findings] == ["target-quantized"]


def test_sglang_quantizes_the_drafter_only_when_the_launch_passes_quantization(targets: dict, tmp_path: Path) -> None:
    t = _copy(targets["llama", 1], tmp_path)
    edit_config(t, quantization_config=FP8_CONFIG)
    d = SAMPLES / "drafter"
    for fields, want in (({"quantization": "fp8"}, "warning"), ({}, "info"),
                         ({"quantization": "fp8", "speculative_draft_model_quantization": "unquant"}, "info")):
        log = sglang_log(tmp_path / "s.log", t, d, **fields)
        r = _run(("target-quantized",), target=str(t), log=str(log))
        assert _codes(r, ("error", "warning", "info")) == [("target-quantized", want)], (fields, r.to_text())
    r = _run(("target-quantized",), target=str(t), engine="sglang")  # no log: the launch is not known
    assert _codes(r, ("error", "warning", "info")) == [("target-quantized", "info")]
    assert "--log" in r.findings[0].finding.message


def test_a_modelopt_side_file_is_read_when_the_config_has_no_quantization(tmp_path: Path) -> None:
    t = _copy(SAMPLES / "target", tmp_path)
    (t / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.37.0"},
                                                        "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                                         "exclude_modules": ["lm_head"]}}))
    r = _run(("target-quantized",), target=str(t), engine="vllm", engine_version="0.11.0")
    assert _codes(r) == [("target-quantized", "warning")]
    assert "modelopt (NVFP4)" in r.findings[0].finding.message and "lm_head among them" in r.findings[0].finding.message


def test_in_layer_transforms_and_modelslim_rotations(targets: dict, tmp_path: Path) -> None:
    quip = {"config_groups": {"v": {"type": "hadamard", "apply": [
        {"targets": ["Linear"], "location": "input", "ignore": "lm_head"},
        {"targets": ["Linear"], "location": "weight_input", "inverse": True, "ignore": "lm_head"}]}}}
    t = _copy(targets["qwen3", 2], tmp_path, "quip")
    edit_config(t, quantization_config={**FP8_CONFIG, "transform_config": quip})
    r = _run(("target-rotated",), target=str(t), engine="vllm")
    assert _codes(r, ("error", "warning", "info")) == [("target-rotated", "info")]
    t = _copy(targets["qwen3", 2], tmp_path, "slim")
    (t / "quant_model_description.json").write_text(json.dumps({"model_quant_type": "W8A8", "optional": {
        "quarot": {"rotation_path": "rotation.safetensors"}}}))
    r = _run(("target-rotated",), target=str(t), engine="vllm", engine_version="0.33.0")
    assert _codes(r) == [("target-rotated", "error")]
    assert "quant_model_description.json" in r.findings[0].finding.message


def test_layouts_that_are_not_hybrid_or_multimodal(targets: dict, tmp_path: Path) -> None:
    t = _copy(targets["qwen3", 3], tmp_path, "swa")
    edit_config(t, layer_types=["sliding_attention", "full_attention"] * 2, image_token_id=5)
    assert _codes(_run(("hybrid-target", "multimodal-target"), target=str(t)), ("error", "warning", "info")) == []
    t = _copy(targets["qwen3", 3], tmp_path, "next")
    edit_config(t, architectures=["Qwen3NextForCausalLM"],
                layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])
    for engine in ("vllm", "sglang", None):
        r = _run(("hybrid-target",), target=str(t), engine=engine)
        assert _codes(r, ("error", "warning", "info")) == [("hybrid-target", "info")]
        assert "3 of 4 layers are linear_attention" in r.findings[0].finding.message
        assert "no EAGLE-3 capture (raises at start) at 0.11.0 - 0.14.1" in r.findings[0].finding.message
    # issue 41: vLLM 0.11.0's qwen3_next.py class lacks SupportsEagle3, so the launch refuses; 0.25.0 captures it
    r = _run(("hybrid-target",), target=str(t), engine="vllm", engine_version="0.11.0")
    assert _codes(r) == [("hybrid-target", "error")]
    assert "vllm 0.11.0 vllm/model_executor/models/qwen3_next.py" in r.findings[0].finding.source
    r = _run(("hybrid-target",), target=str(t), engine="vllm", engine_version="0.25.0")
    assert _codes(r, ("error", "warning", "info")) == [("hybrid-target", "info")]
    r = _run(("hybrid-target",), target=str(t), engine="sglang", engine_version="0.5.8")
    assert _codes(r) == [("hybrid-target", "error")]
    r = _run(("hybrid-target",), target=str(t), engine="sglang", engine_version="0.5.9")
    assert _codes(r, ("error", "warning", "info")) == [("hybrid-target", "info")]
    # a release not read is said, never answered with a neighbour's row, even where every release read captures it
    r = _run(("hybrid-target",), target=str(t), engine="vllm", engine_version="0.30.0")
    assert _codes(r) == [("hybrid-target", "warning")]
    assert "vLLM 0.30.0: not read for this release" in r.findings[0].finding.message
    from eagleforensics.checks.targetkind import hybrid_layout

    assert hybrid_layout({"attn_type_list": [0, 0, 1, 0]})["layers"] == 3  # MiniMax's lightning attention
    assert hybrid_layout({"layer_types": ["conv", "full_attention"]})["kinds"] == ["conv"]  # LFM2
    assert hybrid_layout({"attn_type_list": [1, 1], "layer_types": ["sliding_attention"]}) is None
    r = _run(("hybrid-target",), target=str(t.parent / "swa"), engine="sglang", engine_version="0.5.12")
    assert _codes(r, ("error", "warning", "info")) == []
    t = _copy(targets["qwen3", 3], tmp_path, "nemo")
    edit_config(t, architectures=["NemotronHForCausalLM"], hybrid_override_pattern="M-M*")
    r = _run(("hybrid-target",), target=str(t), engine="sglang", engine_version="0.5.12")
    assert _codes(r) == [("hybrid-target", "error")]
    r = _run(("hybrid-target",), target=str(t), engine="sglang", engine_version="0.5.13")
    assert _codes(r) == [("hybrid-target", "warning")]
    assert "0.5.13: not read for this release" in r.findings[0].finding.message


def test_a_vl_target_on_vllm_0_11_0_is_refused_and_on_0_11_1_captured(targets: dict, tmp_path: Path) -> None:
    """vLLM 0.11.0's qwen2_5_vl.py class lacks SupportsEagle3 (the runner raises); 0.11.1's has it (issue 41)."""
    t = _copy(targets["qwen3", 1], tmp_path, "vl")
    edit_config(t, architectures=["Qwen2_5_VLForConditionalGeneration"], vision_config={"depth": 2})
    r = _run(("multimodal-target",), target=str(t), engine="vllm", engine_version="0.11.0")
    assert _codes(r) == [("multimodal-target", "error")]
    assert "vllm 0.11.0 vllm/model_executor/models/qwen2_5_vl.py" in r.findings[0].finding.source
    r = _run(("multimodal-target",), target=str(t), engine="vllm", engine_version="0.11.1")
    assert _codes(r, ("error", "warning", "info")) == [("multimodal-target", "info")]


def test_a_vl_target_on_an_engine_that_captures_it_is_info_and_reads_the_records(tmp_path: Path) -> None:
    t = _copy(SAMPLES / "target", tmp_path)
    cfg = json.loads((t / "config.json").read_text())
    edit_config(t, architectures=["Qwen2_5_VLForConditionalGeneration"], vision_config={"depth": 2},
                rope_parameters={**cfg["rope_parameters"], "mrope_section": [4, 6, 6]}, image_token_id=500)
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(SAMPLES / "data_0.ckpt", data / "data_0.ckpt")
    r = _run(("multimodal-target",), target=str(t), engine="vllm", train=str(data))
    assert _codes(r, ("error", "warning", "info")) == [("multimodal-target", "info")]
    row = r.outcomes[0]
    assert row.data["records_read"] == 1 and row.data["records_with_image_tokens"] == 0
    assert "trained on text only" in r.findings[0].finding.message
    from eagleforensics.io.training import load_training

    rec = load_training(str(data / "data_0.ckpt"))
    ids = [int(x) for x in rec.input_ids.reshape(-1)[:8]]
    served = tmp_path / "served.jsonl"
    text = {"messages": [{"role": "user", "content": "hi"}]}
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}},
                                                        {"type": "text", "text": "what is this?"}]}]}
    served.write_text(json.dumps(text) + "\n")
    r = _run(("multimodal-target",), target=str(t), engine="vllm", train=str(data), served_prompts=str(served))
    assert _codes(r, ("error", "warning", "info")) == [("multimodal-target", "info")]
    assert r.outcomes[0].data["served_with_media"] == 0
    served.write_text(json.dumps(text) + "\n" + json.dumps(image) + "\n")
    r = _run(("multimodal-target",), target=str(t), engine="vllm", train=str(data), served_prompts=str(served))
    assert _codes(r) == [("multimodal-target", "warning")] and "1 of 2 served requests" in r.findings[0].finding.message
    edit_config(t, image_token_id=ids[3])  # a token the record holds
    r = _run(("multimodal-target",), target=str(t), engine="vllm", train=str(data))
    assert r.outcomes[0].data["records_with_image_tokens"] == 1
    r = _run(("multimodal-target",), target=str(t), engine="vllm", train=str(data), served_prompts=str(served))
    assert _codes(r, ("error", "warning", "info")) == [("multimodal-target", "info")]  # trained with image tokens


def test_verifier_names_and_suffixes() -> None:
    assert short_name("RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic") == "llama-3.1-8b-instruct"
    assert short_name("/models/Qwen3-32B-w8a8") == short_name("Qwen/Qwen3-32B") == "qwen3-32b"
    assert short_name("deepseek-ai/DeepSeek-V3-AWQ") == "deepseek-v3"


def test_a_verifier_named_otherwise_with_the_same_architecture_is_info(targets: dict, tmp_path: Path) -> None:
    t = targets["llama", 2]
    d = _speculators_drafter(t, tmp_path / "d", "meta-llama/Llama-3.3-70B-Instruct", ["LlamaForCausalLM"])
    r = _run(("verifier",), target=str(t), draft_config=str(d / "config.json"))
    assert _codes(r, ("error", "warning", "info")) == [("verifier-mismatch", "info")]
    flat = _run(("verifier",), target=str(t), drafter=str(SAMPLES / "drafter"))  # SpecForge: no verifier named
    assert flat.outcomes[0].status == "clean" and "names no verifier" in flat.outcomes[0].note


# ---------------------------------------------------------------- too little data
def test_the_record_count_decides_and_one_file_is_not_run(tmp_path: Path) -> None:
    one = _run(("data-size",), train=str(SAMPLES / "data_0.ckpt"))
    assert one.outcomes[0].status == "not-run" and "--train DIR" in one.outcomes[0].reason
    farm = tmp_path / "data"
    farm.mkdir()
    record = SAMPLES / "data_0.ckpt"
    for i in range(FEW_RECORDS):  # a dataset of FEW_RECORDS conversations (links to one real record)
        os.symlink(record, farm / f"data_{i}.ckpt")
    r = diagnose(DoctorInputs(train=str(farm), max_records=4), checks=[get_check("data-size")], pipelines=())
    assert _codes(r, ("error", "warning", "info")) == [("too-little-data", "info")]
    row = r.outcomes[0].data
    assert row["records"] == FEW_RECORDS and row["supervised_tokens_estimate"] == 24 * FEW_RECORDS
    os.remove(farm / "data_0.ckpt")
    r = diagnose(DoctorInputs(train=str(farm), max_records=4), checks=[get_check("data-size")], pipelines=())
    assert _codes(r) == [("too-little-data", "warning")]
    assert f"{FEW_RECORDS - 1:,} records" in r.findings[0].finding.message


@pytest.mark.parametrize("edit", [
    {"quantization_config": {"quant_method": ["fp8"], "ignore": "lm_head", "config_groups": [1, 2],
                             "transform_config": {"config_groups": {"R1": {"apply": ["x", {"targets": 7}]}}}}},
    {"layer_types": [None, 3, {"a": 1}], "hybrid_override_pattern": 12, "attn_type_list": "0,1"},
    {"vision_config": "", "rope_scaling": {"mrope_section": "[1,2]"}, "image_token_id": True,
     "num_nextn_predict_layers": "1", "architectures": "LlamaForCausalLM"},
])
def test_odd_config_values_are_read_without_a_crash(tmp_path: Path, edit: dict) -> None:
    t = _copy(SAMPLES / "target", tmp_path)
    edit_config(t, **edit)
    d = _speculators_drafter(t, tmp_path / "d", ["not", "a", "name"], None)  # type: ignore[arg-type]
    cfg = json.loads((d / "config.json").read_text())
    cfg["speculators_config"]["verifier"]["architectures"] = "Qwen3ForCausalLM"
    (d / "config.json").write_text(json.dumps(cfg))
    report = _run(target=str(t), draft_config=str(d / "config.json"), engine="vllm")
    assert {o.name for o in report.outcomes} == set(MINE)


@pytest.mark.parametrize("entry", ["qwen3-14b-mlx-4bit", "glm-4.5-air-mlx-4bit"])
def test_an_mlx_export_is_named_from_its_own_layout(entry: str) -> None:
    """mlx-lm writes {group_size, bits[, mode]} with no quant_method (0.32.2 utils.py quantize_model): the page names
    it MLX with its mode and group, not "unknown"."""
    from eagleforensics.checks.targetquant import describe

    cfg = json.loads((Path(__file__).parent / "fixtures" / "published" / entry / "config.json").read_text())
    got = describe(cfg["quantization_config"])
    assert got["method"] == "mlx" and got["format"] == "affine, group 64" and "4-bit weights" in got["schemes"]
    assert describe({"quant_method": "gptq", "bits": 4, "group_size": 128})["method"] == "gptq"  # named: kept


@pytest.mark.parametrize("engine", [None, "vllm", "sglang"])
def test_a_hadamard_transform_that_says_not_where_it_acts_is_weak_evidence(engine: str | None) -> None:
    """Spark-X2.5's published re-export declares ``hadamard_spin`` (dim 256, its head size) with no location: the
    page says so as info (weak evidence), never the error a residual-stream rotation gets."""
    entry = Path(__file__).parent / "fixtures" / "published" / "spark-x2.5-4b-hadamard"
    version = {"vllm": "0.34.0", "sglang": "0.5.23", None: None}[engine]
    r = _run(("target-rotated",), target=entry, engine=engine, engine_version=version)
    (f,) = [x.finding for x in r.findings if x.finding.code == "target-rotated"]
    assert f.severity == "info" and "weak evidence" in f.message and "hadamard_spin" in f.message
