"""A pickle that would run code on load is refused before anything runs (the marker file proves it).

The payload objects below reduce to ``exec``/``pathlib.Path.touch``/``os.system`` calls that
create a marker file. They ride inside otherwise real files (the incident sample's tensors),
as a training record, a capture, a SpecForge ``.ckpt.gz``, a legacy torch save, a per-position
file of a capture directory, and a ``--input-ids`` file.
"""
from __future__ import annotations

import gzip
import os
import pathlib
import pickle
from pathlib import Path
from typing import Callable

import pytest
import torch
from click.testing import CliRunner

from eagleforensics.cli import main
from eagleforensics.errors import ForensicsError
from eagleforensics.io.training import load_training

from .realdata import SAMPLES

REC, CAP, CKPT = SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture.pt", SAMPLES / "data_0.ckpt"


class ExecPayload:
    """Unpickling this calls ``exec`` on code that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]:
        return (exec, (f"open({self.marker!r}, 'w').close()",))


class TouchPayload(ExecPayload):
    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]:
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


class SystemPayload(ExecPayload):
    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]:
        return (os.system, (f"touch '{self.marker}'",))


def _record_with(payload: object) -> dict:
    rec = torch.load(REC, weights_only=True)
    rec["hidden_states"].append(payload)
    return rec


def _training_pt(d: Path, m: Path) -> list[str]:
    torch.save(_record_with(ExecPayload(m)), d / "evil.pt")
    return ["align", str(d / "evil.pt"), str(CAP)]


def _training_legacy(d: Path, m: Path) -> list[str]:
    torch.save(_record_with(TouchPayload(m)), d / "evil_legacy.pt", _use_new_zipfile_serialization=False)
    return ["align", str(d / "evil_legacy.pt"), str(CAP)]


def _training_raw_pickle(d: Path, m: Path) -> list[str]:
    (d / "evil_raw.pt").write_bytes(pickle.dumps({"hidden_state": SystemPayload(m)}, protocol=4))
    return ["align", str(d / "evil_raw.pt"), str(CAP)]


def _training_ckpt_gz(d: Path, m: Path) -> list[str]:
    rec = torch.load(CKPT, weights_only=True)
    rec["conversation_id"] = ExecPayload(m)
    torch.save(rec, d / "plain.ckpt")
    (d / "data_0.ckpt.gz").write_bytes(gzip.compress((d / "plain.ckpt").read_bytes()))
    return ["align", str(d / "data_0.ckpt.gz"), str(CAP)]


def _capture_pt(d: Path, m: Path) -> list[str]:
    cap = torch.load(CAP, weights_only=True)
    cap["model"] = TouchPayload(m)
    torch.save(cap, d / "evil_capture.pt")
    return ["align", str(REC), str(d / "evil_capture.pt")]


def _capture_directory(d: Path, m: Path) -> list[str]:
    cap = torch.load(CAP, weights_only=True)
    sweep = d / "sweep"
    sweep.mkdir()
    for i, h in enumerate(cap["hidden_states"]):
        torch.save({"h": h} if i != 7 else {"h": h, "x": ExecPayload(m)}, sweep / f"layer_{i}.pt")
    torch.save(cap["input_ids"], sweep / "input_ids.pt")
    return ["align", str(REC), str(sweep)]


def _capture_input_ids(d: Path, m: Path) -> list[str]:
    torch.save({"input_ids": torch.tensor([1, 2, 3]), "why": SystemPayload(m)}, d / "ids.pt")
    (d / "model").mkdir()
    return ["capture", str(d / "model"), "--input-ids", str(d / "ids.pt"), "-o", str(d / "out.safetensors")]


BUILDERS = [_training_pt, _training_legacy, _training_raw_pickle, _training_ckpt_gz, _capture_pt,
            _capture_directory, _capture_input_ids]


@pytest.mark.parametrize("build", BUILDERS, ids=[b.__name__[1:] for b in BUILDERS])
def test_payload_is_refused_before_it_runs(build: Callable[[Path, Path], list[str]], tmp_path: Path) -> None:
    marker = tmp_path / "PAYLOAD_RAN"
    args = build(tmp_path, marker)
    res = CliRunner().invoke(main, args)
    assert not marker.exists(), "the pickle's code ran"
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "refused to unpickle" in res.stderr and "--allow-unsafe-pickle" in res.stderr
    assert res.stdout == ""


def test_refusal_names_what_the_pickle_would_call(tmp_path: Path) -> None:
    marker = tmp_path / "PAYLOAD_RAN"
    res = CliRunner().invoke(main, _training_pt(tmp_path, marker))
    assert "calls exec, which would run code on load" in res.stderr
    assert not marker.exists()


def test_help_says_what_the_opt_in_risks() -> None:
    text = " ".join(CliRunner().invoke(main, ["align", "--help"]).output.split())
    assert "--allow-unsafe-pickle" in text
    assert "DANGEROUS: runs any code the file contains; trusted files only" in text


def test_opt_in_is_honest_it_does_run_the_code(tmp_path: Path) -> None:
    """In a scratch folder only: with allow_unsafe the same file's payload runs, as the help warns."""
    marker = tmp_path / "PAYLOAD_RAN"
    _training_pt(tmp_path, marker)
    with pytest.raises(ForensicsError):  # the payload's return value is no tensor
        load_training(tmp_path / "evil.pt", allow_unsafe=True)
    assert marker.exists()
