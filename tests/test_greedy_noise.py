"""Greedy data written under numeric noise is the target's: records a tiny target wrote greedily in bfloat16 (its
near-ties broken otherwise than the float32 scorer breaks them) are not called data-not-from-target."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.checks.registry import get_check
from eagleforensics.doctor import diagnose
from eagleforensics.dataaudit.agreement import GREEDY_AGREEMENT, NOISY_GREEDY_AGREEMENT
from eagleforensics.testing.drafterbuild import default_positions, export_target
from eagleforensics.testing.tinymodels import build_model, prompt_ids


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _records(model: torch.nn.Module, writer: torch.nn.Module, d: Path, n: int = 12, answer: int = 40) -> Path:
    """SpecForge records whose answers ``writer`` wrote greedily; states from ``model`` (the served target)."""
    d.mkdir(parents=True)
    layers = model.config.num_hidden_layers
    for r in range(n):
        ids = prompt_ids(40, seed=100 + r, vocab=model.config.vocab_size)
        with torch.no_grad():
            for _ in range(answer):
                ids = torch.cat([ids, writer(ids[None]).logits[0, -1].float().argmax()[None]])
            hs = model(ids[None], output_hidden_states=True).hidden_states
        mask = torch.cat([torch.zeros(40), torch.ones(answer)]).long()
        torch.save({"input_ids": ids, "loss_mask": mask, "hidden_state": hs[layers].to(torch.bfloat16),
                    "aux_hidden_state": torch.cat([hs[p] for p in default_positions(layers)], -1).to(torch.bfloat16)},
                   d / f"data_{r}.ckpt")
    return d


def test_greedy_answers_regenerated_in_bf16_are_from_the_target(tmp_path: Path) -> None:
    model = build_model("deepseek_v3", num_layers=8, seed=3)  # a flat tiny target: many near-ties
    export_target(model, tmp_path / "target")
    train = _records(model, copy.deepcopy(model).to(torch.bfloat16), tmp_path / "bf16")
    report = diagnose(DoctorInputs(target=str(tmp_path / "target"), train=str(train)),
                      checks=[get_check("data-origin")], pipelines=())
    a = next(o for o in report.outcomes if o.name == "data-origin").data["agreement"]
    assert NOISY_GREEDY_AGREEMENT <= a["agreement"] < GREEDY_AGREEMENT  # greedy, with ties broken otherwise
    assert a["shape_chi2"] > 33.7  # the PIT alone would have flagged it (it did before near-ties were counted)
    assert a["agreement"] + a["near_tie"] / a["tokens"] >= GREEDY_AGREEMENT  # the others are near-ties
    assert not [r for r in report.findings if r.finding.severity in ("error", "warning")], report.to_text()
