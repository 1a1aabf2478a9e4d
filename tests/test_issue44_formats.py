"""Issue 44's formats: vLLM ``extract_hidden_states`` files read as captures (layout of vLLM 0.34.0's
example_hidden_states_connector.py: ``hidden_states`` [T, L, H] stacked over the aux layer ids, ``token_ids`` [T]),
written here from a real forward pass and aligned like any other capture; a capture with fewer states than ids
refused with both counts (docs/causes.md row 9)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagleforensics.alignment import align
from eagleforensics.errors import ForensicsError
from eagleforensics.io.capture import load_capture

from .realdata import N, forward


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).contiguous()


def extract_file(path: Path, run, layer_ids: list[int], drop: int = 0) -> Path:  # noqa: ANN001
    """What vLLM's connector writes for a request whose draft config lists ``layer_ids`` (id k: the state entering
    layer k, position p=k); ``drop`` leading rows missing, as a prefix-cached capture returns them."""
    states = torch.stack([run.p(k) for k in layer_ids], dim=1)[drop:]
    save_file({"hidden_states": _bf16(states), "token_ids": run.ids.clone().to(torch.int64)}, str(path))
    return path


def specforge_record(path: Path, run, slots: list[int]) -> Path:  # noqa: ANN001
    aux = torch.cat([run.p(k) for k in slots], dim=-1)
    torch.save({"input_ids": run.ids.clone(), "loss_mask": torch.ones_like(run.ids),
                "hidden_state": _bf16(run.hs[N][None]), "aux_hidden_state": _bf16(aux[None])}, path)
    return path


def test_an_extract_hidden_states_capture_aligns_like_any_other(tmp_path: Path) -> None:
    run = forward("llama")
    cap = extract_file(tmp_path / "hs_0.safetensors", run, list(range(N)))
    loaded = load_capture(str(cap), convention="vllm")
    assert loaded.metadata["format"] == "vllm extract_hidden_states" and loaded.num_tokens == len(run.ids)
    assert [p.p for p in loaded.positions] == list(range(N))
    rec = specforge_record(tmp_path / "rec.ckpt", run, [2, 5, 7])
    r = align(rec, cap, convention="vllm")
    assert [(m.position.p, m.position.normed) for m in r.matches[:3]] == [(2, False), (5, False), (7, False)]
    assert all(m.confident for m in r.matches[:3])


def test_without_the_ids_its_entries_are_matched_by_content_and_not_named(tmp_path: Path) -> None:
    run = forward("llama")
    cap = extract_file(tmp_path / "hs_0.safetensors", run, [1, 3, 6])  # the engine's three aux layers only
    loaded = load_capture(str(cap))
    assert loaded.label_kind == "list-index" and len(loaded.positions) == 3
    rec = specforge_record(tmp_path / "rec.ckpt", run, [1, 3, 6])
    r = align(rec, cap)
    # each slot is its entry's copy; the file does not say which layers the entries are, and align says so
    assert [m.best.p for m in r.matches[:3]] == [0, 1, 2] and all(m.score > 0.999 for m in r.matches[:3])
    assert "labels-not-positions" in {f.code for f in r.findings}


def test_a_capture_with_fewer_states_than_ids_is_refused_with_the_counts(tmp_path: Path) -> None:
    run = forward("llama")
    cap = extract_file(tmp_path / "hs_0.safetensors", run, list(range(N)), drop=8)
    with pytest.raises(ForensicsError) as err:
        load_capture(str(cap))
    msg = str(err.value)
    assert f"{len(run.ids)} token ids" in msg and f"only {len(run.ids) - 8}" in msg and "prefix caching" in msg


# ---------------------------------------------------------------- ModelOpt's speculation_profile.json
MODELOPT_FIELDS = ("schema_version", "measured", "method", "num_speculative_tokens", "conditional_accept_rates",
                   "marginal_accept_rates", "mean_accept_length", "verification_method", "accept_length_model",
                   "measurement_conditions")  # NVIDIA/Model-Optimizer#2247 speculation_profile.py build_profile


def test_replay_profile_round_trips_through_modelopt_field_names(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from eagleforensics.cli import main
    from eagleforensics.io.replayfile import read_replay

    from .realdata import SAMPLES

    out = tmp_path / "speculation_profile.json"
    res = CliRunner().invoke(main, ["replay", str(SAMPLES / "drafter"), str(SAMPLES / "capture_sweep.safetensors"),
                                    "--target", str(SAMPLES / "target"), "--train",
                                    str(SAMPLES / "record_layer_outputs.pt"), "--steps", "3", "--json",
                                    "--profile", str(out)])
    assert res.exit_code == 0, res.output
    replayed = next(w for w in json.loads(res.stdout)["wirings"] if w["label"] == "p3,p7,p10")
    doc = json.loads(out.read_text())
    assert set(MODELOPT_FIELDS) <= set(doc) and doc["schema_version"] == "1.0" and doc["measured"] is True
    # ModelOpt's identities: AL = 1 + sum(marginals); conditional[i] = marginal[i] / marginal[i - 1]
    assert doc["mean_accept_length"] == pytest.approx(1 + sum(doc["marginal_accept_rates"]), abs=1e-5)
    m, c = doc["marginal_accept_rates"], doc["conditional_accept_rates"]
    assert all(c[i] == pytest.approx(m[i] / m[i - 1], abs=1e-5) for i in range(1, len(m)) if m[i - 1] > 0)
    back = read_replay(out)
    (w,) = back.wirings
    assert back.trained is w and w.label == "profile" and w.steps == 3
    assert list(w.reach) == pytest.approx(replayed["reach"][:3], abs=1e-5)
    assert w.accept_length == pytest.approx(replayed["accept_length"], abs=1e-4)


def test_a_modelopt_profile_is_the_serving_gap_reference(tmp_path: Path) -> None:
    from eagleforensics.plan import PlanInputs, make_plan
    from eagleforensics.testing.runlogs import SimRun, chain_reach, write_log

    reach = chain_reach([0.8, 0.75, 0.7])
    profile = {"schema_version": "1.0", "measured": True, "method": "eagle3", "num_speculative_tokens": 3,
               "marginal_accept_rates": [round(r, 6) for r in reach], "mean_accept_length": 1 + sum(reach),
               "verification_method": "longest_prefix", "acceptance_length_histogram": {"1": 800, "2": 600,
                                                                                        "3": 600, "4": 2000}}
    (tmp_path / "speculation_profile.json").write_text(json.dumps(profile))
    served = SimRun("sglang", "0.5.23", steps=3, verify_s=0.014, per_token_s=0.0006, draft_step_s=0.002,
                    reach=chain_reach([0.6, 0.5, 0.4]), lines=60, seed=5)
    logs = {"baseline": str(write_log(tmp_path / "b.log", SimRun("sglang", "0.5.23", decode_step_s=0.011, seed=6))),
            "served": str(write_log(tmp_path / "s.log", served))}
    rep = make_plan(PlanInputs(logs, replay=str(tmp_path / "speculation_profile.json")))
    assert rep.gap is not None and rep.gap.found and rep.gap.expected == pytest.approx(1 + sum(reach), abs=1e-4)
    assert any(f.code == "serving-gap" for f in rep.findings)


@pytest.mark.parametrize("change, said", [({"measured": False}, "placeholder"),
                                          ({"verification_method": "block"}, "longest-prefix"),
                                          ({"marginal_accept_rates": [0.5, 0.7]}, "rise at position 1")])
def test_unusable_profiles_are_refused_in_one_line(tmp_path: Path, change: dict, said: str) -> None:
    from eagleforensics.io.replayfile import read_replay

    doc = {"schema_version": "1.0", "measured": True, "marginal_accept_rates": [0.7, 0.5], **change}
    (tmp_path / "p.json").write_text(json.dumps(doc))
    with pytest.raises(ForensicsError, match=said):
        read_replay(tmp_path / "p.json")
