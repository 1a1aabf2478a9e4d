"""Tests for eagleforensics.engines.rules: one test per engine rule, round trips, the concrete cases."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagleforensics.engines.rules import (
    ALL_TARGETS, ENGINE_TARGETS, RULES, SGLANG, SGLANG_DS_NEW, SGLANG_DS_OLD, SGLANG_GPT_OSS,
    TRTLLM, VLLM, Target, concat_order, default_ids, describe_rules, ids_for_positions,
    parse_version, positions_for_ids, resolve_target, trainer_final_expectation,
)
from eagleforensics.errors import ForensicsError
from eagleforensics.positions import Position, default_aux_positions


def _ps(target: Target, ids: list[int], n: int) -> list[int | None]:
    """Raw positions captured per id (None when nothing is captured)."""
    return [o.position.p if o.position is not None else None
            for o in positions_for_ids(target, ids, n)]


# --- the table -------------------------------------------------------------------------------

def test_engine_targets_order_and_labels():
    """The matcher reports these five targets, in this order."""
    assert [t.label for t in ENGINE_TARGETS] == [
        "vllm", "sglang", "sglang-deepseek<0.5.13", "sglang-deepseek>=0.5.13", "trtllm"]


def test_every_target_has_a_sourced_rule():
    """Every target's row in RULES names a source; describe_rules renders plain dicts."""
    labels = {r.label for r in RULES}
    assert {t.label for t in ALL_TARGETS} <= labels
    assert all(r.source for r in RULES)
    rows = describe_rules()
    assert rows and {"label", "engine", "source", "id_k_captures", "default"} <= set(rows[0])


# --- one test per engine rule -----------------------------------------------------------------

def test_vllm_id_k_is_position_k():
    """vLLM: id k -> p=k; 0 = embedding, N = raw last layer.

    Source: vllm model_executor/models/interfaces.py EagleModelMixin._maybe_add_hidden_state,
    called with 0 before the first layer and idx+1 after layer idx (docs.vllm.ai, ArceeModel).
    """
    out = positions_for_ids(VLLM, [0, 5, 12], 12)
    assert [o.position for o in out] == [Position(0), Position(5), Position(12)]
    assert "embedding" in out[0].note and "before the final norm" in out[2].note
    assert _ps(VLLM, [13, -1], 12) == [None, None]


def test_sglang_llama_adds_one():
    """SGLang Llama/Qwen: id k -> p=k+1 (models/llama.py set_eagle3_layers_to_capture)."""
    assert _ps(SGLANG, [2, 6, 9], 12) == [3, 7, 10]


def test_sglang_llama_last_layer_captures_nothing():
    """SGLang Llama: id N-1 asks for layer index N, never reached by the capture loop.

    Source: models/llama.py LlamaModel.forward (check before layer i, i < end_layer);
    layers/logits_processor.py::_check_aux_hidden_states comment.
    """
    out = positions_for_ids(SGLANG, [11], 12)[0]
    assert out.position is None and "_check_aux_hidden_states" in out.note


def test_sglang_embedding_is_not_capturable():
    """SGLang: id -1 means layer index 0, where the residual is still None (models/llama.py)."""
    out = positions_for_ids(SGLANG, [-1], 12)[0]
    assert out.position is None and "None" in out.note


def test_sglang_deepseek_before_0_5_13_always_adds_one():
    """SGLang DeepSeek 0.5.5-0.5.12: unconditional +1 (models/deepseek_v2.py, pre PR #25454)."""
    assert _ps(SGLANG_DS_OLD, [2, 30, 58], 61) == [3, 31, 59]
    assert _ps(SGLANG_DS_OLD, [1, 29, 57], 61) == [2, 30, 58]


def test_sglang_deepseek_from_0_5_13_adds_one_only_when_first_id_is_one():
    """SGLang DeepSeek >= 0.5.13: +1 only if ids[0]==1 (PR #25454, models/deepseek_v2.py)."""
    assert _ps(SGLANG_DS_NEW, [2, 30, 58], 61) == [2, 30, 58]
    assert _ps(SGLANG_DS_NEW, [1, 29, 57], 61) == [2, 30, 58]


def test_sglang_gpt_oss_rule():
    """SGLang gpt-oss: p=k if max(ids)==N else k+1 (conventions.md; unverified in source)."""
    assert _ps(SGLANG_GPT_OSS, [1, 11, 20], 24) == [2, 12, 21]
    assert _ps(SGLANG_GPT_OSS, [2, 12, 24], 24) == [2, 12, 24]
    assert "unverified" in (positions_for_ids(SGLANG_GPT_OSS, [2, 24], 24)[1].note or "")


def test_trtllm_adds_one_and_minus_one_is_post_norm():
    """TRT-LLM: id k captured at the end of layer k -> p=k+1; -1 = model output after the norm.

    Source: _torch/speculative/eagle3.py maybe_capture_hidden_states (called after each decoder
    layer); _torch/models/modeling_speculative.py SpecDecOneEngineForCausalLM (layer_idx -1).
    """
    out = positions_for_ids(TRTLLM, [-1, 2, 31], 32)
    assert [o.position for o in out] == [Position(32, normed=True), Position(3), Position(32)]
    assert concat_order(out) == [Position(3), Position(32), Position(32, normed=True)]
    assert _ps(TRTLLM, [32, -2], 32) == [None, None]


def test_duplicates_capture_once_on_every_engine():
    """Each engine tests `layer in ids` once per layer, so a repeated id adds no state."""
    for t in ALL_TARGETS:
        out = positions_for_ids(t, [3, 3], 12)
        assert out[1].position is None and "duplicate" in out[1].note


def test_default_ids_capture_the_same_positions_everywhere():
    """Defaults: vLLM (2,N//2,N-3); SGLang [2,N//2,N-3] unshifted; TRT-LLM {1,N//2-1,N-4}.

    Sources: vllm models/llama.py get_eagle3_aux_hidden_state_layers; sglang models/llama.py
    set_eagle3_layers_to_capture(None); trtllm speculative/eagle3.py __post_init__.
    """
    assert default_ids(VLLM, 32) == [2, 16, 29]
    assert default_ids(TRTLLM, 32) == [1, 15, 28]
    assert default_ids(SGLANG, 61) == [1, 29, 57]
    for t in ALL_TARGETS:
        for n in (8, 12, 32, 61):
            assert _ps(t, default_ids(t, n), n) == default_aux_positions(n)


def test_trtllm_default_needs_more_than_five_layers():
    """TRT-LLM raises for N <= 5 ('Not enough hidden layers for default EAGLE3 capture')."""
    with pytest.raises(ForensicsError, match="N > 5"):
        default_ids(TRTLLM, 5)


# --- resolve_target -----------------------------------------------------------------------------

@pytest.mark.parametrize("engine,model_type,version,label", [
    ("vllm", "deepseek_v3", None, "vllm"),
    ("sglang", "llama", None, "sglang"),
    ("sglang", "qwen3_moe", "0.5.12", "sglang"),
    ("sglang", "kimi_k2", "0.5.12", "sglang-deepseek<0.5.13"),
    ("sglang", "deepseek_v3", "0.5.13", "sglang-deepseek>=0.5.13"),
    ("sglang", "deepseek_v2", "0.5.13rc1", "sglang-deepseek>=0.5.13"),
    ("sglang", "deepseek_v3", None, "sglang-deepseek>=0.5.13"),
    ("sglang", "gpt_oss", None, "sglang-gpt-oss"),
    ("TRTLLM", "mistral", None, "trtllm"),
])
def test_resolve_target(engine, model_type, version, label):
    """Engine + model_type + version pick one convention."""
    assert resolve_target(engine, model_type, version).label == label


def test_resolve_target_rejects_unknowns_with_allowed_values():
    """Unknown engine or model_type is a ForensicsError listing what is allowed."""
    with pytest.raises(ForensicsError, match="vllm, sglang, trtllm"):
        resolve_target("tgi")
    with pytest.raises(ForensicsError, match="deepseek_v3"):
        resolve_target("sglang", "falcon")
    with pytest.raises(ForensicsError, match="X.Y.Z"):
        resolve_target("sglang", "llama", "latest")


def test_parse_version():
    """Simple tuple parsing: leading numbers only."""
    assert parse_version("0.5.13") == (0, 5, 13)
    assert parse_version("v0.5.13rc1") == (0, 5, 13)
    assert parse_version("0.33.post1") == (0, 33)


# --- ids_for_positions: concrete cases ------------------------------------------------------------

def test_llama_n12_example():
    """Llama N=12, P=[3,7,10]: SGLang ids [2,6,9], vLLM [3,7,10], TRT-LLM [2,6,9]."""
    assert ids_for_positions(SGLANG, [3, 7, 10], 12).ids == [2, 6, 9]
    assert ids_for_positions(VLLM, [3, 7, 10], 12).ids == [3, 7, 10]
    assert ids_for_positions(TRTLLM, [3, 7, 10], 12).ids == [2, 6, 9]


def test_deepseek_n61_same_ids_move_one_layer_across_0_5_13():
    """N=61 ids [2,30,58]: p [3,31,59] on SGLang 0.5.5-0.5.12, [2,30,58] from 0.5.13."""
    assert _ps(resolve_target("sglang", "deepseek_v3", "0.5.12"), [2, 30, 58], 61) == [3, 31, 59]
    assert _ps(resolve_target("sglang", "deepseek_v3", "0.5.13"), [2, 30, 58], 61) == [2, 30, 58]


def test_deepseek_prefers_version_stable_ids():
    """When P starts at 2, ids starting with 1 mean the same on both sides of 0.5.13."""
    plan = ids_for_positions(SGLANG_DS_NEW, [2, 30, 58], 61)
    assert plan.ids == [1, 29, 57] and "same" in plan.notes[0]
    assert _ps(SGLANG_DS_OLD, plan.ids, 61) == [2, 30, 58]


def test_embedding_position_rejected_except_on_vllm():
    """P with 0: SGLang (all families) and TRT-LLM cannot; vLLM uses id 0."""
    assert ids_for_positions(VLLM, [0, 3, 7], 12).ids == [0, 3, 7]
    for t in (SGLANG, SGLANG_DS_OLD, SGLANG_DS_NEW, SGLANG_GPT_OSS, TRTLLM):
        plan = ids_for_positions(t, [0, 3, 7], 12)
        assert plan.ids is None and any("embedding" in r for r in plan.reasons)


def test_descending_positions_rejected_everywhere():
    """P=[10,3,7]: no engine can (all concatenate ascending)."""
    for t in ALL_TARGETS:
        plan = ids_for_positions(t, [10, 3, 7], 12)
        assert plan.ids is None and any("ascending" in r for r in plan.reasons)


def test_last_layer_position_on_sglang_llama_rejected():
    """P with N: impossible on SGLang Llama/DeepSeek; vLLM id N; TRT-LLM id N-1."""
    assert ids_for_positions(SGLANG, [3, 12], 12).ids is None
    assert ids_for_positions(SGLANG_DS_NEW, [3, 12], 12).ids is None
    assert ids_for_positions(VLLM, [3, 12], 12).ids == [3, 12]
    assert ids_for_positions(TRTLLM, [3, 12], 12).ids == [2, 11]


def test_deepseek_new_cannot_start_at_position_one():
    """DeepSeek >= 0.5.13 with P[0]==1: ids [1,..] get +1, ids [0,..] don't: no list works."""
    plan = ids_for_positions(SGLANG_DS_NEW, [1, 5, 9], 12)
    assert plan.ids is None and any("p=1" in r for r in plan.reasons)
    assert ids_for_positions(SGLANG_DS_OLD, [1, 5, 9], 12).ids == [0, 4, 8]


def test_duplicates_and_out_of_range_rejected():
    """Duplicates and positions outside 0..N have no id list."""
    assert ids_for_positions(VLLM, [3, 3, 7], 12).ids is None
    assert ids_for_positions(VLLM, [3, 13], 12).ids is None
    assert ids_for_positions(VLLM, [-1, 3], 12).ids is None


def test_bad_arguments_are_forensics_errors():
    """Non-integer ids or a bad layer count are user errors."""
    with pytest.raises(ForensicsError):
        positions_for_ids(VLLM, [1, "2"], 12)  # type: ignore[list-item]
    with pytest.raises(ForensicsError):
        ids_for_positions(VLLM, [1, 2], 0)


# --- round trips ----------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=6, max_value=96).flatmap(
    lambda n: st.tuples(st.just(n), st.lists(st.integers(0, n), min_size=1, max_size=6,
                                             unique=True).map(sorted))))
def test_round_trip_every_valid_ascending_list(case):
    """For every ascending P that a target accepts, ids_for_positions -> positions_for_ids == P."""
    n, pos = case
    for t in ALL_TARGETS:
        plan = ids_for_positions(t, pos, n)
        if plan.ids is None:
            assert plan.reasons
            continue
        assert _ps(t, plan.ids, n) == pos


@pytest.mark.parametrize("n", [6, 12, 32, 61, 80])
def test_round_trip_exhaustive_triples(n):
    """Every ascending triple inside 1..N-1 works on every target except DeepSeek>=0.5.13 at 1."""
    for a in range(1, n - 1):
        for b in range(a + 1, n, max(1, n // 7)):
            for c in range(b + 1, n, max(1, n // 5)):
                for t in ALL_TARGETS:
                    plan = ids_for_positions(t, [a, b, c], n)
                    if t is SGLANG_DS_NEW and a == 1:
                        assert plan.ids is None
                        continue
                    assert plan.ids is not None, (t.label, a, b, c)
                    assert _ps(t, plan.ids, n) == [a, b, c]


# --- trainers ------------------------------------------------------------------------------------

def test_trainer_final_expectation():
    """SpecForge expects post-norm (lm_head only); speculators raw (applies verifier_norm)."""
    assert trainer_final_expectation("SpecForge").startswith("post-norm")
    assert trainer_final_expectation("speculators").startswith("raw")
    with pytest.raises(ForensicsError, match="specforge or speculators"):
        trainer_final_expectation("eagle")
