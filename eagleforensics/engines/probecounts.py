"""How each release counts what ``probe`` reads: the slack of vLLM's counters, metrics off, per-request spec
metrics, SGLang's adaptive steps. Read from the released wheels (``pip download --no-deps sglang==X
vllm==Y``, unzipped).

* vLLM counts a verify round's accepted drafts *before* the output is cut at a stop token or at
  ``max_tokens`` (``vllm/v1/core/sched/scheduler.py``, ``update_from_output``: the spec-decode
  stats are made before the new tokens are appended and trimmed at the stop; read in 0.9.2, 0.10.0,
  0.10.1.1, 0.11.0, 0.11.1, 0.12.0, 0.14.0, 0.14.1, 0.25.0, 0.29.0, 0.33.0, 0.34.0). A request's
  last round can so count up to k accepted drafts whose tokens were never returned: a request's
  counted tokens (rounds + accepted) may pass its own tokens - 1 by up to k. From 0.33.0 (read in
  0.33.0 and 0.34.0; 0.30-0.32 not read) no drafts are proposed in a step that samples a request's
  last token under ``max_tokens`` (``_drafts_unused``, same file), so a request cut at
  ``max_tokens`` overshoots by at most k - 1; a stop token cannot be known in advance, so k stays
  the bound there. Releases not read get k, the larger bound.
* ``--disable-log-stats`` builds no stat logger at all (0.10.1.1 and 0.34.0,
  ``vllm/v1/engine/async_llm.py``: ``StatLoggerManager`` only ``if self.log_stats``), so /metrics
  carries no ``vllm:`` family: acceptance cannot be read, which is not "no speculation".
* Per-request spec metrics (0.29.0 and 0.34.0, ``vllm/config/observability.py``
  ``per_request_spec_decode_metrics``: ``none`` | ``summary`` | ``detailed``, flag
  ``--per-request-spec-decode-metrics``; vllm-project/vllm#48915): the completion carries
  ``metrics.speculative_decoding`` (``entrypoints/generate/base/protocol.py``
  ``SpeculativeDecodingMetrics``): ``acceptance_histogram`` (verify steps that accepted j drafts,
  j = 0..k), ``num_spec_steps``, ``num_accepted_draft_tokens``, ``num_draft_tokens``,
  ``num_spec_tokens``, ``mean_acceptance_length`` (``vllm/v1/metrics/stats.py``
  ``RequestSpecDecodeMetrics.to_dict``). Counted in the same place as the counters, so they carry
  the same overshoot.
* SGLang's own averages are since start (``internal_states.avg_spec_accept_length``); with
  ``--enable-metrics`` 0.5.23 counts, per finished request, ``sglang:generation_tokens_total`` and
  ``sglang:spec_verify_calls_total`` (``srt/observability/metrics_collector.py``
  ``observe_one_finished_request``): their differences between two reads are a window's accept
  length (``probe --since`` differences one probe's last read and the next one's first).
* SGLang 0.5.23 adaptive steps: ``speculative_adaptive`` and ``speculative_adaptive_config`` are
  server arguments (``srt/arg_groups/field_order.py``), so ``/server_info`` (which returns the
  resolved arguments, ``srt/entrypoints/http_server.py``) says the launch's steps, not the running
  ones; ``srt/speculative/adaptive_spec_params.py`` moves ``speculative_num_steps`` at run time
  among candidate steps (1, 3, 5, 7 at batch 1). The running value is the gauge
  ``sglang:spec_num_steps`` ("Currently active speculative_num_steps",
  ``srt/observability/metrics_collector.py``) on /metrics when the server runs with
  ``--enable-metrics``; without it, the per-position acceptance (a cliff after the running steps)
  is the evidence.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

# vLLM releases whose scheduler was read for the overshoot, and what was found
OVERSHOOT_READ = ("0.9.2", "0.10.0", "0.10.1.1", "0.11.0", "0.11.1", "0.12.0", "0.14.0", "0.14.1", "0.25.0", "0.29.0",
                  "0.33.0", "0.34.0")  # vllm/v1/core/sched/scheduler.py update_from_output: counted before the cut
NO_DRAFT_AT_LAST_TOKEN = Version("0.33.0")  # the earliest release read with _drafts_unused (0.30-0.32 not read)
PER_REQUEST_METRICS_FROM = Version("0.29.0")  # vllm/config/observability.py per_request_spec_decode_metrics
ENABLE_PER_REQUEST = "--per-request-spec-decode-metrics summary"
ENABLE_STATS = "drop --disable-log-stats (vLLM builds its /metrics stat loggers only when stats are logged)"
SGLANG_STEPS_GAUGE = "sglang:spec_num_steps"
# SGLang 0.5.23 srt/observability/metrics_collector.py observe_one_finished_request: per finished request,
# its completion tokens and its verify passes (--enable-metrics); their ratio over a window is the accept length
SGLANG_GENERATED = "sglang:generation_tokens_total"
SGLANG_VERIFY_CALLS = "sglang:spec_verify_calls_total"
CLIFF = 0.05  # a position accepted under this share of the one before it was (almost) never drafted


def _version(version: str | None) -> Version | None:
    try:
        return Version(version) if version else None
    except InvalidVersion:
        return None


def overshoot(version: str | None, k: int | None, finish: str | None) -> int:
    """Most accepted drafts vLLM may count past what one request returned (its last round, cut at the stop).

    k per request; k - 1 for a request cut at ``max_tokens`` from 0.33.0 (no drafts for its last
    token). k unknown: 0 (the caller has no bound, and says so by the window's status).
    """
    if not k:
        return 0
    v = _version(version)
    if finish == "length" and v is not None and v >= NO_DRAFT_AT_LAST_TOKEN:
        return max(0, k - 1)
    return k


_VLLM_FAMILY = re.compile(r"^(?:# (?:HELP|TYPE) )?vllm:", re.MULTILINE)
# SGLang /server_info fields that differ between two back-ends of one launch (srt/entrypoints/http_server.py
# returns the resolved ServerArgs plus startup_time; port and host are ServerArgs fields)
IDENTITY_FIELDS = ("host", "port", "startup_time", "base_gpu_id", "dist_init_addr", "node_rank",
                   "speculative_num_steps", "speculative_draft_model_path", "model_path", "version")


def has_vllm_family(page: str) -> bool:
    """Whether a /metrics page carries any ``vllm:`` family; none means --disable-log-stats (no stat logger)."""
    return _VLLM_FAMILY.search(page) is not None


def identity(args: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The server-info fields that tell one back-end from another, as text (bounded)."""
    return tuple((k, str(args[k])[:200]) for k in IDENTITY_FIELDS if k in args and args[k] is not None)


@dataclass(frozen=True)
class RequestSpec:
    """One request's own spec-decode account (vLLM's ``metrics.speculative_decoding``)."""

    steps: int  # verify steps (rounds)
    accepted: int  # accepted drafts, bonus tokens not included
    draft_tokens: int
    k: int
    histogram: tuple[int, ...]

    @property
    def accept_length(self) -> float:
        return 1.0 + self.accepted / self.steps if self.steps else math.nan


def request_spec(body: Any) -> RequestSpec | None:
    """``metrics.speculative_decoding`` of a vLLM completion (0.29+), checked; None when absent or not that shape."""
    metrics = body.get("metrics") if isinstance(body, dict) else None
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(spec, dict):
        return None
    hist = spec.get("acceptance_histogram")
    nums = [spec.get(k) for k in ("num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens")]
    if not isinstance(hist, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                             for v in [*hist, *nums]):
        return None
    steps, accepted, drafted, k = nums
    if len(hist) > 1024 or sum(hist) != steps or sum(j * c for j, c in enumerate(hist)) != accepted:
        return None
    return RequestSpec(steps, accepted, drafted, k, tuple(hist))


def served_steps(per_pos: tuple[float, ...] | None) -> int | None:
    """Steps the per-position acceptance shows were run: the positions before the first cliff (a position
    accepted under ``CLIFF`` of the one before it); None without a curve or without a cliff."""
    if not per_pos:
        return None
    for i in range(1, len(per_pos)):
        before = per_pos[i - 1]
        if before > 0 and per_pos[i] < CLIFF * before:
            return i
    return None


def gauge(text: str, name: str, combine: Any = max) -> float | None:
    """The value of one sample name on a Prometheus page, combined over its label sets (``max`` for a gauge
    repeated per DP rank, ``sum`` for a counter split by labels), or None when absent."""
    from prometheus_client.parser import text_string_to_metric_families

    keep = "\n".join(line for line in text.splitlines()
                     if line.startswith((name, f"# HELP {name} ", f"# TYPE {name} ")))
    total = None
    try:
        for family in text_string_to_metric_families(keep + "\n" if keep else ""):
            for s in family.samples:
                if s.name == name and math.isfinite(s.value):
                    total = s.value if total is None else combine((total, s.value))
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    return total
