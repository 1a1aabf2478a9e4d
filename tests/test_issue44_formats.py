"""Issue 44's formats: vLLM ``extract_hidden_states`` files read as captures (layout of vLLM 0.34.0's
example_hidden_states_connector.py: ``hidden_states`` [T, L, H] stacked over the aux layer ids, ``token_ids`` [T]),
written here from a real forward pass and aligned like any other capture; a capture with fewer states than ids
refused with both counts (docs/causes.md row 9)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagleforensics.alignment import align
from eagleforensics.errors import ForensicsError
from eagleforensics.io.capture import load_capture

from .realdata import N, forward


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).contiguous()


def extract_file(path: Path, run, layer_ids: list[int], drop: int = 0) -> Path:  # noqa: ANN001
    """What vLLM's connector writes for a request whose draft config lists ``layer_ids`` (id k: the state entering
    layer k, position p=k); ``drop`` leading rows missing, as a prefix-cached capture returns them."""
    states = torch.stack([run.p(k) for k in layer_ids], dim=1)[drop:]
    save_file({"hidden_states": _bf16(states), "token_ids": run.ids.clone().to(torch.int64)}, str(path))
    return path


def specforge_record(path: Path, run, slots: list[int]) -> Path:  # noqa: ANN001
    aux = torch.cat([run.p(k) for k in slots], dim=-1)
    torch.save({"input_ids": run.ids.clone(), "loss_mask": torch.ones_like(run.ids),
                "hidden_state": _bf16(run.hs[N][None]), "aux_hidden_state": _bf16(aux[None])}, path)
    return path


def test_an_extract_hidden_states_capture_aligns_like_any_other(tmp_path: Path) -> None:
    run = forward("llama")
    cap = extract_file(tmp_path / "hs_0.safetensors", run, list(range(N)))
    loaded = load_capture(str(cap), convention="vllm")
    assert loaded.metadata["format"] == "vllm extract_hidden_states" and loaded.num_tokens == len(run.ids)
    assert [p.p for p in loaded.positions] == list(range(N))
    rec = specforge_record(tmp_path / "rec.ckpt", run, [2, 5, 7])
    r = align(rec, cap, convention="vllm")
    assert [(m.position.p, m.position.normed) for m in r.matches[:3]] == [(2, False), (5, False), (7, False)]
    assert all(m.confident for m in r.matches[:3])


def test_without_the_ids_its_entries_are_matched_by_content_and_not_named(tmp_path: Path) -> None:
    run = forward("llama")
    cap = extract_file(tmp_path / "hs_0.safetensors", run, [1, 3, 6])  # the engine's three aux layers only
    loaded = load_capture(str(cap))
    assert loaded.label_kind == "list-index" and len(loaded.positions) == 3
    rec = specforge_record(tmp_path / "rec.ckpt", run, [1, 3, 6])
    r = align(rec, cap)
    # each slot is its entry's copy; the file does not say which layers the entries are, and align says so
    assert [m.best.p for m in r.matches[:3]] == [0, 1, 2] and all(m.score > 0.999 for m in r.matches[:3])
    assert "labels-not-positions" in {f.code for f in r.findings}


def test_a_capture_with_fewer_states_than_ids_is_refused_with_the_counts(tmp_path: Path) -> None:
    run = forward("llama")
    cap = extract_file(tmp_path / "hs_0.safetensors", run, list(range(N)), drop=8)
    with pytest.raises(ForensicsError) as err:
        load_capture(str(cap))
    msg = str(err.value)
    assert f"{len(run.ids)} token ids" in msg and f"only {len(run.ids) - 8}" in msg and "prefix caching" in msg
