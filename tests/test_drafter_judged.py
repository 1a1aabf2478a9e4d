"""Broken drafters are never OK: missing, never-trained and swapped-in parts of every trainer's layout.

A tiny Llama target (real forward passes), its training record and capture, and a clean drafter of each
layout (SpecForge, speculators, ModelOpt) fitted on them (``testing.drafterbuild``). Each clean drafter must
raise nothing from ``drafter-weights`` and ``drafter-baseline``; each planted defect (lm_head, fc or the
decoder layer left at a fresh init, deleted, or taken from a drafter of another target) must be found.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.checks.registry import get_check
from eagleforensics.doctor import diagnose
from eagleforensics.testing.drafterbuild import LAYOUTS, SPECFORGE, export_drafter, export_target, write_capture, \
    write_record
from eagleforensics.testing.tinymodels import build_model

PARTS = {"lm_head": ("lm_head.weight",), "fc": ("fc.weight",),
         "midlayer": tuple(f"self_attn.{p}_proj.weight" for p in "qkvo") + tuple(f"mlp.{p}_proj.weight"
                                                                               for p in ("gate", "up", "down"))}
OURS = ("drafter-weights", "drafter-baseline")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run far faster on one torch thread than on two when the machine is shared (OpenMP waits)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("judged")
    model = build_model("llama", num_layers=6, seed=3)
    export_target(model, out / "target")
    write_record(model, out / "data_0.ckpt")  # 40 prompt + 24 supervised tokens
    write_capture(model, out / "capture.safetensors")
    drafters = {layout: export_drafter(model, out / layout, layout=layout, prompts=8, seed=1) for layout in LAYOUTS}
    other = build_model("llama", num_layers=6, seed=11)  # another target of the same shape
    drafters["other"] = export_drafter(other, out / "other", prompts=8, seed=2)
    drafters["other-modelopt"] = export_drafter(other, out / "other-modelopt", layout="modelopt", prompts=8, seed=2)
    return {"out": out, **drafters}


def _names(d: Path, part: str) -> list[str]:
    keys = load_file(d / "model.safetensors").keys()
    return [k for k in keys if any(k.endswith(p) and (part != "midlayer" or "proj" in k) for p in PARTS[part])]


def _plant(built: dict, layout: str, part: str, how: str) -> Path:
    d = built["out"] / f"{layout}-{part}-{how}"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(built[layout], d)
    w = load_file(d / "model.safetensors")
    gen = torch.Generator().manual_seed(5)
    donor = load_file(built["other-modelopt" if layout == "modelopt" else "other"] / "model.safetensors")
    for name in _names(d, part):
        if how == "random":  # transformers' init: normal(0, initializer_range)
            w[name] = (torch.randn(w[name].shape, generator=gen) * 0.02).to(w[name].dtype)
        elif how == "missing":
            del w[name]
        else:  # swapped in from the drafter of another target (same shapes, trained)
            key = name if name in donor else name.replace("layers.0.", "midlayer.")
            if key not in donor or donor[key].shape != w[name].shape:
                pytest.skip(f"{name}: no donor of that shape")
            w[name] = donor[key].clone()
    save_file(w, d / "model.safetensors", metadata={"format": "pt"})
    return d


def _doctor(built: dict, drafter: Path, *, only: tuple[str, ...] | None = OURS):  # noqa: ANN202
    """The doctor on ``drafter`` with the fixture's target, record and capture (``only`` these checks: seconds)."""
    out = built["out"]
    inputs = DoctorInputs(drafter=str(drafter), target=str(out / "target"), train=str(out / "data_0.ckpt"),
                          capture=str(out / "capture.safetensors"), engine="vllm")
    if only is None:
        return diagnose(inputs)
    return diagnose(inputs, checks=[get_check(name) for name in only], pipelines=())


def _codes(report, checks: tuple[str, ...] = OURS) -> set[str]:  # noqa: ANN001
    return {r.finding.code for r in report.flagged if r.check in checks}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_clean_drafters_of_each_layout_are_not_flagged(built: dict, layout: str) -> None:
    report = _doctor(built, built[layout], only=None)  # every check: no false alarm anywhere
    assert report.level == "OK", report.to_text()
    rows = {o.name: o for o in report.outcomes}
    assert rows["drafter-weights"].status == "clean", report.to_text()
    assert rows["drafter-baseline"].status == "clean", report.to_text()
    judged = rows["drafter-baseline"].data["judgements"]
    assert {j["source"] for j in judged} == {"records", "capture"} and all(j["judged"] for j in judged)
    assert all(j["drafter_acc1"] > max(j["baselines"].values()) + 0.3 for j in judged), judged


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("part", sorted(PARTS))
def test_a_part_left_at_its_init_is_random_and_no_better_than_the_baselines(built: dict, layout: str,
                                                                           part: str) -> None:
    report = _doctor(built, _plant(built, layout, part, "random"))
    # speculators' decoder layer with random weights still passes fc's output on through its residual: on these
    # 62 rows it beats the baselines (records 0.17 against 0.00, capture 0.00 against 0.00; pooled 2.1 SE) once the
    # capture's bigram is not fitted on the captured sequence itself (it memorised it before: issue 43). The
    # weights check names the cause either way.
    beaten = (layout, part) == ("speculators", "midlayer")
    want = {"drafter-weights-random"} | (set() if beaten else {"drafter-no-better-than-baseline"})
    assert _codes(report) == want, report.to_text()
    assert report.level == "PROBLEM" and report.exit_code == 1
    found = next(r.finding for r in report.flagged if r.finding.code == "drafter-weights-random")
    shown = {"lm_head": "lm_head", "fc": "fc", "midlayer": "midlayer" if layout == SPECFORGE else "layers.0"}[part]
    assert shown in found.message


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("part", sorted(PARTS))
def test_a_missing_part_is_found(built: dict, layout: str, part: str) -> None:
    report = _doctor(built, _plant(built, layout, part, "missing"))
    assert "drafter-weights-missing" in _codes(report), report.to_text()
    # vLLM (newest release read) serves the target's lm_head in place of a missing one (engines.lmheadrules): a
    # warning that names the release assumed; any other part missing breaks the drafter
    assert report.level == ("ACTION" if part == "lm_head" else "PROBLEM"), report.to_text()
    if part == "lm_head":
        found = next(r.finding for r in report.flagged if r.finding.code == "drafter-weights-missing")
        assert found.severity == "warning" and "vllm" in found.message.lower(), found.message


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("part", sorted(PARTS))
def test_a_part_swapped_in_from_another_targets_drafter_is_no_better_than_the_baselines(built: dict, layout: str,
                                                                                       part: str) -> None:
    report = _doctor(built, _plant(built, layout, part, "swapped"))
    codes = _codes(report)
    assert "drafter-no-better-than-baseline" in codes, report.to_text()
    # trained weights, only not this drafter's; except a ModelOpt head, whose donor is the other tiny target's own
    # head: an HF init in a random tiny model, rightly seen as one
    assert codes - {"drafter-no-better-than-baseline"} == (
        {"drafter-weights-random"} if (layout, part) == ("modelopt", "lm_head") else set()), report.to_text()
    assert report.level == "PROBLEM"


@pytest.mark.parametrize("how", ["random", "missing"])
def test_the_sample_drafter_with_a_broken_head_is_never_ok(tmp_path: Path, how: str) -> None:
    """The issue's case: the SpecForge sample drafter with a fresh N(0, 0.02) lm_head was OK (exit 0) beside replay's
    accept length 1.00, and one without lm_head raised nothing."""
    from eagleforensics.testing.defects import SAMPLES

    d = tmp_path / "drafter"
    shutil.copytree(SAMPLES / "drafter", d)
    w = load_file(d / "model.safetensors")
    if how == "random":
        w["lm_head.weight"] = (torch.randn(w["lm_head.weight"].shape, generator=torch.Generator().manual_seed(0))
                               * 0.02).to(torch.bfloat16)
    else:
        del w["lm_head.weight"]
    save_file(w, d / "model.safetensors", metadata={"format": "pt"})
    report = diagnose(DoctorInputs(drafter=str(d), target=str(SAMPLES / "target"), train=str(SAMPLES / "data_0.ckpt"),
                                   capture=str(SAMPLES / "capture_sweep.safetensors")))
    want = ({"drafter-weights-random", "drafter-no-better-than-baseline"} if how == "random"
            else {"drafter-weights-missing"})
    assert {r.finding.code for r in report.flagged} == want, report.to_text()
    assert report.level == "PROBLEM" and report.exit_code == 1
