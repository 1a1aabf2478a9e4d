"""Records rendered with another system prompt than the served request (issue 43, defect 2).

Real forward passes of a tiny Llama with a ChatML tokenizer: one conversation rendered twice, with SpecForge's Qwen
system prompt (the record) and with the served default (the capture). The template check must name the two
beginnings from the ids, and align must explain the rows' drift by that context, not by quantised weights or MoE
routing on a dense, unquantized model; the same conversation with the same system prompt stays clean.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagleforensics.alignment import align
from eagleforensics.checks.base import DoctorInputs
from eagleforensics.doctor import diagnose
from eagleforensics.evidence.tokens import align_tokens
from eagleforensics.io.sweep import sweep, write_capture
from eagleforensics.testing.chat import load, render_record, specforge_record, write_target
from eagleforensics.testing.tinymodels import build_model

TRAINED_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
SERVED_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face."
USER = "Explain in a few sentences why the sky looks blue during the day and red at sunset."
ANSWER = ("Sunlight is scattered by the molecules of the air, and short wavelengths scatter the most, so the sky "
          "looks blue. At sunset the light crosses more air, and the blue is scattered away before it reaches you.")
WRONG_CAUSES = ("quantised weights", "MoE routing", "corrupt")


def _conversation(system: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": USER},
            {"role": "assistant", "content": ANSWER}]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("context")
    model = build_model("llama", num_layers=8, seed=3)
    target = write_target(out / "target", model, "chatml")
    tok = load(target)
    paths = {"target": target}
    for name, system in (("trained", TRAINED_SYSTEM), ("served", SERVED_SYSTEM)):
        ids, mask = render_record(tok, _conversation(system))
        torch.save(specforge_record(model, ids, mask), out / f"record_{name}.ckpt")
        write_capture(out / f"capture_{name}.safetensors", sweep(model, torch.tensor([ids])), model)
        paths[f"record_{name}"] = out / f"record_{name}.ckpt"
        paths[f"capture_{name}"] = out / f"capture_{name}.safetensors"
    return paths


def _texts(report) -> str:  # noqa: ANN001
    return report.to_text() + report.to_json()


def test_another_system_prompt_is_a_template_mismatch_named_from_the_ids(pair: dict[str, Path]) -> None:
    report = diagnose(DoctorInputs(target=str(pair["target"]), train=str(pair["record_trained"]),
                                   capture=str(pair["capture_served"])))
    row = next(o for o in report.outcomes if o.name == "template")
    found = [f for f in row.findings if f.code == "template-mismatch"]
    assert row.status == "found" and [f.severity for f in found] == ["warning"], report.to_text()
    assert "You are Qwen" in found[0].message and "SmolLM" in found[0].message
    assert "template-mismatch" in [c.key for c in report.causes]
    assert "record-states" not in [c.key for c in report.causes], report.to_text()
    wiring = next(o for o in report.outcomes if o.name == "wiring")
    for f in wiring.findings:
        assert not any(w in f.message for w in WRONG_CAUSES), f.message


def test_align_names_the_context_as_the_drift(pair: dict[str, Path]) -> None:
    result = align(pair["record_trained"], pair["capture_served"])
    assert result.tokens.method == "ids-run" and result.tokens.other_context
    drifted = [m for m in result.matches if m.fidelity == "drift"]
    assert drifted and all(m.fidelity_cause == "context" for m in drifted), [(m.key, m.fidelity_cause)
                                                                             for m in result.matches]
    text = result.to_text()
    assert "another system prompt" in text and not any(w in text for w in WRONG_CAUSES), text
    assert all(f.severity == "info" for f in result.findings if f.code == "rows-differ")


def test_the_same_system_prompt_on_both_sides_stays_clean(pair: dict[str, Path]) -> None:
    report = diagnose(DoctorInputs(target=str(pair["target"]), train=str(pair["record_served"]),
                                   capture=str(pair["capture_served"])))
    row = next(o for o in report.outcomes if o.name == "template")
    assert not [f for f in row.findings if f.code == "template-mismatch"], row.findings
    result = align(pair["record_served"], pair["capture_served"])
    assert result.tokens.method == "ids-prefix" and not result.tokens.other_context
    assert not any(m.fidelity_cause == "context" for m in result.matches)
    assert result.judge().level == "OK", result.to_text()


def test_other_context_is_said_only_for_a_run_after_rows_that_differ() -> None:
    a, b = list(range(10, 40)), list(range(10, 40))
    assert align_tokens(a, 30, 0, b, 30).other_context == ""  # the same ids: one context
    assert align_tokens([1, 2, 3] + a, 33, 0, [7, 8] + b, 32).other_context.startswith("the compared rows follow")
    assert "only the capture holds" in align_tokens(a, 30, 0, [5, 6] + b, 32).other_context
