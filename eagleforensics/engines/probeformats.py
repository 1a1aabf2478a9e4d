"""What a running SGLang or vLLM server says about speculative decoding over HTTP, per release: the data ``probe`` reads.

Read from the released wheels (``pip download --no-deps sglang==X vllm==Y``, unzipped); fields are
read by name, so a release that adds fields still parses, and a release the table does not list is
said plainly (``release_note``).

SGLang, per request (``POST /generate``, the native API; the reply is ``{"text", ["output_ids",]
"meta_info"}``):

* 0.4.6, ``srt/managers/tokenizer_manager.py`` (``_handle_batch_output``): ``meta_info`` has
  ``id, finish_reason, prompt_tokens, completion_tokens, cached_tokens, e2e_latency`` and, when the
  server runs a speculative algorithm, ``spec_verify_ct`` (verify passes of the request) once it is
  finished. The accept length is ``completion_tokens / spec_verify_ct`` (as the wheel's own
  ``test/send_one.py`` computes it). No ``output_ids`` beside the text of a text reply.
  Server info: ``GET /get_model_info`` (``model_path``, ``tokenizer_path``, ``is_generation``) and
  ``GET /get_server_info`` (the ServerArgs dataclass as a dict, ``speculative_*`` included, plus
  ``version``) in ``srt/entrypoints/http_server.py``.
* 0.5.3, the same file: the same ``meta_info`` (``spec_verify_ct`` only), and the text reply carries
  ``output_ids``; server info still under the ``get_`` names.
* 0.5.13, ``srt/managers/tokenizer_manager.py`` (``_calculate_spec_decoding_metrics``): besides
  ``spec_verify_ct``: ``spec_accept_length`` (= completion_tokens / spec_verify_ct, bonus token
  included), ``spec_accept_rate`` (correct drafts / proposed drafts, no bonus),
  ``spec_num_correct_drafts``, ``spec_num_proposed_drafts`` (= verify_ct x (num_draft_tokens - 1)),
  ``spec_correct_drafts_histogram`` (verify passes that accepted 0, 1, 2, ... drafts) and the
  aliases ``spec_accepted_drafts``, ``spec_proposed_drafts``, ``spec_accept_histogram``. The reply
  carries ``output_ids``. Server info moved to ``GET /model_info`` and ``GET /server_info`` (the
  ``get_`` names remain, deprecated) in ``srt/entrypoints/http_server.py``.
* 0.5.23, the same files: the same ``meta_info`` fields (``_calculate_spec_decoding_metrics``; the
  histogram grows to the largest accepted count seen, ``srt/managers/schedule_batch.py``), the
  text reply with ``output_ids``; ``GET /model_info``, ``GET /server_info`` (the resolved server
  arguments, ``speculative_adaptive`` among them, plus ``startup_time`` and ``internal_states``)
  with the ``get_`` names kept.

vLLM, as Prometheus counters on ``GET /metrics`` (cumulative since the server started, so ``probe``
reads them before and after its own requests):

* 0.7.3 (V0 engine), ``vllm/engine/metrics.py``: counters ``vllm:spec_decode_num_accepted_tokens_total``,
  ``vllm:spec_decode_num_draft_tokens_total``, ``vllm:spec_decode_num_emitted_tokens_total`` and
  gauges ``vllm:spec_decode_draft_acceptance_rate``, ``vllm:spec_decode_efficiency`` (label
  ``model_name``). No count of drafts: ``vllm/spec_decode/metrics.py`` defines efficiency as
  emitted / (draft_tokens / k x (k + 1)), so k (tokens per draft) follows from the cumulative
  values, and a window's drafts are its draft tokens / k. The counters move when the engine logs
  its stats (every few seconds), not per step.
* 0.8.3 and 0.8.4 (V1 engine, the default from 0.8), ``vllm/v1/metrics/loggers.py``
  (``PrometheusStatLogger``): only ``vllm:spec_decode_num_draft_tokens_total`` and
  ``vllm:spec_decode_num_accepted_tokens_total`` (labels ``model_name``, ``engine``), declared and
  labelled at start whether or not the server speculates (they then stay at 0). No count of drafts
  and no k: ``probe`` takes k from its own tokens (every token after a request's first comes from a
  round: drafts = tokens - 1 - accepted per request) and checks every window against that k.
  0.8.2's V1 engine exports no spec-decode counter at all (its ``v1/metrics`` has none).
* 0.9.0 and 0.11.0 (V1 engine), ``vllm/v1/spec_decode/metrics.py`` (``SpecDecodingProm``): counters
  ``vllm:spec_decode_num_drafts``, ``vllm:spec_decode_num_draft_tokens``,
  ``vllm:spec_decode_num_accepted_tokens`` and ``vllm:spec_decode_num_accepted_tokens_per_pos``
  (label ``position`` 0..k-1), labels ``model_name`` and ``engine``; Prometheus writes counters with
  a ``_total`` suffix. Mean acceptance length = 1 + accepted / drafts; per-position rate =
  accepted_per_pos / drafts (the class's docstring).
* 0.10.1.1, 0.29.0 and 0.34.0 (V1 engine; ``engines.probecounts`` holds how they count):
  ``vllm/v1/spec_decode/metrics.py`` declares the same four counters and labels as 0.11.0;
  ``GET /version`` (0.10.1.1 ``entrypoints/openai/api_server.py``, from 0.29.0
  ``entrypoints/serve/instrumentator/basic.py``), ``GET /v1/models``; ``return_token_ids`` adds
  ``choices[].token_ids`` in 0.29.0 and 0.34.0 (``entrypoints/openai/completion/protocol.py``), not in
  0.10.1.1 (outputs then compared by text). 0.29.0+ may add ``metrics.speculative_decoding`` per reply.
* Requests: ``POST /v1/completions`` (``choices[].text``, ``finish_reason``, ``usage.completion_tokens``);
  ``return_token_ids`` (0.11.0, ``entrypoints/openai/protocol.py``) adds ``choices[].token_ids``.
  ``GET /v1/models`` names the model, ``GET /version`` the release (both releases,
  ``entrypoints/openai/api_server.py``).

Bounds on what a server can declare (``MAX_STEPS``; docs/probe.md, "Hardening"):

* vLLM's V1 rejection sampler asserts ``max_spec_len <= MAX_SPEC_LEN``: 32 in 0.9.2, 0.10.0 and
  0.10.1.1, 128 in 0.11.0 to 0.33.0 (``vllm/v1/sample/rejection_sampler.py``); 0.34.0 has no V1 sampler
  and no such limit anywhere (``v1/worker/gpu/spec_decode/rejection_sampler.py``; ``config/speculative.py``
  only asks for at least one token): the probe keeps 128 as its bound.
* SGLang 0.5.9 and 0.5.23 (``srt/server_args.py``) set no upper bound on ``speculative_num_steps``,
  ``speculative_eagle_topk`` or ``speculative_num_draft_tokens``: the probe takes vLLM's 128 steps
  as the sane bound, and 1024 for top-k and draft tokens (what ``plan`` reads from a run).
* SGLang's ``spec_correct_drafts_histogram`` grows one entry per count of accepted drafts
  (``Req.update_spec_correct_drafts_histogram``, ``srt/managers/schedule_batch.py``, 0.5.23), so it
  has at most steps + 1 entries; vLLM's per-position counter has one ``position`` per step.
"""
from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

MAX_STEPS = 128  # draft steps (positions) any engine runs: vLLM's MAX_SPEC_LEN from 0.11.0; SGLang has no bound
MAX_TOPK = 1024  # SGLang has no bound; what ``plan`` reads from a probe run
MAX_DRAFT_TOKENS = 1024  # likewise

SGLANG_RELEASES = ("0.4.6", "0.5.3", "0.5.13", "0.5.23")
VLLM_RELEASES = ("0.7.3", "0.8.2", "0.8.3", "0.8.4", "0.9.0", "0.10.1.1", "0.11.0", "0.29.0", "0.34.0")

# SGLang meta_info fields, by what they hold (first name present wins).
SGLANG_VERIFY = ("spec_verify_ct",)
SGLANG_ACCEPT_LENGTH = ("spec_accept_length",)
SGLANG_HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")
SGLANG_MODEL_INFO = ("/model_info", "/get_model_info")
SGLANG_SERVER_INFO = ("/server_info", "/get_server_info")

# vLLM counter sample names as /metrics writes them (counters with the _total suffix).
V1_DRAFTS = "vllm:spec_decode_num_drafts_total"
V1_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
V1_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
V1_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
V0_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
V0_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
V0_EMITTED = "vllm:spec_decode_num_emitted_tokens_total"
V0_EFFICIENCY = "vllm:spec_decode_efficiency"


@dataclass(frozen=True)
class CounterFormat:
    """Which vLLM counter layout a /metrics page speaks: ``v1`` (drafts counted) or ``v0`` (emitted tokens)."""

    name: str
    release: str
    file: str
    per_position: bool


V1 = CounterFormat("v1", "0.11.0", "vllm/v1/spec_decode/metrics.py", True)
V1_EARLY = CounterFormat("v1-early", "0.8.4", "vllm/v1/metrics/loggers.py", False)
V0 = CounterFormat("v0", "0.7.3", "vllm/engine/metrics.py", False)


def counter_format(names: set[str]) -> CounterFormat | None:
    """The counter layout a /metrics page's sample names show; None when it has no spec-decode counters."""
    if V1_DRAFTS in names:
        return V1
    if V0_EMITTED in names:
        return V0
    if V1_DRAFT_TOKENS in names and V1_ACCEPTED in names:
        return V1_EARLY
    return None


def release_note(engine: str, version: str | None) -> str | None:
    """A plain sentence when ``version`` is not one of the releases the formats were read from; else None."""
    known = SGLANG_RELEASES if engine == "sglang" else VLLM_RELEASES
    if version is None:
        return f"the server does not say its {engine} release; fields are read by name as in {', '.join(known)}"
    try:
        v = Version(version)
    except InvalidVersion:
        return f"{engine} release {version!r} is not a version number; fields are read by name"
    if str(v) in {str(Version(k)) for k in known}:
        return None
    lo, hi = Version(known[0]), Version(known[-1])
    where = "older than" if v < lo else "newer than" if v > hi else "between"
    return (f"{engine} {version} is not a release these formats were read from ({', '.join(known)}; it is {where} "
            "them): fields are read by name, a renamed field reads as missing")
