"""Many sequences in one call: ``capture --prompts``, replay pooled over a capture set, records matched by ids.

Real forward passes of the samples' tiny target (``scripts/make_samples.py``'s model, saved as a model
directory); the drafter and records are the shipped samples.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from eagleforensics.cli import main
from eagleforensics.evidence.recordmatch import closest_record, match_record
from eagleforensics.io.capture import load_capture
from eagleforensics.io.captureset import capture_many, list_capture_set
from eagleforensics.io.sweep import sweep
from eagleforensics.io.training import load_training
from eagleforensics.positions import Position
from eagleforensics.testing.tinymodels import prompt_ids

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data_samples"
sys.path.insert(0, str(ROOT / "scripts"))
from make_samples import sample_ids, target_model  # noqa: E402


class _Rec:
    def __init__(self, ids: list[int], pad: int = 0) -> None:
        self.input_ids = np.array(ids + [0] * pad)
        self.loss_mask = np.array([1] * len(ids) + [0] * pad)


def test_records_are_matched_by_their_ids_not_by_a_shared_opening() -> None:
    system = [5, 6, 7, 8, 9, 10]
    a, b = _Rec(system + [11, 12, 13, 14], pad=3), _Rec(system + [21, 22, 23, 24, 25])
    assert match_record(np.array(system + [21, 22]), [a, b]).index == 1  # a prompt-only capture: a prefix of b
    assert match_record(np.array(system + [11, 12, 13, 14]), [a, b]).index == 0  # a's padding dropped
    assert match_record(np.array(system + [31, 32]), [a, b]) is None  # only the system prompt is shared
    assert closest_record(np.array(system + [31, 32]), [a, b]).shared == len(system)
    longer = _Rec(system + [21, 22, 23, 24, 25, 26])
    assert match_record(np.array(system + [21, 22, 23, 24, 25, 26, 27]), [b, longer]).index == 1  # longest wins


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("capset")
    model = target_model()
    model.save_pretrained(root / "target")
    seqs = [sample_ids(), prompt_ids(30, seed=91), prompt_ids(47, seed=92)]
    requests = root / "requests.jsonl"
    requests.write_text("".join(json.dumps({"input_ids": s.tolist()}) + "\n" for s in seqs))
    out, n, tokens = capture_many(root / "target", requests, root / "captures", max_batch_tokens=80)
    return {"root": root, "model": model, "seqs": seqs, "out": out, "n": n, "tokens": tokens}


def test_capture_many_equals_one_capture_per_sequence(world: dict) -> None:
    """Batched (right padding, sorted by length, two batches here) each capture holds what a capture of that sequence
    alone holds, in the request file's order, with an index naming each file's request line."""
    assert (world["n"], world["tokens"]) == (3, 64 + 30 + 47)
    files = list_capture_set(world["out"])
    assert [f.name for f in files] == ["seq-0000.safetensors", "seq-0001.safetensors", "seq-0002.safetensors"]
    for f, ids in zip(files, world["seqs"]):
        cap, alone = load_capture(f), sweep(world["model"], ids)
        assert cap.input_ids.tolist() == ids.tolist()
        for p in (0, 3, 12):
            got = torch.from_numpy(np.asarray(cap.read(Position(p)), dtype=np.float32))
            assert torch.allclose(got, alone[f"hidden.{p}"].float(), atol=1e-4, rtol=1e-4)
    index = [json.loads(x) for x in (world["out"] / "captures.jsonl").read_text().splitlines()]
    assert [(x["file"], x["line"], x["kind"]) for x in index] == [(f.name, i + 1, "ids") for i, f in enumerate(files)]


def test_a_capture_set_is_told_from_one_capture(world: dict, tmp_path: Path) -> None:
    assert list_capture_set(SAMPLES / "capture_sweep.safetensors") is None
    per_position = tmp_path / "one"
    per_position.mkdir()
    for p in range(3):
        torch.save(torch.zeros(4, 8), per_position / f"layer_{p}.pt")
    assert list_capture_set(per_position) is None
    assert list_capture_set(world["out"]) is not None


def test_pooled_replay_adds_each_sequences_counts_and_pairs_records_by_ids(world: dict, tmp_path: Path) -> None:
    """The sample's own sequence is paired with data_0.ckpt (its ids), the two others with no record (said once);
    pooled acc@k and row counts are the sums of the per-sequence replays."""
    from eagleforensics.replay import run_replay
    from eagleforensics.replaypool import run_pooled

    records = tmp_path / "records"
    records.mkdir()
    shutil.copy(SAMPLES / "data_0.ckpt", records / "data_0.ckpt")
    rep = run_pooled(SAMPLES / "drafter", world["out"], train=records, target=SAMPLES / "target")
    assert [s["record"] for s in rep.sequences] == ["data_0.ckpt", None, None]
    assert [f.code for f in rep.findings if f.code == "capture-unmatched"] == ["capture-unmatched"]
    first = rep.wirings[0]
    rows = hits = 0
    for i, f in enumerate(list_capture_set(world["out"])):
        one = run_replay(SAMPLES / "drafter", f, target=SAMPLES / "target",
                         train=load_training(records / "data_0.ckpt") if i == 0 else None)
        r = next(x for x in one.results if x.label == first.label)
        rows += r.acc_rows[0]
        hits += round(r.acc[0] * r.acc_rows[0]) if r.acc_rows[0] else 0
    assert first.rows[0] == rows and first.hits[0] == hits
    assert first.acc[0] == pytest.approx(hits / rows)
    assert rep.to_dict()["sequences"][0]["supervised_rows"] == 24


def test_cli_capture_prompts_then_replay_a_directory(world: dict, tmp_path: Path) -> None:
    runner = CliRunner()
    requests = tmp_path / "r.jsonl"
    requests.write_text(json.dumps({"input_ids": sample_ids().tolist()}) + "\n")
    out = tmp_path / "caps"
    res = runner.invoke(main, ["capture", str(world["root"] / "target"), "--prompts", str(requests), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "wrote 1 captures (64 tokens)" in res.output
    res = runner.invoke(main, ["replay", str(SAMPLES / "drafter"), str(out), "--target", str(SAMPLES / "target"),
                               "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["schema"] == "eagleforensics-replay-pooled-v1" and len(data["sequences"]) == 1
    res = runner.invoke(main, ["capture", str(world["root"] / "target"), "--prompt", "x", "--prompts", str(requests),
                               "-o", str(out)])
    assert res.exit_code == 2 and "exactly one of" in res.output


def test_doctor_train_dir_aligns_the_record_of_the_captured_sequence(world: dict, tmp_path: Path) -> None:
    """--train DIR with the record of another sequence first: the wiring row aligns the record whose ids hold the
    capture's; with no such record it aligns the closest and says so (info)."""
    from eagleforensics.checks.base import DoctorInputs
    from eagleforensics.doctor import diagnose
    from eagleforensics.testing.drafterbuild import write_record

    records = tmp_path / "records"
    write_record(world["model"], records / "data_0.ckpt", seed=93)  # another sequence, listed first
    shutil.copy(SAMPLES / "record_layer_outputs.pt", records / "data_1.pt")
    cap = world["out"] / "seq-0000.safetensors"
    report = diagnose(DoctorInputs(train=str(records), capture=str(cap)), checks=[])
    assert report.align["training"]["path"].endswith("data_1.pt")
    assert not any(r.finding.code == "capture-record-unmatched" for r in report.findings)
    other = world["out"] / "seq-0001.safetensors"
    report = diagnose(DoctorInputs(train=str(records), capture=str(other)), checks=[])
    notes = [r.finding for r in report.findings if r.finding.code == "capture-record-unmatched"]
    assert len(notes) == 1 and notes[0].severity == "info"


def test_doctor_on_a_capture_set_pools_replay_and_aligns_the_matching_capture(world: dict, tmp_path: Path) -> None:
    """--capture DIR: align and the single-sequence checks read the capture a record holds (seq-0000 here, listed
    after nothing else matching), the replay row adds the pooled figures of every capture."""
    from eagleforensics.checks.base import DoctorInputs
    from eagleforensics.doctor import diagnose

    records = tmp_path / "records"
    records.mkdir()
    shutil.copy(SAMPLES / "data_0.ckpt", records / "data_0.ckpt")
    report = diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter"), target=str(SAMPLES / "target"),
                                   train=str(records), capture=str(world["out"])), checks=[])
    assert report.align["capture"]["path"].endswith("seq-0000.safetensors")
    pooled = report.replay["pooled"]
    assert len(pooled["sequences"]) == 3 and pooled["sequences"][0]["record"] == "data_0.ckpt"
    row = next(o for o in report.outcomes if o.name == "replay")
    assert "pooled over 3 captures" in row.note
