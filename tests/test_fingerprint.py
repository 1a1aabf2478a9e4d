"""Fingerprints: align on a fingerprint gives the full path's verdict on every sample and test case."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from eagleforensics.alignment import align
from eagleforensics.arrays import as_array, f32
from eagleforensics.io.capture import load_capture
from eagleforensics.cli.fingerprint import fingerprint as fingerprint_cli
from eagleforensics.errors import ForensicsError
from eagleforensics.evidence.fingerprint import is_fingerprint, load_fingerprint, make_fingerprint, projection, write_fingerprint
from eagleforensics.evidence.match import score_slots
from eagleforensics.evidence.fpmatch import score_fingerprint
from eagleforensics.io.sweep import write_capture

from .realdata import N, ROOT, SAMPLES, _model, forward

SAMPLE_RECORDS = ("record_layer_outputs.pt", "record_wrong_fix.pt", "data_0.ckpt")
SAMPLE_CAPTURES = ("capture.pt", "capture_sweep.safetensors")


def _fp(tmp_path, capture, name="cap.fp.json", **kw):
    return write_fingerprint(make_fingerprint(load_capture(capture, **kw)), tmp_path / name)


def same_verdict(full, est):
    placed = lambda r: [(m.best, m.confident) for m in r.matches]  # noqa: E731
    return full.verdict == est.verdict and full.exit_code == est.exit_code and placed(full) == placed(est)


@pytest.mark.parametrize("capture", SAMPLE_CAPTURES)
def test_fingerprint_verdict_equals_full_verdict_on_every_sample(tmp_path, capture):
    fp = _fp(tmp_path, SAMPLES / capture)
    for record in SAMPLE_RECORDS:
        full, est = align(SAMPLES / record, SAMPLES / capture), align(SAMPLES / record, fp)
        assert same_verdict(full, est), (record, full.verdict, est.verdict)
        assert "fingerprint-estimate" in {f.code for f in est.findings}


def _bf16(t):
    return t.to(torch.bfloat16).contiguous()


def _records(tmp_path, run, model):
    """Records a trainer could have written: default layers, one layer deeper, a pre-norm final, a final one layer early."""
    n = N
    early = model.model.norm(run.p(n - 1)[None])[0].detach()  # the model's own final norm on p=N-1
    recipes = {
        "default": ([2, n // 2, n - 3], run.hs[n]),
        "deeper": ([3, n // 2 + 1, n - 2], run.hs[n]),
        "prenorm-final": ([2, n // 2, n - 3], run.raw_last),
        "early-final": ([2, n // 2, n - 3], early),
    }
    out = {}
    for name, (aux, final) in recipes.items():
        obj = {"hidden_states": [_bf16(run.p(p)) for p in aux] + [_bf16(final)], "input_ids": run.ids.clone()}
        torch.save(obj, tmp_path / f"{name}.pt")
        out[name] = tmp_path / f"{name}.pt"
    return out


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_fingerprint_verdict_equals_full_verdict_on_tiny_model_captures(tmp_path, family):
    """HF tuple .pt (post-norm last), the capture helper sweep, and a vLLM-style raw sweep (no post-norm state)."""
    run, model = forward(family), _model(family, 0)
    torch.save({"hidden_states": [h[None] for h in run.hs], "input_ids": run.ids.clone()}, tmp_path / "hf.pt")
    write_capture(tmp_path / "sweep.safetensors", run.sweep, model, dtype="bfloat16")
    save_file({**{f"h.{p}": _bf16(run.p(p)) for p in range(N + 1)}, "input_ids": run.ids.clone()},
              str(tmp_path / "vllm.safetensors"))
    captures = {"hf.pt": {}, "sweep.safetensors": {}, "vllm.safetensors": {"convention": "vllm"}}
    equal = total = 0
    for cap_name, kw in captures.items():
        fp = _fp(tmp_path, tmp_path / cap_name, name=cap_name + ".fp.json", **kw)
        for name, record in _records(tmp_path, run, model).items():
            full, est = align(record, tmp_path / cap_name, **kw), align(record, fp)
            total += 1
            equal += same_verdict(full, est)
            assert same_verdict(full, est), (cap_name, name, full.verdict, est.verdict)
    assert equal == total == 12


def test_without_probe_tokens_a_post_norm_final_is_cannot_tell_not_a_guess(tmp_path):
    """No post-norm state in the capture and no probes to fit a gain: the final stays unplaced, and says why."""
    run = forward("qwen3")
    save_file({f"h.{p}": _bf16(run.p(p)) for p in range(N + 1)}, str(tmp_path / "raw.safetensors"))
    rec = _records(tmp_path, run, _model("qwen3", 0))["default"]
    full = align(rec, tmp_path / "raw.safetensors", convention="vllm")
    assert full.matches[-1].confident and full.matches[-1].best.normed
    fp = write_fingerprint(make_fingerprint(load_capture(tmp_path / "raw.safetensors", convention="vllm"), probes=0),
                           tmp_path / "noprobe.fp.json")
    est = align(rec, fp)
    assert [m.confident for m in est.matches] == [True, True, True, False]
    note = next(f.message for f in est.findings if f.code == "fingerprint-estimate")
    assert "cannot tell" in note


def test_sketch_estimates_sit_within_their_stated_error(tmp_path):
    """Per cell, |estimate - exact cosine| stays within 3 stated standard errors."""
    run = forward("llama")
    path = write_capture(tmp_path / "s.safetensors", run.sweep, _model("llama", 0))
    cap = load_capture(path)
    fp = load_fingerprint(write_fingerprint(make_fingerprint(cap), tmp_path / "s.fp.json"))
    slots = [_bf16(run.p(p)) for p in (1, 4, 7)]
    exact = score_slots(slots, [False] * 3, cap.positions, cap, 0, 0, 32)
    est = score_fingerprint(slots, [False] * 3, fp, 0, 0, 32)
    gap = np.abs(est.score - exact.score)
    assert (gap <= 3 * est.error + 1e-4).mean() >= 0.95
    assert np.nanmax(gap) < 0.05


def test_fingerprint_file_holds_norms_hashes_and_a_readable_header(tmp_path):
    cap = load_capture(SAMPLES / "capture_sweep.safetensors")
    fp_path = _fp(tmp_path, SAMPLES / "capture_sweep.safetensors")
    assert is_fingerprint(fp_path) and not is_fingerprint(SAMPLES / "capture.pt")
    head = json.loads(fp_path.read_text())
    assert head["format"] == "eagleforensics-fingerprint-v1" and head["num_tokens"] == 40
    entry = head["positions"][5]
    x = np.ascontiguousarray(as_array(cap.read_rows(cap.positions[5], 0, 40)))
    assert entry["sha256"] == hashlib.sha256(x.tobytes()).hexdigest()
    fp = load_fingerprint(fp_path)
    assert isinstance(fp.norms[cap.positions[5]], np.ndarray) and fp.norms[cap.positions[5]].dtype == np.float32
    assert np.allclose(fp.norms[cap.positions[5]], np.linalg.norm(f32(x).astype(np.float64), axis=-1), rtol=1e-6)
    assert fp_path.stat().st_size < 1.2 * (SAMPLES / "capture_sweep.safetensors").stat().st_size


def test_projection_is_fixed_by_seed_alone():
    torch.manual_seed(123)
    a = projection(128, 64, seed=7)
    torch.manual_seed(456)
    b = projection(128, 64, seed=7)
    assert a.dtype == np.float32 and a.shape == (128, 64)
    assert np.array_equal(a, b) and not np.array_equal(a, projection(128, 64, seed=8))
    assert set(np.unique(a).tolist()) == {-1 / 8, 1 / 8}


def test_cli_writes_a_fingerprint_and_refuses_bad_input(tmp_path):
    out = tmp_path / "c.fp.json.gz"
    r = CliRunner().invoke(fingerprint_cli, [str(SAMPLES / "capture.pt"), "-o", str(out)])
    assert r.exit_code == 0 and out.exists() and is_fingerprint(out)
    assert align(SAMPLES / "record_layer_outputs.pt", out).level == "ACTION"  # as with the full capture
    r = CliRunner().invoke(fingerprint_cli, [str(SAMPLES / "capture.pt"), "-o", str(SAMPLES / "capture.pt")])
    assert r.exit_code == 2 and "would overwrite the capture" in r.output
    bad = tmp_path / "bad.fp.json"
    bad.write_text('{"format": "eagleforensics-fingerprint-v1", "positions": 3}')
    with pytest.raises(ForensicsError, match="corrupt fingerprint"):
        align(SAMPLES / "record_layer_outputs.pt", bad)


def test_fitted_estimates_from_probes_track_the_full_fit(tmp_path):
    """Cross-fitted probe scores of post-norm columns sit near the full path's, within their stated error."""
    run = forward("qwen3")
    save_file({f"h.{p}": _bf16(run.p(p)) for p in range(N + 1)}, str(tmp_path / "raw.safetensors"))
    cap = load_capture(tmp_path / "raw.safetensors", convention="vllm")
    fp = load_fingerprint(write_fingerprint(make_fingerprint(cap), tmp_path / "raw.fp.json"))
    slots = [_bf16(run.hs[N])]
    exact = score_slots(slots, [True], cap.positions, cap, 0, 0, 32, fit_candidates=None)
    est = score_fingerprint(slots, [True], fp, 0, 0, 32)
    fitted = [j for j, c in enumerate(exact.columns) if c.normed]
    gap = np.abs(est.score[0, fitted] - exact.score[0, fitted])
    assert (gap <= 3 * est.error[0, fitted] + 0.01).all(), (gap, est.error[0, fitted])


def test_an_estimate_within_its_error_of_a_rival_is_not_confident():
    """The decision rule: clear the bars with the score lowered and the rival raised by 2 errors."""
    from eagleforensics.evidence.confidence import thresholds
    from eagleforensics.evidence.fpmatch import choose_estimated
    from eagleforensics.positions import Position

    cols = [Position(3), Position(4), Position(5)]
    bar = thresholds(torch.bfloat16)
    scores, ratios = np.array([0.9995, 0.990, 0.97]), np.array([1.0, 1.0, 1.0])
    assert choose_estimated(scores, ratios, cols, 32, bar, np.array([0.0, 0.0, 0.0])).confident
    shaky = choose_estimated(scores, ratios, cols, 32, bar, np.array([0.0005, 0.003, 0.003]))
    assert not shaky.confident and "estimation error" in shaky.reason


# ---------------------------------------------------------------- torch stays out of the fingerprint path

TORCH_FREE = ("evidence/fingerprint.py", "evidence/fpmatch.py", "scan/signature.py", "scan/reference.py",
              "scan/runner.py", "scan/results.py", "scan/summary.py", "cli/fingerprint.py")


@pytest.mark.parametrize("rel", TORCH_FREE)
def test_fingerprint_and_scan_modules_import_torch_only_inside_functions(rel):
    """A module-level ``import torch`` here would put torch's start-up back on every CPU fingerprint alignment."""
    import ast

    from .test_layout import PKG

    tree = ast.parse((PKG / rel).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m == "torch" or m.startswith("torch.")], rel


_NO_TORCH = r'''
import json, sys, traceback

class Watch:  # records who imports torch first, then lets the import go on
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "chain" not in globals():
            globals()["chain"] = [f"{f.filename.split('eagleforensics/')[-1]}:{f.lineno}"
                                  for f in traceback.extract_stack() if "/eagleforensics/" in f.filename]
        return None

sys.meta_path.insert(0, Watch())
import numpy as np
from eagleforensics.arrays import BF16
from eagleforensics.evidence.fingerprint import load_fingerprint
from eagleforensics.evidence.fpmatch import score_fingerprint

fp = load_fingerprint(sys.argv[1])
slots = [a.view(BF16) if a.dtype == np.uint16 else a for a in np.load(sys.argv[2]).values()]
sm = score_fingerprint(slots, [False, False, True], fp, 0, 0, 32)
print(json.dumps({"torch": "torch" in sys.modules, "chain": globals().get("chain"),
                  "score": np.nan_to_num(sm.score, nan=-9).tolist(), "types": sorted({type(v).__name__ for v in fp.norms.values()})}))
'''


def test_loading_a_fingerprint_and_scoring_numpy_slots_never_imports_torch(tmp_path):
    """In a fresh interpreter: load a fingerprint, score a record's slots given as ndarrays (bf16 and float32);
    the scores equal those from torch tensors here, and torch is never imported."""
    import os
    import subprocess
    import sys

    from eagleforensics.arrays import as_array

    run = forward("llama")
    path = write_capture(tmp_path / "s.safetensors", run.sweep, _model("llama", 0))
    fp_path = write_fingerprint(make_fingerprint(load_capture(path)), tmp_path / "s.fp.json.gz")
    slots = [_bf16(run.p(1)), _bf16(run.p(4)), run.hs[N].float().contiguous()]
    arrays = [as_array(s) for s in slots]
    np.savez(tmp_path / "slots.npz", *[a.view(np.uint16) if a.dtype.itemsize == 2 else a for a in arrays])
    want = score_fingerprint(slots, [False, False, True], load_fingerprint(fp_path), 0, 0, 32).score
    out = subprocess.run([sys.executable, "-c", _NO_TORCH, str(fp_path), str(tmp_path / "slots.npz")],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert not got["torch"], f"torch was imported, first by: {' <- '.join(reversed(got['chain'] or []))}"
    assert got["types"] == ["ndarray"]
    assert np.allclose(np.array(got["score"]), np.nan_to_num(want, nan=-9), atol=1e-6, rtol=0)
