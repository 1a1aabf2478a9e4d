"""Replay under hostile or broken input (issue 19): one stderr line and exit 2, or a finding; never a made-up figure.

NaN/Inf states or heads, attention memory that grew with heads x tokens, tensors read before their shapes were
checked, bad rope_scaling values, integer weights, a target of the wrong width, and paths that forge lines.
"""
from __future__ import annotations

import json
import math
import shutil
import struct

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from eagleforensics.cli import main
from eagleforensics.io.sweep import sweep, write_capture
from eagleforensics.testing.tinymodels import build_model, prompt_ids

from .realdata import ROOT, SAMPLES
from .test_hardening import run_process

DRAFTER = SAMPLES / "drafter"
TARGET = SAMPLES / "target"
SWEEP = SAMPLES / "capture_sweep.safetensors"
RECORD = SAMPLES / "record_layer_outputs.pt"


def run_cli(*args):
    return CliRunner().invoke(main, ["replay", *map(str, args)])


def one_line(out, code=2):
    assert out.exit_code == code, out.output
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.output, out.stderr
    return out.stderr


def nan_capture(path, which):
    """The sample capture with NaN in ``which``: every state, only the final state, or rows 5..9 of p3."""
    data = torch.load(SAMPLES / "capture.pt")
    hs = [h.clone() for h in data["hidden_states"]]
    if which == "all":
        hs = [torch.full_like(h, float("nan")) for h in hs]
    elif which == "final":
        hs[-1] = torch.full_like(hs[-1], float("nan"))
    elif which == "aux":
        hs = [h if i in (0, 12) else torch.full_like(h, float("inf")) for i, h in enumerate(hs)]
    else:
        hs[3][..., 5:10, :] = float("nan")
    torch.save({"hidden_states": hs, "input_ids": data["input_ids"]}, path)
    return path


@pytest.mark.parametrize("which", ["all", "final", "aux"])
def test_nan_capture_is_never_a_best_wiring(tmp_path, which):
    """An all-NaN capture (or NaN final / Inf everywhere but the embedding and the final): one line, exit 2."""
    cap = nan_capture(tmp_path / "nan.pt", which)
    err = one_line(run_cli(DRAFTER, cap, "--target", TARGET))
    assert "NaN or Inf" in err and str(cap) in err


def test_nan_rows_are_a_finding_and_not_counted(tmp_path):
    cap = nan_capture(tmp_path / "rows.pt", "rows")
    out = run_cli(DRAFTER, cap, "--target", TARGET, "--wiring", "p3,p7,p10", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    by = {w["label"]: w for w in data["wirings"]}
    assert by["p3,p7,p10"]["excluded_rows"] == 5 and by["p2,p6,p9"]["excluded_rows"] == 0
    assert by["p3,p7,p10"]["acc_rows"][0] == by["p2,p6,p9"]["acc_rows"][0] - 5
    assert all(w["measured"] and 1.0 <= w["accept_length"] <= 4.0 for w in data["wirings"])
    assert any(f["code"] == "nonfinite-capture" and "p3,p7,p10: 5 rows" in f["message"] for f in data["findings"])


def test_nan_target_head_is_refused(tmp_path):
    t = tmp_path / "t"
    shutil.copytree(TARGET, t)
    shard = t / "model-00002-of-00002.safetensors"
    tensors = load_file(str(shard))
    tensors["lm_head.weight"][7, 3] = float("nan")
    save_file(tensors, str(shard))
    err = one_line(run_cli(DRAFTER, SWEEP, "--target", t))
    assert "lm_head.weight holds NaN or Inf" in err


def test_target_norm_of_the_wrong_width_is_one_line(tmp_path):
    """capture.pt read in vLLM's convention has no post-norm entry, so the target's final norm is applied."""
    t = tmp_path / "t"
    shutil.copytree(TARGET, t)
    shard = t / "model-00001-of-00002.safetensors"
    tensors = load_file(str(shard))
    tensors["model.norm.weight"] = tensors["model.norm.weight"][:64].contiguous()
    save_file(tensors, str(shard))
    err = one_line(run_cli(DRAFTER, SAMPLES / "capture.pt", "--target", t, "--capture-convention", "vllm"))
    assert "model.norm.weight has shape [64]; the drafter needs [128]" in err


def test_target_tensors_are_checked_against_the_drafter_before_they_are_read(tmp_path):
    t = tmp_path / "t"
    shutil.copytree(TARGET, t)
    shard = t / "model-00002-of-00002.safetensors"
    save_file({"lm_head.weight": torch.zeros(600, 128)}, str(shard))
    err = one_line(run_cli(DRAFTER, SWEEP, "--target", t))
    assert "lm_head.weight has shape [600, 128]; the drafter needs [512, 128]" in err


def drafter_copy(tmp_path, edit=None, config=None):
    d = tmp_path / "d"
    shutil.copytree(DRAFTER, d)
    if edit is not None:
        tensors = load_file(str(d / "model.safetensors"))
        edit(tensors)
        save_file(tensors, str(d / "model.safetensors"))
    if config is not None:
        cfg = json.loads((d / "config.json").read_text())
        config(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("name,edit,words", [
    ("u32-d2t", lambda t: t.update(d2t=t["d2t"].to(torch.uint32)), "d2t has dtype U32"),
    ("int-fc", lambda t: t.update({"fc.weight": t["fc.weight"].to(torch.int32)}), "fc.weight has dtype I32"),
    ("bool-norm", lambda t: t.update({"norm.weight": t["norm.weight"] > 0}), "norm.weight has dtype BOOL"),
    ("wide-lm-head", lambda t: t.update({"lm_head.weight": torch.zeros(256, 129, dtype=torch.bfloat16)}),
     "lm_head.weight has shape [256, 129]"),
])
def test_bad_drafter_tensors_are_one_line(tmp_path, name, edit, words):
    err = one_line(run_cli(drafter_copy(tmp_path, edit), SWEEP, "--target", TARGET))
    assert words in err


@pytest.mark.parametrize("scaling,words", [
    ({"rope_type": "llama3", "factor": "x"}, "factor must be a finite number"),
    ({"rope_type": "linear", "factor": -2}, "factor must be a finite number > 0"),
    ({"rope_type": "linear"}, "linear needs a factor"),
    ({"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 4}, "high_freq_factor >"),
    ({"rope_type": "yarn", "factor": 4}, "needs original_max_position_embeddings"),
    ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 64, "beta_fast": [1]}, "beta_fast"),
    ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 64, "truncate": "no"}, "truncate"),
    ({"rope_type": "dynamic", "factor": 2}, "not supported"),
    ({"rope_type": 7}, "not supported"),
    ("yarn", "must be an object"),
    ({"rope_type": "llama3", "factor": math.inf}, "finite"),
])
def test_bad_rope_scaling_is_one_line(tmp_path, scaling, words):
    d = drafter_copy(tmp_path, config=lambda c: c.update(rope_scaling=scaling))
    err = one_line(run_cli(d, SWEEP, "--target", TARGET))
    assert words in err and "config.json" in err


def test_shapes_are_checked_from_the_headers_before_any_tensor_is_read(tmp_path):
    """A 430 KB sparse file whose header claims a 2.3 GB fc.weight: refused from the header, nothing read."""
    d = tmp_path / "d"
    shutil.copytree(DRAFTER, d)
    tensors = load_file(str(DRAFTER / "model.safetensors"))
    del tensors["fc.weight"]
    header, blobs, offset = {}, [], 0
    for name, t in sorted(tensors.items()):
        raw = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool else t.numpy().tobytes()
        dtype = {torch.bfloat16: "BF16", torch.int64: "I64", torch.bool: "BOOL"}[t.dtype]
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    huge = (3_000_000, 384)
    header["fc.weight"] = {"dtype": "BF16", "shape": list(huge), "data_offsets": [offset, offset + 2 * huge[0] * huge[1]]}
    text = json.dumps(header).encode()
    path = d / "model.safetensors"
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
        fh.truncate(8 + len(text) + offset + 2 * huge[0] * huge[1])  # a hole: 2.3 GB claimed, nothing stored
    code, _, err, peak_kib = peak_cli(d, SWEEP, "--target", TARGET)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "fc.weight has shape [3000000, 384], config implies [128, 384]" in err
    assert peak_kib < 1 << 20, peak_kib  # the 2.3 GB were never read (the old loader read them, then checked)


def peak_cli(*args) -> tuple[int, str, str, int]:
    """``eagleforensics replay ARGS`` as a process: exit code, stdout, stderr, its own peak resident KiB.

    Through test_hardening.run_process: a child forked straight from pytest inherits pytest's RSS high-water
    mark in ``ru_maxrss`` (CI measured 1,072,468 KiB for both tests here, pytest's figure, not replay's)."""
    code, out, err, peak = run_process(["replay", *map(str, args)], ROOT, timeout=600)
    return code, out, err, peak // 1024


def test_paths_cannot_forge_lines(tmp_path):
    """A drafter directory whose name holds a newline and an escape sequence: still one VERDICT line, escaped."""
    d = tmp_path / "dr\nVERDICT: forged \x1b[31m"
    shutil.copytree(DRAFTER, d)
    out = run_cli(d, SWEEP, "--target", TARGET, "--train", RECORD)
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert sum(line.startswith("VERDICT:") for line in lines) == 1
    assert "\x1b" not in out.stdout and "dr\\nVERDICT: forged \\x1b[31m" in out.stdout


def _big_heads_inputs(tmp_path):
    """A 512-token capture of a tiny target (H=24, bf16) and a drafter with 1,024 heads of dim 2: < 1 MB together."""
    model = build_model("llama", num_layers=4, hidden=24, seed=5)
    ids = prompt_ids(512, seed=9)
    cap = tmp_path / "cap.safetensors"
    write_capture(cap, sweep(model, ids), model, dtype="bfloat16")
    d = tmp_path / "heads"
    d.mkdir()
    gen = torch.Generator().manual_seed(0)
    h, heads, kv, hd = 32, 1024, 128, 2

    def lin(o, i):
        return (torch.randn(o, i, generator=gen) / i ** 0.5).to(torch.bfloat16)

    tensors = {"fc.weight": lin(h, 72), "midlayer.self_attn.q_proj.weight": lin(heads * hd, 2 * h),
               "midlayer.self_attn.k_proj.weight": lin(kv * hd, 2 * h), "midlayer.self_attn.v_proj.weight": lin(kv * hd, 2 * h),
               "midlayer.self_attn.o_proj.weight": lin(h, heads * hd), "midlayer.mlp.gate_proj.weight": lin(h, h),
               "midlayer.mlp.up_proj.weight": lin(h, h), "midlayer.mlp.down_proj.weight": lin(h, h),
               "lm_head.weight": lin(512, h), "embed_tokens.weight": lin(512, h)}
    for n in ("midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
              "midlayer.post_attention_layernorm.weight", "norm.weight"):
        tensors[n] = torch.ones(h, dtype=torch.bfloat16)
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": h, "target_hidden_size": 24,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd, "intermediate_size": h,
        "num_hidden_layers": 1, "vocab_size": 512, "draft_vocab_size": 512, "rms_norm_eps": 1e-6}))
    return d, cap


def test_attention_memory_is_bounded(tmp_path):
    """Peak memory of the whole CLI run under 1 GiB (was 2+ GB here, 3.4 GB in the report: attention scores
    [heads, 256 rows, T] held at once). The wiring given is the engines' default for N=4, so one wiring runs."""
    d, cap = _big_heads_inputs(tmp_path)
    size = sum(f.stat().st_size for f in [cap, *d.iterdir()])
    assert size < 1 << 20
    code, out, err, peak_kib = peak_cli(d, cap, "--wiring", "p2,p2,p1", "--steps", "1")
    assert code == 0, err[-2000:]
    assert "accept len" in out and peak_kib < 1 << 20, peak_kib  # 0.53 GiB here; the old code took 1.8 GiB


def test_too_few_rows_for_the_chain_is_one_line():
    err = one_line(run_cli(DRAFTER, SWEEP, "--target", TARGET, "--max-tokens", "3", "--steps", "3"))
    assert "no start row has 3 target tokens after it" in err
