"""Alignment on real forward passes: placement, confidence, honesty, findings, engine ids."""
from __future__ import annotations

import pytest
import torch

from eagleforensics.alignment import align
from eagleforensics.positions import Position

from .realdata import SAMPLES, N, forward


def _save(path, obj):
    torch.save(obj, path)
    return path


def _bf16(t):
    return t.to(torch.bfloat16).contiguous()


def _hf_capture(tmp_path, run, name="capture.pt", ids=True):
    obj = {"hidden_states": [h[None] for h in run.hs]}
    if ids:
        obj["input_ids"] = run.ids.clone()
    return _save(tmp_path / name, obj)


def _list_record(tmp_path, run, positions, final, ids=True, name="rec.pt"):
    obj = {"hidden_states": [_bf16(run.p(p)) for p in positions] + [_bf16(final)]}
    if ids:
        obj["input_ids"] = run.ids.clone()
    return _save(tmp_path / name, obj)


def placed(result):
    return [None if m.position is None else (m.position.p, m.position.normed) for m in result.matches]


def test_incident_sample_places_layer_outputs_and_gives_sglang_ids():
    """Done-when: p = 3, N//2+1, N-2 for hs[0..2], post-norm final, SGLang ids [2, N//2, N-3]."""
    r = align(SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture.pt")
    n = 12
    assert placed(r) == [(3, False), (n // 2 + 1, False), (n - 2, False), (n, True)]
    assert all(m.confident for m in r.matches)
    assert r.engine_ids["sglang"] == [2, n // 2, n - 3]
    assert r.engine_ids["vllm"] == [3, n // 2 + 1, n - 2]
    assert "off-by-default" in {f.code for f in r.findings}
    assert r.exit_code == 1 and r.level == "ACTION"  # placed, but every engine must be told the ids


def test_wrong_fix_sample_says_embedding_included_and_which_ids():
    r = align(SAMPLES / "record_wrong_fix.pt", SAMPLES / "capture_sweep.safetensors")
    assert placed(r)[:3] == [(0, False), (2, False), (6, False)]
    codes = {f.code for f in r.findings}
    assert "embedding-included" in codes
    assert r.engine_ids["vllm"] == [0, 2, 6]
    # SGLang Llama reaches the embedding through id -1 only from 0.5.22 (the newest, 0.5.23, answers)
    assert r.engine_ids["sglang"] == [-1, 1, 5] and r.engine_ids["trtllm"] is None
    assert any("none works" in n and "0.5.21" in n for n in r.engine_notes["sglang"])
    assert r.exit_code == 1


def test_specforge_sample_drops_padding_and_sits_on_the_engine_default():
    r = align(SAMPLES / "data_0.ckpt", SAMPLES / "capture.pt")
    assert r.tokens.padding_dropped == 16 and r.tokens.length == 40
    assert placed(r) == [(2, False), (6, False), (9, False), (12, True)]
    assert "engine-default" in {f.code for f in r.findings}
    assert r.engine_ids["sglang"] == [1, 5, 8]


def test_flattened_cosine_cannot_tell_middle_layers_apart_but_per_token_can(llama):
    """Why the score is per-token: the first token's massive activation dominates a flattened cosine."""
    def flat(a, b):
        return torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()

    def per_token(a, b):
        return torch.nn.functional.cosine_similarity(a, b, dim=-1).mean().item()

    flat_gap = 1 - flat(llama.p(3), llama.p(5))
    token_gap = 1 - per_token(llama.p(3), llama.p(5))
    assert flat_gap < 1e-5  # two layers apart, yet flattened they look identical
    assert token_gap > 1000 * flat_gap
    assert llama.p(3)[0].abs().max() > 50 * llama.p(3)[1:].abs().max()  # the massive activation is real


@pytest.mark.parametrize("family", ["llama", "qwen3", "deepseek_v3"])
def test_every_family_places_speculators_style_record_against_engine_capture(tmp_path, family):
    """speculators layout: aux at [2, N//2, N-3] plus the RAW last layer, vs a vLLM-convention raw sweep."""
    run = forward(family)
    stack = torch.stack([run.p(2), run.p(N // 2), run.p(N - 3), run.raw_last], dim=1)
    from safetensors.torch import save_file

    save_file({"token_ids": run.ids.clone(), "hidden_states": _bf16(stack)}, str(tmp_path / "hs_0.safetensors"))
    save_file({f"layer.{p}": run.p(p).contiguous() for p in range(N + 1)} | {"input_ids": run.ids.clone()},
              str(tmp_path / "cap.safetensors"))
    r = align(tmp_path / "hs_0.safetensors", tmp_path / "cap.safetensors", convention="vllm")
    assert placed(r) == [(2, False), (N // 2, False), (N - 3, False), (N, False)]
    assert "final-raw" in {f.code for f in r.findings}
    assert r.exit_code == 0


def test_post_norm_final_is_placed_without_a_post_norm_capture(tmp_path):
    """A vLLM-style capture has only raw p=N; the gain-fitted RMSNorm still places a post-norm final."""
    run = forward("llama")
    rec = _list_record(tmp_path, run, [2, 4, 5], run.hs[N])
    torch.save({f"h.{p}": run.p(p) for p in range(N + 1)} | {"input_ids": run.ids.clone()}, tmp_path / "raw.pt")
    r = align(rec, tmp_path / "raw.pt", convention="vllm")
    assert placed(r)[-1] == (N, True)
    assert r.matches[-1].confident


def test_final_taken_one_layer_early_is_flagged(tmp_path):
    """TorchSpec #87-style: the 'final' state is p=N-1."""
    run = forward("llama")
    rec = _list_record(tmp_path, run, [2, 4, 5], run.p(N - 1))
    r = align(rec, _hf_capture(tmp_path, run))
    assert placed(r)[-1] == (N - 1, False)
    assert "final-wrong-layer" in {f.code for f in r.findings}


def test_non_ascending_concat_order_means_no_id_list_works(tmp_path):
    run = forward("llama")
    aux = torch.cat([run.p(N - 3), run.p(2), run.p(N // 2)], dim=-1)
    torch.save({"input_ids": run.ids.clone(), "loss_mask": torch.ones_like(run.ids),
                "hidden_state": _bf16(run.hs[N][None]), "aux_hidden_state": _bf16(aux[None])}, tmp_path / "d.ckpt")
    r = align(tmp_path / "d.ckpt", _hf_capture(tmp_path, run))
    assert placed(r)[:3] == [(N - 3, False), (2, False), (N // 2, False)]
    assert "concat-order" in {f.code for f in r.findings}
    assert all(v is None for v in r.engine_ids.values())
    assert r.exit_code == 1


def test_record_from_a_different_prompt_gets_no_confident_slot(tmp_path):
    run, other = forward("llama", prompt_seed=0), forward("llama", prompt_seed=5)
    rec = _list_record(tmp_path, other, [2, 4, 5], other.hs[N])
    r = align(rec, _hf_capture(tmp_path, run))
    assert not any(m.confident for m in r.matches)
    assert "token-mismatch" in {f.code for f in r.findings}
    assert r.exit_code == 1


def test_different_prompt_without_ids_still_gets_no_confident_slot(tmp_path):
    """Without ids nothing vouches for the pairing; content must not produce a guess."""
    run, other = forward("llama", prompt_seed=0), forward("llama", prompt_seed=5)
    rec = _list_record(tmp_path, other, [2, 4, 5], other.hs[N], ids=False)
    r = align(rec, _hf_capture(tmp_path, run, ids=False))
    assert not any(m.confident for m in r.matches)
    assert r.exit_code == 1


def test_record_from_a_different_model_gets_no_confident_slot(tmp_path):
    run, other = forward("llama", model_seed=0), forward("llama", model_seed=3)
    assert torch.equal(run.ids, other.ids)
    rec = _list_record(tmp_path, other, [2, 4, 5], other.hs[N])
    r = align(rec, _hf_capture(tmp_path, run))
    assert not any(m.confident for m in r.matches)
    assert r.exit_code == 1


def test_capture_missing_the_slot_layer_gives_no_confident_match(tmp_path):
    """Honest answers: if the capture lacks the slot's layer, a neighbour is not reported as a match."""
    run = forward("llama")
    torch.save({"hidden_states": [run.p(p)[None] for p in range(4)], "input_ids": run.ids.clone()}, tmp_path / "c.pt")
    rec = _list_record(tmp_path, run, [1, 2, 5], run.hs[N])
    r = align(rec, tmp_path / "c.pt", convention="vllm", num_layers=N)
    assert [m.confident for m in r.matches] == [True, True, False, False]
    assert r.matches[2].best == Position(3)  # the nearest neighbour, reported only as a candidate
    assert r.exit_code == 1


def test_rows_offset_from_their_ids_are_found_by_content(tmp_path):
    """Token misalignment: ids agree but the hidden rows are shifted by one token."""
    run = forward("llama", length=32)
    shifted = {"hidden_states": [_bf16(run.p(p)[1:]) for p in (2, 4, 5)] + [_bf16(run.hs[N][1:])],
               "input_ids": run.ids[:-1].clone()}
    torch.save(shifted, tmp_path / "rec.pt")
    r = align(tmp_path / "rec.pt", _hf_capture(tmp_path, run))
    assert r.tokens.method == "content-shift"
    assert (r.tokens.train_start, r.tokens.capture_start) == (0, 1)
    assert placed(r) == [(2, False), (4, False), (5, False), (N, True)]
    assert "token-misalignment" in {f.code for f in r.findings}
    assert r.exit_code == 1


def test_no_ids_on_either_side_pairs_rows_from_the_first_token(tmp_path):
    run = forward("qwen3")
    rec = _list_record(tmp_path, run, [2, 4, 5], run.hs[N], ids=False)
    r = align(rec, _hf_capture(tmp_path, run, ids=False))
    assert r.tokens.method == "position"
    assert placed(r) == [(2, False), (4, False), (5, False), (N, True)]


def test_bf16_needs_less_than_fp32_but_still_a_clear_margin():
    from eagleforensics.evidence.confidence import thresholds

    assert thresholds(torch.float32, torch.bfloat16) == thresholds(torch.bfloat16)
    assert thresholds(torch.float32).min_score > thresholds(torch.bfloat16).min_score
    assert thresholds(torch.bfloat16, min_score=0.99).min_score == 0.99


def test_json_shape_of_the_mapping():
    r = align(SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture.pt")
    d = r.to_dict()
    assert set(d) >= {"mapping", "engine_ids", "findings", "tokens", "verdict"}
    entry = d["mapping"][0]
    assert {k: entry[k] for k in ("key", "index", "position", "post_norm", "confident")} == {
        "key": "hidden_states", "index": 0, "position": 3, "post_norm": False, "confident": True}
    assert isinstance(entry["score"], float) and isinstance(entry["margin"], float)
    assert {"code", "severity", "message"} == set(d["findings"][0])
