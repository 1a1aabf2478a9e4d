"""The EAGLE repository's ``pytorch_model.bin`` drafter is read (restricted reader) and judged like a safetensors one."""
from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.doctor import diagnose
from eagleforensics.errors import ForensicsError
from eagleforensics.io.drafter import load_drafter
from eagleforensics.io.modeldir import ModelDir
from eagleforensics.testing.defects import SAMPLES


def _bin_drafter(out: Path, *, fp16: bool = False) -> Path:
    """data_samples/drafter saved the way the EAGLE repository saves its drafter: torch.save of the state dict."""
    out.mkdir(parents=True)
    cfg = json.loads((SAMPLES / "drafter" / "config.json").read_text())
    w = load_file(SAMPLES / "drafter" / "model.safetensors")
    if fp16:
        w = {k: v.half() if v.is_floating_point() else v for k, v in w.items()}
        cfg["torch_dtype"] = "float16"
    (out / "config.json").write_text(json.dumps(cfg))
    torch.save(w, out / "pytorch_model.bin")
    return out


def test_a_pytorch_model_bin_drafter_reads_as_its_safetensors_twin(tmp_path: Path) -> None:
    d = _bin_drafter(tmp_path / "bin")
    md, ref = ModelDir(d), ModelDir(SAMPLES / "drafter")
    assert {k: (v.dtype, v.shape) for k, v in md.tensors.items()} == \
        {k: (v.dtype, v.shape) for k, v in ref.tensors.items()}
    a, b = load_drafter(d, target=SAMPLES / "target"), load_drafter(SAMPLES / "drafter", target=SAMPLES / "target")
    assert all(torch.equal(a.weights[k], b.weights[k]) for k in b.weights)
    report = diagnose(DoctorInputs(drafter=str(d), target=str(SAMPLES / "target"),
                                   capture=str(SAMPLES / "capture_sweep.safetensors")))
    assert report.level == "OK", report.to_text()
    assert {o.name: o.status for o in report.outcomes}["replay"] == "clean"


def test_the_fp16_bin_variant_meets_the_dtype_check(tmp_path: Path) -> None:
    d = _bin_drafter(tmp_path / "bin16", fp16=True)
    t = tmp_path / "target"
    shutil.copytree(SAMPLES / "target", t)
    cfg = json.loads((t / "config.json").read_text())
    cfg["torch_dtype"] = "bfloat16"
    (t / "config.json").write_text(json.dumps(cfg))
    report = diagnose(DoctorInputs(drafter=str(d), target=str(t)))
    assert "dtype-mismatch" in [r.finding.code for r in report.flagged], report.to_text()


def test_a_bin_that_runs_code_is_refused_not_loaded(tmp_path: Path) -> None:
    d = tmp_path / "evil"
    d.mkdir()
    shutil.copy(SAMPLES / "drafter" / "config.json", d / "config.json")

    class Boom:
        def __reduce__(self):  # noqa: ANN204
            return (print, ("ran",))
    (d / "pytorch_model.bin").write_bytes(pickle.dumps({"fc.weight": Boom()}))
    with pytest.raises(ForensicsError):
        ModelDir(d).tensors  # noqa: B018
