"""The engine-facts tables for doctor: drafter features, what each engine release honours,
whose embedding/head it serves, d2t, trainers and RoPE; each queried on both sides of every
boundary release read from the wheels, and every row citing a released version and file."""
from __future__ import annotations

import json
import math
import re
from itertools import groupby

import pytest

from eagleforensics.engines import embedrules, flagrules, flagtable, roperules
from eagleforensics.engines.rules import parse_version
from eagleforensics.errors import ForensicsError
from eagleforensics.io.formats import read_safetensors_header
from eagleforensics.io.safeload import open_safetensors, read_tensor

from .realdata import ROOT

DRAFTER = ROOT / "data_samples" / "drafter"
CONTRACT = ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual", "own_embedding",
            "own_lm_head", "extra_layers", "sliding_window", "aux_hidden_state_off", "qk_norm")


def _sample():
    cfg = json.loads((DRAFTER / "config.json").read_text())
    names = {n for n in read_safetensors_header(DRAFTER / "model.safetensors") if n != "__metadata__"}
    return cfg, names


# A speculators 0.9.0 config as Eagle3SpeculatorConfig serialises it (Qwen3 layer, EAGLE-3.1
# switches, a sliding-window layer), with the tensor names its Eagle3DraftModel saves.
SPECULATORS_CFG = {
    "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
    "draft_vocab_size": 32000, "norm_before_residual": True, "norm_before_fc": False,
    "fc_norm": True, "norm_output": True, "embed_requires_grad": False,
    "eagle_aux_hidden_state_layer_ids": [2, 18, 33],
    "speculators_config": {"verifier": {"name_or_path": "Qwen/Qwen3-8B"}},
    "transformer_layer_config": {
        "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 2,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 151936,
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 2048},
}
SPECULATORS_TENSORS = {
    "d2t", "t2d", "fc.weight", "fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight",
    "embed_tokens.weight", "lm_head.weight", "norm.weight", "layers.0.hidden_norm.weight",
    "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.q_norm.weight",
    "layers.0.self_attn.k_norm.weight", "layers.1.self_attn.q_proj.weight",
}


# --- drafter_features ----------------------------------------------------------------------------

def test_feature_names_are_the_replay_contract():
    assert tuple(flagrules.FEATURES) == CONTRACT


def test_specforge_sample_uses_only_its_own_head():
    cfg, names = _sample()
    assert "lm_head.weight" in names and "embed_tokens.weight" not in names
    assert flagrules.drafter_features(cfg, names) == {"own_lm_head"}
    assert flagrules.drafter_layout(cfg) == "flat" and flagrules.drafter_arch(cfg) == "llama"


def test_specforge_sample_with_switches_and_tensors_added():
    cfg, names = _sample()
    cfg = {**cfg, "norm_output": True, "num_hidden_layers": 2,
           "eagle_config": {**cfg["eagle_config"], "norm_before_fc": True,
                            "use_aux_hidden_state": False}}
    names = names | {"embed_tokens.weight", "midlayer.self_attn.q_norm.weight"}
    assert flagrules.drafter_features(cfg, names) == {
        "own_lm_head", "own_embedding", "norm_output", "extra_layers", "norm_before_fc",
        "aux_hidden_state_off", "qk_norm"}


def test_tensors_alone_reveal_norms_and_layers():
    cfg, names = _sample()
    extra = {"input_norm.weight", "aux_norm_low.weight", "layers.1.mlp.up_proj.weight"}
    got = flagrules.drafter_features(cfg, names | extra)
    assert {"norm_before_fc", "fc_norm", "extra_layers"} <= got


def test_speculators_config_features_layout_and_arch():
    got = flagrules.drafter_features(SPECULATORS_CFG, SPECULATORS_TENSORS)
    assert got == {"fc_norm", "norm_output", "norm_before_residual", "own_embedding",
                   "own_lm_head", "extra_layers", "sliding_window", "qk_norm"}
    assert flagrules.drafter_layout(SPECULATORS_CFG) == "speculators"
    assert flagrules.drafter_arch(SPECULATORS_CFG) == "qwen3"


def test_arch_by_architecture_name():
    assert flagrules.drafter_arch({"architectures": ["Eagle3DeepseekV2ForCausalLM"]}) == "deepseek"
    assert flagrules.drafter_arch({"architectures": ["Qwen3ForCausalLM"]}) == "qwen3"
    # a Qwen3-VL drafter is served by vLLM's llama_eagle3 file
    assert flagrules.drafter_arch({"architectures": ["Eagle3Qwen3vlForCausalLM"]}) == "llama"


@pytest.mark.parametrize("bad", [[1, 2], "config"])
def test_bad_config_is_refused(bad):
    with pytest.raises(ForensicsError, match="JSON object"):
        flagrules.drafter_features(bad, set())


def test_bad_tensor_names_are_refused():
    with pytest.raises(ForensicsError, match="tensor_names"):
        flagrules.drafter_features({}, ["fc.weight"])


# --- FLAG_RULES at every boundary read -----------------------------------------------------------

BOUNDARIES = [
    # engine, version, runner, arch, layout, feature, status
    ("sglang", "0.5.16", None, "llama", "flat", "norm_before_fc", "ignored"),
    ("sglang", "0.5.17", None, "llama", "flat", "norm_before_fc", "honoured"),
    ("sglang", "0.5.11", None, "llama", "flat", "fc_norm", "ignored"),
    ("sglang", "0.5.12", None, "llama", "flat", "fc_norm", "honoured"),
    ("sglang", "0.5.11", None, "llama", "flat", "norm_output", "ignored"),
    ("sglang", "0.5.12", None, "llama", "flat", "norm_output", "honoured"),
    ("sglang", "0.5.11", None, "llama", "flat", "extra_layers", "refused"),
    ("sglang", "0.5.12", None, "llama", "flat", "extra_layers", "honoured"),
    ("sglang", "0.5.23", None, "llama", "flat", "norm_before_residual", "ignored"),
    ("sglang", "0.5.23", None, "llama", "flat", "sliding_window", "ignored"),
    ("sglang", "0.5.23", None, "qwen3", "flat", "qk_norm", "ignored"),
    ("sglang", "0.5.23", None, "llama", "speculators", "fc_norm", "refused"),
    ("sglang", "0.5.11", None, "deepseek", "flat", "fc_norm", "refused"),
    ("sglang", "0.5.12", None, "deepseek", "flat", "fc_norm", "ignored"),
    ("sglang", "0.5.13", None, "deepseek", "flat", "fc_norm", "honoured"),
    ("sglang", "0.5.23", None, "deepseek", "flat", "extra_layers", "refused"),
    ("sglang", "0.4.10", None, "llama", "flat", "own_embedding", "ignored"),
    ("sglang", "0.5.23", None, "llama", "flat", "own_embedding", "ignored"),
    ("sglang", "0.5.23", None, "llama", "flat", "own_lm_head", "honoured"),
    ("sglang", "0.5.12", None, "llama", "flat", "aux_hidden_state_off", "ignored"),
    ("sglang", "0.5.12.post1", None, "llama", "flat", "aux_hidden_state_off", "honoured"),
    ("vllm", "0.17.1", "v1", "llama", "flat", "norm_before_fc", "refused"),
    ("vllm", "0.18.0", "v1", "llama", "flat", "norm_before_fc", "honoured"),
    ("vllm", "0.18.1", "v1", "llama", "speculators", "norm_before_fc", "ignored"),
    ("vllm", "0.19.0", "v1", "llama", "speculators", "norm_before_fc", "honoured"),
    ("vllm", "0.21.0", "v1", "llama", "flat", "fc_norm", "refused"),
    ("vllm", "0.22.0", "v1", "llama", "flat", "fc_norm", "honoured"),
    ("vllm", "0.24.0", "v1", "llama", "speculators", "fc_norm", "refused"),
    ("vllm", "0.25.0", "v1", "llama", "speculators", "fc_norm", "honoured"),
    ("vllm", "0.21.0", "v1", "llama", "flat", "norm_output", "ignored"),
    ("vllm", "0.22.0", "v1", "llama", "flat", "norm_output", "honoured"),
    ("vllm", "0.24.0", "v1", "llama", "speculators", "norm_output", "ignored"),
    ("vllm", "0.25.0", "v1", "llama", "speculators", "norm_output", "honoured"),
    ("vllm", "0.10.1.1", "v1", "llama", "flat", "norm_before_residual", "honoured"),
    ("vllm", "0.11.0", "v1", "llama", "flat", "extra_layers", "refused"),
    ("vllm", "0.11.1", "v1", "llama", "flat", "extra_layers", "honoured"),
    ("vllm", "0.10.1.1", "v1", "llama", "flat", "sliding_window", "refused"),
    ("vllm", "0.10.2", "v1", "llama", "flat", "sliding_window", "honoured"),
    ("vllm", "0.23.0", "v1", "qwen3", "speculators", "qk_norm", "refused"),
    ("vllm", "0.24.0", "v1", "qwen3", "speculators", "qk_norm", "honoured"),
    ("vllm", "0.25.1", "v1", "qwen3", "speculators", "sliding_window", "ignored"),
    ("vllm", "0.26.0", "v1", "qwen3", "speculators", "sliding_window", "honoured"),
    ("vllm", "0.17.1", "v1", "deepseek", "flat", "norm_output", "refused"),
    ("vllm", "0.18.0", "v1", "deepseek", "flat", "norm_output", "ignored"),
    ("vllm", "0.22.0", "v1", "deepseek", "flat", "norm_output", "honoured"),
    ("vllm", "0.22.1", "v1", "deepseek", "flat", "fc_norm", "ignored"),
    ("vllm", "0.23.0", "v1", "deepseek", "flat", "fc_norm", "honoured"),
    ("vllm", "0.24.0", "v1", "deepseek", "flat", "norm_before_fc", "ignored"),
    ("vllm", "0.25.0", "v1", "deepseek", "flat", "norm_before_fc", "refused"),
    ("vllm", "0.11.0", "v1", "llama", "flat", "own_embedding", "ignored"),
    ("vllm", "0.11.1", "v1", "llama", "flat", "own_embedding", "honoured"),
    ("vllm", "0.17.1", "v2", "llama", "flat", "own_embedding", "honoured"),
    ("vllm", "0.10.1.1", "v1", "llama", "flat", "own_lm_head", "honoured"),
    ("vllm", "0.17.0", "v1", "llama", "flat", "aux_hidden_state_off", "ignored"),
    ("vllm", "0.17.1", "v1", "llama", "flat", "aux_hidden_state_off", "honoured"),
    ("vllm", "0.27.1", "v2", "llama", "flat", "aux_hidden_state_off", "ignored"),
    ("vllm", "0.33.0", "v2", "llama", "flat", "aux_hidden_state_off", "honoured"),
    ("vllm", "0.34.0", "v2", "llama", "flat", "aux_hidden_state_off", "honoured"),  # read: eagle/config.py
    ("vllm", "0.34.0", None, "llama", "flat", "own_embedding", "honoured"),  # V2, the only runner
]


@pytest.mark.parametrize("engine,version,runner,arch,layout,feature,status", BOUNDARIES)
def test_boundary_versions(engine, version, runner, arch, layout, feature, status):
    (ruling,) = flagrules.ignored_features(engine, version, runner, [feature], arch, layout)
    assert ruling.feature == feature and ruling.status == status, ruling


def test_every_feature_has_an_answer_on_the_newest_releases():
    # V1's newest is 0.33.0: vLLM 0.34.0 removed the V1 model runner (rules.V1_REMOVED)
    for engine, version, runner in (("sglang", None, None), ("vllm", "0.33.0", "v1"), ("vllm", None, "v2")):
        got = flagrules.ignored_features(engine, version, runner, CONTRACT, "llama", "flat")
        assert [r.feature for r in got] == sorted(CONTRACT)
        assert all(r.status in flagtable.STATUSES and r.source for r in got)
        assert all(r.status != "unknown" for r in got), [r for r in got if r.status == "unknown"]


def test_trtllm_is_unknown_never_guessed():
    got = flagrules.ignored_features("trtllm", None, None, CONTRACT)
    assert {r.status for r in got} == {"unknown"}


def test_layout_not_given_assumes_flat_and_says_so():
    (r,) = flagrules.ignored_features("sglang", "0.5.23", None, ["fc_norm"])
    assert r.status == "honoured" and "flat config layout assumed" in r.consequence
    assert "speculators config: refused" in r.consequence
    (same,) = flagrules.ignored_features("vllm", "0.33.0", "v1", ["extra_layers"])
    assert "assumed" not in same.consequence


def test_vllm_runner_not_given_takes_the_default_and_says_so():
    (r,) = flagrules.ignored_features("vllm", "0.30.0", None, ["aux_hidden_state_off"])
    assert r.status == "ignored" and "v2, the one a plain `vllm serve`" in r.consequence
    (v1,) = flagrules.ignored_features("vllm", "0.30.0", "v1", ["aux_hidden_state_off"])
    assert v1.status == "honoured" and "assumed" not in v1.consequence


def test_qwen3_before_its_file_is_built_as_llama():
    (r,) = flagrules.ignored_features("vllm", "0.22.0", None, ["qk_norm"], "qwen3", "flat")
    assert r.status == "refused" and "as Llama" in r.consequence


@pytest.mark.parametrize("args,match", [
    (("sglang", "0.5.23", None, ["norm_befor_fc"]), "unknown drafter feature"),
    (("tensorrt", "1.0", None, ["fc_norm"]), "unknown engine"),
    (("sglang", "0.5.23", "v2", ["fc_norm"]), "vLLM only"),
    (("vllm", "0.5", None, ["fc_norm"], None, "nested"), "layout"),
    (("vllm", "latest", None, ["fc_norm"]), "version"),
])
def test_bad_queries_are_refused(args, match):
    with pytest.raises(ForensicsError, match=match):
        flagrules.ignored_features(*args)


def test_rows_cite_a_released_version_and_a_file():
    cite = re.compile(r"\b(sglang|vllm|specforge|speculators|nvidia-modelopt|transformers) "
                      r"\d+\.\d+[\w.]*.*\.py|SafeAILab/EAGLE .*\.py.* at commit [0-9a-f]{7}")
    rows = [*flagtable.FLAG_RULES, *embedrules.EMBED_RULES, *embedrules.D2T_RULES,
            *embedrules.TRAINER_RULES, *roperules.ROPE_RULES]
    missing = [r.label for r in rows if not cite.search(r.source)]
    assert not missing


def test_each_rule_chain_is_contiguous_without_overlap():
    v = parse_version
    key = (lambda r: (r.engine, r.feature, r.arch or "", r.layout or "", r.runner or ""))
    for k, grp in groupby(sorted(flagtable.FLAG_RULES, key=key), key=key):
        rows = sorted(grp, key=lambda r: v(r.since))
        for a, b in zip(rows, rows[1:]):
            assert a.until is not None and v(a.until) < v(b.since), (k, a.label, b.label)
        for r in rows:
            assert r.status in flagtable.STATUSES
            assert r.until is None or v(r.since) <= v(r.until)


# --- whose embedding and head ---------------------------------------------------------------------

def test_embedding_sglang_replaces_vllm_keeps_since_28549():
    sg = embedrules.embed_rule("sglang", "0.5.23")
    assert sg.embedding_used(has_own=True) == "target"
    assert sg.embedding_used(has_own=True, widths_differ=True) == "draft"
    assert sg.embedding_used(has_own=False, widths_differ=True) == "uninitialised"
    assert embedrules.embed_rule("vllm", "0.11.0").embedding_used(True) == "target"
    assert embedrules.embed_rule("vllm", "0.11.1").embedding_used(True) == "draft"
    assert embedrules.embed_rule("vllm", "0.11.1").embedding_used(False) == "target"
    assert embedrules.embed_rule("vllm", "0.33.0", "v2").embedding_used(True) == "draft"


def test_lm_head_when_the_drafter_has_none():
    assert embedrules.embed_rule("sglang", "0.5.1.post3").lm_head_used(False) == "uninitialised"
    assert embedrules.embed_rule("sglang", "0.5.2").lm_head_used(False) == "target"
    assert embedrules.embed_rule("vllm", "0.11.0").lm_head_used(False) == "uninitialised"
    assert embedrules.embed_rule("vllm", "0.11.1").lm_head_used(False) == "target"
    assert embedrules.embed_rule("vllm", "0.33.0").lm_head_used(True) == "draft"


def test_v2_runner_before_it_had_eagle_is_refused():
    with pytest.raises(ForensicsError, match="V2"):
        embedrules.embed_rule("vllm", "0.16.0", "v2")


# --- d2t ----------------------------------------------------------------------------------------

def test_every_engine_read_expects_offsets_and_serves_identity_without_d2t():
    for engine in ("sglang", "vllm"):
        rule = embedrules.d2t_rule(engine, None)
        assert rule.convention == "offsets" and rule.when_missing == "identity"
        assert not rule.t2d_read
    assert embedrules.d2t_rule("trtllm") is None
    assert "id i" in embedrules.d2t_missing_consequence("sglang", "0.5.23", 256, 512)
    assert "nothing lost" in embedrules.d2t_missing_consequence("vllm", "0.33.0", 512, 512)


def test_trainer_offsets_are_what_the_drafter_reader_applies():
    """The trainers' d2t formula (used_tokens[i] - i) mapped through io.drafter gives the ids back."""
    import torch

    from eagleforensics.io.drafter import Drafter

    used = torch.tensor([0, 3, 4, 9, 200, 511])
    d2t = used - torch.arange(len(used))
    drafter = Drafter(spec=None, weights={"d2t": d2t})  # type: ignore[arg-type]
    assert drafter.draft_to_target(torch.arange(len(used))).tolist() == used.tolist()
    # the data sample's d2t holds offsets: added to arange they give increasing target ids
    handle = open_safetensors(DRAFTER / "model.safetensors")
    offsets = torch.as_tensor(read_tensor(handle, "d2t", DRAFTER / "model.safetensors"))
    targets = torch.arange(len(offsets)) + offsets
    assert bool((targets[1:] > targets[:-1]).all())


# --- trainers -----------------------------------------------------------------------------------

def test_trainer_heads_and_embeddings():
    assert embedrules.trainer_rule("specforge").head_is_target_copy is False
    assert embedrules.trainer_rule("specforge").embedding == "target-frozen"
    assert embedrules.trainer_rule("speculators", "0.9.0").head_is_target_copy is True
    assert embedrules.trainer_rule("speculators", "0.4.0").head_is_target_copy is False
    assert embedrules.trainer_rule("modelopt").head_is_target_copy is None
    assert embedrules.trainer_rule("modelopt").embedding == "not-exported"
    assert embedrules.trainer_rule("eagle").lm_head == "trained-from-scratch"
    with pytest.raises(ForensicsError, match="outside"):
        embedrules.trainer_rule("speculators", "0.2.0")
    with pytest.raises(ForensicsError, match="unknown trainer"):
        embedrules.trainer_rule("medusa")


def test_fresh_init_row_norm_matches_a_real_transformers_init():
    """A never-loaded embedding from transformers' own init has row norms ~ std * sqrt(H)."""
    transformers = pytest.importorskip("transformers")
    hidden = 128
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(cfg)
    rows = model.model.embed_tokens.weight.detach().float().norm(dim=1)
    want = embedrules.trainer_rule("specforge").fresh_row_norm(hidden)
    assert want == pytest.approx(0.02 * math.sqrt(hidden))
    assert float(rows.median()) == pytest.approx(want, rel=0.1)


# --- RoPE ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine,version,runner,rope,past", [
    ("sglang", "0.5.17", None, None, "out-of-bounds"),
    ("sglang", "0.5.18", None, None, "refuse-at-start"),
    ("vllm", "0.10.2", "v1", None, "out-of-bounds"),
    ("vllm", "0.11.0", "v1", None, "no-drafts"),
    ("vllm", "0.33.0", "v1", "yarn", "no-drafts"),
    ("vllm", "0.26.0", "v2", None, "out-of-bounds"),
    ("vllm", "0.27.0", "v2", None, "raised"),
    ("vllm", "0.33.0", "v2", "llama3", "raised"),
    ("vllm", "0.33.0", "v2", "yarn", "target-capped"),
    ("vllm", "0.34.0", "v2", "llama3", "raised"),
    ("vllm", "0.34.0", None, "yarn", "target-capped"),  # no V1 runner: V2's row by default
])
def test_rope_boundaries(engine, version, runner, rope, past):
    rule = roperules.draft_rope_rule(engine, version, runner, rope)
    assert rule.past_max == past and rule.rope_params == "draft"
    assert rule.consequence == roperules.PAST_MAX[past]


def test_rope_kind_and_unknowns():
    assert roperules.rope_kind({"rope_scaling": {"rope_type": "llama3", "factor": 8}}) == "llama3"
    assert roperules.rope_kind({"rope_parameters": {"rope_type": "yarn"}}) == "yarn"
    assert roperules.rope_kind({}) == "default"
    assert roperules.draft_rope_rule("trtllm") is None
    with pytest.raises(ForensicsError, match="no RoPE rule"):
        roperules.draft_rope_rule("vllm", "0.16.0", "v2")


# --- norm_output ----------------------------------------------------------------------------------

def test_norm_output_meaning_flags_the_specforge_020_reading():
    cfg, _ = _sample()
    assert not flagrules.norm_output_meaning(cfg).ambiguous  # key absent: every reader agrees
    flat_true = flagrules.norm_output_meaning({**cfg, "norm_output": True})
    assert flat_true.ambiguous and "SpecForge <= 0.2.0" in flat_true.trainer
    assert not flagrules.norm_output_meaning(SPECULATORS_CFG).ambiguous


def test_describe_functions_list_every_row():
    assert len(flagrules.describe_flag_rules()) == len(flagtable.FLAG_RULES)
    tables = {d["table"] for d in embedrules.describe_embed_rules()}
    assert tables == {"embed", "d2t", "trainer"}
    assert len(roperules.describe_rope_rules()) == len(roperules.ROPE_RULES)
