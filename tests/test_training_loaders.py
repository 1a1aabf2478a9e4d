"""Every training-side layout loads from a file written the way its producer writes it."""
from __future__ import annotations

import gzip
import io

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from eagleforensics.arrays import as_array, f32
from eagleforensics.errors import ForensicsError
from eagleforensics.io.training import detect_format, load_training

from .realdata import H, N, forward


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).contiguous()


def same(a, t) -> bool:
    """``a`` (what io hands out) holds exactly ``t``'s values: an ndarray of the same dtype, shape and bits."""
    b = as_array(t)
    return isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture(scope="module")
def run():
    return forward("llama", length=24)


def _specforge(run) -> dict:
    """SpecForge prepare_hidden_states.py: dict of input_ids, loss_mask, hidden_state [1,S,H], aux [1,S,3H]."""
    aux = torch.cat([run.p(2), run.p(N // 2), run.p(N - 3)], dim=-1)[None]
    return {"input_ids": run.ids.clone(), "loss_mask": torch.ones_like(run.ids),
            "hidden_state": _bf16(run.hs[N][None]), "aux_hidden_state": _bf16(aux)}


def test_specforge_ckpt_splits_concatenated_aux_into_slots(tmp_path, run):
    """SpecForge .ckpt: aux [1,S,3H] splits into three slots (key, index) once H is known."""
    path = tmp_path / "data_0.ckpt"
    torch.save(_specforge(run), path)
    rec = load_training(path)
    assert rec.format == "specforge"
    slots = rec.slots(H)
    assert [(s.key, s.index, s.role) for s in slots] == [
        ("aux_hidden_state", 0, "aux"), ("aux_hidden_state", 1, "aux"), ("aux_hidden_state", 2, "aux"),
        ("hidden_state", None, "final")]
    assert same(slots[1].data, _bf16(run.p(N // 2)))
    assert same(rec.input_ids, run.ids)


def test_specforge_ckpt_gz(tmp_path, run):
    """SpecForge can write data_{idx}.ckpt.gz: a gzipped torch.save."""
    buf = io.BytesIO()
    torch.save(_specforge(run), buf)
    path = tmp_path / "data_0.ckpt.gz"
    path.write_bytes(gzip.compress(buf.getvalue()))
    rec = load_training(path)
    assert rec.format == "specforge" and len(rec.slots(H)) == 4


def test_speculators_safetensors_index_is_the_L_axis(tmp_path, run):
    """speculators data_generation_offline.py: hs_{idx}.safetensors with token_ids and hidden_states [S,L,H]."""
    stack = torch.stack([run.p(2), run.p(N // 2), run.p(N - 3), run.raw_last], dim=1)
    path = tmp_path / "hs_0.safetensors"
    save_file({"token_ids": run.ids.clone(), "hidden_states": _bf16(stack)}, str(path))
    rec = load_training(path)
    assert rec.format == "speculators"
    slots = rec.slots(H)
    assert [(s.index, s.role) for s in slots] == [(0, "aux"), (1, "aux"), (2, "aux"), (3, "final")]
    assert same(slots[3].data, _bf16(run.raw_last))


def test_modelopt_pt_keeps_conversation_id_as_metadata(tmp_path, run):
    """ModelOpt compute_hidden_states_hf.py: {conversation_id}.pt with [S,H] / [S,3H] tensors and a string id."""
    aux = torch.cat([run.p(2), run.p(N // 2), run.p(N - 3)], dim=-1)
    path = tmp_path / "conv-17.pt"
    torch.save({"input_ids": run.ids.clone(), "hidden_states": _bf16(run.hs[N]),
                "aux_hidden_states": _bf16(aux), "conversation_id": "conv-17"}, path)
    rec = load_training(path)
    assert rec.format == "modelopt"
    assert rec.metadata["conversation_id"] == "conv-17"
    assert [s.name for s in rec.slots(H)] == ["aux_hidden_states[0]", "aux_hidden_states[1]",
                                               "aux_hidden_states[2]", "hidden_states"]


def test_eagle12_ckpt(tmp_path, run):
    """EAGLE-1/2 ge_data_all_llama3.py: data_{idx}.ckpt with input_ids, hidden_state, loss_mask."""
    path = tmp_path / "data_3.ckpt"
    torch.save({"input_ids": run.ids[None].clone(), "hidden_state": _bf16(run.hs[N][None]),
                "loss_mask": torch.ones(1, 24, dtype=torch.int64)}, path)
    rec = load_training(path)
    assert rec.format == "eagle"
    assert [(s.name, s.role) for s in rec.slots(H)] == [("hidden_state", "final")]


def test_list_layout_index_is_list_position(tmp_path, run):
    """{"hidden_states": [aux_0, aux_1, aux_2, final]}: index = list position, last = final."""
    path = tmp_path / "rec.pt"
    torch.save({"hidden_states": [_bf16(run.p(3)[None]), _bf16(run.p(5)[None]), _bf16(run.hs[N][None])],
                "input_ids": run.ids.clone(), "note": "made by hand", "step": 7}, path)
    rec = load_training(path)
    assert rec.format == "list"
    assert [(s.name, s.role) for s in rec.slots(H)] == [
        ("hidden_states[0]", "aux"), ("hidden_states[1]", "aux"), ("hidden_states[2]", "final")]
    assert rec.metadata == {"note": "made by hand", "step": 7}


@pytest.mark.parametrize("container", ["list", "tuple", "dict"])
def test_plain_pt_containers(tmp_path, run, container):
    """A plain .pt list/tuple/dict of tensors: every float tensor is a slot."""
    items = [run.p(2), run.p(4)]
    obj = {"list": items, "tuple": tuple(items), "dict": {"a": items[0], "b": items[1], "tag": "x"}}[container]
    path = tmp_path / "plain.pt"
    torch.save(obj, path)
    rec = load_training(path)
    assert rec.format == "generic"
    assert len(rec.slots(H)) == 2
    assert same(rec.slots(H)[1].data, run.p(4))


def test_plain_safetensors_and_numpy(tmp_path, run):
    """.safetensors, .npy and .npz files load as generic records."""
    save_file({"x": run.p(3).contiguous()}, str(tmp_path / "a.safetensors"))
    np.save(tmp_path / "b.npy", run.p(3).numpy())
    np.savez(tmp_path / "c.npz", first=run.p(3).numpy(), second=run.p(6).numpy(), input_ids=run.ids.numpy())
    for name in ("a.safetensors", "b.npy"):
        rec = load_training(tmp_path / name)
        assert np.allclose(f32(rec.slots(H)[0].data), run.p(3).numpy())
    rec = load_training(tmp_path / "c.npz")
    assert [s.key for s in rec.slots(H)] == ["first", "second"]
    assert same(rec.input_ids, run.ids)


def test_concatenated_generic_tensor_splits_once_h_is_known(tmp_path, run):
    """A lone [S, 3H] tensor splits into three slots named by index."""
    path = tmp_path / "cat.pt"
    torch.save({"aux": torch.cat([run.p(2), run.p(4), run.p(6)], dim=-1)}, path)
    slots = load_training(path).slots(H)
    assert [s.name for s in slots] == ["aux[0]", "aux[1]", "aux[2]"]
    assert same(slots[2].data, run.p(6))


def test_width_that_h_does_not_divide_is_a_clear_error(tmp_path, run):
    path = tmp_path / "odd.pt"
    torch.save({"aux_hidden_state": run.p(2)[None, :, :50], "hidden_state": run.hs[N][None]}, path)
    rec = load_training(path)
    with pytest.raises(ForensicsError, match="width 50.*hidden size 64"):
        rec.slots(H)


def test_format_override_and_unknown_format(tmp_path, run):
    path = tmp_path / "rec.pt"
    torch.save(_specforge(run), path)
    assert load_training(path, fmt="generic").format == "generic"
    with pytest.raises(ForensicsError, match="unknown training format"):
        load_training(path, fmt="bogus")
    with pytest.raises(ForensicsError, match="needs key"):
        load_training(path, fmt="speculators")


def test_detect_format_on_plain_objects():
    assert detect_format([torch.zeros(2, 2)]) == "generic"
    assert detect_format({"hidden_states": [torch.zeros(1)]}) == "list"
