"""Read-only: align and capture never change the user's files or write next to them.

Copies of the samples (and a saved tiny model) are snapshotted byte for byte with their
modification times and the folder listing; every command is run from an empty working
folder; afterwards the inputs are unchanged, nothing new sits beside them, the working
folder is still empty and ``capture`` wrote exactly the ``-o`` file.
"""
from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from eagleforensics.cli import main
from eagleforensics.testing.tinymodels import build_model, prompt_ids

from .realdata import SAMPLES


def snapshot(root: Path) -> dict[str, tuple[str, int, int, int]]:
    """Every path under ``root`` with (sha256, size, mtime_ns, mode); folders too."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.stat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p.relative_to(root))] = (digest, st.st_size, st.st_mtime_ns, st.st_mode)
    return out


@pytest.fixture()
def inputs(tmp_path: Path) -> Path:
    d = tmp_path / "inputs"
    d.mkdir()
    for f in SAMPLES.iterdir():  # the replay drafter and target are folders
        if f.name == "real":  # the real pair's 19 MB drafter: its own tests (test_real_target.py)
            continue
        (shutil.copytree if f.is_dir() else shutil.copy2)(f, d / f.name)
    (d / "data_0.ckpt.gz").write_bytes(gzip.compress((SAMPLES / "data_0.ckpt").read_bytes(), mtime=0))
    cap = torch.load(SAMPLES / "capture.pt", weights_only=True)
    sweep = d / "sweep"  # a capture directory, one file per position
    sweep.mkdir()
    for i, h in enumerate(cap["hidden_states"]):
        torch.save(h.clone(), sweep / f"layer_{i}.pt")
    torch.save(cap["input_ids"].clone(), sweep / "input_ids.pt")
    (d / "half.safetensors").write_bytes((SAMPLES / "capture_sweep.safetensors").read_bytes()[:5000])
    model = build_model("llama", num_layers=2, hidden=64, seed=0)
    model.save_pretrained(d / "model")
    torch.save({"input_ids": prompt_ids(12, seed=1)}, d / "ids.pt")
    return d


def test_align_and_capture_leave_inputs_untouched(inputs: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = snapshot(inputs)
    runs = [
        ["align", "record_layer_outputs.pt", "capture.pt"],
        ["align", "--json", "record_wrong_fix.pt", "capture_sweep.safetensors"],
        ["align", "data_0.ckpt", "sweep"],
        ["align", "data_0.ckpt.gz", "capture.pt"],
        ["align", "record_layer_outputs.pt", "half.safetensors"],  # bad input: nothing written either
        ["replay", "drafter", "capture_sweep.safetensors", "--target", "target", "--train", "record_layer_outputs.pt"],
    ]
    codes = [CliRunner().invoke(main, [a if a.startswith("-") or a in ("align", "replay") else str(inputs / a)
                                       for a in r]).exit_code for r in runs]
    assert codes == [1, 1, 0, 0, 2, 0]  # ACTION, PROBLEM, OK, OK, bad input, replay
    out = tmp_path / "out" / "cap.safetensors"
    res = CliRunner().invoke(main, ["capture", str(inputs / "model"), "--input-ids", str(inputs / "ids.pt"),
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert snapshot(inputs) == before
    assert list(work.iterdir()) == []
    assert sorted(p.name for p in out.parent.iterdir()) == ["cap.safetensors"]
