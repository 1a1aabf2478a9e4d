"""The torch-free reader of .pt/.ckpt files: bit for bit what ``torch.load(weights_only=True)`` gives,
every other object refused before it runs, every size bounded before it is allocated.

Records and captures are real forward passes (``realdata``) saved by torch itself in every layout
(zip, legacy, gzipped, deflate-compressed members); the hostile files are built by editing real ones.
"""
from __future__ import annotations

import collections
import gzip
import io
import os
import pickle
import struct
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from eagleforensics.alignment import align
from eagleforensics.arrays import as_array
from eagleforensics.cli import main
from eagleforensics.errors import ForensicsError
from eagleforensics.io import torchfile
from eagleforensics.io.capture import load_capture
from eagleforensics.io.safeload import load_object
from eagleforensics.positions import Position

from .realdata import SAMPLES, N, forward

CAP = SAMPLES / "capture.pt"


def _same(got: Any, ref: Any, where: str = "obj") -> None:
    """``got`` (our reader) equals ``ref`` (torch.load): containers, keys, values; arrays bit for bit,
    with torch's shape, dtype and strides."""
    if isinstance(ref, torch.Tensor):
        want = as_array(ref)
        assert isinstance(got, np.ndarray), (where, type(got))
        assert (got.dtype, got.shape) == (want.dtype, want.shape), where
        assert got.strides == want.strides or got.size == 0, (where, got.strides, want.strides)
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), where
    elif isinstance(ref, dict):
        assert isinstance(got, dict) and list(got) == list(ref), where
        for k in ref:
            _same(got[k], ref[k], f"{where}[{k!r}]")
    elif isinstance(ref, (list, tuple)):
        assert isinstance(got, type(ref) if type(ref) in (list, tuple) else tuple) and len(got) == len(ref), where
        for i, (a, b) in enumerate(zip(got, ref)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(ref, torch.device):
        assert got == str(ref) and type(got).__name__ == "TorchDevice", where
    else:
        assert type(got) is type(ref) and got == ref, (where, got, ref)


def _real_records(d: Path) -> list[Path]:
    """Real hidden states saved by torch in each record and capture layout eagleforensics reads."""
    run = forward("qwen3")
    bf = [run.p(p).to(torch.bfloat16).contiguous() for p in (3, 5, 7)] + [run.hs[N].to(torch.bfloat16).contiguous()]
    ids, mask = run.ids.clone(), torch.ones_like(run.ids)
    ckpt = {"input_ids": ids, "loss_mask": mask, "hidden_state": bf[3][None].clone(),
            "aux_hidden_state": torch.cat(bf[:3], -1)[None].clone()}
    objs = {
        "list.pt": {"hidden_states": bf, "input_ids": ids},
        "specforge.ckpt": ckpt,
        "speculators.pt": {"token_ids": ids, "hidden_states": torch.stack(bf, 1)},
        "modelopt.pt": {"input_ids": ids, "hidden_states": bf[3].float(), "aux_hidden_states": torch.cat(bf[:3], -1)},
        "views.pt": {"aux": (a := torch.cat(bf[:3], -1)), "slot1": a[:, 64:128], "t": a.t(), "step": a[::3, 1::2]},
        "capture.pt": {"hidden_states": [h[None].contiguous() for h in run.hs], "input_ids": ids},
        "param.pt": collections.OrderedDict(w=torch.nn.Parameter(run.p(2).clone()), n=7, s="text", f=0.5,
                                            dev=torch.device("cuda", 1), b=b"\x00\xff", t=(1, (2.5, None))),
        "dtypes.pt": {k: run.p(4)[:3, :5].to(getattr(torch, k)) for k in (
            "float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool",
            "uint16", "uint32", "complex64")},
        "neg_conj.pt": {"neg": torch._neg_view(run.p(1)), "conj": run.p(1)[:4, :4].to(torch.complex64).conj()},
        "empty_scalar.pt": {"e": torch.empty(0, 8), "s": torch.tensor(3.5), "i": torch.tensor(7)},
    }
    out = []
    for name, obj in objs.items():
        torch.save(obj, d / name)
        out.append(d / name)
        if name in ("list.pt", "specforge.ckpt", "views.pt", "param.pt"):
            legacy = d / f"legacy_{name}"
            torch.save(obj, legacy, _use_new_zipfile_serialization=False)
            out.append(legacy)
    gz = d / "specforge.ckpt.gz"
    gz.write_bytes(gzip.compress((d / "specforge.ckpt").read_bytes()))
    return out + [gz]


def _deflated(src: Path, dst: Path) -> Path:
    """``src`` re-zipped with every member deflate-compressed (torch reads such a file too)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info), compress_type=zipfile.ZIP_DEFLATED)
    return dst


def _torch_load(path: Path) -> Any:
    data = path.read_bytes()
    return torch.load(io.BytesIO(gzip.decompress(data) if path.suffix == ".gz" else data), weights_only=True)


def test_every_sample_and_real_record_reads_as_torch_loads_it(tmp_path):
    """Samples and real records in every layout (zip, legacy, gzip, deflate): torch.load's arrays, bit for bit."""
    files = sorted(SAMPLES.glob("*.pt")) + sorted(SAMPLES.glob("*.ckpt")) + _real_records(tmp_path)
    files += [_deflated(tmp_path / "views.pt", tmp_path / "deflated_views.pt"),
              _deflated(SAMPLES / "data_0.ckpt", tmp_path / "deflated.ckpt")]
    for f in files:
        _same(load_object(f), _torch_load(f), f.name)
        lazy = load_object(f, lazy=True)  # the same tensors, read later from the file
        _same(torchfile_read_all(lazy), _torch_load(f), f"{f.name} (lazy)")


def torchfile_read_all(obj: Any) -> Any:
    if isinstance(obj, torchfile.StoredTensor):
        return obj.read()
    if isinstance(obj, dict):
        return type(obj)((k, torchfile_read_all(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(torchfile_read_all(v) for v in obj)
    return obj


def test_a_deflated_capture_is_read_through_zipfile_and_scores_as_the_stored_one(tmp_path):
    """Issue 19: a capture whose members are deflate-compressed gave wrong rows through the memory map.
    Now its rows come from zipfile's decompression (never from the file's bytes), so align answers
    exactly as on the plain file."""
    bad = _deflated(CAP, tmp_path / "deflated_capture.pt")
    cap = load_capture(bad)
    ref = load_capture(CAP)
    for pos in ref.positions:
        assert np.array_equal(cap.read(pos), ref.read(pos))
        assert np.array_equal(cap.read_rows(pos, 3, 9), ref.read_rows(pos, 3, 9))
    record = SAMPLES / "record_layer_outputs.pt"
    got, want = align(record, bad), align(record, CAP)
    assert [m.position for m in got.matches] == [m.position for m in want.matches] == \
        [Position(3), Position(7), Position(10), Position(12, True)]
    np.testing.assert_array_equal(got.scores.score, want.scores.score)


def test_an_expanded_tensor_is_bounded_by_what_it_would_take(tmp_path):
    """Issue 19: a stride-0 tensor of a 1 KB file claims 2 GiB once materialised: refused before anything
    is allocated (one line, exit 2), measured by its storage (4 bytes) and its materialised size."""
    path = tmp_path / "expanded.pt"
    torch.save({"hidden_state": torch.zeros(1, 1).expand(1 << 15, 1 << 14), "input_ids": torch.arange(4)}, path)
    assert path.stat().st_size < 4096
    with pytest.raises(ForensicsError, match="expands .* to 2.0 GiB|past") as err:
        load_object(path)
    assert "tensor" in str(err.value)
    res = CliRunner().invoke(main, ["align", str(path), str(CAP)])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    small = tmp_path / "small_expanded.pt"  # a legitimately expanded small tensor reads as torch gives it
    torch.save({"m": torch.arange(3.0)[None].expand(5, 3)}, small)
    _same(load_object(small), torch.load(small, weights_only=True))


def test_many_small_expanded_tensors_are_bounded_together(tmp_path):
    """Each under the 64 MiB floor, together 100x past the file's size: refused as a whole."""
    path = tmp_path / "many.pt"
    one = torch.zeros(1).expand(15 << 20)  # 60 MiB of float32 each
    torch.save({f"t{i}": one for i in range(40)}, path)
    with pytest.raises(ForensicsError, match="tensors together"):
        load_object(path)


def test_a_record_truncated_while_it_is_read_is_one_line_not_sigbus(tmp_path, monkeypatch):
    """Issue 19: a training .pt cut short while align read it ended in SIGBUS (a memory map). Storages
    are read with pread now: the short read is bad input naming the file (exit 2)."""
    path = tmp_path / "record.pt"
    path.write_bytes((SAMPLES / "record_layer_outputs.pt").read_bytes())
    real = torchfile._finish

    def cut(obj, loader, lazy):
        os.truncate(path, path.stat().st_size // 2)  # after the archive was parsed, before any storage is read
        return real(obj, loader, lazy)

    monkeypatch.setattr(torchfile, "_finish", cut)
    res = CliRunner().invoke(main, ["align", str(path), str(SAMPLES / "capture_sweep.safetensors")])
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and str(path) in res.stderr and "Traceback" not in res.stderr
    assert "file ended while reading" in res.stderr


def test_a_capture_truncated_after_it_was_opened_is_one_line(tmp_path):
    path = tmp_path / "capture.pt"
    path.write_bytes(CAP.read_bytes())
    cap = load_capture(path)
    os.truncate(path, path.stat().st_size // 3)
    with pytest.raises(ForensicsError, match="file ended while reading"):
        cap.read(Position(11))


def _zip_with_pickle(d: Path, pkl: bytes, name: str = "evil.pt") -> Path:
    """A real record archive whose data.pkl is replaced by ``pkl`` (storages left as they are)."""
    src = SAMPLES / "record_layer_outputs.pt"
    out = d / name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, pkl if info.filename.endswith("/data.pkl") else zin.read(info))
    return out


@pytest.mark.parametrize("pkl,words", [
    (b"\x80\x02N" + b"r" + struct.pack("<I", 0x7FFFFFF0) + b".", None),  # memo index 2e9: C pickle would allocate 16 GB
    (b"\x80\x02c__builtin__\nbytearray\nJ\x00\x00\x00\x40\x85R.", "bytearray"),  # bytearray(2**30)
    (b"\x80\x02" + b"(" * 200000 + b"t" * 200000 + b".", "nested"),  # 200,000 nested tuples
    (b"\x80\x02]q\x00h\x00a.", "contains itself"),  # a list holding itself
    (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\nq\x00h\x00}b.", "BUILD"),  # BUILD on a rebuild function
    (b"\x80\x02X\x01\x00\x00\x00aQ.", "persistent_load"),  # a persistent id that is no storage
], ids=["memo-index", "bytearray-size", "deep-nesting", "self-containing", "build-on-ours", "persid-not-storage"])
def test_hostile_pickles_are_one_line_and_fast(tmp_path, pkl, words):
    path = _zip_with_pickle(tmp_path, pkl)
    t0 = time.perf_counter()
    try:
        obj = load_object(path)
    except ForensicsError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        if words:
            assert words in str(exc) or "corrupt" in str(exc), str(exc)
    else:
        assert words is None and obj is None  # the memo index alone is harmless in a dict memo
    assert time.perf_counter() - t0 < 10


def test_shared_tuples_cannot_make_hashing_take_forever(tmp_path):
    """t0 = (1, 1); t_k = (t_{k-1}, t_{k-1}): 60 levels are 2**60 values to hash as a dict key."""
    ops = [b"\x80\x02}q\x00K\x01K\x01\x86q\x01"]
    for i in range(1, 61):
        ops.append(b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86q" + bytes([i + 1]))
    pkl = b"".join(ops) + b"K\x00s."  # {t60: 0}
    path = _zip_with_pickle(tmp_path, pkl)
    t0 = time.perf_counter()
    with pytest.raises(ForensicsError, match="shared parts"):
        load_object(path)
    assert time.perf_counter() - t0 < 10


# torch 2.13 deprecates building quantized tensors; files holding them still exist, and must stay refused
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_other_tensor_kinds_and_dtypes_are_one_line(tmp_path):
    """Quantized, sparse and float8 tensors, which no numpy array holds: each named in one line."""
    cases = {
        "q.pt": ({"q": torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8)}, "quantized"),
        "sparse.pt": ({"s": torch.randn(3, 3).to_sparse()}, "sparse"),
        "f8.pt": ({"f": torch.zeros(3).to(torch.float8_e4m3fn)}, "float8_e4m3fn tensor that cannot be read as an array"),
    }
    for name, (obj, words) in cases.items():
        torch.save(obj, tmp_path / name)
        with pytest.raises(ForensicsError, match=words):
            load_object(tmp_path / name)


def test_every_global_torch_allows_is_read_or_refused_by_name():
    """The allowlist against torch's own (the pinned version): each name torch's weights-only loader allows
    is either rebuilt here, or refused in one line; only tensor-type classes (usable only to build a tensor
    from a Python list) and TypedStorage as a global (torch.save names storage classes) are left out on
    purpose: torch.save never writes them."""
    from torch._weights_only_unpickler import _get_allowed_globals

    loader = torchfile._Loader(torchfile._Source(SAMPLES / "data_0.ckpt"), legacy=False)
    left_out = []
    for full in _get_allowed_globals():
        module, name = full.rsplit(".", 1)
        try:
            found = loader.allowed(module, name)
        except ForensicsError:
            continue
        if found is None:
            left_out.append(full)
    assert left_out and all((n.endswith("Tensor") and n != "torch.Tensor") or n == "torch.storage.TypedStorage"
                            for n in left_out), left_out


def test_a_pickle_that_is_not_a_torch_file_is_refused_or_named(tmp_path):
    """A bare pickle of plain values is no torch file; one with code is refused before it runs."""
    plain = tmp_path / "plain.pt"
    plain.write_bytes(pickle.dumps({"a": 1}, protocol=2))
    with pytest.raises(ForensicsError, match="Invalid magic number"):
        load_object(plain)
