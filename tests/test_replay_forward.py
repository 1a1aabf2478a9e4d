"""The drafter forward beyond the one-layer SpecForge drafter: several decoder layers, RoPE scaling, sliding
windows, the optional norms, and the "as served" variants that drop a feature.

Drafters are built from the sample drafter (data_samples/drafter, trained on the tiny target): its first layer,
plus seeded extra layers in speculators' layout (``layers.{i}.*``, plain decoder layers); fed the real capture
sweep of the tiny target. Every forward is held against ``tests/plaindraft.py`` (float64, one row at a time,
transformers' own rotary functions).
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from eagleforensics.arrays import to_torch
from eagleforensics.cli import main
from eagleforensics.errors import ForensicsError
from eagleforensics.drafter.replay import DraftForward, rope_tables
from eagleforensics.io.capture import load_capture
from eagleforensics.io.drafter import load_drafter, load_target, read_spec
from eagleforensics.io.served import SERVED_FEATURES
from eagleforensics.positions import Position

from .plaindraft import hf_rope, plain_logits
from .torchthreads import one_thread  # noqa: F401  (autouse)
from .realdata import SAMPLES

DRAFTER = SAMPLES / "drafter"
TARGET = SAMPLES / "target"
SWEEP = SAMPLES / "capture_sweep.safetensors"
ROWS = (3, 17, 36)


@pytest.fixture(scope="module")
def inputs():
    cap = load_capture(SWEEP)
    aux = torch.cat([to_torch(cap.read(Position(p))).float() for p in (3, 7, 10)], -1)
    return aux, to_torch(cap.input_ids).long()


def build(tmp, name="d", *, layers=1, rope=None, sliding=None, norm_output=False, norm_before_residual=False,
          input_norm=False, fc_norm=False, own_embed=False, noisy_embed=False, seed=0):
    """A speculators-layout drafter: the sample's trained first layer, ``layers - 1`` seeded plain layers after it."""
    d = tmp / name
    d.mkdir()
    gen = torch.Generator().manual_seed(seed)
    tensors = {k.replace("midlayer.", "layers.0."): v for k, v in load_file(str(DRAFTER / "model.safetensors")).items()}
    h = 128

    def lin(o, i):
        return (torch.randn(o, i, generator=gen) / i ** 0.5).to(torch.bfloat16)

    def gain(n):
        return (1 + 0.3 * torch.randn(n, generator=gen)).to(torch.bfloat16)

    for i in range(1, layers):
        p = f"layers.{i}."
        tensors.update({p + "input_layernorm.weight": gain(h), p + "post_attention_layernorm.weight": gain(h),
                        p + "self_attn.q_proj.weight": lin(128, h), p + "self_attn.k_proj.weight": lin(64, h),
                        p + "self_attn.v_proj.weight": lin(64, h), p + "self_attn.o_proj.weight": lin(h, 128),
                        p + "mlp.gate_proj.weight": lin(128, h), p + "mlp.up_proj.weight": lin(128, h),
                        p + "mlp.down_proj.weight": lin(h, 128)})
    if input_norm:
        tensors["input_norm.weight"] = gain(3 * h)
    if fc_norm:
        for i in range(3):
            tensors[f"fc_norm.{i}.weight"] = gain(h)
    if own_embed:
        emb = load_target(TARGET).embed
        if noisy_embed:
            emb = emb + 0.5 * emb.std() * torch.randn(emb.shape, generator=gen)
        tensors["embed_tokens.weight"] = emb.to(torch.bfloat16)
    save_file(tensors, str(d / "model.safetensors"))
    base = json.loads((DRAFTER / "config.json").read_text())
    layer = {k: base[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                  "intermediate_size", "rms_norm_eps", "rope_theta", "vocab_size", "hidden_act",
                                  "max_position_embeddings")}
    layer.update(num_hidden_layers=layers, model_type="llama")
    if rope is not None:
        layer["rope_scaling"] = rope
    if sliding is not None:
        window, kinds = sliding
        layer.update(sliding_window=window, layer_types=kinds)
    cfg = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"], "transformer_layer_config": layer,
           "draft_vocab_size": base["draft_vocab_size"], "norm_before_residual": norm_before_residual,
           "norm_output": norm_output, "eagle_aux_hidden_state_layer_ids": [3, 7, 10]}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def replay_logits(drafter, aux, ids, steps=3, drop=frozenset(), chunk=7):
    fwd = DraftForward.of(drafter, drop=drop)
    with torch.no_grad():
        h0, _ = fwd.project_rows(aux, ids.shape[0], chunk)
        pre = fwd.prefix(h0, ids, chunk=chunk)  # several chunks: each layer's keys are written before they are read
        return list(fwd.chain(pre, steps, 0, ids.shape[0]))


def close_to_plain(drafter, aux, ids, drop=frozenset()):
    got = replay_logits(drafter, aux, ids, drop=drop)
    for t in ROWS:
        plain = plain_logits(drafter, aux, ids, t, steps=3, drop=drop)
        for k in range(3):
            assert torch.allclose(got[k][t].double(), plain[k], atol=2e-4, rtol=2e-4), (t, k + 1)


ROPES = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "yarn-mscale": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "beta_fast": 16,
                    "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.5},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                              "attention_factor": 1.3, "truncate": False},
}


@pytest.mark.parametrize("kind", sorted(ROPES))
def test_rope_tables_equal_transformers(tmp_path, kind):
    """Frequencies and the attention factor of each scaling, against transformers' own rotary functions."""
    spec = read_spec(build(tmp_path, rope=ROPES[kind]))
    inv, scale = rope_tables(spec)
    want_inv, want_scale = hf_rope(spec)
    assert torch.allclose(inv.double(), want_inv, rtol=1e-6, atol=0)
    assert scale == pytest.approx(want_scale, rel=1e-9)
    if kind.startswith("yarn"):
        assert scale != 1.0 or kind == "yarn-mscale"
        assert not torch.allclose(inv, rope_tables(read_spec(build(tmp_path, "plain")))[0])  # the scaling did act


def test_three_layers_yarn_sliding_and_every_norm_match_the_plain_forward(tmp_path, inputs):
    """Layers 1 and 2 are plain decoder layers; layer 1 slides over 8 rows; YaRN stretches the rotary; input_norm,
    fc_norm, norm_before_residual and speculators' norm_output (normed state fed back) all on."""
    aux, ids = inputs
    d = build(tmp_path, layers=3, rope=ROPES["yarn"], sliding=(8, ["full_attention", "sliding_attention",
                                                                    "full_attention"]),
              norm_output=True, norm_before_residual=True, input_norm=True, fc_norm=True)
    drafter = load_drafter(d, target=TARGET)
    assert drafter.spec.num_layers == 3 and drafter.spec.sliding_layers == (1,) and drafter.spec.sliding_window == 8
    assert drafter.features() == {"extra_layers", "sliding_window", "norm_output", "norm_before_residual",
                                  "norm_before_fc", "fc_norm"}
    close_to_plain(drafter, aux, ids)


@pytest.mark.parametrize("kind", ["linear", "llama3"])
def test_two_layers_with_rope_scaling_match_the_plain_forward(tmp_path, inputs, kind):
    aux, ids = inputs
    close_to_plain(load_drafter(build(tmp_path, layers=2, rope=ROPES[kind]), target=TARGET), aux, ids)


def without(tmp_path, feature):
    """(drafter using every feature, the same drafter with ``feature`` taken out of its files)."""
    kw = dict(layers=2, sliding=(6, ["sliding_attention", "full_attention"]), norm_output=True,
              norm_before_residual=True, input_norm=True, fc_norm=True, own_embed=True, noisy_embed=True)
    full = build(tmp_path, "full", **kw)
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    cfg = json.loads((cut / "config.json").read_text())
    tensors = load_file(str(cut / "model.safetensors"))
    if feature == "norm_before_fc":
        del tensors["input_norm.weight"]
    elif feature == "fc_norm":
        tensors = {k: v for k, v in tensors.items() if not k.startswith("fc_norm.")}
    elif feature == "norm_output":
        cfg["norm_output"] = False
    elif feature == "norm_before_residual":
        cfg["norm_before_residual"] = False
    elif feature == "own_embedding":
        del tensors["embed_tokens.weight"]
    elif feature == "extra_layers":
        tensors = {k: v for k, v in tensors.items() if not k.startswith("layers.1.")}
        cfg["transformer_layer_config"].update(num_hidden_layers=1, layer_types=["sliding_attention"])
    elif feature == "sliding_window":
        del cfg["transformer_layer_config"]["layer_types"]
    save_file(tensors, str(cut / "model.safetensors"))
    (cut / "config.json").write_text(json.dumps(cfg))
    return full, cut


@pytest.mark.parametrize("feature", sorted(SERVED_FEATURES))
def test_served_without_is_the_drafter_with_that_feature_taken_out(tmp_path, inputs, feature):
    """Dropping a feature in the forward gives what a drafter whose files lack it gives, and differs from keeping it."""
    aux, ids = inputs
    full, cut = without(tmp_path, feature)
    drafter = load_drafter(full, target=TARGET, target_embed=feature == "own_embedding")
    assert feature in drafter.features()
    dropped = replay_logits(drafter, aux, ids, drop=frozenset({feature}))
    reference = replay_logits(load_drafter(cut, target=TARGET), aux, ids)
    kept = replay_logits(drafter, aux, ids)
    for k in range(3):
        assert torch.allclose(dropped[k], reference[k], atol=1e-5, rtol=1e-5), k + 1
    assert any(not torch.allclose(dropped[k], kept[k], atol=1e-3) for k in range(3)), \
        "the feature changed nothing: the test would prove nothing"


def test_served_without_row_in_the_report_and_cli(tmp_path):
    full, _ = without(tmp_path, "fc_norm")
    out = CliRunner().invoke(main, ["replay", str(full), str(SWEEP), "--target", str(TARGET), "--steps", "2",
                                    "--served-without", "fc_norm", "--served-without", "norm_output", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    served = [w for w in data["wirings"] if w["served_without"]]
    assert len(served) == 1 and served[0]["served_without"] == ["fc_norm", "norm_output"]
    assert served[0]["source"] == "as served without fc_norm, norm_output"
    assert data["served_without"] == ["fc_norm", "norm_output"] and "as served without" in data["verdict"]
    assert served[0]["accept_length"] != next(w for w in data["wirings"] if w["label"] == served[0]["label"]
                                              and not w["served_without"])["accept_length"]
    bad = CliRunner().invoke(main, ["replay", str(full), str(SWEEP), "--served-without", "lm_head"])
    assert bad.exit_code == 2
    plain = CliRunner().invoke(main, ["replay", str(DRAFTER), str(SWEEP), "--target", str(TARGET), "--steps", "2",
                                      "--served-without", "sliding_window", "--json"])
    note = [w for w in json.loads(plain.stdout)["wirings"] if w["served_without"]][0]["note"]
    assert "does not use sliding_window" in note  # nothing dropped: the row says so


def test_layer_files_must_agree_with_the_config(tmp_path):
    d = build(tmp_path, layers=2)
    cfg = json.loads((d / "config.json").read_text())
    cfg["transformer_layer_config"]["num_hidden_layers"] = 1
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ForensicsError, match="decoder layer 1"):
        load_drafter(d, target=TARGET)
    cfg["transformer_layer_config"]["num_hidden_layers"] = 3
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ForensicsError, match="no layers.2"):
        load_drafter(d, target=TARGET)
