"""io hands out numpy arrays, reads safetensors, numpy and torch files without torch, and keeps every bit."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from eagleforensics.arrays import BF16, as_array
from eagleforensics.errors import ForensicsError
from eagleforensics.io.capture import load_capture
from eagleforensics.io.safeload import load_object
from eagleforensics.io.training import load_training

from .realdata import ROOT, SAMPLES

# Loads a safetensors capture, a safetensors record and numpy files the way align does, then says
# which of them pulled torch in. Run in a fresh interpreter: this test process has torch already.
_PROBE = textwrap.dedent("""
    import sys
    import numpy as np
    import eagleforensics.io.capture, eagleforensics.io.training, eagleforensics.io.sweep
    from eagleforensics.io.capture import load_capture
    from eagleforensics.io.training import load_training
    from eagleforensics.positions import Position
    seen = []
    cap = load_capture(sys.argv[1])
    cap.read(Position(3)); cap.read_rows(Position(5), 2, 9)
    seen.append(("capture", "torch" in sys.modules))
    rec = load_training(sys.argv[2])
    rec.slots(cap.hidden_size)
    seen.append(("record", "torch" in sys.modules))
    np.save(sys.argv[3] + "/x.npy", np.ones((4, 8), np.float32))
    np.savez(sys.argv[3] + "/x.npz", a=np.ones((4, 8), np.float16), input_ids=np.arange(4))
    load_training(sys.argv[3] + "/x.npy"); load_training(sys.argv[3] + "/x.npz")
    seen.append(("numpy", "torch" in sys.modules))
    if len(sys.argv) > 4:
        load_training(sys.argv[4])
        seen.append(("pt", "torch" in sys.modules))
        load_training(sys.argv[4], allow_unsafe=True)
        seen.append(("unsafe", "torch" in sys.modules))
    print(seen)
""")


def _probe(tmp_path: Path, *extra: Path) -> list:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(SAMPLES / "capture_sweep.safetensors"),
                          str(SAMPLES / "record_layer_outputs.safetensors"), str(tmp_path), *map(str, extra)],
                         capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own probe's list of tuples


def test_safetensors_and_numpy_inputs_never_import_torch(tmp_path):
    """Importing io, loading a capture and a record from safetensors, and npy/npz records: torch stays out."""
    assert _probe(tmp_path) == [("capture", False), ("record", False), ("numpy", False)]


def test_pt_files_are_read_without_torch_and_the_probe_sees_it_when_unsafe_loading_brings_it(tmp_path):
    """A .pt record is read without torch too; ``allow_unsafe`` (torch.load) brings it in, and the probe
    reports it then: the checks above can fail."""
    assert _probe(tmp_path, SAMPLES / "record_layer_outputs.pt")[-2:] == [("pt", False), ("unsafe", True)]


def test_safetensors_record_is_the_pt_record_bit_for_bit():
    """The list layout stored as hidden_states.0..3 reads back as the .pt list: names, roles, bits, ids, mask."""
    st, pt = load_training(SAMPLES / "record_layer_outputs.safetensors"), load_training(SAMPLES / "record_layer_outputs.pt")
    assert st.format == pt.format == "list"
    a, b = st.slots(128), pt.slots(128)
    assert [(s.name, s.role) for s in a] == [(s.name, s.role) for s in b] == [
        ("hidden_states[0]", "aux"), ("hidden_states[1]", "aux"), ("hidden_states[2]", "aux"),
        ("hidden_states[3]", "final")]
    for x, y in zip(a, b):
        assert x.data.dtype == y.data.dtype == BF16 and x.data.tobytes() == y.data.tobytes()
    assert st.input_ids.dtype == np.int64 and np.array_equal(st.input_ids, pt.input_ids)
    assert np.array_equal(st.loss_mask, pt.loss_mask)


def test_a_numbered_run_with_a_gap_stays_generic(tmp_path):
    """hidden_states.0 and .2 without .1 are not a list: every float array stays its own named slot."""
    from safetensors.numpy import save_file

    h = np.arange(24, dtype=np.float32).reshape(3, 8)
    save_file({"hidden_states.0": h, "hidden_states.2": h + 1}, str(tmp_path / "gap.safetensors"))
    rec = load_training(tmp_path / "gap.safetensors")
    assert rec.format == "generic" and [s.name for s in rec.slots(8)] == ["hidden_states.0", "hidden_states.2"]


def test_pt_tensors_become_arrays_at_the_boundary(tmp_path):
    """Nested dicts, lists and tuples of tensors come back as ndarrays over the same values (bf16 as BF16)."""
    t = torch.randn(5, 4)
    torch.save({"a": [t.to(torch.bfloat16), (t, {"ids": torch.arange(5)})], "name": "x"}, tmp_path / "n.pt")
    obj = load_object(tmp_path / "n.pt")
    bf, (f, inner) = obj["a"][0], obj["a"][1]
    assert bf.dtype == BF16 and bf.tobytes() == t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    assert isinstance(f, np.ndarray) and np.array_equal(f, t.numpy())
    assert inner["ids"].dtype == np.int64 and obj["name"] == "x"


def test_a_tensor_numpy_cannot_hold_is_one_clear_error(tmp_path):
    torch.save({"hidden_state": torch.zeros(3, 4).to(torch.float8_e4m3fn)}, tmp_path / "f8.pt")
    with pytest.raises(ForensicsError, match="float8_e4m3fn tensor that cannot be read as an array"):
        load_training(tmp_path / "f8.pt")


def test_big_endian_npy_is_read_as_native_numbers(tmp_path):
    h = np.linspace(-2, 2, 32, dtype=">f4").reshape(4, 8)
    np.save(tmp_path / "be.npy", h)
    data = load_training(tmp_path / "be.npy").slots(8)[0].data
    assert data.dtype == np.float32 and np.array_equal(data, h.astype(np.float32))


def _raw_safetensors(path: Path, header: dict, body: bytes) -> Path:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + body)
    return path


@pytest.mark.parametrize("header,body,message", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(12), "its tensors cover 8"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8), "starts at byte 4 of the data, expected 0"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(8), "tensors overlap or leave a gap"),
    ({"a": {"dtype": "XX", "shape": [2], "data_offsets": [0, 2]}}, bytes(2), "unknown dtype 'XX'"),
    ({"a": {"dtype": "F8_E4M3", "shape": [2, 2], "data_offsets": [0, 4]}}, bytes(4), "holds F8_E4M3 values"),
])
def test_safetensors_the_library_refused_are_still_refused(tmp_path, header, body, message):
    """Without safe_open, our reader keeps its rules: tensors tile the data section, dtypes are known."""
    path = _raw_safetensors(tmp_path / "bad.safetensors", header, body)
    with pytest.raises(ForensicsError, match=message) as err:
        load_object(path)
    assert "\n" not in str(err.value) and "bad.safetensors" in str(err.value)


def test_pt_capture_rows_stream_from_the_file_bit_for_bit():
    """A memory-mapped .pt capture's rows are located in the file (arrays over the mapping) and read from it."""
    from eagleforensics.io.filerows import FileRows
    from eagleforensics.positions import Position

    cap = load_capture(SAMPLES / "capture.pt")
    assert cap.streams
    src = cap.readers[Position(4)]
    assert isinstance(getattr(src._rows, "__self__", None), FileRows)
    raw = torch.load(SAMPLES / "capture.pt", weights_only=True)["hidden_states"][4][0]
    assert cap.read_rows(Position(4), 3, 11).tobytes() == as_array(raw[3:11]).tobytes()
