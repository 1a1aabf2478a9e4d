"""Issue 34, the serving side: penalties, LoRA, DP attention, benchmark prompts and plan's new suspects.

Each code is planted into a server log in the engine's own format (``testing.defects.sglang_log`` /
``vllm_log``, or a release's fixture line from ``scripts/make_serverargs_fixtures.py`` with fields
changed) or into a served-prompts file, beside the sample drafter and target; the doctor must find it
with its code and flag nothing else. Clean controls: every fixture log of both engines and neutral
request samples raise none of these codes.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.doctor import diagnose
from eagleforensics.engines.serverargs import find_server_args, parse_server_args_line
from eagleforensics.testing.defects import SAMPLES, sglang_log, vllm_log

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
SERVING_CODES = ("sampling-penalty", "lora-target", "dp-attention", "benchmark-prompts")
FLAGGED = ("error", "warning")
SPEC = {"method": "eagle3", "model": str(SAMPLES / "drafter"), "num_speculative_tokens": 3}


def flagged(report) -> list[tuple[str, str]]:  # noqa: ANN001
    return [(r.finding.code, r.finding.severity) for r in report.findings if r.finding.severity in FLAGGED]


def run(**inputs: object):  # noqa: ANN201
    inputs.setdefault("drafter", str(SAMPLES / "drafter"))
    inputs.setdefault("target", str(SAMPLES / "target"))
    return diagnose(DoctorInputs(**{k: str(v) if isinstance(v, Path) else v for k, v in inputs.items()}))


def prompts(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def chat(**sampling: object) -> dict:
    return {"messages": [{"role": "user", "content": "Explain the bonus token."}], **sampling}


def finding(report, code: str):  # noqa: ANN001, ANN201
    return next(r.finding for r in report.findings if r.finding.code == code)


def all_fixture_logs() -> list[Path]:
    return sorted((FIXTURES / "serverargs").glob("*.log")) + sorted(FIXTURES.glob("*.log"))


# ---------------------------------------------------------------- clean controls
@pytest.mark.parametrize("log", all_fixture_logs(), ids=lambda p: p.name)
def test_clean_logs_of_both_engines_raise_no_serving_code(log: Path, tmp_path: Path) -> None:
    served = prompts(tmp_path / "p.jsonl", [chat(temperature=0.7, repetition_penalty=1.0, presence_penalty=0.0),
                                            {"prompt": "Once upon a time", "max_tokens": 64}])
    report = run(log=log, served_prompts=served)
    assert not [c for c, _ in flagged(report) if c in SERVING_CODES], report.to_text()
    rows = {o.name: o.status for o in report.outcomes}
    assert rows["sampling-penalty"] == "clean" and rows["benchmark-prompts"] == "clean"


def test_checks_without_their_inputs_are_not_run_and_name_the_option() -> None:
    report = run()
    rows = {o.name: o for o in report.outcomes}
    assert rows["sampling-penalty"].status == "not-run" and "--log" in rows["sampling-penalty"].reason \
        and "--served-prompts" in rows["sampling-penalty"].reason
    assert rows["lora-target"].status == "not-run" and "--log" in rows["lora-target"].reason
    assert rows["dp-attention"].status == "not-run" and "--log" in rows["dp-attention"].reason
    assert rows["benchmark-prompts"].status == "not-run" and "--served-prompts" in rows["benchmark-prompts"].reason


# ---------------------------------------------------------------- sampling-penalty
@pytest.mark.parametrize("rp, severity, impact", [(1.5, "warning", "high"), (1.2, "warning", "medium"),
                                                  (1.05, "info", "low")])
def test_request_penalties_on_sglang_follow_the_measured_losses(tmp_path: Path, rp: float, severity: str,
                                                                impact: str) -> None:
    log = sglang_log(tmp_path / "s.log", SAMPLES / "target", SAMPLES / "drafter")
    served = prompts(tmp_path / "p.jsonl", [chat(repetition_penalty=rp)] * 3 + [chat()])
    report = run(log=log, served_prompts=served)
    f = finding(report, "sampling-penalty")
    assert (f.severity, f.impact) == (severity, impact), f.message
    assert "3 of 4 served requests" in f.message and f"repetition_penalty {rp:g}" in f.message
    assert "sglang 0.5.23 python/sglang/srt/speculative/eagle_utils.py" in f.source and "#28242" in f.source
    assert flagged(report) == ([] if severity == "info" else [("sampling-penalty", severity)])


@pytest.mark.parametrize("version, outcome", [("0.12.0", "not-speculated"), ("0.13.0", "not-speculated"),
                                              ("0.14.0", "target-only"), ("0.33.0", "target-only")])
def test_vllm_releases_skip_or_penalise_the_target_only(tmp_path: Path, version: str, outcome: str) -> None:
    log = vllm_log(tmp_path / "v.log", version, SAMPLES / "target", SPEC)
    served = prompts(tmp_path / "p.jsonl", [chat(frequency_penalty=0.8)] * 2)
    report = run(log=log, served_prompts=served)
    row = next(o for o in report.outcomes if o.name == "sampling-penalty")
    assert [r["outcome"] for r in row.data["rules"]] == [outcome]
    f = finding(report, "sampling-penalty")
    assert f.severity == "warning"
    assert ("does not speculate such requests" in f.message) == (outcome == "not-speculated")
    assert ("Upgrade to vLLM >= 0.14.0" in f.fix) == (outcome == "not-speculated")


def test_nested_sampling_params_and_extra_body_are_read(tmp_path: Path) -> None:
    served = prompts(tmp_path / "p.jsonl", [{"text": "Hello", "sampling_params": {"repetition_penalty": 1.4}},
                                            {"prompt": "Hi", "extra_body": {"presence_penalty": 0.6}},
                                            {"body": {"messages": [{"role": "user", "content": "x"}],
                                                      "repetition_penalty": 1.0}}])
    report = run(served_prompts=served)
    f = finding(report, "sampling-penalty")
    assert "2 of 3 served requests" in f.message and f.impact == "high"
    assert "engine unknown" in f.message  # no --log or --engine: both engines' rules are stated


def test_a_bad_sampling_value_is_one_line_of_bad_input(tmp_path: Path) -> None:
    from eagleforensics.errors import ForensicsError

    served = prompts(tmp_path / "p.jsonl", [chat(repetition_penalty="strong")])
    with pytest.raises(ForensicsError, match="line 1: 'repetition_penalty' must be a number"):
        run(served_prompts=served)


@pytest.fixture()
def penalised_target(tmp_path: Path) -> Path:
    target = tmp_path / "target"
    shutil.copytree(SAMPLES / "target", target)
    (target / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.3, "temperature": 0.7}))
    return target


def test_the_target_s_generation_config_penalty_is_applied_by_default(tmp_path: Path,
                                                                      penalised_target: Path) -> None:
    log = sglang_log(tmp_path / "s.log", penalised_target, SAMPLES / "drafter", sampling_defaults="model")
    report = run(target=penalised_target, log=log)
    f = finding(report, "sampling-penalty")
    assert (f.severity, f.impact) == ("warning", "high")
    assert "generation_config.json sets repetition_penalty 1.3" in f.message and "sampling_defaults='openai'" in f.fix
    # a request that sets its own neutral penalty is not penalised
    served = prompts(tmp_path / "p.jsonl", [chat(repetition_penalty=1.0), chat()])
    assert "1 of 2 served requests" in finding(run(target=penalised_target, log=log, served_prompts=served),
                                                 "sampling-penalty").message
    # a SGLang line without sampling_defaults is a release that has none (0.4.6): not applied
    log = sglang_log(tmp_path / "n.log", penalised_target, SAMPLES / "drafter")
    assert "no sampling_defaults" in {o.name: o for o in run(target=penalised_target, log=log).outcomes}[
        "sampling-penalty"].note
    # sampling_defaults='openai': the generation config is not applied
    log = sglang_log(tmp_path / "o.log", penalised_target, SAMPLES / "drafter", sampling_defaults="openai")
    report = run(target=penalised_target, log=log)
    assert not [c for c, _ in flagged(report) if c == "sampling-penalty"], report.to_text()
    # vLLM: --generation-config vllm turns it off, the default 'auto' applies it
    log = vllm_log(tmp_path / "v.log", "0.20.0", penalised_target, SPEC, generation_config="vllm")
    assert not [c for c, _ in flagged(run(target=penalised_target, log=log)) if c == "sampling-penalty"]
    log = vllm_log(tmp_path / "w.log", "0.20.0", penalised_target, SPEC)
    assert ("sampling-penalty", "warning") in flagged(run(target=penalised_target, log=log))


def test_generation_config_presence_penalty_only_where_the_engine_reads_it(tmp_path: Path,
                                                                          penalised_target: Path) -> None:
    (penalised_target / "generation_config.json").write_text(json.dumps({"presence_penalty": 0.8}))
    log = sglang_log(tmp_path / "s.log", penalised_target, SAMPLES / "drafter", sampling_defaults="model")
    assert not flagged(run(target=penalised_target, log=log))  # SGLang takes only repetition_penalty from it
    log = vllm_log(tmp_path / "v.log", "0.29.0", penalised_target, SPEC)
    assert not flagged(run(target=penalised_target, log=log))
    log = vllm_log(tmp_path / "w.log", "0.33.0", penalised_target, SPEC)  # 0.33.0 reads frequency / presence too
    assert flagged(run(target=penalised_target, log=log)) == [("sampling-penalty", "warning")]


def test_vllm_override_generation_config_sets_a_penalty_for_every_request(tmp_path: Path) -> None:
    log = vllm_log(tmp_path / "v.log", "0.33.0", SAMPLES / "target", SPEC,
                   override_generation_config={"repetition_penalty": 1.25})
    report = run(log=log)
    f = finding(report, "sampling-penalty")
    assert (f.severity, f.impact) == ("warning", "medium") and "override_generation_config" in f.message
    assert flagged(report) == [("sampling-penalty", "warning")]


# ---------------------------------------------------------------- lora-target
def test_lora_adapters_named_at_launch_on_sglang(tmp_path: Path) -> None:
    log = sglang_log(tmp_path / "s.log", SAMPLES / "target", SAMPLES / "drafter", enable_lora=True,
                     lora_paths=["sql=/adapters/sql", "chat=/adapters/chat"])
    report = run(log=log)
    assert flagged(report) == [("lora-target", "warning")], report.to_text()
    f = finding(report, "lora-target")
    assert "(sql, chat)" in f.message and f.fix and "eagle_worker_v2.py" in f.source and "#9756" in f.source


def test_lora_modules_on_vllm_and_lora_enabled_without_adapters(tmp_path: Path) -> None:
    line = ("(APIServer pid=1) INFO 11-29 12:58:00 [startup.py:96] non-default args: {'model_tag': 'm', "
            "'enable_lora': True, 'lora_modules': [LoRAModulePath(name='sql-lora', path='/a/sql', "
            "base_model_name=None)], 'speculative_config': {'method': 'eagle3', 'model': 'd', "
            "'num_speculative_tokens': 3}}\n")
    (tmp_path / "v.log").write_text("INFO 11-29 12:57:58 [api_server.py:1896] vLLM API server version 0.33.0\n" + line)
    report = run(log=tmp_path / "v.log")
    assert flagged(report) == [("lora-target", "warning")] and "(sql-lora)" in finding(report, "lora-target").message
    log = vllm_log(tmp_path / "e.log", "0.14.0", SAMPLES / "target", SPEC, enable_lora=True)
    report = run(log=log)
    assert flagged(report) == [] and finding(report, "lora-target").severity == "info"


# ---------------------------------------------------------------- dp-attention
def _sglang_059(tmp_path: Path, dp_attention: bool = True, a2a: str = "deepep") -> Path:
    """SGLang 0.5.9's arguments line (the fixture rendered from its ServerArgs) with DP attention set."""
    text = (FIXTURES / "serverargs" / "sglang_0.5.9_args.log").read_text()
    text = re.sub(r"(?<![a-z_])enable_dp_attention=False", f"enable_dp_attention={dp_attention}", text)
    text = re.sub(r"(?<![a-z_])dp_size=1\b", "dp_size=8", text)
    text = re.sub(r"(?<![a-z_])moe_a2a_backend='none'", f"moe_a2a_backend={a2a!r}", text)
    text = re.sub(r"(?<![a-z_])context_length=\d+", "context_length=None", text)  # the sample drafter's 512
    path = tmp_path / "sglang.log"
    path.write_text(text)
    return path


def test_the_planted_line_reads_as_dp_attention(tmp_path: Path) -> None:
    from eagleforensics.engines.servingargs import dp_setting

    s = dp_setting(find_server_args(_sglang_059(tmp_path)))
    assert (s.dp_attention, s.dp_size, s.a2a_backend) == (True, 8, "deepep")


@pytest.mark.parametrize("version, model_type, expected", [
    ("0.5.8", "deepseek_v3", ("error", "high")),  # the wrong group, certain
    ("0.5.7", "kimi_k2", ("error", "high")),
    (None, "deepseek_v3", ("warning", "high")),  # the repr format spans 0.4.7 - 0.5.18
    ("0.5.8", None, ("warning", "high")),  # family unknown
    ("0.5.10", "deepseek_v3", ("info", "low")),  # fixed by sgl-project/sglang#20492
    ("0.5.8", "llama", ("info", "low")),  # not the DeepSeek model file
])
def test_dp_attention_on_the_releases_with_the_wrong_gather_group(tmp_path: Path, version: str | None,
                                                                  model_type: str | None, expected: tuple) -> None:
    inputs: dict = {"drafter": str(SAMPLES / "drafter"), "log": str(_sglang_059(tmp_path))}
    if version:
        inputs["engine_version"] = version
    if model_type:
        inputs["model_type"] = model_type
    report = diagnose(DoctorInputs(**inputs))
    f = finding(report, "dp-attention")
    assert (f.severity, f.impact) == expected, f.message
    assert [c for c, _ in flagged(report) if c != "dp-attention"] == []
    if f.severity != "info":
        assert "#20492" in f.source and "0.5.10" in f.fix and "attention-TP group" in f.message
    if f.severity == "warning":
        assert "--engine-version" in f.message or "--target" in f.message


def test_dp_attention_without_an_a2a_backend_or_off_is_not_flagged(tmp_path: Path) -> None:
    for kwargs in ({"a2a": "none"}, {"dp_attention": False}):
        report = diagnose(DoctorInputs(log=str(_sglang_059(tmp_path, **kwargs)), engine_version="0.5.8",
                                       model_type="deepseek_v3"))
        assert not flagged(report), report.to_text()
    log = vllm_log(tmp_path / "v.log", "0.33.0", SAMPLES / "target", SPEC, data_parallel_size=4,
                   enable_expert_parallel=True)
    report = run(log=log)
    assert not flagged(report) and "no vLLM release" in {o.name: o for o in report.outcomes}["dp-attention"].note


# ---------------------------------------------------------------- benchmark-prompts
def test_random_id_prompts_and_ignore_eos_are_named(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = [{"prompt_token_ids": rng.integers(0, 128256, 256).tolist(), "ignore_eos": True} for _ in range(6)]
    report = run(target=None, drafter=None, served_prompts=prompts(tmp_path / "p.jsonl", rows))
    f = finding(report, "benchmark-prompts")
    assert f.severity == "warning" and "6 of 6 prompts are random token ids" in f.message
    assert "6 of 6 requests set ignore_eos" in f.message and "#52536" in f.source
    rows = {c["name"]: c for c in json.loads(report.to_json())["checks"]}  # the --json object carries the counts
    assert rows["benchmark-prompts"]["data"]["random_ids"] == 6 and rows["sampling-penalty"]["status"] == "clean"
    only_eos = [chat(ignore_eos=True)] * 2 + [chat()] * 2
    f = finding(run(served_prompts=prompts(tmp_path / "q.jsonl", only_eos)), "benchmark-prompts")
    assert f.severity == "warning" and "random token ids" not in f.message


@pytest.fixture(scope="module")
def tokenized_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample target with a byte-level BPE of about 16k ids trained on the test corpus (about 1.5 s): large
    enough that random ids decoded to text re-encode into about the same ids, as with a real vocabulary (the
    512-id test tokenizer re-encodes such text into byte pieces)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from eagleforensics.testing.chat import english_text, write_tokenizer

    target = tmp_path_factory.mktemp("tok") / "target"
    shutil.copytree(SAMPLES / "target", target)
    write_tokenizer(target, "chatml")  # tokenizer_config.json with a chat template
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([english_text(None)], trainers.BpeTrainer(
        vocab_size=16384, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(str(target / "tokenizer.json"))
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "vocab_size": tok.get_vocab_size()}))
    return target


def test_text_prompts_are_tokenized_and_real_text_is_not_random(tmp_path: Path, tokenized_target: Path) -> None:
    from eagleforensics.io.tokenizer import load_tokenizer
    from eagleforensics.testing.chat import english_text

    tok = load_tokenizer(tokenized_target)
    text = english_text(20_000)
    real = [{"prompt": text[i * 600:(i + 1) * 600]} for i in range(8)] + \
        [{"prompt_token_ids": tok.encode(text[6000 + i * 600:6600 + i * 600])} for i in range(8)]
    report = run(target=tokenized_target, drafter=None, served_prompts=prompts(tmp_path / "real.jsonl", real))
    row = next(o for o in report.outcomes if o.name == "benchmark-prompts")
    assert row.status == "clean" and row.data["tested_for_random_ids"] == 16, row.note
    rng = np.random.default_rng(1)  # what a random-dataset benchmark sends: random ids decoded to text
    fake = [{"prompt": tok.decode(rng.integers(0, tok.vocab_size, 128).tolist())} for _ in range(8)]
    f = finding(run(target=tokenized_target, drafter=None, served_prompts=prompts(tmp_path / "fake.jsonl", fake)),
                "benchmark-prompts")
    assert f.severity == "warning" and "8 of 8 prompts are random token ids" in f.message
    # the same through the chat endpoint: random text in a user message; real chat text is not flagged
    wrapped = [{"messages": [{"role": "user", "content": r["prompt"]}]} for r in fake[:4]] + \
        [{"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": text[9000 + i * 800:9800 + i * 800]}]} for i in range(4)]
    f = finding(run(target=tokenized_target, drafter=None, served_prompts=prompts(tmp_path / "chat.jsonl", wrapped)),
                "benchmark-prompts")
    assert "4 of 8 prompts are random token ids (lines 1, 2, 3, 4:" in f.message


def test_random_id_rule_against_uniform_draws_and_text() -> None:
    from eagleforensics.checks.benchprompts import looks_random

    rng = np.random.default_rng(2)
    for vocab in (32000, 128256, 151936):
        for n in (32, 256, 2048):
            assert looks_random(rng.integers(0, vocab, n).tolist(), vocab)
    zipf = np.minimum(rng.zipf(1.3, 512), 30000).tolist()  # text: frequent (low) ids repeat
    assert not looks_random(zipf, 128256)
    assert not looks_random(list(range(100)), 128256)  # distinct but all low ids
    assert not looks_random(rng.integers(0, 128256, 20).tolist(), 128256)  # too short to tell


# ---------------------------------------------------------------- plan's new suspects
def test_new_suspects_read_each_engine_s_settings() -> None:
    from eagleforensics.engines.suspects import SUSPECTS, match_suspects

    sgl = parse_server_args_line(
        "[2026-11-29 10:00:00] server_args={'model_path': 'm', 'speculative_algorithm': 'EAGLE3', "
        "'speculative_num_steps': 3, 'speculative_eagle_topk': 1, 'speculative_num_draft_tokens': 4, "
        "'chunked_prefill_size': 8192, 'disable_overlap_schedule': False, 'attention_backend': 'fa3', "
        "'speculative_draft_attention_backend': 'triton', 'speculative_accept_threshold_single': 1.0, "
        "'speculative_accept_threshold_acc': 0.5}")
    got = {m.suspect.code: (m.status, m.this_run) for m in match_suspects(sgl)}
    assert got["chunked-prefill"] == ("matches", "chunked prefill on in this run (chunked_prefill_size=8192): "
                                                 "prompts longer than a chunk cross a chunk end")
    assert got["async-scheduling"][0] == "matches" and "disable_overlap_schedule=False" in got["async-scheduling"][1]
    assert got["attention-backend"] == ("matches", "this run: attention_backend=fa3, "
                                                   "speculative_draft_attention_backend=triton")
    assert got["verify-rule"][0] == "matches" and "speculative_accept_threshold_acc=0.5" in got["verify-rule"][1] \
        and "lossy" in got["verify-rule"][1]
    vllm = parse_server_args_line(
        "(APIServer pid=1) INFO 11-29 12:58:00 [startup.py:96] non-default args: {'model_tag': 'm', "
        "'speculative_config': {'method': 'eagle3', 'model': 'd', 'num_speculative_tokens': 3, "
        "'draft_sample_method': 'probabilistic'}, 'enable_chunked_prefill': False, 'async_scheduling': False}")
    got = {m.suspect.code: m.status for m in match_suspects(vllm)}
    assert got["chunked-prefill"] == got["async-scheduling"] == got["verify-rule"] == "ruled-out"
    assert got["attention-backend"] == "unknown"
    plain = parse_server_args_line(
        "INFO 11-29 12:58:00 [utils.py:233] non-default args: {'model_tag': 'm', 'speculative_config': "
        "{'method': 'eagle3', 'model': 'd', 'num_speculative_tokens': 3}}")
    got = {m.suspect.code: (m.status, m.this_run) for m in match_suspects(plain)}
    assert got["chunked-prefill"][0] == "matches" and "vLLM V1's default" in got["chunked-prefill"][1]
    assert got["async-scheduling"][0] == "unknown"  # no version: 0.10 - 0.13 off, 0.14 on by default
    assert got["verify-rule"][0] == "matches" and "target-only" in got["verify-rule"][1]
    for s in SUSPECTS:
        assert s.sources and all("/" in src and "#" in src for src in s.sources)


@pytest.mark.parametrize("version, pp, status", [("0.12.0", 1, "ruled-out"), ("0.14.0", 1, "matches"),
                                                 ("0.14.0", 2, "ruled-out"), ("0.17.0", 2, "matches"),
                                                 ("0.33.0", 1, "matches")])
def test_async_scheduling_default_per_vllm_release(tmp_path: Path, version: str, pp: int, status: str) -> None:
    from eagleforensics.engines.suspects import match_suspects

    args = find_server_args(vllm_log(tmp_path / "v.log", version, SAMPLES / "target", SPEC,
                                     pipeline_parallel_size=pp))
    got = {m.suspect.code: m.status for m in match_suspects(args)}
    assert got["async-scheduling"] == status


def test_serving_rules_cite_a_wheel_file_and_cover_both_engines() -> None:
    from eagleforensics.engines.servingrules import SERVING_RULES, TOPICS, serving_rule

    for r in SERVING_RULES:
        assert re.search(r"(sglang|vllm) \d+\.\d+", r.source) and (".py" in r.source), r
    for topic in TOPICS:
        assert any(r.topic == topic for r in SERVING_RULES)
    assert serving_rule("penalty", "vllm", "0.13.0").outcome == "not-speculated"
    assert serving_rule("penalty", "vllm", "0.14.0").outcome == "target-only"
    assert serving_rule("dp-attention", "sglang", "0.5.9", "deepseek_v3").outcome == "wrong-group"
    assert serving_rule("dp-attention", "sglang", "0.5.9", "llama") is None
    assert serving_rule("verify", "vllm", "0.20.0").outcome == "strict"
