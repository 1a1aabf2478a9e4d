"""Drafter replay: the forward against an independent plain re-implementation, the sample's verdict, loading, CLI.

The sample drafter (data_samples/drafter, scripts/train_drafter.py) was trained on positions 3, 7, 10 of
the tiny target that made every sample; data_samples/target holds that target's embedding, final norm
and lm_head as a two-shard checkpoint.
"""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from eagleforensics.arrays import to_torch
from eagleforensics.cli import main
from eagleforensics.errors import ForensicsError
from eagleforensics.drafter.replay import DraftForward, replay_drafts, target_tokens
from eagleforensics.io.capture import load_capture
from eagleforensics.io.drafter import load_drafter, load_target
from eagleforensics.positions import Position
from eagleforensics.replay import parse_wiring, run_replay

from .realdata import SAMPLES

DRAFTER = SAMPLES / "drafter"
TARGET = SAMPLES / "target"
SWEEP = SAMPLES / "capture_sweep.safetensors"
RECORD = SAMPLES / "record_layer_outputs.pt"
TRAINED = (3, 7, 10)


@pytest.fixture(scope="module")
def sample():
    drafter = load_drafter(DRAFTER, target=TARGET)
    cap = load_capture(SWEEP)
    aux = torch.cat([to_torch(cap.read(Position(p))).float() for p in TRAINED], -1)
    y = target_tokens(to_torch(cap.read(Position(12, True))).float(), load_target(TARGET).lm_head)
    return drafter, cap, aux, y


def _plain_chain(drafter, aux, ids, t, steps):
    """Draft logits of steps 1..``steps`` at start row t, written out row by row: no batching, no shared code.

    Rotary is a complex rotation of (x[i], x[i + d/2]) pairs; attention is a python loop with its own
    softmax over the prefix's step-1 keys (rows 0..t) and this row's own keys of steps 2..k.
    """
    w = {k: v.double() if v.is_floating_point() else v for k, v in drafter.weights.items()}
    s = drafter.spec
    d, group = s.head_dim, s.num_heads // s.num_kv_heads

    def norm(x, g):
        return g * x / torch.sqrt((x * x).mean() + s.rms_norm_eps)

    def rot(x, position):
        half = d // 2
        freq = torch.tensor([s.rope_theta ** (-2.0 * i / d) for i in range(half)], dtype=torch.float64)
        z = torch.complex(x[:half], x[half:]) * torch.exp(1j * position * freq)
        return torch.cat([z.real, z.imag])

    def qkv(token, state):
        x = torch.cat([norm(w["embed"][token], w["layer.input_layernorm.weight"]),
                       norm(state, w["layer.hidden_norm.weight"])])
        return tuple(w[f"layer.self_attn.{n}_proj.weight"] @ x for n in "qkv")

    prefix = []  # (position, k, v) of the step-1 pass over rows 0..t
    for r in range(t + 1):
        _, k, v = qkv(ids[r + 1], w["fc.weight"] @ aux[r].double())
        prefix.append((r, k, v))
    state, own, out = w["fc.weight"] @ aux[t].double(), [], []
    for step in range(1, steps + 1):
        q, k, v = qkv(ids[t + step], state)
        if step > 1:
            own.append((t + step - 1, k, v))
        heads = []
        for h in range(s.num_heads):
            kv = slice((h // group) * d, (h // group + 1) * d)
            qh = rot(q[h * d:(h + 1) * d], t + step - 1)
            scores = [float(qh @ rot(kk[kv], pos)) / math.sqrt(d) for pos, kk, _ in prefix + own]
            top = max(scores)
            weights = [math.exp(x - top) for x in scores]
            heads.append(sum((wt / sum(weights)) * vv[kv] for wt, (_, _, vv) in zip(weights, prefix + own)))
        h1 = state + w["layer.self_attn.o_proj.weight"] @ torch.cat(heads)
        m = norm(h1, w["layer.post_attention_layernorm.weight"])
        gate = w["layer.mlp.gate_proj.weight"] @ m
        state = h1 + w["layer.mlp.down_proj.weight"] @ (gate * torch.sigmoid(gate) * (w["layer.mlp.up_proj.weight"] @ m))
        out.append(w["lm_head.weight"] @ norm(state, w["norm.weight"]))
    return out


def test_replay_matches_a_plain_reimplementation(sample):
    drafter, cap, aux, y = sample
    ids = to_torch(cap.input_ids)  # the internal steps below take tensors; replay_drafts takes either
    fwd = DraftForward.of(drafter)
    drafts = replay_drafts(fwd, aux, ids, steps=3, chunk=16)  # chunking crosses the rows checked
    assert torch.equal(drafts, replay_drafts(fwd, aux, ids, steps=3, chunk=7))
    h0 = fwd.project(aux)
    logits = list(fwd.chain(fwd.prefix(h0, ids), 3, 0, aux.shape[0]))
    d2t = drafter.weights["d2t"]
    accepted_plain, accepted_replay = [], []
    for t in (0, 5, 17, 30):
        plain = _plain_chain(drafter, aux, ids, t, 3)
        for k in range(3):
            assert torch.allclose(logits[k][t].double(), plain[k], atol=1e-4, rtol=1e-4), (t, k + 1)
            token = int(plain[k].argmax()) + int(d2t[int(plain[k].argmax())])
            assert token == int(drafts[k, t]), (t, k + 1)
        first = int(plain[0].argmax()) + int(d2t[int(plain[0].argmax())])
        accepted_plain.append(first == int(y[t + 1]))  # first-step acceptance, by the plain code
        accepted_replay.append(int(drafts[0, t]) == int(y[t + 1]))
    assert accepted_plain == accepted_replay
    assert any(accepted_plain) and not all(accepted_plain)  # the rows checked include both outcomes


def test_trained_wiring_beats_every_wrong_one_on_the_sample():
    rep = run_replay(DRAFTER, SWEEP, target=TARGET, train=RECORD, wirings=["p0,p2,p6"], steps=4)
    by = {r.label: r for r in rep.results}
    assert rep.trained is not None and rep.trained.label == "p3,p7,p10"
    assert set(by) == {"p3,p7,p10", "p2,p6,p9", "p0,p2,p6"}  # trained, engine default, the wrong fix
    for label in ("p2,p6,p9", "p0,p2,p6"):
        assert by["p3,p7,p10"].accept_length > by[label].accept_length, label
        assert by["p3,p7,p10"].acc[0] > by[label].acc[0], label
    assert rep.best is rep.trained
    r = rep.trained
    assert r.accept_length == pytest.approx(1 + sum(r.reach))
    assert all(a >= b for a, b in zip(r.reach, r.reach[1:]))


def test_speculators_layout_gives_the_same_drafts(tmp_path, sample):
    drafter, cap, aux, _ = sample
    tensors = load_file(str(DRAFTER / "model.safetensors"))
    renamed = {k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}
    renamed["embed_tokens.weight"] = load_target(TARGET).embed.to(torch.bfloat16)
    save_file(renamed, str(tmp_path / "model.safetensors"))
    cfg = json.loads((DRAFTER / "config.json").read_text())
    layer = {k: cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                 "intermediate_size", "rms_norm_eps", "rope_theta", "vocab_size", "hidden_act")}
    spec_cfg = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
                "transformer_layer_config": {**layer, "num_hidden_layers": 1, "model_type": "llama"},
                "draft_vocab_size": cfg["draft_vocab_size"], "norm_before_residual": False,
                "eagle_aux_hidden_state_layer_ids": [3, 7, 10]}
    (tmp_path / "config.json").write_text(json.dumps(spec_cfg))
    other = load_drafter(tmp_path)  # carries its own embedding: no target needed
    assert other.spec.layout == "speculators"
    ids = cap.input_ids
    a = replay_drafts(DraftForward.of(drafter), aux, ids, 3)
    b = replay_drafts(DraftForward.of(other), aux, ids, 3)
    assert torch.equal(a, b)


def test_bad_drafters_are_refused_naming_the_file(tmp_path):
    d = tmp_path / "d"
    shutil.copytree(DRAFTER, d)
    with pytest.raises(ForensicsError, match="embed_tokens"):
        load_drafter(d)  # no embedding and no target
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["fc.weight"]
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(ForensicsError, match="fc.weight") as err:
        load_drafter(d, target=TARGET)
    assert str(d) in str(err.value)
    (d / "config.json").write_text("{not json")
    with pytest.raises(ForensicsError, match="config.json"):
        load_drafter(d, target=TARGET)
    t = tmp_path / "t"
    shutil.copytree(TARGET, t)
    index = json.loads((t / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = "../outside.safetensors"
    (t / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ForensicsError, match="same directory"):
        load_target(t)
    # found by scripts/fuzz.py: a control character inside a string of the index was a JSONDecodeError (exit 3)
    (t / "model.safetensors.index.json").write_text('{"weight_map": {"lm_head.weight": "a\tb"}}')
    with pytest.raises(ForensicsError, match="safetensors shard index is not valid JSON") as err:
        load_target(t)
    assert "model.safetensors.index.json" in str(err.value)
    (t / "model.safetensors.index.json").write_text("[1, 2]")
    with pytest.raises(ForensicsError, match="safetensors shard index is not a JSON object"):
        load_target(t)


def test_wiring_parser():
    assert parse_wiring("p3,p7,p10") == (Position(3), Position(7), Position(10))
    assert parse_wiring("2, 6, 12n") == (Position(2), Position(6), Position(12, True))
    with pytest.raises(ForensicsError, match="--wiring"):
        parse_wiring("p3,layer7")


def run_cli(*args):
    return CliRunner().invoke(main, list(args))


def test_cli_json_and_engine_exit_codes():
    base = ["replay", str(DRAFTER), str(SWEEP), "--target", str(TARGET), "--train", str(RECORD), "--steps", "2"]
    out = run_cli(*base, "--engine", "sglang", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["schema"] == "eagleforensics-replay-v1" and data["trained"] == "p3,p7,p10"
    sources = {w["label"]: w["source"] for w in data["wirings"]}
    assert "sglang" in sources["p3,p7,p10"]  # the drafter's nested ids [2, 6, 9] are read as p3, p7, p10
    assert all(len(w["acc"]) == 2 and w["speedup"] > 0 for w in data["wirings"])
    out = run_cli(*base, "--engine", "vllm")  # vLLM reads only the top-level key: it serves the default
    assert out.exit_code == 1, out.output
    out = run_cli("replay", str(DRAFTER), str(RECORD), "--target", str(TARGET))  # a record is not a capture
    assert out.exit_code == 2 and "--train" in out.stderr
    out = run_cli(*base, "--wiring", "p0,p1,p2", "--steps", "16", "--json")  # chains die out: cond undefined
    assert out.exit_code == 0, out.output
    assert None in json.loads(out.stdout)["wirings"][-1]["cond"]
    out = run_cli("replay", str(SAMPLES / "nope"), str(SWEEP))
    assert out.exit_code == 2 and "nope" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_report_has_the_replay_section(tmp_path):
    """``report --drafter``: the notebook records the replay summary and the page carries the chart."""
    from eagleforensics.report import pipeline as report

    out = report.build_report(RECORD, SAMPLES / "capture.pt", tmp_path / "r.html", drafter=DRAFTER, target=TARGET,
                              keep_notebook=True)
    assert out.exit_code == 1  # the incident record: ACTION (ids to write), the page is written all the same
    summary = report.read_summary(out.notebook, "eagleforensics-replay-v1")
    assert summary["trained"] == "p3,p7,p10"
    lengths = {w["label"]: w["accept_length"] for w in summary["wirings"]}
    assert lengths["p3,p7,p10"] == max(lengths.values())
    page = out.html.read_text(encoding="utf-8")
    assert "Replayed accept length per wiring" in page and "#1a9850" in page  # the trained bar is green
    with pytest.raises(ForensicsError, match="target needs drafter"):
        report.validate_params(RECORD, SAMPLES / "capture.pt", target=TARGET)


@pytest.mark.parametrize("plant", ["fifo", "deep"])
def test_hostile_drafter_config_is_one_line(tmp_path, plant):
    """A drafter config.json that is a FIFO or nests 100,000 levels: one line, exit 2 (was a RecursionError)."""
    import os

    d = tmp_path / "drafter"
    shutil.copytree(DRAFTER, d)
    (d / "config.json").unlink()
    if plant == "fifo":
        os.mkfifo(d / "config.json")
    else:
        (d / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    out = run_cli("replay", str(d), str(SWEEP))
    assert out.exit_code == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert ("not a regular file" if plant == "fifo" else "nested 100000 levels") in out.stderr
