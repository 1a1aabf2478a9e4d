"""GPU mode: the per-position reduction on CUDA gives the CPU's numbers and verdicts. Skipped without CUDA."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from eagleforensics.alignment import align
from eagleforensics.io.capture import load_capture
from eagleforensics.evidence.fingerprint import make_fingerprint
from eagleforensics.evidence.identity import step_reader
from eagleforensics.evidence.match import resolve_device, score_slots
from eagleforensics.io.sweep import write_capture

from .realdata import N, SAMPLES, _model, forward

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _bf16(t):
    return t.to(torch.bfloat16).contiguous()


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_gpu_scores_equal_cpu_scores(tmp_path, family):
    """Every cell (fitted columns included) within float32 rounding of the CPU's exact mode."""
    run = forward(family)
    path = write_capture(tmp_path / "s.safetensors", run.sweep, _model(family, 0), dtype="bfloat16")
    torch.save({"hidden_states": [h[None] for h in run.hs], "input_ids": run.ids.clone()}, tmp_path / "hf.pt")
    slots = [_bf16(run.p(p)) for p in (2, N // 2, N - 3)] + [_bf16(run.hs[N])]
    slots[1] = slots[1].clone()
    slots[1][9] = float("nan")
    fit = [False, False, False, True]
    for capture in (path, tmp_path / "hf.pt"):
        cap = load_capture(capture)
        cpu = score_slots(slots, fit, cap.positions, cap, 1, 2, 28, device="cpu", fit_candidates=None)
        gpu = score_slots(slots, fit, cap.positions, cap, 1, 2, 28, device="cuda")
        assert gpu.device.startswith("cuda") and gpu.columns == cpu.columns
        for name in ("score", "rel_diff", "norm_ratio", "tokens_used", "max_abs"):
            a, b = getattr(cpu, name), getattr(gpu, name)
            assert np.array_equal(np.isnan(a), np.isnan(b)), name
            assert np.nanmax(np.abs(a - b)) < 1e-4, name
        assert np.nanmax(np.abs(cpu.per_token - gpu.per_token)) < 1e-4
        for p in cap.positions:
            assert np.allclose(cpu.column_norms[p], gpu.column_norms[p], rtol=1e-5)
        read = step_reader(cap.read_rows, 2, 28)  # the layer steps the GPU pass kept, as a re-read gives them
        assert gpu.steps and all(abs(v - read(*k)) < 1e-5 for k, v in gpu.steps.items())


def test_gpu_and_auto_give_the_cpu_verdict_on_every_sample():
    assert resolve_device("auto") == "cuda"
    for record in ("record_layer_outputs.pt", "record_wrong_fix.pt", "data_0.ckpt"):
        for capture in ("capture.pt", "capture_sweep.safetensors"):
            cpu = align(SAMPLES / record, SAMPLES / capture)
            gpu = align(SAMPLES / record, SAMPLES / capture, device="auto")
            assert gpu.scores.device.startswith("cuda")
            assert gpu.verdict == cpu.verdict and gpu.exit_code == cpu.exit_code


def test_fingerprint_on_gpu_matches_cpu(tmp_path):
    cap = load_capture(SAMPLES / "capture_sweep.safetensors")
    a, b = make_fingerprint(cap), make_fingerprint(cap, device="cuda")
    assert [e["sha256"] for e in a["positions"]] == [e["sha256"] for e in b["positions"]]
    from eagleforensics.evidence.fingerprint import _decode

    for ea, eb in zip(a["positions"], b["positions"]):
        sa, sb = _decode(ea["sketch"], "cpu").astype(np.float32), _decode(eb["sketch"], "gpu").astype(np.float32)
        assert np.allclose(sa, sb, atol=2e-3, equal_nan=True)



def test_doctor_and_replay_on_cuda_give_the_cpu_answers():
    """``doctor --device cuda`` and ``replay --device cuda`` on the samples (a real drafter, target and capture): the
    same rows, findings and verdict as on the CPU; replay's accept lengths within 0.02 and acc@k within 0.01
    (float order differs between devices); the target's lm_head reaches the GPU whole and checked."""
    from eagleforensics.checks.base import DoctorInputs
    from eagleforensics.doctor import diagnose
    from eagleforensics.replay import run_replay

    full = dict(drafter=str(SAMPLES / "drafter"), target=str(SAMPLES / "target"),
                train=str(SAMPLES / "record_layer_outputs.pt"), capture=str(SAMPLES / "capture.pt"))
    cpu, gpu = (diagnose(DoctorInputs(**full, device=d)) for d in ("cpu", "cuda"))
    assert [(o.name, o.status, [f.code for f in o.findings]) for o in gpu.outcomes] == \
        [(o.name, o.status, [f.code for f in o.findings]) for o in cpu.outcomes]
    assert gpu.exit_code == cpu.exit_code
    reps = [run_replay(full["drafter"], full["capture"], target=full["target"], train=full["train"], device=d)
            for d in ("cpu", "cuda")]
    for a, b in zip(reps[0].results, reps[1].results, strict=True):
        assert a.label == b.label and abs(a.accept_length - b.accept_length) <= 0.02
        assert max(abs(x - y) for x, y in zip(a.acc, b.acc)) <= 0.01
