"""Where a serving path loses acceptance the drafter has: the usual suspects, sourced, and what a run's arguments say.

When the drafter and its wiring are right (replay expects a good accept length for the wiring the
engine feeds) and the server still accepts far less, the loss is in the serving path. The failure
catalogue (row 3, "bugs in the engine's serving path", 15 public threads) names where it was found;
each suspect here carries the threads it rests on and what to try. ``match_suspects`` reads a
run's launch arguments (``engines.serverargs.ServerArgs``) and says for each suspect whether this
run uses the feature (``matches``), does not (``ruled-out``), or the arguments line does not say
(``unknown``), quoting the setting.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..errors import printable

if TYPE_CHECKING:  # pragma: no cover
    from .serverargs import ServerArgs

MATCHES, RULED_OUT, UNKNOWN = "matches", "ruled-out", "unknown"


@dataclass(frozen=True)
class Suspect:
    """One known way a serving path loses acceptance: what, the public threads, what to try."""

    code: str
    what: str
    sources: tuple[str, ...]
    try_: str
    engine: str | None = None  # the one engine it concerns, None for both

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "what": self.what, "sources": list(self.sources), "try": self.try_,
                "engine": self.engine}


SUSPECTS: tuple[Suspect, ...] = (
    Suspect("cuda-graph", "the drafter left out of, or miscaptured in, the CUDA-graph capture (acceptance differs "
            "between graph and eager runs)", ("vllm-project/vllm#17504", "vllm-project/vllm#54997"),
            "run once with CUDA graphs toggled (SGLang --disable-cuda-graph, vLLM --enforce-eager) and compare the "
            "accept length"),
    Suspect("prefix-cache", "the prefix cache: EAGLE drops the last cached block (the drafter runs one token "
            "ahead) and hybrid layouts lose far more", ("vllm-project/vllm#17137", "vllm-project/vllm#51771"),
            "run once with the prefix cache off (SGLang --disable-radix-cache, vLLM --no-enable-prefix-caching)"),
    Suspect("pd-disaggregation", "prefill/decode disaggregation sent the target's hidden states (and fake top-k) to "
            "the decode side instead of the drafter's", ("sgl-project/sglang#10801", "sgl-project/sglang#10616"),
            "compare with a server without disaggregation; upgrade past the fix"),
    Suspect("tree", "topk > 1: the tree-verification path (attention backend, sliding-window metadata) has had "
            "bugs of its own", ("sgl-project/sglang#9658", "sgl-project/sglang#22679"),
            "compare with topk 1 (a chain) at the same step count"),
    Suspect("page-size", "a draft page table indexed in the wrong page size reads the KV cache as zeros",
            ("lightseekorg/tokenspeed#913",), "compare with page size 1", "sglang"),
    Suspect("model-runner-v2", "vLLM's V2 model runner (the default for every model from 0.29) has dropped drafter "
            "settings the V1 runner honours", ("vllm-project/vllm#40656",),
            "compare with VLLM_USE_V2_MODEL_RUNNER=0 (up to 0.33.0; 0.34.0 removed the V1 runner and refuses it: "
            "there, compare with the same drafter on 0.33.0)", "vllm"),
    Suspect("release", "a release regression: the same drafter accepts less on one engine release "
            "(Qwen-VL: 2.2 on SGLang 0.5.4, 1.0 on 0.5.5.post3)", ("vllm-project/vllm#26191",
                                                                   "sgl-project/SpecForge#310"),
            "run the same drafter on the previous (or next) release"),
    Suspect("chunked-prefill", "chunked prefill: at the end of a non-final chunk the drafter is handed the target's "
            "predicted token instead of the next prompt token, or is primed from the last chunk only, so long "
            "prompts accept less", ("sgl-project/sglang#26329", "sgl-project/sglang#26800",
                                    "vllm-project/vllm-ascend#3025"),
            "compare a run whose chunk size exceeds the longest prompt (SGLang --chunked-prefill-size, vLLM "
            "--max-num-batched-tokens), or with chunked prefill off (SGLang --chunked-prefill-size -1)"),
    Suspect("async-scheduling", "asynchronous scheduling (vLLM) or the overlap scheduler (SGLang): the next step is "
            "prepared before the accepted count is known, and fixes have traded acceptance for it",
            ("vllm-project/vllm-ascend#11215", "vllm-project/vllm#37150", "vllm-project/vllm-ascend#8230"),
            "run once with it off (vLLM --no-async-scheduling, SGLang --disable-overlap-schedule) and compare the "
            "accept length"),
    Suspect("attention-backend", "the attention backend of the target or the draft: the same drafter has accepted "
            "less on one backend than another (2.6 against 2.35, flashinfer-mla against triton; docs/causes.md "
            "row 29)",
            ("sgl-project/sglang#4724",),
            "run once with another backend (SGLang --attention-backend / --speculative-draft-attention-backend, "
            "vLLM --attention-backend) and compare"),
    Suspect("verify-rule", "the acceptance rule at temperature > 0: greedy drafts verified as one-hot, or strict "
            "token matching, accept less as the temperature rises (3.19 against 2.66 with greedy draft sampling, "
            "docs/causes.md row 29; vLLM chose argmax drafts knowing they lower acceptance at high temperature)",
            ("vllm-project/vllm#16899", "vllm-project/vllm#40551", "syv-ai/qwen38-27b-rtx3090#73",
             "sgl-project/sglang#26312"),
            "compare the accept length at temperature 0; where the release offers it, sample the drafts (vLLM "
            "speculative_config draft_sample_method 'probabilistic' (0.25 on) / 'gumbel' (0.21 - 0.24), SGLang "
            "--speculative-use-rejection-sampling with topk 1)"),
)


def _cuda_graph(args: ServerArgs) -> tuple[str, str]:
    flag = "disable_cuda_graph" if args.engine == "sglang" else "enforce_eager"
    if args.cuda_graph is None:
        return UNKNOWN, "the arguments line does not say whether CUDA graphs were on"
    how = " (the engine's default)" if "cuda_graph" in args.inferred else ""
    if args.cuda_graph:
        return MATCHES, f"CUDA graphs on in this run ({flag}=False{how})"
    return MATCHES, f"CUDA graphs off in this run ({flag}=True): the drafter ran eagerly; compare a run with graphs on"


def _prefix_cache(args: ServerArgs) -> tuple[str, str]:
    flag = "disable_radix_cache" if args.engine == "sglang" else "enable_prefix_caching"
    if args.prefix_cache is None:
        return UNKNOWN, "the arguments line does not say whether the prefix cache was on (vLLM's default decides)"
    if args.prefix_cache:
        value = "False" if args.engine == "sglang" else "True"
        return MATCHES, f"prefix cache on in this run ({flag}={value})"
    value = "True" if args.engine == "sglang" else "False"
    return RULED_OUT, f"prefix cache off in this run ({flag}={value})"


def _pd(args: ServerArgs) -> tuple[str, str]:
    if args.engine == "sglang":
        mode = args.raw.get("disaggregation_mode")
        if mode is None:
            return UNKNOWN, "the arguments line has no disaggregation_mode"
        if str(mode) in ("null", "None", ""):
            return RULED_OUT, "no disaggregation in this run (disaggregation_mode='null')"
        return MATCHES, f"this server is a disaggregated {printable(str(mode))} node (disaggregation_mode={printable(repr(mode))})"
    config = args.raw.get("kv_transfer_config")
    if config:
        return MATCHES, "this server was started with a kv_transfer_config (disaggregated prefill)"
    if args.source == "vllm-non-default":
        return RULED_OUT, "no kv_transfer_config among the non-default arguments"
    return UNKNOWN, "the arguments line does not show kv_transfer_config"


def _tree(args: ServerArgs) -> tuple[str, str]:
    if args.topk is None:
        return UNKNOWN, "the arguments line does not give topk"
    if args.topk > 1:
        return MATCHES, f"this run speculates a tree (topk {args.topk}, {args.num_draft_tokens} draft tokens)"
    return RULED_OUT, "this run speculates a chain (topk 1)"


def _page_size(args: ServerArgs) -> tuple[str, str]:
    size = args.raw.get("page_size")
    if size is None:
        return UNKNOWN, "the arguments line does not give the page size"
    try:
        value = int(size)
    except (TypeError, ValueError):
        return UNKNOWN, f"page size {printable(str(size))!r} is not a number"
    if value > 1:
        return MATCHES, f"page size {value} in this run"
    return RULED_OUT, f"page size {value} in this run"


def _runner(args: ServerArgs) -> tuple[str, str]:
    from .rules import V1_REMOVED, parse_version

    first = args.version or (args.version_range[0] if args.version_range else None)
    if first is None:
        return UNKNOWN, "the vLLM release is not in the log"
    try:
        v = parse_version(first)
    except Exception:  # a version text we cannot order: say so instead of guessing
        return UNKNOWN, f"vLLM release {printable(first)!r} not understood"
    exact = args.version is not None
    if v >= parse_version(V1_REMOVED):
        return MATCHES, (f"vLLM {first}" if exact else f"vLLM >= {first}") + \
            f": the V2 model runner, the only one (V1 removed in {V1_REMOVED}: vllm/platforms/interface.py)"
    if v >= parse_version("0.29.0"):
        return MATCHES, (f"vLLM {first}" if exact else f"vLLM >= {first}") + \
            ": the V2 model runner by default (vllm/config/vllm.py use_v2_model_runner, 0.29.0 on)"
    if exact and v < parse_version("0.22.0"):
        return RULED_OUT, f"vLLM {first}: the V1 runner unless VLLM_USE_V2_MODEL_RUNNER=1"
    return UNKNOWN, f"vLLM {first}: the runner depends on the architecture (engines.rules RUNNER_RULES)"


def _release(args: ServerArgs) -> tuple[str, str]:
    hint = args.version or args.version_hint
    if hint:
        return MATCHES, f"this run: {printable(str(hint))}"
    return UNKNOWN, "the release is not in the log"


def _chunked_prefill(args: ServerArgs) -> tuple[str, str]:
    from .servingargs import chunked_prefill

    on, said = chunked_prefill(args)
    if on is None:
        return UNKNOWN, said
    if on:
        return MATCHES, f"chunked prefill on in this run ({said}): prompts longer than a chunk cross a chunk end"
    return RULED_OUT, f"chunked prefill off in this run ({said})"


def _first_version(args: ServerArgs) -> tuple[Any, bool] | None:
    from .rules import parse_version

    first = args.version or (args.version_range[0] if args.version_range else None)
    if first is None:
        return None
    try:
        return parse_version(first), args.version is not None
    except Exception:  # a version text we cannot order: the caller says unknown
        return None


def _async_scheduling(args: ServerArgs) -> tuple[str, str]:
    from .rules import parse_version
    from .servingargs import _get, _truthy

    if args.engine == "sglang":
        key, value = _get(args, "disable_overlap_schedule")
        flag = _truthy(value)
        if flag is None:
            return UNKNOWN, "the arguments line has no disable_overlap_schedule"
        if flag:
            return RULED_OUT, "overlap scheduler off in this run (disable_overlap_schedule=True)"
        return MATCHES, "overlap scheduler on in this run (disable_overlap_schedule=False, as resolved at start)"
    key, value = _get(args, "async_scheduling")
    flag = _truthy(value)
    if flag is not None:
        return (MATCHES, "async scheduling on in this run (async_scheduling=True)") if flag else \
            (RULED_OUT, "async scheduling off in this run (async_scheduling=False)")
    v = _first_version(args)
    if v is None:
        return UNKNOWN, "async_scheduling not set and the vLLM release is not in the log"
    version, exact = v
    if version >= parse_version("0.14.0"):
        if args.pp and args.pp > 1 and version < parse_version("0.17.0"):
            return RULED_OUT, (f"async_scheduling not set, pipeline_parallel_size {args.pp}: off "
                               "(vllm/config/vllm.py 0.14.0; no longer from 0.17.0)")
        return MATCHES, (f"vLLM {args.version}" if exact else f"vLLM >= {args.version_range[0]}") + \
            ": async_scheduling not set, so on by default for EAGLE methods (vllm/config/vllm.py 0.14.0 - 0.33.0, 0.34.0; " \
            "the log line 'Asynchronous scheduling is enabled/disabled', printed by 0.14.0 and 0.25.0 but no longer " \
            "by 0.29.0, 0.33.0 or 0.34.0, says what it resolved to)"
    if exact:
        return RULED_OUT, f"vLLM {args.version}: async scheduling off by default (config/scheduler.py 0.10.0 - 0.13.0)"
    return UNKNOWN, f"async_scheduling not set; its default depends on the release ({args.version_hint})"


def _attention_backend(args: ServerArgs) -> tuple[str, str]:
    from .servingargs import attention_backends

    named = attention_backends(args)
    if named:
        return MATCHES, "this run: " + ", ".join(f"{k}={printable(v)}" for k, v in named.items())
    return UNKNOWN, "no attention backend named in the arguments line (the engine picked its default for the GPU)"


def _verify_rule(args: ServerArgs) -> tuple[str, str]:
    from .servingargs import verify_settings
    from .servingrules import rules_between, serving_rule

    settings = verify_settings(args)
    shown = ", ".join(f"{k}={printable(repr(v))}" for k, v in settings.items())
    if args.version or args.version_range is None:
        rows = [r for r in [serving_rule("verify", args.engine, args.version)] if r is not None]
    else:
        rows = rules_between("verify", args.engine, args.version_range[0], args.version_range[1])
    rule = "; ".join(f"{r.engine} {r.span()}: {r.outcome} ({r.setting or 'default'})" for r in rows)
    lossy = []
    for key in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
        try:
            if key in settings and float(settings[key]) < 1.0:
                lossy.append(f"{key}={settings[key]} accepts more than the target's probabilities allow (lossy)")
        except (TypeError, ValueError):
            pass
    if str(settings.get("rejection_sample_method", "")).strip("'\"") in ("synthetic", "fly"):
        lossy.append(f"rejection_sample_method={settings['rejection_sample_method']} does not verify losslessly "
                     "(synthetic: accepts at configured rates)")
    sampled = (str(settings.get("draft_sample_method", "")).strip("'\"") in ("probabilistic", "gumbel") or
               settings.get("speculative_use_rejection_sampling") is True)
    if sampled and not lossy:
        return RULED_OUT, f"this run samples its drafts ({shown}): the ratio test uses the draft probabilities"
    return MATCHES, "; ".join(lossy + [f"this run: {shown or 'the release defaults'}; rule: {rule or 'none read'} "
                                       "(engines.servingrules); matters only for requests at temperature > 0"])


_CHECKS: dict[str, Callable[[Any], tuple[str, str]]] = {
    "cuda-graph": _cuda_graph, "prefix-cache": _prefix_cache, "pd-disaggregation": _pd, "tree": _tree,
    "page-size": _page_size, "model-runner-v2": _runner, "release": _release,
    "chunked-prefill": _chunked_prefill, "async-scheduling": _async_scheduling,
    "attention-backend": _attention_backend, "verify-rule": _verify_rule,
}


@dataclass(frozen=True)
class SuspectMatch:
    """A suspect with what this run's arguments say about it."""

    suspect: Suspect
    status: str
    this_run: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.suspect.to_dict(), "status": self.status, "this_run": self.this_run}


def match_suspects(args: ServerArgs | None) -> list[SuspectMatch]:
    """Every suspect with this run's setting, those the run matches first; without arguments all are ``unknown``."""
    out = []
    for s in SUSPECTS:
        if args is None:
            out.append(SuspectMatch(s, UNKNOWN, "the log has no arguments line"))
            continue
        if s.engine is not None and s.engine != args.engine:
            continue
        status, note = _CHECKS[s.code](args)
        out.append(SuspectMatch(s, status, note))
    order = {MATCHES: 0, UNKNOWN: 1, RULED_OUT: 2}
    return sorted(out, key=lambda m: order[m.status])
