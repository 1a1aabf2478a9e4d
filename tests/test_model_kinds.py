"""Issue 40: a model is a drafter or a target by its structure, never by a word in its architecture's name.

NVIDIA's Eagle 2.5 VLM (``Eagle2_5_VLForConditionalGeneration``, a row of the project's own multimodal table) was
refused as "an EAGLE-3 drafter" because its name holds "eagle". Its structure is a target's: many decoder layers,
no fc over aux states, no midlayer, no trainer keys.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from eagleforensics.io.identify import DRAFTER, TARGET, model_kind
from eagleforensics.testing.defects import SAMPLES, edit_config

from .test_hardening import run_process


def _eagle_vl_target(tmp_path: Path) -> Path:
    """The sample target (real weights) wrapped as Eagle 2.5 VL's config: its text model under text_config."""
    t = shutil.copytree(SAMPLES / "target", tmp_path / "eagle25vl")
    text = json.loads((t / "config.json").read_text())
    cfg = {"architectures": ["Eagle2_5_VLForConditionalGeneration"], "model_type": "eagle_2_5_vl",
           "text_config": {**text, "architectures": ["LlamaForCausalLM"]},
           "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152}, "image_token_index": 151667,
           "downsample_ratio": 0.5, "select_layer": -1, "tie_word_embeddings": False}
    (t / "config.json").write_text(json.dumps(cfg, indent=2))
    return t


def test_an_eagle_named_vision_language_target_is_a_target(tmp_path: Path) -> None:
    kind = model_kind(_eagle_vl_target(tmp_path))
    assert kind.kind == TARGET, kind


def test_doctor_accepts_an_eagle_named_target(tmp_path: Path) -> None:
    target = _eagle_vl_target(tmp_path)
    code, out, err, _ = run_process(["doctor", "--drafter", SAMPLES / "drafter", "--target", target, "--json"],
                                    tmp_path, timeout=300)
    assert code in (0, 1) and "EAGLE-3 drafter" not in err, (code, err[-1500:])
    rows = {c["name"]: c for c in json.loads(out)["checks"]}
    assert rows["multimodal-target"]["status"] != "not-run", rows["multimodal-target"]


def test_a_drafter_is_recognised_without_any_name(tmp_path: Path) -> None:
    """A drafter whose config lost its architectures and trainer keys is still one: fc over 3H, midlayer weights."""
    d = shutil.copytree(SAMPLES / "drafter", tmp_path / "drafter")
    cfg = json.loads((d / "config.json").read_text())
    drop = tuple(k for k in ("eagle_config", "draft_vocab_size", "architectures") if k in cfg)
    edit_config(d, drop=drop, architectures=["LlamaForCausalLM"])
    kind = model_kind(d)
    assert kind.kind == DRAFTER and "fc over the aux states" in kind.why and "midlayer" in kind.why, kind


def test_a_target_named_like_a_drafter_is_still_a_target(tmp_path: Path) -> None:
    t = shutil.copytree(SAMPLES / "target", tmp_path / "target")
    edit_config(t, architectures=["LlamaForCausalLMEagle3"])
    assert model_kind(t).kind == TARGET
