"""What each engine does with the drafter's RoPE and ``max_position_embeddings``, as sourced data.

The drafter runs at the target's absolute positions. Both engines build the drafter's rotary
embedding from the DRAFT's config (its ``rope_theta``, ``rope_scaling``/``rope_parameters``,
``max_position_embeddings``); neither copies the target's. What happens once a sequence is
longer than the draft's own limit changed across releases: a rotary cache read past its end,
no drafts for that batch, a refusal at start-up, or the draft's limit raised to the target's.
``draft_rope_rule(engine, version, runner=None, rope_type=None)`` returns the ``RopeRule``;
each row cites the wheel version and file it was read from.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import ForensicsError
from .rules import ENGINE_NAMES, ENGINES, NEWEST, RUNNERS, parse_version, release_span, row_at, runner_or_default

# RoPE types whose max_position_embeddings only sizes the cos/sin cache (vLLM 0.33.0 and 0.34.0
# config/speculative.py _CACHE_ONLY_ROPE_TYPES, the same set); yarn, dynamic, longrope, deepseek derive more.
CACHE_ONLY_ROPE_TYPES = frozenset({"default", "linear", "llama3", "ntk", "proportional"})

# past_max codes: what a position >= the draft's limit gets
PAST_MAX = {
    "out-of-bounds": "the drafter's rotary cos/sin cache (sized by its max_position_embeddings) "
                     "is indexed past its end: garbage rotations or an illegal memory access / "
                     "device-side assert",
    "no-drafts": "no drafts for any step whose longest sequence (+ k) passes the drafter's max "
                 "length: speculation stops for the whole batch",
    "refuse-at-start": "start-up fails (ValueError: target context_length > the draft's derived "
                       "context length) unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, which "
                       "raises the draft's max_position_embeddings to the target's",
    "raised": "the draft's max_position_embeddings is raised to the target's max_model_len: the "
              "draft's own rope_theta/scaling is applied at every position",
    "target-capped": "the served max_model_len is reduced to the drafter's",
}


@dataclass(frozen=True)
class RopeRule:
    """One engine's handling of the draft's RoPE from ``since`` to ``until``.

    ``rope_params``: whose theta/scaling the drafter's attention uses ('draft');
    ``past_max``: a ``PAST_MAX`` code for positions past the draft's limit;
    ``limit``: how the limit is derived. ``rope_types``: 'cache-only', 'other' or None (any).
    """

    engine: str
    since: str
    until: str | None
    rope_params: str
    past_max: str
    limit: str
    source: str
    runner: str | None = None
    rope_types: str | None = None
    note: str = ""

    @property
    def label(self) -> str:
        span = release_span(self.since, self.until)
        extra = " ".join(x for x in (f"{self.runner} runner" if self.runner else "",
                                      f"{self.rope_types} rope" if self.rope_types else "") if x)
        return f"{self.engine} rope {span}" + (f" ({extra})" if extra else "")

    @property
    def consequence(self) -> str:
        """Plain words for ``past_max``."""
        return PAST_MAX[self.past_max]


_DRAFT_LEN = "the draft's max_position_embeddings (x rope factor where the scaling type has one)"
_VSC = "vllm {v} vllm/config/speculative.py"
ROPE_RULES: tuple[RopeRule, ...] = (
    RopeRule("sglang", "0.4.10", "0.5.17", "draft", "out-of-bounds",
             "the draft context length is --context-length when given (start-up ValueError if "
             "it exceeds the draft's derived length, unless the env override is set), else "
             + _DRAFT_LEN, "sglang 0.4.10, 0.5.17 srt/configs/model_config.py "
             "_derive_context_length / from_server_args(context_length=server_args."
             "context_length); srt/models/llama.py LlamaAttention get_rope(config.rope_theta, "
             "rope_scaling, max_position_embeddings) of the draft config",
             note="sgl-project/sglang#10787 (0.5.3) raises max_position_embeddings only under "
                  "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1; sgl-project/sglang#6783"),
    RopeRule("sglang", "0.5.18", None, "draft", "refuse-at-start",
             "the draft worker gets the target's context length; a shorter derived draft length "
             "refuses to start unless the env override is set",
             "sglang 0.5.18, 0.5.23 srt/speculative/eagle_worker_v2.py TpModelWorker("
             "context_length=target ... context_len); srt/configs/model_config.py "
             "_derive_context_length"),
    RopeRule("vllm", "0.10.1.1", "0.10.2", "draft", "out-of-bounds", _DRAFT_LEN,
             "vllm 0.10.1.1 vllm/model_executor/models/llama.py LlamaAttention get_rope("
             "max_position=max_position_embeddings) of the draft config; no drafter length check "
             "in vllm/v1/worker/gpu_model_runner.py", runner="v1"),
    RopeRule("vllm", "0.11.0", "0.33.0", "draft", "no-drafts",
             "drafter max_model_len = min(" + _DRAFT_LEN + ", target max_model_len)",
             _VSC.format(v="0.11.0") + " _maybe_override_draft_max_model_len; vllm 0.11.0, "
             "0.33.0 vllm/v1/worker/gpu_model_runner.py effective_drafter_max_model_len / "
             "input_fits_in_drafter (zeroed drafts from 0.14.0; the V1 runner is gone from 0.34.0)", runner="v1",
             note="from 0.27.0 the rotary cache is raised to the target's length, but the "
                  "drafter max_model_len is computed before that (config/speculative.py order): "
                  "read from code, not run"),
    RopeRule("vllm", "0.17.1", "0.26.0", "draft", "out-of-bounds", _DRAFT_LEN,
             "vllm 0.24.0 vllm/model_executor/layers/rotary_embedding/base.py cos_sin_cache "
             "sized by max_position_embeddings (vllm-project/vllm#48894: device-side assert "
             "under torch.compile past 2048); V2 runner has no drafter length check",
             runner="v2"),
    RopeRule("vllm", "0.27.0", "0.32.0", "draft", "raised", "target max_model_len",
             _VSC.format(v="0.27.0") + " _maybe_override_draft_max_position_embeddings",
             runner="v2"),
    RopeRule("vllm", "0.33.0", None, "draft", "raised", "target max_model_len",
             _VSC.format(v="0.33.0, 0.34.0") + " _maybe_override_draft_max_position_embeddings "
             "(_CACHE_ONLY_ROPE_TYPES); 0.34.0 calls it from vllm/v1/worker/gpu/spec_decode/speculator_config.py "
             "DraftModelSpeculatorConfig.configure (shares_target_positions, true for EAGLE drafts)",
             runner="v2", rope_types="cache-only"),
    RopeRule("vllm", "0.33.0", None, "draft", "target-capped", _DRAFT_LEN,
             _VSC.format(v="0.33.0, 0.34.0") + " (no raise for yarn/dynamic/longrope/deepseek rope); "
             "vllm 0.33.0, 0.34.0 vllm/config/vllm.py _limit_max_model_len_to_draft reduces max_model_len "
             "to the draft's for the V2 runner (0.34.0: the draft length from the speculator config's "
             "max_model_len)", runner="v2", rope_types="other"),
)


def draft_rope_rule(engine: str, version: str | None = None, runner: str | None = None,
                    rope_type: str | None = None) -> RopeRule | None:
    """The ``RopeRule`` of ``engine`` at ``version`` (None: newest); None for TensorRT-LLM.

    ``runner``: vLLM 'v1'/'v2' (None: v1, v2 from 0.34.0); ``rope_type``: the draft's rope type, needed on
    vLLM's V2 runner from 0.33.0 (None counts as 'default').
    """
    eng = str(engine).strip().lower()
    if eng not in ENGINES:
        raise ForensicsError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if eng == "trtllm":
        return None
    if runner is not None and (eng != "vllm" or runner not in RUNNERS):
        raise ForensicsError(f"runner {runner!r} applies to vLLM only (v1 or v2)")
    ver = str(parse_version(version or NEWEST[eng]))
    run = runner_or_default(ver, runner) if eng == "vllm" else None
    kind = "cache-only" if (rope_type or "default") in CACHE_ONLY_ROPE_TYPES else "other"
    rows = [r for r in ROPE_RULES if r.engine == eng and r.runner == run
            and r.rope_types in (None, kind)]
    row = row_at(rows, ver)
    if row is None:
        raise ForensicsError(f"no RoPE rule for {ENGINE_NAMES[eng]} {ver}"
                             + (f" ({run} runner)" if run else ""))
    return row


def rope_kind(config: dict) -> str:
    """The rope type a config uses ('default' when none), from rope_scaling or rope_parameters."""
    for key in ("rope_parameters", "rope_scaling"):
        val = config.get(key)
        if isinstance(val, dict):
            kind = val.get("rope_type", val.get("type"))
            if isinstance(kind, str):
                return kind
    return "default"


def describe_rope_rules() -> list[dict]:
    """Every ROPE_RULES row as a plain dict with its label."""
    return [{"label": r.label, **asdict(r)} for r in ROPE_RULES]

