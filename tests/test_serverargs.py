"""The launch-arguments parser: every SGLang and vLLM release format, hostile lines, never mixed with metrics."""
from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import pytest

from eagleforensics.engines import serverargs as sa
from eagleforensics.engines.logs import parse_log
from eagleforensics.engines.pyrepr import ReprError, parse_repr, split_assignments
from eagleforensics.errors import ForensicsError

FIX = Path(__file__).parent / "fixtures" / "logs"
ARGS_FIX = FIX / "serverargs"
TARGET = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "/models/eagle3-llama3.1-8b"
SGL = "[2026-11-29 10:00:00] "
SGL_MS = "[2026-11-29 10:00:00.123 TP0] "


def vllm_prefix(where: str, process: bool = True) -> str:
    """vLLM's logging prefix (vllm/logger.py _FORMAT); the ``(APIServer pid=N) `` tag only on newer releases."""
    return ("(APIServer pid=7) " if process else "") + f"INFO 11-29 12:58:00 [{where}] "


# ---- SGLang: one line per release range, made from that release's ServerArgs fields -------------

SGLANG_RELEASES = {  # release -> (source, algorithm as printed, pp field present)
    "0.4.0": ("sglang-repr", None, False),
    "0.4.3": ("sglang-repr", "EAGLE", False),
    "0.4.7": ("sglang-repr", "EAGLE3", True),
    "0.4.10.post2": ("sglang-repr", "EAGLE3", True),
    "0.5.5": ("sglang-repr", "EAGLE3", True),
    "0.5.9": ("sglang-repr", "EAGLE3", True),
    "0.5.13": ("sglang-repr", "EAGLE3", True),
    "0.5.18": ("sglang-repr", "EAGLE3", True),
    "0.5.19": ("sglang-dict", "EAGLE3", True),
    "0.5.21": ("sglang-dict", "EAGLE3", True),
    "0.5.23": ("sglang-dict", "EAGLE3", True),
}


@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_sglang_release_formats(release):
    source, algo, has_pp = SGLANG_RELEASES[release]
    path = ARGS_FIX / f"sglang_{release}_args.log"
    first, line = path.read_text().splitlines()
    assert first.startswith("# format made from sgl-project/sglang " + release)
    rec = sa.parse_server_args_line(line, line_no=2)
    assert rec is not None and rec.engine == "sglang" and rec.source == source and rec.line_no == 2
    # the raw dict holds every field the release prints, with their types intact
    n_fields = int(first.split(" with the ")[1].split()[0])
    assert len(rec.raw) == n_fields
    assert rec.model == TARGET and rec.tp == 2 and rec.max_len == 32768 and rec.decode_log_interval == 25
    assert rec.cuda_graph is False and rec.prefix_cache is True  # disable_cuda_graph=True, radix cache on
    assert rec.raw["chat_template"] == "{% for m in messages %}'{{ m['content'] }}'\n{% endfor %}"
    assert json.loads(rec.raw["json_model_override_args"])["rope_scaling"]["factor"] == 4.0
    assert rec.pp == 1 and (("pp" in rec.inferred) is not has_pp)
    if algo is None:  # 0.4.0 had no speculative decoding
        assert not rec.speculative and rec.draft is None and rec.describe() == "no speculative decoding"
        return
    assert (rec.algorithm_raw, rec.algorithm) == (algo, algo.lower())
    assert (rec.draft, rec.num_steps, rec.topk, rec.num_draft_tokens) == (DRAFT, 5, 4, 8)
    assert rec.describe() == f"{algo} (draft {DRAFT}, 5 steps, topk 4, 8 draft tokens)"
    assert rec.version is None and rec.version_hint.startswith("sglang")
    since = {"0.4.0": "0.4.0", "0.4.3": "0.4.3"}.get(release, "0.4.7" if source == "sglang-repr" else "0.5.19")
    assert rec.version_range == (since, "0.5.18" if source == "sglang-repr" else None)
    json.dumps(rec.to_dict())  # JSON-ready


def test_sglang_prefix_with_milliseconds_rank_tags_and_colour():
    line = "\x1b[32m" + SGL_MS + "\x1b[0mserver_args=ServerArgs(model_path='m', tp_size=1, pp_size=2, " \
        "speculative_algorithm='EAGLE', speculative_draft_model_path='m', speculative_num_steps=3, " \
        "speculative_eagle_topk=1, speculative_num_draft_tokens=4)\r\n"
    rec = sa.parse_server_args_line(line)
    assert rec.pp == 2 and rec.algorithm == "eagle" and rec.draft == rec.model == "m"


# ---- vLLM: every release range ------------------------------------------------------------------

SPEC = {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3}
VLLM_NON_DEFAULT = {  # range -> (where it logs, process tag, the non-default args)
    "0.10.0": ("cli_args.py:261", False, {"model_tag": TARGET, "model": TARGET, "speculative_config": SPEC,
                                          "tensor_parallel_size": 2, "max_model_len": 8192}),
    "0.10.1.1 - 0.22.1": ("utils.py:233", True, {"model_tag": TARGET, "speculative_config": SPEC,
                                                 "tensor_parallel_size": 2, "max_model_len": 8192,
                                                 "enforce_eager": True, "enable_prefix_caching": False}),
    "0.22.0 on (--spec-* flags)": ("api_utils.py:102", True, {"model_tag": TARGET, "spec_method": "eagle3",
                                                              "spec_model": DRAFT, "spec_tokens": 3,
                                                              "tensor_parallel_size": 2, "max_model_len": 8192}),
    "0.29.0 on (redacted)": ("api_utils.py:110", True, {"model_tag": TARGET, "api_key": "***",
                                                        "speculative_config": {"method": "eagle3", "model": DRAFT,
                                                                               "num-speculative-tokens": 3},
                                                        "tensor_parallel_size": 2, "max_model_len": 8192}),
    "0.33.0": ("startup.py:96", True, {"model_tag": TARGET, "model": TARGET, "speculative_config": SPEC,
                                       "tensor_parallel_size": 2, "pipeline_parallel_size": 1,
                                       "max_model_len": 8192, "compilation_config": {"level": 3, "cudagraph_capture_sizes": [1, 2, 4]}}),
}


@pytest.mark.parametrize("release", VLLM_NON_DEFAULT)
def test_vllm_non_default_args_formats(release):
    where, process, args = VLLM_NON_DEFAULT[release]
    line = vllm_prefix(where, process) + f"non-default args: {args}"
    rec = sa.parse_server_args_line(line, line_no=4)
    assert rec.engine == "vllm" and rec.source == "vllm-non-default" and rec.line_no == 4
    assert (rec.model, rec.draft, rec.algorithm, rec.num_steps) == (TARGET, DRAFT, "eagle3", 3)
    assert (rec.topk, rec.num_draft_tokens) == (1, 4) and {"topk", "num_draft_tokens"} <= set(rec.inferred)
    assert rec.tp == 2 and rec.max_len == 8192 and rec.pp == 1 and rec.dp == 1
    assert "pp" in rec.inferred or "pipeline_parallel_size" in rec.raw
    if "enforce_eager" in args:
        assert rec.cuda_graph is False and rec.prefix_cache is False and "cuda_graph" not in rec.inferred
    else:
        assert rec.cuda_graph is True and "cuda_graph" in rec.inferred and rec.prefix_cache is None
    assert rec.describe() == f"eagle3 (draft {DRAFT}, 3 speculative tokens)"
    since = "0.29.0" if "api_key" in args else "0.22.0" if "spec_method" in args else "0.10.0"
    assert rec.version_range == (since, None) and rec.version is None


def test_vllm_namespace_line_with_function_values():
    """``args: Namespace(...)`` (demo api_server, run_batch): every argument, a function repr among them."""
    def cmd() -> None:  # stands for ServeSubcommand.cmd, printed as <function ... at 0x...>
        return None

    ns = argparse.Namespace(subparser="serve", model_tag=TARGET, host=None, port=8000, model=TARGET,
                            speculative_config={"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B",
                                                "num_speculative_tokens": 5},
                            tensor_parallel_size=1, pipeline_parallel_size=4, data_parallel_size=1,
                            max_model_len=None, enforce_eager=False, enable_prefix_caching=None,
                            disable_log_stats=True, dispatch_function=cmd)
    rec = sa.parse_server_args_line(vllm_prefix("api_server.py:123", False) + f"args: {ns}")
    assert rec.source == "vllm-namespace" and rec.algorithm == "eagle" and rec.num_steps == 5
    assert rec.pp == 4 and "pp" not in rec.inferred and rec.log_stats is False and rec.max_len is None
    assert rec.raw["dispatch_function"].startswith("<function ")


def _engine_config_0100(method: str | None = "eagle3") -> str:
    """VllmConfig.__str__ as vllm 0.10.0 vllm/config.py writes it (the f-string's separators kept)."""
    spec = "None" if method is None else f"SpeculativeConfig(method={method!r}, model={DRAFT!r}, num_spec_tokens=3)"
    return (f"model={TARGET!r}, speculative_config={spec}, tokenizer={TARGET!r}, skip_tokenizer_init=False, "
            "tokenizer_mode=auto, revision=None, override_neuron_config={}, tokenizer_revision=None, "
            "trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=131072, download_dir=None, "
            "load_format=LoadFormat.AUTO, tensor_parallel_size=1, pipeline_parallel_size=2, "
            "disable_custom_all_reduce=False, quantization=None, enforce_eager=False, kv_cache_dtype=auto,  "
            "device_config=cuda, decoding_config=DecodingConfig(backend='auto', disable_fallback=False), "
            "observability_config=ObservabilityConfig(show_hidden_metrics_for_version=None), seed=0, "
            f"served_model_name={TARGET}, num_scheduler_steps=1, multi_step_stream_outputs=True, "
            "enable_prefix_caching=True, chunked_prefill_enabled=True, use_async_output_proc=True, "
            'pooler_config=None, compilation_config={"level":3,"debug_dump_path":"","cudagraph_capture_sizes":[4,2,1]}')


def _engine_config_0330() -> str:
    """VllmConfig.__str__ as vllm 0.33.0 vllm/config/vllm.py writes it."""
    return (f"model={TARGET!r}, speculative_config=SpeculativeConfig(method='eagle3', model={DRAFT!r}, "
            f"num_spec_tokens=3), tokenizer={TARGET!r}, skip_tokenizer_init=False, tokenizer_mode=auto, "
            "revision=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, "
            "max_seq_len=8192, download_dir=None, load_format=auto, tensor_parallel_size=2, "
            "pipeline_parallel_size=1, data_parallel_size=1, decode_context_parallel_size=1, "
            "dcp_comm_backend=ag_rs, disable_custom_all_reduce=False, quantization=None, "
            "quantization_config=None, enforce_eager=False, aux_output_config=None, kv_cache_dtype=auto, "
            "device_config=cuda, structured_outputs_config=StructuredOutputsConfig(backend='auto'), "
            "observability_config=ObservabilityConfig(), seed=0, "
            f"served_model_name={TARGET}, enable_prefix_caching=True, enable_chunked_prefill=True, "
            "pooler_config=None, compilation_config={'mode': <CompilationMode.VLLM_COMPILE: 3>}, "
            "kernel_config=KernelConfig()")


def test_vllm_engine_config_line_alone_gives_version_and_resolved_values():
    line = ("(EngineCore_DP0 pid=301) INFO 11-29 12:58:09 [core.py:77] Initializing a V1 LLM engine (v0.10.0) "
            "with config: " + _engine_config_0100())
    rec = sa.parse_server_args_line(line)
    assert rec.source == "vllm-engine-config" and rec.version == "0.10.0" and rec.version_hint == "vllm 0.10.0"
    assert (rec.algorithm, rec.draft, rec.num_steps, rec.pp, rec.tp, rec.max_len) == ("eagle3", DRAFT, 3, 2, 1, 131072)
    assert rec.prefix_cache is True and rec.cuda_graph is True
    assert rec.engine_config["served_model_name"] == TARGET and rec.engine_config["dtype"] == "torch.bfloat16"


def test_vllm_log_merges_version_args_and_engine_config(tmp_path):
    """The 0.33.0 order: version line, non-default args, engine config; resolved values fill the gaps."""
    log = tmp_path / "serve.log"
    log.write_text("\n".join([
        vllm_prefix("startup.py:38") + f"vLLM server version 0.33.0, serving model {TARGET}",
        vllm_prefix("startup.py:96") + f"non-default args: {{'model_tag': {TARGET!r}, 'speculative_config': "
        f"{{'model': {DRAFT!r}, 'num_speculative_tokens': 3}}, 'tensor_parallel_size': 2}}",
        "(EngineCore pid=9) INFO 11-29 12:58:09 [core.py:140] Initializing a V1 LLM engine (v0.33.0) with "
        "config: " + _engine_config_0330(),
        "",
    ]))
    rec = sa.find_server_args(log)
    assert rec.version == "0.33.0" and rec.line_no == 2 and rec.starts == 1
    assert rec.algorithm == "eagle3" and "algorithm" in rec.inferred  # no method given: the engine's own
    assert rec.max_len == 8192 and "max_len" in rec.inferred and rec.tp == 2 and "tp" not in rec.inferred
    assert rec.prefix_cache is True and rec.engine_config["compilation_config"] == {
        "mode": "<CompilationMode.VLLM_COMPILE: 3>"}


def test_vllm_0100_auto_detected_method_from_the_engine_config():
    """0.10.0 without 'method' runs a draft named eagle3-... as 'eagle' (launchrules method-omitted)."""
    lines = [vllm_prefix("api_server.py:1755", False) + "vLLM API server version 0.10.0",
             vllm_prefix("cli_args.py:261", False) + "non-default args: {'speculative_config': "
             "{'model': 'yuhuili/EAGLE3-LLaMA3.1-Instruct-8B', 'num_speculative_tokens': 3}}",
             "INFO 11-29 12:58:09 [core.py:71] Initializing a V1 LLM engine (v0.10.0) with config: "
             + _engine_config_0100(method="eagle")]
    rec = sa.find_server_args(lines)
    assert (rec.algorithm, rec.algorithm_raw, rec.version) == ("eagle", "eagle", "0.10.0")


def test_vllm_logo_version_line(tmp_path):
    lines = [vllm_prefix("startup.py:38") + "\n", " \x1b[93m▄▄\x1b[0m \x1b[94m▄█\x1b[0m \x1b[1m█     █     █ ▀▄▀ █"
             "\x1b[0m  version \x1b[1m0.31.0\x1b[0m\n",
             vllm_prefix("api_utils.py:110") + "non-default args: {'model_tag': 'm'}\n"]
    rec = sa.find_server_args(lines)
    assert rec.version == "0.31.0" and not rec.speculative and rec.model == "m"


def test_last_start_wins_and_starts_are_counted(tmp_path):
    first = (ARGS_FIX / "sglang_0.5.5_args.log").read_text().splitlines()[1]
    second = SGL + "server_args=ServerArgs(model_path='m2', speculative_algorithm='EAGLE', pp_size=1)"
    path = tmp_path / "restart.log.gz"
    path.write_bytes(gzip.compress(f"{first}\nsome line\n{second}\n".encode()))
    rec = sa.find_server_args(path)
    assert rec.model == "m2" and rec.starts == 2 and rec.line_no == 3


def test_no_arguments_line_gives_none():
    assert sa.find_server_args(FIX / "vllm_0.33.log").model == TARGET
    assert sa.find_server_args(["Decode batch, #running-req: 1", "hello"]) is None
    assert sa.parse_server_args_line("[2026-11-29 10:00:00] Load weight end. server_args=ServerArgs(a=1)") is None
    assert sa.parse_server_args_line(vllm_prefix("x.py:1") + "vLLM API server version 0.10.0") is None
    with pytest.raises(ForensicsError, match="unknown engine"):
        sa.parse_server_args_line("x", engine="trtllm")


def test_engine_filter():
    line = (ARGS_FIX / "sglang_0.5.23_args.log").read_text().splitlines()[1]
    assert sa.parse_server_args_line(line, engine="vllm") is None
    assert sa.parse_server_args_line(line, engine="sglang").engine == "sglang"


@pytest.mark.parametrize("raw, norm", [
    ("EAGLE3", "eagle3"), ("eagle3", "eagle3"), ("EAGLE", "eagle"), ("NEXTN", "nextn"), ("deepseek_mtp", "mtp"),
    ("qwen3_next_mtp", "mtp"), ("mtp", "mtp"), ("[ngram]", "ngram"), ("<SpeculativeAlgorithm.EAGLE3: 3>", "eagle3"),
    (None, None), ("None", None), ("", None), ("DFLASH", "dflash"),
])
def test_normalise_algorithm(raw, norm):
    assert sa.normalise_algorithm(raw) == norm


# ---- never mixed with metrics -------------------------------------------------------------------

def test_args_lines_are_never_counted_as_metrics(tmp_path):
    """Strings inside the arguments that look like data lines must not become rows (they did before)."""
    decoy = "Decode batch, #running-req: 1, #token: 9, token usage: 0.01, accept len: 9.99, accept rate: 0.99, " \
            "cuda graph: True, gen throughput (token/s): 999.00, #queue-req: 0"
    spec = "SpecDecoding metrics: Mean acceptance length: 9.99, Accepted: 9 tokens, Drafted: 9 tokens, " \
           "Avg Draft acceptance rate: 99.9%"
    tput = "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 999.0 tokens/s, Running: 1 reqs"
    sgl = tmp_path / "sgl.log"
    sgl.write_text(SGL + f"server_args=ServerArgs(model_path='m', chat_template={decoy!r}, "
                   "speculative_algorithm='EAGLE3')\n")
    vll = tmp_path / "vllm.log"
    vll.write_text(vllm_prefix("utils.py:233") + f"non-default args: {{'model_tag': 'm', 'chat_template': {spec!r}, "
                   f"'served_model_name': [{tput!r}]}}\n")
    for path, engine in ((sgl, "sglang"), (vll, "vllm")):
        df = parse_log(path)
        assert df.empty and df.attrs["server_args"].engine == engine


def test_metrics_lines_are_never_read_as_arguments():
    for name in ("sglang_0.4_baseline.log", "sglang_0.5.5_broken.log", "sglang_0.5.23_fixed.log", "vllm_0.33.log"):
        lines = (FIX / name).read_text().splitlines()
        args = [i for i, line in enumerate(lines, 1) if sa.is_args_line(line)]
        assert args == [2], name  # the fixture's arguments line, nothing else
        df = parse_log(FIX / name)
        assert not set(df["line"]) & set(args)


# ---- hostile lines -----------------------------------------------------------------------------

HOSTILE = {
    "unbalanced": SGL + "server_args=ServerArgs(model_path='m', lora_paths=[1, 2, (3, ",
    "unterminated string": SGL + "server_args={'model_path': 'm" + "\\'" * 50_000,
    "deep list": SGL + "server_args={'a': " + "[" * 50_000 + "]" * 50_000 + "}",
    "deep call": SGL + "server_args=ServerArgs(a=" + "f(" * 20_000 + ")" * 20_000 + ")",
    "deep opaque": SGL + "server_args={'a': " + "<" * 100_000 + "}",
    "not a dict": vllm_prefix("utils.py:1") + "non-default args: {1, 2, 3}",
    "trailing junk": SGL + "server_args={'a': 1} and more",
    "bad escape": SGL + "server_args={'a': '\\N{NO SUCH NAME}'}",
    "bare words": vllm_prefix("utils.py:1") + "non-default args: {'a': meta-llama/Llama}",
    "engine config unbalanced": "INFO 11-29 12:58:09 [core.py:1] Initializing a V1 LLM engine (v0.10.0) with "
                                "config: model='m', speculative_config=SpeculativeConfig(method='eagle3'))",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_lines_give_none_or_one_line_error(name):
    line = HOSTILE[name]
    assert sa.parse_server_args_line(line) is None
    with pytest.raises(ForensicsError) as info:
        sa.parse_server_args_line(line, strict=True, line_no=7)
    assert "\n" not in str(info.value) and "damaged arguments line 7" in str(info.value)
    scanner = sa.ServerArgsScanner()
    assert scanner.feed(7, line) is True and scanner.result() is None and scanner.damaged[0][0] == 7


def test_huge_line_is_refused_without_parsing():
    line = SGL + "server_args={" + "'k': 1, " * 200_000 + "}"
    assert len(line) > sa.MAX_ARGS_LINE
    assert sa.parse_server_args_line(line) is None
    with pytest.raises(ForensicsError, match="longer than 1024 KiB"):
        sa.parse_server_args_line(line, strict=True)


def test_non_utf8_nul_and_control_characters():
    raw = (SGL + "server_args=ServerArgs(model_path='/m/\xff\xfe', tp_size=2, speculative_algorithm='EAGLE3', "
           "speculative_draft_model_path='/d\x00\x1b[31m')").encode("latin-1")
    rec = sa.parse_server_args_line(raw)
    assert rec.model == "/m/\ufffd\ufffd" and rec.tp == 2
    assert "\x1b" not in rec.describe() and "\\x00" in rec.describe()  # printable for the terminal


def test_truncated_real_lines_never_raise():
    """Every prefix of a full 0.5.23 and 0.5.5 line: a record or None, never an exception."""
    for release in ("0.5.23", "0.5.5"):
        line = (ARGS_FIX / f"sglang_{release}_args.log").read_text().splitlines()[1]
        for cut in range(line.index("server_args=") + 24, len(line), 97):
            assert sa.parse_server_args_line(line[:cut]) is None
            with pytest.raises(ForensicsError):
                sa.parse_server_args_line(line[:cut], strict=True)


def test_values_keep_their_types():
    value = parse_repr("{'a': None, 'b': True, 'c': -1.5e-3, 'd': inf, 'e': -inf, 'f': (1,), 'g': frozenset({1}), "
                       "'h': {1, 2}, 'i': b'x', 'j': PosixPath('/p'), 'k': <Foo.BAR: 'x'>, 'l': 1_000, "
                       "'m': [], 'n': {}, 'o': set(), 'p': 'it\\'s', 'q': r'\\d'}")
    assert value["a"] is None and value["b"] is True and value["c"] == -1.5e-3 and value["d"] == float("inf")
    assert value["e"] == float("-inf") and value["f"] == (1,) and value["h"] == frozenset({1, 2})
    assert value["g"] == {"__call__": "frozenset", "__args__": [frozenset({1})]} and value["i"] == "x"
    assert value["j"] == {"__call__": "PosixPath", "__args__": ["/p"]} and value["k"] == "<Foo.BAR: 'x'>"
    assert value["l"] == 1000 and value["m"] == [] and value["n"] == {} and value["o"] == {"__call__": "set"}
    assert value["p"] == "it's" and value["q"] == "\\d"
    assert split_assignments("a=1, b=x/y, c=F(d=2, e='f, g=h')") == [("a", "1"), ("b", "x/y"), ("c", "F(d=2, e='f, g=h')")]
    with pytest.raises(ReprError, match="unclosed"):
        split_assignments("a=1, b=(2")
    with pytest.raises(ReprError, match="unbalanced"):
        split_assignments("a=1), b=2")


def test_formats_table_covers_every_supported_release_start():
    rows = sa.describe_formats()
    assert {(r["engine"], r["since"]) for r in rows} >= {("sglang", "0.4.0"), ("sglang", "0.5.19"), ("vllm", "0.10.0")}
    assert all(".py" in r["where"] for r in rows)
