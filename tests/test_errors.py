"""The error catalogue (docs/errors.md): every bad input is one stderr line naming the file, exit 2.

Each row builds its bad input from the real samples (data_samples/, regenerated from a tiny
Llama's forward pass) or from a real forward pass of another tiny model, by truncating,
flipping bytes or re-saving with a wrong dtype or shape, then runs the real CLI.
"""
from __future__ import annotations

import gzip
import io
import json
import pickle
import pickletools
import re
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from eagleforensics.alignment import align
from eagleforensics.cli import main
from eagleforensics.errors import ForensicsError

from .realdata import SAMPLES, N, forward

ROOT = Path(__file__).resolve().parent.parent
REC, CAP, SWEEP, CKPT = (SAMPLES / n for n in
                         ("record_layer_outputs.pt", "capture.pt", "capture_sweep.safetensors", "data_0.ckpt"))


def run_cli(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, [str(a) for a in args])
    return res.exit_code, res.stdout, res.stderr


def assert_one_line_error(code: int, out: str, err: str, *expect: str, exit_code: int = 2) -> None:
    """Exit code, exactly one stderr line in the house format, no traceback, nothing on stdout."""
    assert code == exit_code, (code, out, err)
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith("eagleforensics: error: "), err
    assert "Traceback" not in err + out
    assert out == ""
    for e in expect:
        assert e in err, f"{e!r} not in {err!r}"


# ---------------------------------------------------------------- builders (real data, made bad)

def _load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def _save(path: Path, obj: object) -> Path:
    torch.save(obj, path)
    return path


def _bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _safetensors_with_header(path: Path, header: dict, body: bytes) -> Path:
    raw = json.dumps(header).encode()
    return _bytes(path, struct.pack("<Q", len(raw)) + raw + body)


def _legacy_claiming(path: Path, numel: int) -> Path:
    """A legacy (non-zip) torch.save of a real slot whose storage numel is edited to ``numel``."""
    rec = _load(REC)
    torch.save({"hidden_states": [rec["hidden_states"][0]]}, path, _use_new_zipfile_serialization=False)
    data = path.read_bytes()
    with io.BytesIO(data) as fh:  # legacy layout: three small pickles, then the object pickle
        for _ in range(3):
            pickle.load(fh)
        ops = list(pickletools.genops(fh))
    # the persistent id is ('storage', <type>, key, 'cpu', numel, ...): numel is the int after 'cpu'
    at = next(i for i, (_, arg, _) in enumerate(ops) if arg == "cpu")
    op, _, pos = next(o for o in ops[at:] if o[0].name.startswith(("BININT", "LONG")))
    end = ops[ops.index((op, _, pos)) + 1][2]
    big = numel.to_bytes(8, "little", signed=True)
    return _bytes(path, data[:pos] + b"\x8a\x08" + big + data[end:])


@dataclass(frozen=True)
class Row:
    """One catalogue row: how to build the bad input, the CLI args, what the message must say."""

    id: str
    build: Callable[[Path], list[str]]
    expect: tuple[str, ...]


def _b_missing(d: Path) -> list[str]:
    return ["align", str(d / "no_such_record.pt"), str(CAP)]


def _b_missing_capture(d: Path) -> list[str]:
    return ["align", str(REC), str(d / "no_such_capture.pt")]


def _b_dir_input_ids(d: Path) -> list[str]:
    (d / "ids_dir").mkdir()
    return ["capture", str(d / "model"), "--input-ids", str(d / "ids_dir"), "-o", str(d / "out.safetensors")]


def _b_empty(d: Path) -> list[str]:
    return ["align", str(_bytes(d / "empty.pt", b"")), str(CAP)]


def _b_empty_capture(d: Path) -> list[str]:
    return ["align", str(REC), str(_bytes(d / "empty.safetensors", b""))]


def _b_not_regular(d: Path) -> list[str]:
    return ["align", "/dev/null", str(CAP)]


def _b_trunc_zip(d: Path) -> list[str]:
    data = REC.read_bytes()
    return ["align", str(_bytes(d / "half.pt", data[: len(data) // 2])), str(CAP)]


def _b_trunc_zip_capture(d: Path) -> list[str]:
    data = CAP.read_bytes()
    return ["align", str(REC), str(_bytes(d / "half_capture.pt", data[: len(data) - 100]))]


def _b_trunc_safetensors(d: Path) -> list[str]:
    data = SWEEP.read_bytes()
    return ["align", str(REC), str(_bytes(d / "half.safetensors", data[: len(data) // 2]))]


def _b_trunc_safetensors_header(d: Path) -> list[str]:
    return ["align", str(REC), str(_bytes(d / "head.safetensors", SWEEP.read_bytes()[:200]))]


def _b_trunc_gzip(d: Path) -> list[str]:
    packed = gzip.compress(CKPT.read_bytes(), mtime=0)
    return ["align", str(_bytes(d / "cut.ckpt.gz", packed[: len(packed) // 2])), str(CAP)]


def _b_gz_not_gzip(d: Path) -> list[str]:
    return ["align", str(_bytes(d / "data_0.ckpt.gz", CKPT.read_bytes())), str(CAP)]


def _b_unknown(d: Path) -> list[str]:
    return ["align", str(_bytes(d / "notes.pt", b"hidden states are in the other folder\n")), str(CAP)]


def _b_corrupt_pickle(d: Path) -> list[str]:
    data = REC.read_bytes()  # torch does not check zip CRCs: a flipped name inside data.pkl is read as is
    i = data.index(b"_rebuild_tensor_v2")
    return ["align", str(_bytes(d / "flipped.pt", data[:i] + b"_rebuild_tensor_w2" + data[i + 18:])), str(CAP)]


def _b_no_float(d: Path) -> list[str]:
    rec = _load(REC)
    return ["align", str(_save(d / "ids_only.pt", {"input_ids": rec["input_ids"], "loss_mask": rec["loss_mask"]})),
            str(CAP)]


def _b_no_float_capture(d: Path) -> list[str]:
    return ["align", str(REC), str(_save(d / "ids_capture.pt", {"input_ids": _load(CAP)["input_ids"]}))]


def _b_no_split(d: Path) -> list[str]:
    run = forward("llama")  # a real H=64 model: SpecForge aux is 3 x 64 = 192, which 128 does not split
    aux = torch.cat([run.p(2), run.p(N // 2), run.p(N - 3)], dim=-1)
    rec = {"input_ids": run.ids.clone(), "loss_mask": torch.ones_like(run.ids),
           "hidden_state": run.hs[N][None].clone(), "aux_hidden_state": aux[None].clone()}
    return ["align", str(_save(d / "h64.ckpt", rec)), str(CAP)]


def _b_different_h(d: Path) -> list[str]:
    run = forward("llama")
    rec = {"hidden_states": [run.p(3), run.hs[N]], "input_ids": run.ids.clone()}
    return ["align", str(_save(d / "h64_list.pt", rec)), str(CAP)]


def _b_ragged_t(d: Path) -> list[str]:
    cap = _load(CAP)
    hs = list(cap["hidden_states"])
    hs[9] = hs[9][:, :30].clone()
    return ["align", str(REC), str(_save(d / "ragged_t.pt", {"hidden_states": hs, "input_ids": cap["input_ids"]}))]


def _b_ragged_h(d: Path) -> list[str]:
    sweep = load_file(str(SWEEP))
    sweep["hidden.4"] = sweep["hidden.4"][:, :96].contiguous()
    path = d / "ragged_h.safetensors"
    save_file(sweep, str(path))  # without the helper's metadata: read as named integer keys
    return ["align", str(REC), str(path)]


def _b_zero_padding(d: Path) -> list[str]:
    rec = _load(CKPT)
    rec["input_ids"] = torch.zeros_like(rec["input_ids"])
    rec["loss_mask"] = torch.zeros_like(rec["loss_mask"])
    return ["align", str(_save(d / "all_padding.ckpt", rec)), str(CAP)]


def _b_zero_shared(d: Path) -> list[str]:
    cap = _load(CAP)
    cap["input_ids"] = cap["input_ids"] + 1  # another prompt: no id in common at any offset
    return ["align", str(REC), str(_save(d / "other_prompt_capture.pt", cap))]


def _b_int_train(d: Path) -> list[str]:
    rec = _load(REC)
    rec["hidden_states"] = [(h.float() * 100).to(torch.int32) for h in rec["hidden_states"]]
    return ["align", str(_save(d / "int32.pt", rec)), str(CAP)]


def _b_bool_train(d: Path) -> list[str]:
    rec = _load(CKPT)
    rec["aux_hidden_state"] = rec["aux_hidden_state"] > 0
    return ["align", str(_save(d / "bool.ckpt", rec)), str(CAP)]


def _b_int_capture(d: Path) -> list[str]:
    cap = _load(CAP)
    cap["hidden_states"] = [(h * 100).to(torch.int16) for h in cap["hidden_states"]]
    return ["align", str(REC), str(_save(d / "int16_capture.pt", cap))]


def _b_int_sweep(d: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(SWEEP), "pt") as fh:
        meta = fh.metadata()
    sweep = load_file(str(SWEEP))
    sweep["hidden.5"] = (sweep["hidden.5"] * 100).to(torch.int32)
    path = d / "int_sweep.safetensors"
    save_file(sweep, str(path), metadata=meta)
    return ["align", str(REC), str(path)]


def _b_absurd_shape(d: Path) -> list[str]:
    header = {"hidden.0": {"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 64]}}
    return ["align", str(REC), str(_safetensors_with_header(d / "absurd.safetensors", header, bytes(64)))]


def _b_absurd_header_len(d: Path) -> list[str]:
    return ["align", str(REC), str(_bytes(d / "hlen.safetensors", struct.pack("<Q", 1 << 62) + b"{" + bytes(63)))]


def _b_absurd_npy(d: Path) -> list[str]:
    path = d / "ids.npy"
    np.save(path, _load(CAP)["input_ids"].numpy())
    data = path.read_bytes()
    old = re.search(rb"'shape': \(\d+,\)", data).group(0)
    new = b"'shape': (1000000000000000,)"
    pad = len(new) - len(old)
    head_end = data.index(b"\n") + 1
    patched = (data[:head_end - 1 - pad] + b"\n" + data[head_end:]).replace(old, new)  # keep the header length
    path.write_bytes(patched)
    return ["capture", str(d / "model"), "--input-ids", str(path), "-o", str(d / "out.safetensors")]


def _b_absurd_legacy(d: Path) -> list[str]:
    return ["align", str(_legacy_claiming(d / "legacy.pt", 1 << 50)), str(CAP)]


def _b_expanded(d: Path) -> list[str]:
    """A real slot's first value expanded (stride 0) to [32768, 16384]: a 1 KB file claiming 2 GiB."""
    one = _load(REC)["hidden_states"][0][0, :1, :1].float().clone()
    return ["align", str(_save(d / "expanded.pt", {"hidden_states": [one.expand(1 << 15, 1 << 14)]})), str(CAP)]


def _b_outside_storage(d: Path) -> list[str]:
    """The sample record with one tensor's size edited past its storage (the pickle's first shape, doubled)."""
    data = REC.read_bytes()
    size = b"K\x01K@K\x80\x87"  # BININT1 1, 64, 128, TUPLE3: hidden_states[0]'s size (1, 64, 128)
    return ["align", str(_bytes(d / "outside.pt", data.replace(size, b"K\x01K\x80K\x80\x87", 1))), str(CAP)]


def _b_float8(d: Path) -> list[str]:
    rec = _load(REC)
    rec["hidden_states"][1] = rec["hidden_states"][1].to(torch.float8_e4m3fn)
    return ["align", str(_save(d / "f8.pt", rec)), str(CAP)]


LOGS = ROOT / "tests" / "fixtures" / "logs"


def _b_plan_baseline_only(d: Path) -> list[str]:
    return ["plan", str(LOGS / "sglang_0.4_baseline.log")]


def _b_plan_launch_unknown_run(d: Path) -> list[str]:
    return ["plan", f"broken={LOGS / 'sglang_0.5.5_broken.log'}", "--launch", "fixed=3"]


def _b_plan_launch_malformed(d: Path) -> list[str]:
    return ["plan", f"broken={LOGS / 'sglang_0.5.5_broken.log'}", "--launch", "broken=three"]


def _b_doctor_nothing(d: Path) -> list[str]:
    return ["doctor"]


def _b_doctor_file_for_dir(d: Path) -> list[str]:
    return ["doctor", "--drafter", str(SAMPLES / "drafter" / "config.json")]


ROWS = [
    Row("missing-file", _b_missing, ("no_such_record.pt", "no such file")),
    Row("missing-file", _b_missing_capture, ("no_such_capture.pt", "no such file")),
    Row("directory-for-file", _b_dir_input_ids, ("ids_dir", "is a directory, expected a file")),
    Row("not-a-regular-file", _b_not_regular, ("/dev/null", "is not a regular file")),
    Row("empty-file", _b_empty, ("empty.pt", "file is empty")),
    Row("empty-file", _b_empty_capture, ("empty.safetensors", "file is empty")),
    Row("truncated-zip", _b_trunc_zip, ("half.pt", "truncated or corrupt zip archive")),
    Row("truncated-zip", _b_trunc_zip_capture, ("half_capture.pt", "truncated or corrupt zip archive")),
    Row("truncated-safetensors", _b_trunc_safetensors, ("half.safetensors", "points past the end of the file",
                                                        "truncated or corrupt")),
    Row("truncated-safetensors", _b_trunc_safetensors_header, ("head.safetensors", "safetensors header claims",
                                                               "but the file has 200")),
    Row("truncated-gzip", _b_trunc_gzip, ("cut.ckpt.gz", "truncated or corrupt gzip stream")),
    Row("gz-not-gzip", _b_gz_not_gzip, ("data_0.ckpt.gz", "named .gz but is not gzip", "torch zip archive")),
    Row("unknown-format", _b_unknown, ("notes.pt", "unknown format", "first bytes 68696464")),
    Row("corrupt-pickle", _b_corrupt_pickle, ("flipped.pt", "refused to unpickle", "_rebuild_tensor_w2",
                                              "does not exist here: the pickle is corrupt")),
    Row("no-float-tensors", _b_no_float, ("ids_only.pt", "no floating-point hidden-state tensors")),
    Row("no-float-tensors", _b_no_float_capture, ("ids_capture.pt", "no hidden-state positions found")),
    Row("hidden-size-no-split", _b_no_split, ("h64.ckpt", "'aux_hidden_state' has width 192",
                                              "no split into k states of the capture's hidden size 128")),
    Row("hidden-size-differs", _b_different_h, ("h64_list.pt", "'hidden_states[0]' has hidden size 64",
                                                "capture has hidden size 128")),
    Row("ragged-capture", _b_ragged_t, ("ragged_t.pt", "ragged capture", "token count T",
                                        "[T, H] = [40, 128]", "entry 9 is [30, 128]")),
    Row("ragged-capture", _b_ragged_h, ("ragged_h.safetensors", "ragged capture", "hidden size H",
                                        "entry 4 is [40, 96]")),
    Row("zero-tokens", _b_zero_padding, ("all_padding.ckpt", "zero tokens left after dropping trailing padding")),
    Row("zero-tokens", _b_zero_shared, ("record_layer_outputs.pt", "zero tokens can be paired",
                                        "other_prompt_capture.pt", "differ from the first token", "no run of 4")),
    Row("integer-or-bool-states", _b_int_train, ("int32.pt", "'hidden_states[0]' holds int32 values",
                                                 "must be floating point")),
    Row("integer-or-bool-states", _b_bool_train, ("bool.ckpt", "'aux_hidden_state' holds bool values")),
    Row("integer-or-bool-states", _b_int_capture, ("int16_capture.pt", "holds int16 values")),
    Row("integer-or-bool-states", _b_int_sweep, ("int_sweep.safetensors", "'hidden.5' holds I32 values")),
    Row("absurd-size", _b_absurd_shape, ("absurd.safetensors", "claims shape [1099511627776, 1099511627776] F32",
                                         "but holds 64 bytes")),
    Row("absurd-size", _b_absurd_header_len, ("hlen.safetensors", "header claims 4611686018427387904 bytes")),
    Row("absurd-size", _b_absurd_npy, ("ids.npy", "numpy header claims shape [1000000000000000]",
                                       "7.1 PiB")),
    Row("absurd-size", _b_absurd_legacy, ("legacy.pt", "declares 2.0 PiB of tensor data", "nothing was allocated")),
    Row("expanded-tensor", _b_expanded, ("expanded.pt", "tensor 0 ([32768, 16384] float32) expands", "2.0 GiB",
                                         "decompression bomb")),
    Row("tensor-outside-storage", _b_outside_storage, ("outside.pt", "a tensor of shape [1, 128, 128]",
                                                       "needs 32.0 KiB of its storage '0', which holds 16.0 KiB: corrupt")),
    Row("unsupported-tensor", _b_float8, ("f8.pt", "holds a float8_e4m3fn tensor that cannot be read as an array")),
    Row("no-speculative-run", _b_plan_baseline_only, ("plan needs at least one speculative run",
                                                      "sglang_0.4_baseline (no speculation)")),
    Row("launch-not-a-run", _b_plan_launch_unknown_run, ("--launch names run 'fixed'", "not one of the runs: broken")),
    Row("launch-not-a-run", _b_plan_launch_malformed, ("launch 'three': expected STEPS[,TOPK[,DRAFT_TOKENS]]",)),
    Row("doctor-without-inputs", _b_doctor_nothing, ("give at least one of --drafter, --target, --train",)),
    Row("doctor-without-inputs", _b_doctor_file_for_dir, ("config.json", "--drafter expects a directory")),
]


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    (d / "model").mkdir()  # capture's MODEL_DIR argument; the bad --input-ids is refused before it is read
    return d


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.id}:{r.build.__name__[3:]}" for r in ROWS])
def test_catalogue_row_is_one_line_and_exit_2(row: Row, bad_dir: Path) -> None:
    d = bad_dir / row.build.__name__
    d.mkdir()
    (d / "model").mkdir()
    args = row.build(d)
    assert_one_line_error(*run_cli(*args), *row.expect)


def test_every_catalogue_row_in_the_docs_has_a_test_and_back() -> None:
    """docs/errors.md and ROWS name the same rows (plus the rows tested elsewhere in this file)."""
    text = (ROOT / "docs" / "errors.md").read_text()
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", text, flags=re.M))
    from .hostile import CATALOGUE_IDS  # the rows of issue 13, tested in tests/test_hardening.py

    tested = ({r.id for r in ROWS} | {"nan-or-inf", "malicious-pickle", "internal-error", "directory-for-file", "gzip-bomb"}
              | CATALOGUE_IDS | {"truncated-while-read", "hostile-pickle"}  # these two: tests/test_torchfile.py
              | {"ambiguous-zip", "tokenizer-panic"}  # tests/test_hardening_io.py
              | {"probe-server", "probe-arguments"})  # tests/test_probe_hardening.py
    assert documented == tested


def test_directory_as_training_file_is_refused_by_the_library(tmp_path: Path) -> None:
    with pytest.raises(ForensicsError, match="is a directory, expected a file") as err:
        align(tmp_path, CAP)
    assert str(tmp_path) in str(err.value)


def test_directory_as_training_file_is_one_line_in_the_cli(tmp_path: Path) -> None:
    assert_one_line_error(*run_cli("align", tmp_path, CAP), "is a directory, expected a file")


def test_hf_list_with_a_missing_entry_is_refused_when_n_is_given(tmp_path: Path) -> None:
    """Dropping one entry of output_hidden_states silently relabels every later position; --num-layers catches it."""
    cap = _load(CAP)
    del cap["hidden_states"][5]
    path = _save(tmp_path / "gap.pt", cap)
    assert align(REC, path).num_layers == 11  # without N the 12-entry list reads as an 11-layer sweep
    assert_one_line_error(*run_cli("align", "--num-layers", "12", REC, path), "gap.pt",
                          "holds 12 hidden states but a model of 12 layers gives 13")


# ---------------------------------------------------------------- NaN / Inf: a finding, not exit 2

def test_nan_and_inf_rows_are_reported_where_they_are_and_skipped(tmp_path: Path) -> None:
    """Matching skips non-finite tokens, places the slots anyway and names slot/position and rows."""
    rec = _load(REC)
    hs = [h.clone() for h in rec["hidden_states"]]
    hs[1][0, 5, :] = float("nan")
    hs[2][0, 7, 3] = float("inf")
    rec["hidden_states"] = hs
    cap = _load(CAP)
    chs = [h.clone() for h in cap["hidden_states"]]
    chs[3][0, 11, 0] = float("-inf")
    cap["hidden_states"] = chs
    code, out, err = run_cli("align", "--json", _save(tmp_path / "nan.pt", rec), _save(tmp_path / "cap.pt", cap))
    assert err == "" and code == 1, err  # the incident record: ACTION (ids must be set)
    doc = json.loads(out)
    assert doc["level"] == "ACTION"
    msgs = {f["code"]: f["message"] for f in doc["findings"]}
    assert "hidden_states[1]: row 5" in msgs["nonfinite-training"]
    assert "hidden_states[2]: row 7" in msgs["nonfinite-training"]
    assert "skipped in matching" in msgs["nonfinite-training"]
    assert "p3: row 11" in msgs["nonfinite-capture"]
    by_name = {m["name"]: m for m in doc["mapping"]}
    assert [by_name[f"hidden_states[{i}]"]["position"] for i in range(4)] == [3, 7, 10, 12]
    assert by_name["hidden_states[1]"]["tokens"] == 39 and by_name["hidden_states[0]"]["tokens"] == 39
    assert by_name["hidden_states[2]"]["tokens"] == 39 and by_name["hidden_states[3]"]["tokens"] == 40
    assert by_name["hidden_states[1]"]["nonfinite_rows"] == 1


def test_all_rows_nan_gives_no_confident_match_not_a_guess(tmp_path: Path) -> None:
    rec = _load(REC)
    rec["hidden_states"] = [h.clone() for h in rec["hidden_states"]]
    rec["hidden_states"][0][:] = float("nan")
    r = align(_save(tmp_path / "nan0.pt", rec), CAP)
    assert not r.matches[0].confident and r.matches[0].tokens == 0
    assert [m.position.p for m in r.matches[1:]] == [7, 10, 12]
    assert r.exit_code == 1


# ---------------------------------------------------------------- last-resort guard

def test_unexpected_exception_is_one_internal_error_line_with_exit_3(monkeypatch: pytest.MonkeyPatch) -> None:
    import eagleforensics.alignment as align_mod

    def boom(*_a: object, **_k: object) -> None:
        raise ZeroDivisionError("a bug\nover two lines")

    monkeypatch.setattr(align_mod, "align", boom)
    monkeypatch.delenv("EAGLEFORENSICS_TRACEBACK", raising=False)
    code, out, err = run_cli("align", REC, CAP)
    assert code == 3 and out == "" and err.count("\n") == 1, err
    assert err.startswith("eagleforensics: internal error: ZeroDivisionError: a bug")
    assert "EAGLEFORENSICS_TRACEBACK=1" in err and "Traceback" not in err
    monkeypatch.setenv("EAGLEFORENSICS_TRACEBACK", "1")
    res = CliRunner().invoke(main, ["align", str(REC), str(CAP)])
    assert isinstance(res.exception, ZeroDivisionError)  # re-raised for the traceback


def test_file_name_with_a_newline_still_gives_one_line(tmp_path: Path) -> None:
    path = tmp_path / "two\nlines.pt"
    path.write_bytes(b"")
    assert_one_line_error(*run_cli("align", path, CAP), "file is empty", "two\\nlines.pt")


# ---------------------------------------------------------------- the real process, end to end

@pytest.mark.parametrize("build", [_b_missing, _b_trunc_safetensors, _b_absurd_legacy])
def test_real_process_prints_one_line_and_exits_2(build: Callable[[Path], list[str]], tmp_path: Path) -> None:
    args = build(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "eagleforensics", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("eagleforensics: error: ")


def test_samples_still_align_cleanly() -> None:
    """The hardening keeps the incident sample's answer: p=[3, 7, 10] + post-norm final, ACTION (exit 1)."""
    code, out, err = run_cli("align", REC, CAP)
    assert code == 1 and err == "" and "VERDICT: ACTION" in out
    r = align(REC, CAP)
    assert [(m.position.p, m.position.normed) for m in r.matches] == [(3, False), (7, False), (10, False), (12, True)]


def test_legacy_torch_files_still_load(tmp_path: Path) -> None:
    """The legacy-size check reads the real claims: an honest legacy save aligns as the zip one does."""
    rec = _load(REC)
    path = tmp_path / "legacy_ok.pt"
    torch.save(rec, path, _use_new_zipfile_serialization=False)
    r = align(path, CAP)
    assert [m.position.p for m in r.matches] == [3, 7, 10, 12] and r.exit_code == 1


def test_gzip_bomb_is_refused_before_it_fills_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A .ckpt.gz that expands past the cap (half of RAM; 1 MiB here) is one line, exit 2."""
    import gzip as gz

    bomb = tmp_path / "data_0.ckpt.gz"
    bomb.write_bytes(gz.compress(b"\0" * (8 << 20)))  # 8 MiB of zeros in ~8 KiB
    monkeypatch.setattr("eagleforensics.io.safeload.gunzip_limit", lambda: 1 << 20)
    assert_one_line_error(*run_cli("align", bomb, CAP), "data_0.ckpt.gz", "gzip bomb")
