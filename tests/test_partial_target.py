"""Targets as users have them: a partial download whose shard index lists every tensor of an FP8 checkpoint.

The sample target's three head tensors stay in their two shards; the index also lists 139,580 more names
(Kimi-K2 / DeepSeek-V3 FP8 layout: experts and their scales) in 62 shards that are not there. Only the
shards a check reads are needed; a check whose shard is absent is "not run" naming it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.cli import main
from eagleforensics.doctor import diagnose
from eagleforensics.errors import ForensicsError
from eagleforensics.io.modeldir import MAX_INDEX_BYTES, MissingShard, ModelDir, index_tensor_names

SAMPLES = Path(__file__).resolve().parents[1] / "data_samples"
FP8_ENTRIES = 139_583  # the real Kimi-K2 FP8 index's count
SHARDS = 64


def fp8_weight_map(head: dict[str, str], n: int = FP8_ENTRIES) -> dict[str, str]:
    """``head`` (the tensors that are there) plus names in the Kimi-K2 FP8 layout, spread over 64 shards."""
    wmap = dict(head)
    layer = 0
    while len(wmap) < n:
        shard = f"model-{3 + layer % (SHARDS - 2):05d}-of-{SHARDS:05d}.safetensors"
        pre = f"model.layers.{layer}."
        for part in ("self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa",
                     "self_attn.kv_b_proj", "self_attn.o_proj"):
            wmap[pre + part + ".weight"] = shard
            wmap[pre + part + ".weight_scale_inv"] = shard
        for e in range(384):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                wmap[f"{pre}mlp.experts.{e}.{proj}.weight"] = shard
                wmap[f"{pre}mlp.experts.{e}.{proj}.weight_scale_inv"] = shard
        layer += 1
    return dict(list(wmap.items())[:n])


@pytest.fixture()
def partial_target(tmp_path: Path) -> Path:
    t = tmp_path / "target"
    shutil.copytree(SAMPLES / "target", t)
    index = t / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"] = fp8_weight_map(doc["weight_map"])
    index.write_text(json.dumps(doc, indent=2))
    assert index.stat().st_size > 4 * 1024 * 1024  # past the old 4 MiB refusal, as a real one is (13 MB)
    return t


def test_full_size_index_reads_only_the_head_shards(partial_target: Path) -> None:
    md = ModelDir(partial_target, "target directory")
    assert len(md.names) == FP8_ENTRIES and len(index_tensor_names(partial_target)) == FP8_ENTRIES
    assert md.find("embed") == "model.embed_tokens.weight" and md.find("lm_head") == "lm_head.weight"
    assert md.info("lm_head.weight").shape[0] > 0
    assert md.__dict__["_headers"].keys() == {partial_target / "model-00002-of-00002.safetensors"}  # one header read
    with pytest.raises(MissingShard, match="model-00003-of-00064.safetensors") as err:
        md.info("model.layers.0.self_attn.q_a_proj.weight")
    assert err.value.shard == "model-00003-of-00064.safetensors"


def test_doctor_runs_every_row_on_a_partial_download(partial_target: Path) -> None:
    """The same rows and findings as on the sample target itself: the 139,580 absent names change nothing."""
    def run(target: Path) -> dict:
        report = diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter"), target=str(target),
                                       train=str(SAMPLES / "record_layer_outputs.pt"),
                                       capture=str(SAMPLES / "capture.pt")))
        return {o.name: (o.status, sorted({f.code for f in o.findings}), o.note) for o in report.outcomes}
    got, want = run(partial_target), run(SAMPLES / "target")
    assert got == {k: (s, c, n.replace(str(SAMPLES / "target"), str(partial_target))) for k, (s, c, n) in want.items()}
    assert got["replay"][0] == "clean" and got["embedding"][0] == "clean" and got["sizes"][0] == "clean"


def test_a_check_whose_shard_is_absent_is_not_run_naming_the_file(partial_target: Path) -> None:
    (partial_target / "model-00002-of-00002.safetensors").unlink()  # the lm_head's shard
    report = diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter"), target=str(partial_target),
                                   capture=str(SAMPLES / "capture.pt")))
    rows = {o.name: o for o in report.outcomes}
    assert rows["replay"].status == "not-run" and "model-00002-of-00002.safetensors" in rows["replay"].reason
    assert rows["sizes"].status == "clean"  # shapes of the drafter against the target's config: no shard needed
    needing = [o for o in report.outcomes if o.status == "not-run" and "model-00002-of-00002" in o.reason]
    assert needing and all("not downloaded" in o.reason or "not in the directory" in o.reason for o in needing)


def test_replay_refuses_a_missing_head_shard_before_loading_the_drafter(partial_target: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import eagleforensics.io.drafter as drafter_io

    def never(*a: object, **k: object) -> None:
        raise AssertionError("the drafter was loaded before the target was checked")
    monkeypatch.setattr(drafter_io, "load_drafter", never)
    (partial_target / "model-00002-of-00002.safetensors").unlink()
    out = CliRunner().invoke(main, ["replay", str(SAMPLES / "drafter"), str(SAMPLES / "capture.pt"),
                                    "--target", str(partial_target)])
    assert out.exit_code == 2, out.output
    assert "model-00002-of-00002.safetensors" in out.output and "Traceback" not in out.output


def test_index_bounds(tmp_path: Path) -> None:
    """Larger than any real index is refused in one line, before it is parsed; a bad entry names itself."""
    t = tmp_path / "t"
    shutil.copytree(SAMPLES / "target", t)
    index = t / "model.safetensors.index.json"
    with index.open("wb") as fh:
        fh.truncate(MAX_INDEX_BYTES + 1)
    with pytest.raises(ForensicsError, match="larger than 64.0 MiB"):
        _ = ModelDir(t).names
    out = CliRunner().invoke(main, ["doctor", "--target", str(t)])
    assert out.exit_code == 2 and "model.safetensors.index.json" in out.output and "Traceback" not in out.output
    index.write_text(json.dumps({"weight_map": {"lm_head.weight": "sub/x.safetensors"}}))
    with pytest.raises(ForensicsError, match="same directory"):
        _ = ModelDir(t).names
