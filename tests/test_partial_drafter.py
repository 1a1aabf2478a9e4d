"""A drafter downloaded in part: its shard index lists every tensor, one shard is not there yet.

The sample drafter (SpecForge layout) is re-saved as two shards with ``model.safetensors.index.json``, the
decoder layer in the second, as sharded checkpoints are published; then that shard is removed. The rows that
only ask which tensors exist read the index's names (the decoder layer is listed, not missing); the rows that
read the layer's values or shapes are "not run" naming the absent shard. Today's main read only the shards on
disk and called the listed layer missing (``drafter-weights-missing``, error).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.numpy import load_file, save_file

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.checks.drafterfacts import Listed
from eagleforensics.doctor import diagnose
from eagleforensics.io.modeldir import MissingShard, ModelDir

SAMPLES = Path(__file__).resolve().parents[1] / "data_samples"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def _sharded_drafter(out: Path, *, drop_second: bool) -> Path:
    out.mkdir(parents=True)
    shutil.copyfile(SAMPLES / "drafter" / "config.json", out / "config.json")
    tensors = load_file(str(SAMPLES / "drafter" / "model.safetensors"))
    parts = ({k: v for k, v in tensors.items() if not k.startswith("midlayer.")},
             {k: v for k, v in tensors.items() if k.startswith("midlayer.")})
    for name, part in zip(SHARDS, parts):
        save_file(part, str(out / name), metadata={"format": "pt"})
    wmap = {k: SHARDS[i] for i, part in enumerate(parts) for k in part}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    if drop_second:
        (out / SHARDS[1]).unlink()
    return out


def _doctor(drafter: Path):  # noqa: ANN202
    return diagnose(DoctorInputs(drafter=str(drafter), target=str(SAMPLES / "target")))


def test_listed_reads_the_index_names_and_raises_for_an_absent_shard(tmp_path: Path) -> None:
    d = _sharded_drafter(tmp_path / "drafter", drop_second=True)
    listed = Listed(ModelDir(d))
    assert "midlayer.self_attn.q_proj.weight" in listed and len(listed) == 15
    assert "midlayer.self_attn.q_proj.weight" not in ModelDir(d).tensors  # what main read
    assert listed["fc.weight"].shape[0] > 0
    try:
        listed["midlayer.self_attn.q_proj.weight"]
    except MissingShard as exc:
        assert exc.shard == SHARDS[1]
    else:
        raise AssertionError("an absent shard's tensor must raise MissingShard")


def test_a_partial_drafter_is_not_called_missing_its_layer(tmp_path: Path) -> None:
    whole = _doctor(_sharded_drafter(tmp_path / "whole", drop_second=False))
    partial = _doctor(_sharded_drafter(tmp_path / "partial", drop_second=True))
    codes = {r.finding.code for r in partial.findings if r.finding.severity in ("error", "warning")}
    assert "drafter-weights-missing" not in codes, partial.to_text()
    rows = {o.name: o for o in partial.outcomes}
    assert rows["drafter-weights"].status == "not-run" and SHARDS[1] in rows["drafter-weights"].reason
    assert str(tmp_path / "partial") in rows["drafter-weights"].reason  # the drafter's folder, not "the target's"
    # the whole checkpoint, sharded the same way, reads as the single file does
    assert {o.name: o.status for o in whole.outcomes}["drafter-weights"] in ("clean", "found")
    assert "drafter-weights-missing" not in {r.finding.code for r in whole.findings}
