"""Issue 41: the capture's final entry is raw or post-norm by its content, whatever its label says.

A post-norm row is ``g * x / rms(x)``: divided by the final norm's gain g its RMS is 1 on every token, to the
norm's eps and bf16 rounding; a raw residual-stream row's is not. Real forward passes of tiny Llama, Qwen3 and
DeepSeek-V3 models with random norm gains and no massive activation (the massive row is the other content
signature; without it, today's main followed the label), in both layouts:

* a speculators record (final = raw last layer, as vLLM's hidden-state extraction writes it) against an engine
  sweep 0..N whose last entry is raw too, read with HF's convention (last entry "post-norm"): main placed the
  final at "pN post-norm" and told a speculators user it would be normalised twice;
* a SpecForge-style record (final = post-norm) against HF ``output_hidden_states`` read with vLLM's convention
  (last entry "raw"): main placed it at the raw pN.

The gain is the target's final norm weight (``align(final_norm=...)``, the doctor's ``--target``), or fitted from
the compared rows when there are at least two per hidden dimension.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from eagleforensics.alignment import align
from eagleforensics.evidence.labels import norm_kind
from eagleforensics.evidence.norms import gain_kind
from eagleforensics.positions import Position
from eagleforensics.testing import drift as D
from eagleforensics.testing.tinymodels import build_model, prompt_ids

N, H = 8, 64
AUX = [2, 4, 5]
FAMILIES = ("llama", "qwen3", "deepseek_v3")


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).contiguous()


def _norms(t: torch.Tensor) -> np.ndarray:
    return torch.linalg.vector_norm(t.float(), dim=-1).numpy()


@pytest.fixture(scope="module", params=FAMILIES)
def model(request: pytest.FixtureRequest) -> torch.nn.Module:
    return build_model(request.param, num_layers=N, hidden=H, seed=3, massive=0.0)


def _states(model: torch.nn.Module, length: int) -> tuple[D.States, torch.Tensor]:
    ids = prompt_ids(length, seed=1)
    return D.forward_states(model, ids), ids


def _gain(model: torch.nn.Module) -> np.ndarray:
    return model.model.norm.weight.detach().float().numpy()


def _speculators_vs_raw_sweep(tmp: Path, s: D.States, ids: torch.Tensor) -> tuple[Path, Path]:
    rec, cap = tmp / "hs_0.safetensors", tmp / "sweep.pt"
    save_file({"token_ids": ids.clone(), "hidden_states": torch.stack([_bf16(s.raw[p]) for p in AUX + [N]], 1)},
              str(rec))
    torch.save({f"h.{p}": _bf16(s.raw[p]) for p in range(N + 1)} | {"input_ids": ids.clone()}, cap)
    return rec, cap


def _specforge_vs_hf_read_as_vllm(tmp: Path, s: D.States, ids: torch.Tensor) -> tuple[Path, Path]:
    rec, cap = tmp / "rec.pt", tmp / "hf.pt"
    torch.save({"hidden_states": [_bf16(s.raw[p]) for p in AUX] + [_bf16(s.normed)], "input_ids": ids.clone()}, rec)
    torch.save({f"h.{p}": _bf16(s.raw[p]) for p in range(N)} | {f"h.{N}": _bf16(s.normed), "input_ids": ids.clone()},
               cap)
    return rec, cap


def _codes(r) -> set[str]:  # noqa: ANN001
    return {f.code for f in r.findings}


def test_the_rms_after_gain_signature_on_real_states(model: torch.nn.Module) -> None:
    """The trap is there (no massive row: the norm-flatness test cannot call raw pN raw) and the new test decides
    both kinds: with the target's gain on 40 tokens, fitted on 160 (2 per dimension), in float32 and bf16."""
    s, _ = _states(model, 160)
    assert norm_kind(_norms(s.raw[N])) != "raw"
    g = _gain(model)
    for cast in (lambda t: t.float().numpy(), lambda t: _bf16(t).float().numpy()):
        assert gain_kind(cast(s.normed[:40]), g)[0] == "post-norm"
        assert gain_kind(cast(s.raw[N][:40]), g)[0] == "raw"
        assert gain_kind(cast(s.normed), None)[0] == "post-norm"
        assert gain_kind(cast(s.raw[N]), None)[0] == "raw"
        assert gain_kind(cast(s.raw[N][:40]), None)[0] == ""  # 40 rows cannot fit 64 gains: undecided


@pytest.mark.parametrize("given", [True, False], ids=["target-gain", "fitted-gain"])
def test_a_speculators_record_against_a_raw_sweep_labelled_post_norm(tmp_path: Path, model: torch.nn.Module,
                                                                     given: bool) -> None:
    s, ids = _states(model, 40 if given else 160)
    rec, cap = _speculators_vs_raw_sweep(tmp_path, s, ids)
    r = align(rec, cap, final_norm=_gain(model) if given else None)  # convention hf: entry N reads "post-norm"
    assert r.train_format == "speculators"
    assert r.matches[-1].best == Position(N) and r.matches[-1].confident, r.verdict
    assert "final-raw" in _codes(r) and "final-post-norm" not in _codes(r), r.verdict
    note = " ".join(f.message for f in r.findings if f.code == "capture-relabelled")
    assert "RMS" in note and "massive" not in note
    assert "normalise it twice" not in " ".join(f.message for f in r.findings)


@pytest.mark.parametrize("given", [True, False], ids=["target-gain", "fitted-gain"])
def test_a_post_norm_final_in_a_capture_labelled_raw(tmp_path: Path, model: torch.nn.Module, given: bool) -> None:
    s, ids = _states(model, 40 if given else 160)
    rec, cap = _specforge_vs_hf_read_as_vllm(tmp_path, s, ids)
    r = align(rec, cap, convention="vllm", final_norm=_gain(model) if given else None)  # entry N reads "raw"
    assert r.matches[-1].best == Position(N, True) and r.matches[-1].confident, r.verdict
    assert "final-post-norm" in _codes(r) and "final-raw" not in _codes(r), r.verdict
    assert [m.best for m in r.matches[:3]] == [Position(p) for p in AUX]


def test_labels_that_agree_with_the_content_are_left_alone(tmp_path: Path, model: torch.nn.Module) -> None:
    """Clean counterparts: the same records against captures whose labels are right stay unrelabelled."""
    s, ids = _states(model, 40)
    rec, cap = _speculators_vs_raw_sweep(tmp_path, s, ids)
    r = align(rec, cap, convention="vllm", final_norm=_gain(model))
    assert r.matches[-1].best == Position(N) and "capture-relabelled" not in _codes(r) and "final-raw" in _codes(r)
    rec, cap = _specforge_vs_hf_read_as_vllm(tmp_path, s, ids)
    r = align(rec, cap, final_norm=_gain(model))
    assert r.matches[-1].best == Position(N, True) and "capture-relabelled" not in _codes(r)
    assert "final-post-norm" in _codes(r)


def test_the_doctor_reads_the_gain_from_the_target(tmp_path: Path) -> None:
    """doctor --train --capture --target: the wiring row's align gets the target's final norm weight, so the raw
    final of a speculators record is placed raw on 40 tokens (too few to fit a gain); without --target the label
    stands (the fitted gain needs 128 rows here)."""
    from eagleforensics.checks.base import Artifacts, DoctorInputs
    from eagleforensics.testing.drafterbuild import export_target

    model = build_model("qwen3", num_layers=N, hidden=H, seed=3, massive=0.0)
    s, ids = _states(model, 40)
    rec, cap = _speculators_vs_raw_sweep(tmp_path, s, ids)
    target = export_target(model, tmp_path / "target")
    with_target = Artifacts(DoctorInputs(train=str(rec), capture=str(cap), target=str(target)))
    gain = with_target.final_norm()
    assert gain is not None and np.allclose(np.asarray(gain, np.float32), _gain(model), rtol=1e-2, atol=1e-2)
    assert with_target.aligned().matches[-1].best == Position(N)
    without = Artifacts(DoctorInputs(train=str(rec), capture=str(cap)))
    assert without.final_norm() is None and without.aligned().matches[-1].best == Position(N, True)
