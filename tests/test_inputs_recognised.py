"""Inputs are what they claim: swapped drafter/target and swapped align arguments are one line naming the swap
(exit 2), a --train directory reads only records, and a full-vocabulary d2t = arange(V) is called absolute ids."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import torch

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.checks.registry import get_check
from eagleforensics.doctor import diagnose
from eagleforensics.io.identify import DRAFTER, TARGET, model_kind
from eagleforensics.testing.defects import SAMPLES, edit_weights

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagleforensics", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_drafter_and_target_are_recognised_by_content() -> None:
    assert model_kind(SAMPLES / "drafter").kind == DRAFTER
    assert model_kind(SAMPLES / "target").kind == TARGET


def test_swapped_drafter_and_target_exit_2_naming_both_paths() -> None:
    r = _cli("doctor", "--drafter", "data_samples/target", "--target", "data_samples/drafter")
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert "swapped" in line and "--drafter data_samples/drafter --target data_samples/target" in line


def test_a_target_given_as_the_drafter_alone_exits_2() -> None:
    r = _cli("doctor", "--drafter", "data_samples/target")
    assert r.returncode == 2 and "holds a target model" in r.stderr and "Traceback" not in r.stderr


def test_swapped_align_arguments_exit_2_with_the_swap_named() -> None:
    r = _cli("align", "data_samples/capture.pt", "data_samples/record_layer_outputs.pt")
    assert r.returncode == 2, r.stdout
    assert "swapped" in r.stderr and \
        "align data_samples/record_layer_outputs.pt data_samples/capture.pt" in r.stderr


def test_train_dir_skips_model_directories_and_captures_inside_it_and_says_so() -> None:
    report = diagnose(DoctorInputs(train=str(SAMPLES), target=str(SAMPLES / "target")),
                      checks=[get_check("data-shape")], pipelines=())
    row = {o.name: o for o in report.outcomes}["inputs"]
    assert all(name in row.note for name in ("drafter", "target", "real/drafter", "capture.pt",
                                             "capture_sweep.safetensors")), row.note
    shape = {o.name: o for o in report.outcomes}["data-shape"]
    assert shape.note.startswith("4 records"), shape.note  # the four record files, no capture read as one
    assert report.exit_code != 2


def test_full_vocabulary_arange_d2t_is_absolute_ids(tmp_path: Path) -> None:
    d, t = tmp_path / "drafter", tmp_path / "target"
    shutil.copytree(SAMPLES / "drafter", d)
    shutil.copytree(SAMPLES / "target", t)
    vocab = 512

    def full(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        head = torch.zeros(vocab, w["lm_head.weight"].shape[1], dtype=w["lm_head.weight"].dtype)
        head[:w["lm_head.weight"].shape[0]] = w["lm_head.weight"]
        return {**w, "lm_head.weight": head, "d2t": torch.arange(vocab), "t2d": torch.ones(vocab, dtype=torch.bool)}
    edit_weights(d, full)
    import json

    cfg = json.loads((d / "config.json").read_text())
    cfg["draft_vocab_size"] = vocab
    (d / "config.json").write_text(json.dumps(cfg))
    report = diagnose(DoctorInputs(drafter=str(d), target=str(t)), checks=[get_check("vocab-map")], pipelines=())
    codes = [r.finding.code for r in report.flagged]
    assert codes == ["d2t-absolute"], report.to_text()
