"""Issue 41, the engine / serving side: every rule at every release it claims, read from the released wheels.

Each failure is built from the released artifacts' formats (the log lines as the wheels' logging calls
print them, cited beside each) and fails on the main branch before issue 41; the clean counterparts stay
clean.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.checks.registry import get_check
from eagleforensics.doctor import diagnose
from eagleforensics.engines.failurelines import find_failure
from eagleforensics.testing.defects import SAMPLES, sglang_log, vllm_log

SPEC = {"method": "eagle3", "model": str(SAMPLES / "drafter"), "num_speculative_tokens": 3}


def _run(names: tuple[str, ...], **inputs: object):  # noqa: ANN202
    inputs = {k: str(v) if isinstance(v, Path) else v for k, v in inputs.items()}
    return diagnose(DoctorInputs(**inputs), checks=[get_check(n) for n in names], pipelines=())


def _found(report, code: str) -> list[tuple[str, str]]:  # noqa: ANN001
    return [(r.finding.code, r.finding.severity) for r in report.findings if r.finding.code == code]


def _prefixed(path: Path, prefix: str) -> None:
    path.write_text("".join(f"{prefix}{line}\n" for line in path.read_text().splitlines()))


# vLLM 0.11.0: the engine-core process's logger.exception (v1/engine/core.py:708) prints the traceback with vLLM's
# header on every line (logging_utils/formatter.py), the process prefix from vllm/utils _add_prefix; then the
# API server's RuntimeError from v1/engine/utils.py:785
VLLM_0_11_REFUSAL = """\
(EngineCore_DP0 pid=2345) INFO 11-29 12:58:30 [gpu_model_runner.py:2602] Starting to load model /models/qwen3-next...
(EngineCore_DP0 pid=2345) ERROR 11-29 12:58:41 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=2345) ERROR 11-29 12:58:41 [core.py:708] Traceback (most recent call last):
(EngineCore_DP0 pid=2345) ERROR 11-29 12:58:41 [core.py:708]   File "/usr/local/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 699, in run_engine_core
(EngineCore_DP0 pid=2345) ERROR 11-29 12:58:41 [core.py:708]     engine_core = EngineCoreProc(*args, **kwargs)
(EngineCore_DP0 pid=2345) ERROR 11-29 12:58:41 [core.py:708]   File "/usr/local/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py", line 2649, in load_model
(EngineCore_DP0 pid=2345) ERROR 11-29 12:58:41 [core.py:708]     raise RuntimeError(
(EngineCore_DP0 pid=2345) ERROR 11-29 12:58:41 [core.py:708] RuntimeError: Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested
(EngineCore_DP0 pid=2345) Process EngineCore_DP0:
(EngineCore_DP0 pid=2345) Traceback (most recent call last):
(EngineCore_DP0 pid=2345)   File "/usr/lib/python3.12/multiprocessing/process.py", line 314, in _bootstrap
(EngineCore_DP0 pid=2345) RuntimeError: Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested
(APIServer pid=1) Traceback (most recent call last):
(APIServer pid=1)   File "/usr/local/bin/vllm", line 10, in <module>
(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""

# SGLang 0.5.8: managers/scheduler.py logger.error(f"Scheduler hit an exception: {traceback}") (the traceback's
# lines unprefixed), then entrypoints/engine.py's launch-phase sigquit handler
SGLANG_0_5_8_REFUSAL = """\
[2026-11-29 12:00:10 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/local/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 2960, in run_scheduler_process
    scheduler = Scheduler(
  File "/usr/local/lib/python3.12/site-packages/sglang/srt/model_executor/model_runner.py", line 512, in initialize
    self.model.set_eagle3_layers_to_capture(eagle_aux_hidden_state_layer_ids)
AttributeError: 'NemotronHForCausalLM' object has no attribute 'set_eagle3_layers_to_capture'

[2026-11-29 12:00:10] Received sigquit from a child process. It usually means the child failed.
"""


def test_a_vllm_0_11_launch_refused_at_start_is_a_finding_with_the_line(tmp_path: Path) -> None:
    log = vllm_log(tmp_path / "v.log", "0.11.0", SAMPLES / "target", SPEC)
    _prefixed(log, "(APIServer pid=1) ")
    clean = _run(("launch",), log=log)
    assert _found(clean, "engine-refused") == []
    log.write_text(log.read_text() + VLLM_0_11_REFUSAL)
    r = _run(("launch",), log=log)
    assert _found(r, "engine-refused") == [("engine-refused", "error")]
    f = next(x.finding for x in r.findings if x.finding.code == "engine-refused")
    assert "refused EAGLE-3 at start" in f.message and "Model does not support EAGLE3 interface" in f.message
    assert "vllm/v1/worker/gpu_model_runner.py" in f.source
    assert r.outcomes[0].data["failure"]["kind"] == "eagle3-refused"


def test_an_sglang_scheduler_exception_is_a_finding(tmp_path: Path) -> None:
    log = sglang_log(tmp_path / "s.log", SAMPLES / "target", SAMPLES / "drafter")
    body = log.read_text().replace("[2026-11-29 11:59:02] The server is fired up and ready to roll!\n", "")
    log.write_text(body + SGLANG_0_5_8_REFUSAL)
    r = _run(("launch",), log=log)
    assert _found(r, "engine-refused") == [("engine-refused", "error")]
    f = next(x.finding for x in r.findings if x.finding.code == "engine-refused")
    assert "set_eagle3_layers_to_capture" in f.message and "srt/model_executor/model_runner.py" in f.source


def test_failure_lines_clean_and_survived() -> None:
    ready = [(1, "[2026-11-29 12:00:00] server_args=ServerArgs()"),
             (2, "[2026-11-29 12:00:05] The server is fired up and ready to roll!")]
    assert find_failure(ready) is None
    # a request's traceback logged by a running server is not the engine's end
    req = ready + [(3, "Traceback (most recent call last):"), (4, '  File "x.py", line 1'),
                   (5, "ValueError: prompt too long")]
    assert find_failure(req) is None
    # a traceback that ends the log before the server came up is
    start = [(1, "INFO 11-29 12:58:00 [utils.py:233] non-default args: {}"), (2, "Traceback (most recent call last):"),
             (3, '  File "x.py", line 1'), (4, "torch.OutOfMemoryError: CUDA out of memory.")]
    fail = find_failure(start)
    assert fail is not None and fail.kind == "traceback" and fail.line_no == 4
    # a failure before the last start does not count
    assert find_failure(start, after=4) is None


@pytest.mark.parametrize("log", sorted((Path(__file__).parent / "fixtures" / "logs").rglob("*.log")),
                         ids=lambda p: p.name)
def test_no_fixture_log_reads_as_a_refusal(log: Path) -> None:
    assert _found(_run(("launch",), log=log), "engine-refused") == []


# ---------------------------------------------------------------- the draft's quantization (SGLang 'unquant')
FIXTURES = Path(__file__).parent / "fixtures" / "logs"


def sglang_fixture(tmp_path: Path, release: str, name: str = "sglang.log", **fields: object) -> Path:
    """A release's arguments-line fixture (scripts/make_serverargs_fixtures.py, the repr or dict the release logs)
    with ``fields`` set, in the line's own syntax (``k=v`` for the 0.5.9 repr, ``'k': v`` for the 0.5.19+ dict)."""
    import re

    text = (FIXTURES / "serverargs" / f"sglang_{release}_args.log").read_text()
    for key, value in fields.items():
        pat = re.compile(rf"(?<![a-z_])({key}=|'{key}': )([^,)}}]*)")
        assert pat.search(text), key
        text = pat.sub(lambda m, v=value: m.group(1) + repr(v), text, count=1)
    path = tmp_path / name
    path.write_text(text)
    return path


def _quantized_target(tmp_path: Path) -> Path:
    import json
    import shutil

    t = tmp_path / "target"
    shutil.copytree(SAMPLES / "target", t)
    (t / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.37.0"},
                                                        "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                                         "exclude_modules": ["lm_head"]}}))
    return t


@pytest.mark.parametrize("release", ["0.5.9", "0.5.23"])
def test_sglang_unquant_resolves_to_none_and_keeps_the_drafter_unquantized(tmp_path: Path, release: str) -> None:
    """0.5.8 - 0.5.18 server_args.py _handle_missing_default_values, 0.5.19+ arg_groups/serving_hook.py: a missing
    draft quantization takes --quantization, 'unquant' becomes None; the logged line is the resolved one."""
    t = _quantized_target(tmp_path)
    common = {"model_path": str(t), "speculative_draft_model_path": str(SAMPLES / "drafter"),
              "quantization": "modelopt_fp4"}
    log = sglang_fixture(tmp_path, release, "unquant.log", **common, speculative_draft_model_quantization=None)
    r = _run(("target-quantized",), target=t, log=log)
    assert _found(r, "target-quantized") == [("target-quantized", "info")], r.to_text()
    log = sglang_fixture(tmp_path, release, "inherit.log", **common, speculative_draft_model_quantization="modelopt_fp4")
    r = _run(("target-quantized",), target=t, log=log)
    assert _found(r, "target-quantized") == [("target-quantized", "warning")], r.to_text()


# ---------------------------------------------------------------- DP attention: families from the registry
def _dp_log(tmp_path: Path) -> Path:
    return sglang_fixture(tmp_path, "0.5.9", "dp.log", enable_dp_attention=True, dp_size=8, moe_a2a_backend="deepep",
                          context_length=None)


def test_deepseek_v32_is_in_the_deepseek_v2_family_on_sglang_0_5_8(tmp_path: Path) -> None:
    """sglang 0.5.8 srt/models/deepseek_v2.py: DeepseekV32ForCausalLM(DeepseekV2ForCausalLM), EntryClass lists it."""
    import json
    import shutil

    t = tmp_path / "target"
    shutil.copytree(SAMPLES / "target", t)
    cfg = json.loads((t / "config.json").read_text())
    cfg.update(model_type="deepseek_v32", architectures=["DeepseekV32ForCausalLM"])
    (t / "config.json").write_text(json.dumps(cfg))
    log = _dp_log(tmp_path)
    r = _run(("dp-attention",), log=log, target=t, engine_version="0.5.8")
    assert _found(r, "dp-attention") == [("dp-attention", "error")], r.to_text()
    f = r.findings[0].finding
    assert "sglang 0.5.8 sglang/srt/models/deepseek_v2.py DeepseekV32ForCausalLM" in f.message
    # the model_type alone names the registered class
    r = _run(("dp-attention",), log=log, model_type="deepseek_v32", engine_version="0.5.8")
    assert _found(r, "dp-attention") == [("dp-attention", "error")], r.to_text()
    # clean counterparts: the fixed release, and a class outside the family
    r = _run(("dp-attention",), log=log, target=t, engine_version="0.5.10")
    assert _found(r, "dp-attention") == [("dp-attention", "info")]
    cfg.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"])
    (t / "config.json").write_text(json.dumps(cfg))
    r = _run(("dp-attention",), log=log, target=t, engine_version="0.5.8")
    assert _found(r, "dp-attention") == [("dp-attention", "info")]
    assert "not a DeepSeek-V2-family model (sglang 0.5.8 sglang/srt/models/qwen3_moe.py" in r.findings[0].finding.message


# ---------------------------------------------------------------- NEXTN logged as EAGLE
def test_sglang_nextn_logged_as_eagle_on_an_mtp_target_is_not_a_mismatch(tmp_path: Path) -> None:
    """sglang 0.4.10 / 0.5.8 server_args.py, 0.5.23 arg_groups/speculative_hook.py: NEXTN becomes EAGLE, and the
    DeepSeek MTP draft path becomes the target's; the 0.5.23 line logs the resolved values."""
    import json
    import shutil

    t = tmp_path / "target"
    shutil.copytree(SAMPLES / "target", t)
    log = sglang_log(tmp_path / "s.log", t, t, speculative_algorithm="EAGLE")
    plain = _run(("launch",), log=log, target=t)
    assert _found(plain, "algorithm-mismatch") == [("algorithm-mismatch", "warning")]  # no MTP: a real mismatch
    cfg = json.loads((t / "config.json").read_text())
    (t / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": 1}))
    r = _run(("launch",), log=log, target=t)
    assert _found(r, "algorithm-mismatch") == [], r.to_text()
    assert _found(r, "draft-is-target") == [("draft-is-target", "info")]
    # with an EAGLE-3 drafter given, the server still runs the MTP layers: said, as what it is
    r = _run(("launch",), log=log, target=t, drafter=SAMPLES / "drafter")
    f = [x.finding for x in r.findings if x.finding.code == "algorithm-mismatch"]
    assert [(x.severity, "own MTP layers" in x.message) for x in f] == [("warning", True)]


# ---------------------------------------------------------------- lm_head missing: what each engine serves instead
def _headless_drafter(tmp_path: Path, draft_vocab: bool = True) -> Path:
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    d = tmp_path / "drafter"
    shutil.copytree(SAMPLES / "drafter", d)
    w = load_file(d / "model.safetensors")
    del w["lm_head.weight"]
    save_file(w, d / "model.safetensors", metadata={"format": "pt"})
    if not draft_vocab:
        cfg = json.loads((d / "config.json").read_text())
        cfg.pop("draft_vocab_size")
        (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("engine, version, draft_vocab, want, said", [
    (None, None, True, "error", "no engine given"),
    ("vllm", "0.11.1", True, "warning", "serves the target's lm_head"),  # vllm-project/vllm#28549
    ("vllm", "0.34.0", True, "warning", "serves the target's lm_head"),  # _should_share
    ("vllm", "0.11.0", True, "error", "loads the drafter's own head"),  # 256-row draft head != 512-row target head
    ("vllm", "0.11.0", False, "warning", "serves the target's lm_head"),  # same shape: shared
    ("vllm", "0.10.1.1", False, "error", "loads the drafter's own head"),
    ("sglang", "0.5.23", True, "error", "loads the drafter's own head"),  # sgl-project/sglang#27908
    ("sglang", "0.5.8", False, "warning", "serves the target's lm_head"),  # load_lm_head_from_target
    ("sglang", "0.4.10", False, "error", "loads the drafter's own head"),
    ("vllm", "0.35.0", True, "error", "not read for this release"),
])
def test_a_missing_lm_head_is_judged_by_what_the_engine_release_serves(tmp_path: Path, engine: str | None,
                                                                      version: str | None, draft_vocab: bool,
                                                                      want: str, said: str) -> None:
    d = _headless_drafter(tmp_path, draft_vocab)
    r = _run(("drafter-weights",), drafter=d, target=SAMPLES / "target", engine=engine, engine_version=version)
    assert _found(r, "drafter-weights-missing") == [("drafter-weights-missing", want)], r.to_text()
    f = r.findings[0].finding
    assert said in f.message
    if engine and version:
        assert f"{version}" in f.message


# ---------------------------------------------------------------- benchmark prompts as the generators make them
from tests.test_serving_causes import tokenized_target  # noqa: E402,F401  (the 16k-id BPE target fixture)


def _vllm_random_dataset(tok, n: int, length: int, seed: int) -> list[dict]:  # noqa: ANN001
    """Requests as vLLM's RandomDataset writes them (0.34.0 benchmarks/datasets/datasets.py): consecutive allowed ids
    from a random offset, decoded, re-encoded and truncated to the length, decoded again; sent with ignore_eos."""
    import numpy as np

    rng = np.random.default_rng(seed)
    special = set(getattr(tok, "all_special_ids", []) or [])
    allowed = np.array([i for i in range(tok.vocab_size) if i not in special])
    out = []
    for i in range(n):
        offset = int(rng.integers(0, tok.vocab_size))
        ids = allowed[(offset + i + np.arange(length)) % len(allowed)].tolist()
        again = tok.encode(tok.decode(ids))[:length]
        out.append({"prompt": tok.decode(again), "max_tokens": 128, "ignore_eos": True})
    return out


def _sglang_random_ids(tok, n: int, length: int, seed: int) -> list[dict]:  # noqa: ANN001
    """Requests as SGLang's random-ids writes them (0.5.23 benchmark/datasets/random.py): (offset + i + j) % vocab,
    decoded to text (return_text)."""
    import numpy as np

    offsets = np.random.default_rng(seed).integers(0, tok.vocab_size, size=n)
    return [{"text": tok.decode([int((offsets[i] + i + j) % tok.vocab_size) for j in range(length)]),
             "sampling_params": {"max_new_tokens": 128, "ignore_eos": True}} for i in range(n)]


@pytest.mark.parametrize("make", [_vllm_random_dataset, _sglang_random_ids], ids=["vllm", "sglang"])
def test_generator_prompts_are_all_found_as_random_ids(tmp_path: Path, tokenized_target: Path, make) -> None:  # noqa: F811,ANN001
    import json

    from eagleforensics.io.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenized_target)
    rows = make(tok, 64, 256, seed=3)
    path = tmp_path / "served.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = _run(("benchmark-prompts",), target=tokenized_target, served_prompts=path)
    f = next(x.finding for x in r.findings if x.finding.code == "benchmark-prompts")
    # a prompt whose offset falls among the byte tokens re-encodes into merged words (1 of 64 at this seed)
    assert f.severity == "warning" and r.outcomes[0].data["random_ids"] >= 63, f.message
    assert r.outcomes[0].data["generator_ids"] >= 63 and "consecutive ids from an offset" in f.message
    assert "vllm/benchmarks/datasets/datasets.py" in f.source and "sglang/benchmark/datasets/random.py" in f.source
    assert "64 of 64 requests set ignore_eos" in f.message


# ---------------------------------------------------------------- verifier: two hub ids of different models
def _speculators(tmp_path: Path, verifier: str) -> Path:
    import json

    d = tmp_path / "spec"
    d.mkdir()
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.9.0",
           "transformer_layer_config": {"hidden_size": 64, "vocab_size": 512, "num_hidden_layers": 1},
           "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": verifier,
                                                                      "architectures": ["LlamaForCausalLM"]}}}
    (d / "config.json").write_text(json.dumps(cfg))
    return d / "config.json"


def test_a_verifier_and_a_served_model_that_are_hub_ids_of_different_models_is_a_warning(tmp_path: Path) -> None:
    import json
    import shutil

    t = tmp_path / "DeepSeek-R1-Distill-Llama-8B"
    shutil.copytree(SAMPLES / "target", t)
    cfg = json.loads((t / "config.json").read_text())
    (t / "config.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"]}))
    dc = _speculators(tmp_path, "meta-llama/Llama-3.1-8B-Instruct")
    spec = {"method": "eagle3", "model": "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3", "num_speculative_tokens": 3}
    log = vllm_log(tmp_path / "v.log", "0.11.0", t, spec)
    log.write_text(log.read_text().replace(str(t), "deepseek-ai/DeepSeek-R1-Distill-Llama-8B"))
    r = _run(("verifier",), target=t, draft_config=dc, log=log)
    assert _found(r, "verifier-mismatch") == [("verifier-mismatch", "warning")], r.to_text()
    assert "deepseek-ai/DeepSeek-R1-Distill-Llama-8B" in r.findings[0].finding.message
    # without the log (names only) it stays info; a served model that is the verifier's (or its FP8 export) is clean
    assert _found(_run(("verifier",), target=t, draft_config=dc), "verifier-mismatch") == [("verifier-mismatch", "info")]
    log.write_text(log.read_text().replace("deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
                                           "RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic"))
    assert _found(_run(("verifier",), target=t, draft_config=dc, log=log), "verifier-mismatch") == [
        ("verifier-mismatch", "info")]
    # a local path in the log is not a hub id: names only
    log.write_text(log.read_text().replace("RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic", "/models/r1-distill"))
    assert _found(_run(("verifier",), target=t, draft_config=dc, log=log), "verifier-mismatch") == [
        ("verifier-mismatch", "info")]


# ---------------------------------------------------------------- runtime LoRA
def test_runtime_lora_adapters_and_requests_naming_them_are_found(tmp_path: Path) -> None:
    import json

    served = tmp_path / "served.jsonl"
    # SGLang /generate bodies (0.5.8 srt/managers/io_struct.py GenerateReqInput.lora_path)
    served.write_text(json.dumps({"text": "Write a SQL query.", "lora_path": "sql"}) + "\n"
                      + json.dumps({"text": "Say hi.", "sampling_params": {"temperature": 0}}) + "\n")
    log = sglang_log(tmp_path / "s.log", SAMPLES / "target", SAMPLES / "drafter", enable_lora=True)
    assert _found(_run(("lora-target",), log=log), "lora-target") == [("lora-target", "info")]
    r = _run(("lora-target",), log=log, served_prompts=served)
    assert _found(r, "lora-target") == [("lora-target", "warning")], r.to_text()
    assert "1 of 2 served requests go through an adapter (sql)" in r.findings[0].finding.message
    # vLLM: an adapter loaded at run time (0.11.0 entrypoints/openai/serving_models.py), requests naming it as model
    log = vllm_log(tmp_path / "v.log", "0.11.0", SAMPLES / "target", SPEC, enable_lora=True)
    log.write_text(log.read_text() + "(APIServer pid=1) INFO 11-29 13:02:11 [serving_models.py:162] Loaded new LoRA "
                   "adapter: name 'sql-lora', path '/adapters/sql'\n")
    served.write_text(json.dumps({"model": "sql-lora", "prompt": "SELECT"}) + "\n"
                      + json.dumps({"model": "base", "prompt": "Hello"}) + "\n")
    r = _run(("lora-target",), log=log, served_prompts=served)
    assert _found(r, "lora-target") == [("lora-target", "warning")], r.to_text()
    assert "loaded at run time (sql-lora)" in r.findings[0].finding.message
    # clean counterpart: LoRA on, nothing loaded, requests to the base model only
    log = vllm_log(tmp_path / "c.log", "0.11.0", SAMPLES / "target", SPEC, enable_lora=True)
    served.write_text(json.dumps({"model": "base", "prompt": "Hello"}) + "\n")
    assert _found(_run(("lora-target",), log=log, served_prompts=served), "lora-target") == [("lora-target", "info")]


def test_a_log_cut_before_the_refusal_is_still_found_from_the_release_s_class(tmp_path: Path) -> None:
    """vLLM 0.10.1.1's qwen2.py class lacks SupportsEagle3 (its interfaces.py defines it); 0.11.0's has it."""
    import json
    import shutil

    t = tmp_path / "target"
    shutil.copytree(SAMPLES / "target", t)
    cfg = json.loads((t / "config.json").read_text())
    (t / "config.json").write_text(json.dumps({**cfg, "architectures": ["Qwen2ForCausalLM"]}))
    log = vllm_log(tmp_path / "v.log", "0.10.1.1", t, SPEC)
    r = _run(("launch",), log=log, target=t)
    assert _found(r, "engine-refused") == [("engine-refused", "error")], r.to_text()
    assert "vllm 0.10.1.1 vllm/model_executor/models/qwen2.py" in r.findings[0].finding.message
    log = vllm_log(tmp_path / "w.log", "0.11.0", t, SPEC)
    assert _found(_run(("launch",), log=log, target=t), "engine-refused") == []


def test_generator_ids_sent_as_ids_show_their_fixed_length(tmp_path: Path) -> None:
    """SGLang random-ids sent as ids (--tokenize-prompt; 0.5.23 benchmark/datasets/random.py without return_text): all
    the same length, consecutive from an offset; real traffic of equal length is not such a run."""
    import json

    import numpy as np

    vocab = 151_936
    offsets = np.random.default_rng(5).integers(0, vocab, size=8)
    rows = [{"input_ids": [int((offsets[i] + i + j) % vocab) for j in range(200)],
             "sampling_params": {"max_new_tokens": 64}} for i in range(8)]
    path = tmp_path / "ids.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = _run(("benchmark-prompts",), served_prompts=path)
    f = next(x.finding for x in r.findings if x.finding.code == "benchmark-prompts")
    assert f.severity == "warning" and "8 of 8 prompts are random token ids" in f.message
    assert "8 are consecutive ids from an offset, all 200 tokens long" in f.message
    # text-like ids (a repeated sentence's ids) are not
    rows = [{"input_ids": [17, 923, 4410, 88, 17, 902, 3301, 12] * 25} for _ in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [x for x in _run(("benchmark-prompts",), served_prompts=path).findings
            if x.finding.code == "benchmark-prompts"] == []
