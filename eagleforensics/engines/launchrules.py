"""Launch rules as data: which algorithm an EAGLE-3 drafter needs, what a missing draft path or PP does, per engine version.

The facts ``doctor`` checks a server's arguments line against (``engines.serverargs``), each row
citing the released wheel version and file it was read from (``pip download --no-deps``; SGLang
0.4.0 - 0.5.23 and vLLM 0.10.0 - 0.33.0, every release unless a row says which were read; vLLM 0.34.0 read for
every row reaching 0.33.0). Rows
hold from ``since`` to ``until`` (the last release read where the row holds; None: to the newest
known); a version between two rows takes the earlier row.

* ``ALGORITHM_RULES``: the speculative algorithm names each engine accepts, and the one an
  EAGLE-3 drafter needs (SGLang ``EAGLE3``, vLLM ``eagle3``).
* ``LAUNCH_FACTS``: per topic what the engine does: an EAGLE-3 drafter launched as EAGLE
  (``eagle-for-eagle3``), no draft path (``draft-path-missing``), vLLM without a method
  (``method-omitted``), pipeline parallelism and the aux states of non-last stages (``pp-aux``).
* ``PP_SPLITS``: how each engine splits the decoder layers over pipeline stages.
* ``STATS_INTERVALS``: how often each engine prints its decode/metrics lines.

``aux_survives_pp``, ``pp_stage_of_layers``, ``pp_stage_of_position``, ``eagle3_algorithm`` and
``decode_log_interval`` are the appliers ``doctor``, ``plan`` and ``logs`` call.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from ..errors import ForensicsError
from .rules import NEWEST, family_of, parse_version, row_at

ENGINES = ("sglang", "vllm")
OUTCOMES = ("survives", "drops", "rejected", "unsupported")


@dataclass(frozen=True)
class AlgorithmRow:
    """The algorithm names an engine accepts from ``since`` on, and which one EAGLE-3 needs."""

    engine: str
    since: str
    until: str | None
    accepted: tuple[str, ...]
    eagle3: str | None  # the name an EAGLE-3 drafter needs; None: no EAGLE-3 in this range
    eagle: str | None
    aliases: tuple[tuple[str, str], ...]  # (given, what the engine runs)
    source: str


@dataclass(frozen=True)
class LaunchFact:
    """What one engine does in one launch situation (``topic``), for some model families."""

    topic: str
    engine: str
    since: str
    until: str | None
    outcome: str
    detail: str
    source: str
    families: tuple[str, ...] = ()  # empty: every family
    capture_point: str | None = None  # pp-aux: "before-layer" (p on the stage of layer p) or "after-layer"


@dataclass(frozen=True)
class PPSplit:
    """How the layers are split over pipeline stages from ``since`` on (``rule`` names the split)."""

    engine: str
    since: str
    until: str | None
    rule: str  # "last-gets-rest" | "extra-to-last" | "extra-to-second-last-backwards"
    env: str  # the environment variable that overrides the split with a comma list
    source: str


@dataclass(frozen=True)
class StatsInterval:
    """How often an engine prints its decode (SGLang) or metrics (vLLM) lines."""

    engine: str
    since: str
    until: str | None
    unit: str  # "decode batches" | "seconds"
    default: float
    setting: str
    detail: str
    source: str


_SGL = "sglang {v} python/sglang/srt/{f}"
_VLLM = "vllm {v} vllm/{f}"

ALGORITHM_RULES: tuple[AlgorithmRow, ...] = (
    AlgorithmRow("sglang", "0.4.0", "0.4.0", (), None, None, (),
                 _SGL.format(v="0.4.0", f="server_args.py") + ": no speculative_algorithm field"),
    AlgorithmRow("sglang", "0.4.3", "0.4.3", ("EAGLE",), None, "EAGLE", (),
                 _SGL.format(v="0.4.3", f="server_args.py") + ' choices=["EAGLE"]; speculative/spec_info.py '
                 "(0.4.1, 0.4.2, 0.4.4, 0.4.5 not read)"),
    AlgorithmRow("sglang", "0.4.6", "0.5.1.post3", ("EAGLE", "EAGLE3", "NEXTN"), "EAGLE3", "EAGLE",
                 (("NEXTN", "EAGLE"),),
                 _SGL.format(v="0.4.6 - 0.5.1.post3", f="server_args.py") + ': choices=["EAGLE", "EAGLE3", '
                 '"NEXTN"]; __post_init__ turns NEXTN into EAGLE, so the logged args say EAGLE'),
    AlgorithmRow("sglang", "0.5.2", "0.5.2", ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE"), "EAGLE3", "EAGLE",
                 (("NEXTN", "EAGLE"),), _SGL.format(v="0.5.2", f="server_args.py") + " choices"),
    AlgorithmRow("sglang", "0.5.3", "0.5.10.post1", ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"),
                 "EAGLE3", "EAGLE", (("NEXTN", "EAGLE"),),
                 _SGL.format(v="0.5.3 - 0.5.10.post1", f="server_args.py") + " choices"),
    AlgorithmRow("sglang", "0.5.11", "0.5.11", ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH"),
                 "EAGLE3", "EAGLE", (("NEXTN", "EAGLE"),),
                 _SGL.format(v="0.5.11", f="speculative/spec_info.py") + " SpeculativeAlgorithm members"),
    AlgorithmRow("sglang", "0.5.12", "0.5.15.post1",
                 ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "FROZEN_KV_MTP"),
                 "EAGLE3", "EAGLE", (("NEXTN", "EAGLE"),),
                 _SGL.format(v="0.5.12 - 0.5.15.post1", f="speculative/spec_info.py") + " members"),
    AlgorithmRow("sglang", "0.5.16", "0.5.19",
                 ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "FROZEN_KV_MTP"),
                 "EAGLE3", "EAGLE", (("NEXTN", "EAGLE"),),
                 _SGL.format(v="0.5.16 - 0.5.19", f="speculative/spec_info.py") + " members"),
    AlgorithmRow("sglang", "0.5.20", None,
                 ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "FROZEN_KV_MTP", "UNO"),
                 "EAGLE3", "EAGLE", (("NEXTN", "EAGLE"),),
                 _SGL.format(v="0.5.20 - 0.5.23", f="speculative/spec_info.py") + " members; "
                 "arg_groups/speculative_hook.py resolves NEXTN to EAGLE (0.5.23)"),
    AlgorithmRow("vllm", "0.10.0", "0.10.1.1",
                 ("ngram", "eagle", "eagle3", "medusa", "mlp_speculator", "draft_model", "deepseek_mtp"),
                 "eagle3", "eagle", (("[ngram]", "ngram"),),
                 _VLLM.format(v="0.10.0", f="config.py") + " SpeculativeMethod; 0.10.1.1 config/__init__.py"),
    AlgorithmRow("vllm", "0.10.2", None,
                 ("ngram", "eagle", "eagle3", "medusa", "mlp_speculator", "draft_model", "mtp", "suffix",
                  "dflash"),
                 "eagle3", "eagle", (("[ngram]", "ngram"), ("deepseek_mtp", "mtp")),
                 _VLLM.format(v="0.10.2 - 0.33.0, 0.34.0", f="config/speculative.py") + " SpeculativeMethod "
                 "(eagle and eagle3 in every release; *_mtp methods are folded into mtp in 0.33.0; the accepted list "
                 "is the 0.11.0 - 0.29.0 one: medusa and mlp_speculator are gone by 0.33.0, which adds custom_class, "
                 "dspark, extract_hidden_states and ngram_gpu (0.25.0 on); 0.34.0 drops custom_class)"),
)

_EAGLE_AS_EAGLE3_SGL = (
    "EAGLE captures no aux states: the target's layers are marked for capture only when the "
    "algorithm is EAGLE3, and the EAGLE-3 draft's fc is skipped when its input width equals the "
    "hidden size (llama_eagle3.py: `if hidden_states.shape[-1] != embeds.shape[-1]`), so the "
    "drafter silently reads the last hidden state alone")
_EAGLE_AS_EAGLE3_VLLM = (
    "method 'eagle' captures no aux states (use_aux_hidden_state_outputs is set only for "
    "eagle3) and renames the draft architecture Eagle<arch>, an EAGLE-1 model")

LAUNCH_FACTS: tuple[LaunchFact, ...] = (
    LaunchFact("eagle-for-eagle3", "sglang", "0.4.6", None, "no-aux", _EAGLE_AS_EAGLE3_SGL,
               _SGL.format(v="0.4.6, 0.5.5", f="model_executor/model_runner.py") + " (is_eagle3() gate); "
               + _SGL.format(v="0.5.23", f="model_executor/model_runner_components/spec_aux_hidden_state.py")
               + "; models/llama_eagle3.py 0.4.6, 0.5.23"),
    LaunchFact("eagle-for-eagle3", "vllm", "0.10.0", None, "no-aux", _EAGLE_AS_EAGLE3_VLLM,
               _VLLM.format(v="0.10.0, 0.33.0", f="v1/worker/gpu_model_runner.py") + "; "
               + _VLLM.format(v="0.33.0, 0.34.0", f="transformers_utils/configs/eagle.py") + "; "
               + _VLLM.format(v="0.34.0", f="v1/worker/gpu/spec_decode/eagle/config.py") + " (V1 gone: only "
               "Eagle3SpeculatorConfig says uses_aux_hidden_states, EagleSpeculatorConfig keeps the base's False; "
               "an EAGLE-3 drafter class declares no speculator_config_class, so method 'eagle' is not refused)"),
    LaunchFact("method-omitted", "vllm", "0.10.0", "0.10.1.1", "eagle",
               "without 'method' a draft whose name contains 'eagle-' or 'eagle3-' runs as 'eagle': an "
               "EAGLE-3 drafter named EAGLE3-... is launched as EAGLE-1",
               _VLLM.format(v="0.10.0", f="config.py") + ", 0.10.1.1 config/__init__.py SpeculativeConfig"),
    LaunchFact("method-omitted", "vllm", "0.10.2", None, "eagle3",
               "without 'method' a draft name with 'eagle-' runs as 'eagle', one with 'eagle3' as "
               "'eagle3'; any other name falls through to the draft config's model type",
               _VLLM.format(v="0.10.2, 0.33.0", f="config/speculative.py") + " SpeculativeConfig; "
               + _VLLM.format(v="0.34.0", f="v1/worker/gpu/spec_decode/speculator_config.py") + " "
               "_CHECKPOINT_DETECTION_ORDER (eagle by 'eagle-', eagle3 by 'eagle3' in the name, then dflash, "
               "dspark, mtp; else draft_model)"),
    LaunchFact("draft-path-missing", "sglang", "0.4.3", "0.4.6", "error",
               "the draft worker is built with None as its model path: the server fails at start",
               _SGL.format(v="0.4.3, 0.4.6", f="managers/tp_worker.py") + " ModelConfig(speculative_draft_model_path)"),
    LaunchFact("draft-path-missing", "sglang", "0.4.7", None, "target-as-draft",
               "MTP/NEXTN targets (DeepseekV3ForCausalLM and the other archs the engine lists) get the "
               "target path as draft path by design, so the logged args show draft == model; for any "
               "other target ModelConfig.from_server_args falls back to the target's model_path: the "
               "target is loaded as its own draft",
               _SGL.format(v="0.4.7, 0.5.13", f="managers/tp_worker.py") + "; configs/model_config.py "
               "from_server_args (model_path or server_args.model_path); server_args.py 0.4.10.post2 "
               "auto-sets the draft path for DeepseekV3ForCausalLM; arg_groups/speculative_hook.py 0.5.23"),
    LaunchFact("draft-path-missing", "vllm", "0.10.0", None, "error",
               "num_speculative_tokens without a draft model raises at start, except MTP (the target "
               "carries its draft layers: the target path is used) and model-free methods (ngram, suffix)",
               _VLLM.format(v="0.10.0", f="config.py") + "; " + _VLLM.format(v="0.33.0", f="config/speculative.py")
               + "; " + _VLLM.format(v="0.34.0", f="v1/worker/gpu/spec_decode/speculator_config.py") + " "
               "DraftModelSpeculatorConfig.default_model raises; mtp/config.py takes the target"),
    # Pipeline parallelism: do the aux states captured on non-last stages reach the drafter?
    LaunchFact("pp-aux", "sglang", "0.4.0", "0.4.6", "unsupported", "no pipeline parallelism (no pp_size)",
               _SGL.format(v="0.4.0, 0.4.6", f="server_args.py")),
    LaunchFact("pp-aux", "sglang", "0.4.7", "0.5.19", "rejected",
               "pp_size > 1 with any speculative algorithm fails an assertion at start ('Pipeline "
               "parallelism is not compatible with overlap schedule, speculative decoding'); models "
               "mark capture layers only on the last stage (set_eagle3_layers_to_capture returns on "
               "other ranks)", _SGL.format(v="0.4.7 - 0.5.18", f="server_args.py") + " check_server_args; "
               "0.5.19 arg_groups/validation_hook.py; models/llama.py 0.4.7, 0.5.5", capture_point="before-layer"),
    LaunchFact("pp-aux", "sglang", "0.5.20", None, "rejected",
               "PP with speculative decoding is allowed for EAGLE only (NPU in 0.5.20; "
               "SGLANG_ENABLE_PP_SPEC or PD prefill from 0.5.21); EAGLE3 with pp_size > 1 fails at start "
               "('Pipeline parallelism currently only supports EAGLE (non-multi-layer)')",
               _SGL.format(v="0.5.20 - 0.5.23", f="arg_groups/validation_hook.py") + " check_pipeline_parallel_compat",
               capture_point="before-layer"),
    LaunchFact("pp-aux", "vllm", "0.10.0", "0.17.1", "drops",
               "the capture loop compares ids with a stage-local enumerate() that restarts at 0, and "
               "non-last stages return IntermediateTensors without the aux states: only ids below the "
               "last stage's layer count are captured, as layers start+id (vllm-project/vllm#36151)",
               _VLLM.format(v="0.10.0 - 0.17.1", f="model_executor/models/llama.py") + " (qwen2.py from "
               "0.10.1.1)", families=("llama", "qwen2", "qwen3", "qwen_moe"), capture_point="before-layer"),
    LaunchFact("pp-aux", "vllm", "0.18.0", "0.29.0", "drops",
               "the same stage-local enumerate() and aux states left out of IntermediateTensors "
               "(capture now after layer idx, as idx + 1); from 0.22.0 the V2 runner refuses EAGLE3 with "
               "PP and vLLM falls back to the V1 runner, which drops them",
               _VLLM.format(v="0.18.0 - 0.29.0", f="model_executor/models/llama.py") + " and models/interfaces.py "
               "_maybe_add_hidden_state; config/vllm.py 0.22.0 - 0.29.0 'EAGLE3 with pipeline parallelism'",
               families=("llama", "qwen2", "qwen3", "qwen_moe"), capture_point="after-layer"),
    LaunchFact("pp-aux", "vllm", "0.30.0", None, "survives",
               "enumerate(start=start_layer) and the aux states packed into IntermediateTensors "
               "(pack_local_aux_hidden_states / collect_remote_aux_hidden_states), as proposed in "
               "vllm-project/vllm#36731 and #50514",
               _VLLM.format(v="0.30.0 - 0.33.0, 0.34.0", f="model_executor/models/llama.py") + ", qwen2.py, "
               "interfaces.py",
               families=("llama", "qwen2", "qwen3", "qwen_moe"), capture_point="after-layer"),
    LaunchFact("pp-aux", "vllm", "0.10.0", "0.17.1", "unsupported",
               "DeepSeek targets have no EAGLE-3 aux capture", _VLLM.format(v="0.10.0 - 0.17.1",
               f="model_executor/models/deepseek_v2.py"), families=("deepseek",)),
    LaunchFact("pp-aux", "vllm", "0.18.0", None, "drops",
               "layer ids are global (enumerate(start=start_layer)) but non-last stages return "
               "IntermediateTensors without the aux states",
               _VLLM.format(v="0.18.0 - 0.33.0, 0.34.0", f="model_executor/models/deepseek_v2.py"),
               families=("deepseek",), capture_point="before-layer"),
)

PP_SPLITS: tuple[PPSplit, ...] = (
    PPSplit("sglang", "0.4.0", "0.5.5.post3", "last-gets-rest", "SGLANG_PP_LAYER_PARTITION",
            _SGL.format(v="0.4.0 - 0.5.5.post3", f="distributed/utils.py") + " get_pp_indices: N // pp layers "
            "each, the last stage up to N"),
    PPSplit("sglang", "0.5.6", None, "extra-to-last", "SGLANG_PP_LAYER_PARTITION",
            _SGL.format(v="0.5.6 - 0.5.23", f="distributed/utils.py") + " get_pp_indices: the last N % pp "
            "stages get one extra layer"),
    PPSplit("vllm", "0.10.0", None, "extra-to-second-last-backwards", "VLLM_PP_LAYER_PARTITION",
            _VLLM.format(v="0.10.0 - 0.33.0, 0.34.0", f="distributed/utils.py") + " get_pp_indices: N // pp each, "
            "the N % pp extra layers go to stages -2, -3, ... (the last stage keeps the norm)"),
)

STATS_INTERVALS: tuple[StatsInterval, ...] = (
    StatsInterval("sglang", "0.4.0", None, "decode batches", 40, "decode_log_interval",
                  "one 'Decode batch' line each time the scheduler's decode-forward counter reaches a "
                  "multiple of decode_log_interval (the counter runs over all requests; with speculative "
                  "decoding one batch is one verify round)",
                  _SGL.format(v="0.4.0 - 0.5.23", f="server_args.py") + " decode_log_interval = 40 (0.5.17 on "
                  "arg_groups/fields/observability.py); managers/scheduler.py 0.4.0, "
                  "scheduler_output_processor_mixin.py 0.4.6 - 0.5.9, "
                  "scheduler_components/metrics_reporter.py 0.5.13 - 0.5.23"),
    StatsInterval("vllm", "0.10.0", "0.10.0", "seconds", 10.0, "fixed",
                  "the API server logs the throughput and SpecDecoding metrics lines every 10 s; an "
                  "interval with no prompt or generation tokens (and none in the one before) is logged at "
                  "DEBUG; --disable-log-stats turns them off",
                  _VLLM.format(v="0.10.0", f="entrypoints/openai/api_server.py") + " lifespan _force_log "
                  "sleep(10.); v1/metrics/loggers.py LoggingStatLogger.log"),
    StatsInterval("vllm", "0.10.1.1", None, "seconds", 10.0, "VLLM_LOG_STATS_INTERVAL",
                  "every VLLM_LOG_STATS_INTERVAL seconds (10 by default); an interval with no prompt or "
                  "generation tokens (and none in the one before) is logged at DEBUG; --disable-log-stats "
                  "turns them off",
                  _VLLM.format(v="0.10.1.1 - 0.33.0, 0.34.0", f="entrypoints") + " _force_log sleep(envs."
                  "VLLM_LOG_STATS_INTERVAL); envs.py default 10.0; v1/metrics/loggers.py engine_is_idle"),
)


# --- lookups -----------------------------------------------------------------------------------

def engine_name(engine: str) -> str:
    """``engine`` as the release tables name it (sglang, vllm); another name is one line (the log-read engines)."""
    eng = str(engine).strip().lower()
    if eng not in ENGINES:
        raise ForensicsError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    return eng


def _pick(rows: Sequence, engine: str, version: str | None, **match: object):
    """The row with the greatest ``since`` <= version (None: the newest) among this engine's matching rows."""
    eng = engine_name(engine)
    ver = parse_version(version if version is not None else NEWEST[eng])
    return row_at([r for r in rows if r.engine == eng and all(
        (getattr(r, k) == v if not isinstance(getattr(r, k), tuple) else (not getattr(r, k) or v in getattr(r, k)))
        for k, v in match.items())], str(ver))


def algorithm_rule(engine: str, version: str | None = None) -> AlgorithmRow | None:
    """The algorithm row for ``engine`` at ``version`` (None: newest known); None before any row."""
    return _pick(ALGORITHM_RULES, engine, version)


def eagle3_algorithm(engine: str, version: str | None = None) -> str | None:
    """The algorithm name an EAGLE-3 drafter needs (SGLang 'EAGLE3', vLLM 'eagle3'); None if the release has none."""
    row = algorithm_rule(engine, version)
    return row.eagle3 if row else None


def launch_fact(topic: str, engine: str, version: str | None = None,
                model_type: str | None = None) -> LaunchFact | None:
    """The fact for ``topic`` on ``engine`` at ``version`` for the family of ``model_type`` (Llama when None)."""
    family = family_of(model_type) if model_type else "llama"
    rows = [r for r in LAUNCH_FACTS if r.topic == topic]
    return _pick(rows, engine, version, families=family)


def aux_survives_pp(engine: str, version: str | None = None,
                    model_type: str | None = None) -> tuple[bool | None, str]:
    """Whether aux states captured on non-last pipeline stages reach the drafter, and the source.

    (True, src): they do; (False, src): they are dropped; (None, src): the engine refuses EAGLE-3
    with pipeline parallelism at start, or the release has no such capture (the source says which),
    or no row covers this engine/family.
    """
    fact = launch_fact("pp-aux", engine, version, model_type)
    if fact is None:
        return None, f"no pipeline-parallel rule for {engine} {version or 'newest'} ({model_type or 'llama'})"
    verdict = {"survives": True, "drops": False}.get(fact.outcome)
    return verdict, f"{fact.outcome}: {fact.detail} [{fact.source}]"


def _split(engine: str, version: str | None) -> PPSplit:
    row = _pick(PP_SPLITS, engine, version)
    if row is None:
        raise ForensicsError(f"no pipeline split rule for {engine} {version}")
    return row


def pp_stage_of_layers(engine: str, version: str | None, num_layers: int, pp: int,
                       partition: Sequence[int] | None = None) -> list[range]:
    """The decoder layers each pipeline stage runs, as the engine's ``get_pp_indices`` splits them.

    ``partition`` stands for the engine's ``*_PP_LAYER_PARTITION`` list (layers per stage), which
    overrides the split; it must have ``pp`` entries summing to ``num_layers``.
    """
    n, stages = int(num_layers), int(pp)
    if n < 1 or stages < 1:
        raise ForensicsError(f"num_layers and pp must be positive, got {num_layers} and {pp}")
    row = _split(engine, version)
    if partition is not None:
        parts = [int(p) for p in partition]
        if len(parts) != stages or sum(parts) != n or min(parts) < 0:
            raise ForensicsError(f"{row.env} {list(partition)} does not split {n} layers into {stages} stages")
    elif row.rule == "last-gets-rest":
        parts = [n // stages] * stages
        parts[-1] = n - (n // stages) * (stages - 1)
    elif row.rule == "extra-to-last":
        base, rest = divmod(n, stages)
        parts = [base + (1 if i >= stages - rest else 0) for i in range(stages)]
    else:  # vLLM: the remainder goes to stages -2, -3, ... (wrapping to the first when rest == stages - 1)
        base, rest = divmod(n, stages)
        parts = [base] * stages
        for i in range(2, rest + 2):
            parts[-i] += 1
    out, start = [], 0
    for size in parts:
        out.append(range(start, start + size))
        start += size
    return out


def pp_stage_of_position(engine: str, version: str | None, num_layers: int, pp: int, position: int,
                         model_type: str | None = None, partition: Sequence[int] | None = None) -> int | None:
    """The stage whose forward captures residual-stream position ``position`` (0..N), None if none does.

    Before-layer capture (SGLang; vLLM up to 0.17.1): position p is taken on the stage that runs
    layer p, so p = N is never captured. After-layer capture (vLLM 0.18.0 on): position p >= 1 is
    taken after layer p - 1 on the stage that runs it, p = 0 on the first stage.
    """
    stages = pp_stage_of_layers(engine, version, num_layers, pp, partition)
    fact = launch_fact("pp-aux", engine, version, model_type)
    point = (fact.capture_point if fact is not None else None) or "before-layer"
    p = int(position)
    if p < 0 or p > num_layers:
        return None
    layer = p if point == "before-layer" else p - 1
    if point == "after-layer" and p == 0:
        return 0
    for i, r in enumerate(stages):
        if layer in r:
            return i
    return None


def stats_interval(engine: str, version: str | None = None) -> StatsInterval | None:
    """The row saying how often ``engine`` prints its decode/metrics lines at ``version``."""
    return _pick(STATS_INTERVALS, engine, version)


def decode_log_interval(engine: str, version: str | None = None) -> int | None:
    """SGLang's default ``decode_log_interval`` at ``version`` (40 in every release read); None for vLLM."""
    row = stats_interval(engine, version)
    return int(row.default) if row is not None and row.unit == "decode batches" else None


def describe_launch_rules() -> list[dict]:
    """Every row of the four tables as a dict (with its table name), for docs and JSON."""
    out = []
    for table, rows in (("ALGORITHM_RULES", ALGORITHM_RULES), ("LAUNCH_FACTS", LAUNCH_FACTS),
                        ("PP_SPLITS", PP_SPLITS), ("STATS_INTERVALS", STATS_INTERVALS)):
        out += [{"table": table, **asdict(r)} for r in rows]
    return out


# vLLM's runner for EAGLE-3 with pipeline parallelism: use_v2_model_runner turns V2 off and logs the fallback
# ('Model Runner V2 does not yet support ...; using the V1 model runner instead'), vllm 0.29.0
# vllm/config/vllm.py use_v2_model_runner and _get_v2_model_runner_unsupported_features ('EAGLE3 with pipeline
# parallelism'); the releases 0.22.0 - 0.29.0 as the pp-aux row above cites them
PP_V1_FALLBACK = ("0.22.0", "0.29.0")
PP_V1_SOURCE = ("vllm 0.29.0 vllm/config/vllm.py use_v2_model_runner, _get_v2_model_runner_unsupported_features "
                "('EAGLE3 with pipeline parallelism'); 0.22.0 - 0.29.0")
V1_FALLBACK_LINE = "using the V1 model runner instead"


def launch_runner(version: str | None, algorithm: str | None, pp: int | None, log_lines: Sequence[str] = ()
                  ) -> tuple[str | None, str]:
    """The vLLM model runner one launch runs, when the log or the release decides it: ``(runner, why)``.

    The log's own fallback line wins ("Model Runner V2 does not yet support X; using the V1 model runner
    instead"); else an EAGLE-3 launch with pp_size > 1 on a release that refuses it on V2 runs V1. ``(None, '')``
    when neither says (the release's default for the model applies).
    """
    for line in log_lines:
        if V1_FALLBACK_LINE in line:
            what = line.split("does not yet support", 1)[-1].split(";", 1)[0].strip() if "does not yet support" \
                in line else "a feature V2 lacks"
            return "v1", f"the log says vLLM fell back to the V1 runner ({what})"
    if algorithm == "eagle3" and pp and pp > 1 and version:
        try:
            v = parse_version(version)
            inside = parse_version(PP_V1_FALLBACK[0]) <= v <= parse_version(PP_V1_FALLBACK[1])
        except ForensicsError:
            inside = False
        if inside:
            return "v1", (f"vLLM {PP_V1_FALLBACK[0]} - {PP_V1_FALLBACK[1]} run EAGLE3 with pipeline parallelism on "
                          f"the V1 runner ({PP_V1_SOURCE})")
    return None, ""
