"""Token pairing: shared prefix, trailing padding, content check of the row offset."""
from __future__ import annotations

import torch

from eagleforensics.evidence.norms import token_norms
from eagleforensics.evidence.tokens import align_tokens, common_prefix, detect_shift, trailing_padding

from .realdata import N, forward


def test_capture_of_the_prompt_only_pairs_on_the_shared_prefix():
    ids = forward("llama", length=32).ids
    t = align_tokens(ids, 32, 0, ids[:20], 20)
    assert (t.method, t.length) == ("ids-prefix", 20)


def test_diverging_ids_compare_only_the_prefix_and_say_where():
    ids = forward("llama", length=32).ids
    other = ids.clone()
    other[12] = (other[12] + 1) % 500 + 3
    t = align_tokens(ids, 32, 0, other, 32)
    assert t.length == 12 and "diverge at token 12" in t.note


def test_trailing_padding_needs_id_zero_and_mask_zero():
    ids = torch.tensor([1, 5, 0, 7, 0, 0])
    mask = torch.tensor([0, 1, 1, 1, 0, 0])
    assert trailing_padding(ids, mask) == 2
    assert trailing_padding(ids, None) == 0  # id 0 alone can be a real token
    assert common_prefix(ids, torch.tensor([1, 5, 9])) == 2


def test_row_offset_is_found_from_norm_profiles_of_real_states():
    run = forward("deepseek_v3", length=32)
    shifted = run.p(5)[2:]  # training row t holds capture row t+2
    d, corr, corr0 = detect_shift(token_norms(shifted), [token_norms(run.p(p)) for p in range(N)])
    assert d == 2 and corr > 0.99 and corr0 < 0.9


def test_no_offset_is_reported_for_aligned_rows():
    run = forward("qwen3", length=32)
    d, corr, _ = detect_shift(token_norms(run.p(4)), [token_norms(run.p(p)) for p in range(N)])
    assert d == 0 and corr > 0.99
