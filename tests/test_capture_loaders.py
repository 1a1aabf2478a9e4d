"""Every capture layout loads lazily, and each convention maps integers to the right positions."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from eagleforensics.arrays import as_array
from eagleforensics.io.capture import load_capture
from eagleforensics.errors import ForensicsError
from eagleforensics.positions import Position

from .realdata import H, N, forward


def same(a, t) -> bool:
    """``a`` (what io hands out) holds exactly ``t``'s values: an ndarray of the same dtype, shape and bits."""
    b = as_array(t)
    return isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture(scope="module")
def run():
    return forward("qwen3", length=20)


def test_torch_save_of_hf_hidden_states_tuple(tmp_path, run):
    """torch.save(out.hidden_states): N+1 tensors [1,T,H]; HF's last entry is the post-norm final."""
    path = tmp_path / "capture.pt"
    torch.save(tuple(h[None] for h in run.hs), path)
    cap = load_capture(path)
    assert cap.num_layers == N and cap.hidden_size == H and cap.num_tokens == 20
    assert cap.positions == [Position(p) for p in range(N)] + [Position(N, True)]
    assert same(cap.read(Position(N, True)), run.hs[N])
    assert cap.input_ids is None


def test_list_of_2d_tensors(tmp_path, run):
    path = tmp_path / "capture.pt"
    torch.save(list(run.hs), path)
    assert same(load_capture(path).read(Position(3)), run.hs[3])


def test_dict_with_hidden_states_list_and_input_ids(tmp_path, run):
    path = tmp_path / "capture.pt"
    torch.save({"hidden_states": list(run.hs), "input_ids": run.ids[None].clone(), "model": "tiny-qwen3"}, path)
    cap = load_capture(path)
    assert same(cap.input_ids, run.ids)
    assert cap.metadata["model"] == "tiny-qwen3"


@pytest.mark.parametrize("convention,shift", [("vllm", 0), ("sglang", 1), ("hf", 0)])
def test_named_int_keys_follow_the_convention(tmp_path, run, convention, shift):
    """safetensors keys <name>.<int>: vllm k->p=k, sglang k->p=k+1; hf: 1, 3, 5 cannot be a full tuple, so p=i raw."""
    keys = {f"layers.{k}": run.p(k + shift).contiguous() for k in (1, 3, 5)}
    save_file({**keys, "input_ids": run.ids.clone()}, str(tmp_path / "cap.safetensors"))
    cap = load_capture(tmp_path / "cap.safetensors", convention=convention, num_layers=N)
    raw = [p for p in cap.positions if not p.normed]
    if convention == "hf":  # not a contiguous 0..N tuple: positions as labelled, all raw, and said so
        assert cap.positions == [Position(1), Position(3), Position(5)]
        assert cap.notes and "read as positions as labelled" in cap.notes[0]
    else:
        assert raw == [Position(k + shift) for k in (1, 3, 5)]
        assert same(cap.read(Position(3 + shift)), run.p(3 + shift))


def test_trtllm_minus_one_is_the_post_norm_final(tmp_path, run):
    """TensorRT-LLM: k captured at the end of layer k (p=k+1); -1 is the post-norm final."""
    obj = {"hs.1": run.p(2), "hs.3": run.p(4), "hs.-1": run.hs[N]}
    torch.save(obj, tmp_path / "trt.pt")
    cap = load_capture(tmp_path / "trt.pt", convention="trtllm", num_layers=N)
    assert cap.positions == [Position(2), Position(4), Position(N, True)]
    assert same(cap.read(Position(N, True)), run.hs[N])


def test_directory_of_per_position_files(tmp_path, run):
    d = tmp_path / "dump"
    d.mkdir()
    for p in range(N + 1):
        torch.save(run.p(p)[None].clone(), d / f"layer_{p}.pt")
    torch.save(run.ids.clone(), d / "input_ids.pt")
    cap = load_capture(d, convention="vllm")
    assert cap.num_layers == N
    assert cap.positions == [Position(p) for p in range(N + 1)]
    assert same(cap.read(Position(N)), run.raw_last)
    assert same(cap.input_ids, run.ids)


def test_capture_helper_format_has_raw_and_post_norm_final(tmp_path, run):
    from eagleforensics.io.sweep import write_capture
    from .realdata import _model

    path = write_capture(tmp_path / "sweep.safetensors", run.sweep, _model("qwen3", 0))
    cap = load_capture(path)
    assert cap.convention == "eagleforensics" and cap.num_layers == N
    assert cap.positions == [Position(p) for p in range(N + 1)] + [Position(N, True)]
    assert same(cap.read(Position(N)), run.raw_last)
    assert same(cap.read(Position(N, True)), run.hs[N])
    assert not np.allclose(cap.read(Position(N)), cap.read(Position(N, True)))


def test_ragged_capture_is_refused(tmp_path, run):
    torch.save([run.hs[0], run.hs[1][:10]], tmp_path / "ragged.pt")
    with pytest.raises(ForensicsError, match="ragged"):
        load_capture(tmp_path / "ragged.pt")


def test_batch_of_several_sequences_is_refused(tmp_path, run):
    torch.save([torch.stack([run.hs[0], run.hs[0]])], tmp_path / "batch.pt")
    with pytest.raises(ForensicsError, match="batch of 2"):
        load_capture(tmp_path / "batch.pt")


def test_safetensors_capture_is_read_lazily(tmp_path, run, monkeypatch):
    """Opening a safetensors capture reads only its header; a tensor is read when asked for."""
    save_file({f"h.{p}": run.p(p).contiguous() for p in range(N + 1)}, str(tmp_path / "c.safetensors"))
    from eagleforensics.io.safeload import SafetensorsFile

    reads: list[str] = []
    real = SafetensorsFile.get

    def spy(self, name):
        reads.append(name)
        return real(self, name)

    monkeypatch.setattr(SafetensorsFile, "get", spy)
    cap = load_capture(tmp_path / "c.safetensors", convention="vllm")
    assert reads == []
    assert same(cap.read(Position(4)), run.p(4))
    assert reads == ["h.4"]
    assert same(cap.read_rows(Position(5), 2, 7), run.p(5)[2:7])  # rows straight from the file
    assert reads == ["h.4"]


def test_bf16_safetensors_rows_fill_a_strided_buffer_bit_for_bit(tmp_path, run):
    """bf16 positions come back as arrays.BF16 with the stored bits; read_rows fills a caller's strided buffer."""
    from eagleforensics.arrays import BF16

    save_file({f"h.{p}": run.p(p).to(torch.bfloat16).contiguous() for p in range(N + 1)}, str(tmp_path / "b.safetensors"))
    cap = load_capture(tmp_path / "b.safetensors", convention="vllm")
    assert cap.dtype == BF16 and cap.streams
    buf = np.zeros((20, 3, H), BF16)
    got = cap.read_rows(Position(2), 4, 14, out=buf[:, 1])
    assert np.shares_memory(got, buf) and same(got, run.p(2).to(torch.bfloat16)[4:14])
    assert same(buf[:10, 1], run.p(2).to(torch.bfloat16)[4:14]) and not buf[:, [0, 2]].any()
