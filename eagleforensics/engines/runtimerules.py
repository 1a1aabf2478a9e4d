"""Run-time rules as data: drafter caches a restored target cache leaves behind, and speculation the engine turns
off or shortens by batch size (docs/causes.md rows 31 and 34), with the launch settings that switch them on.

Each row cites the released wheel it was read from (``/work/wheels/src``, unpacked, grepped). Releases read:
SGLang 0.4.10, 0.5.4, 0.5.8 - 0.5.12, 0.5.14, 0.5.17 - 0.5.20, 0.5.23; vLLM 0.9.2, 0.10.0, 0.11.0, 0.14.1,
0.25.0, 0.29.0, 0.33.0, 0.34.0. A release between two read ones takes the earlier row; a release outside every
row is said to be not read.

Topics:

* ``hicache``: SGLang's hierarchical cache (``enable_hierarchical_cache``, L2 host memory; L3 through
  ``hicache_storage_backend``) with a drafter. ``target-only``: a prefix restored from L2/L3 brings back the
  target's KV but not the draft's, so the drafter drafts over a cache it never wrote (sgl-project/sglang#32176,
  #31600, #28771). ``paired``: the draft's KV is backed up and loaded with the target's (#21125), except
  ``packed`` draft caches (NextN MTP layers appended to the target's pool, DSA indexer / SWA draft state),
  which follow from #30393.
* ``spec-off``: settings that switch speculation off or shorten it by batch size: vLLM
  ``disable_by_batch_size`` (applied by the V0 engine; V1 accepts the field and no V1 code reads it),
  ``num_speculative_tokens_per_batch_size``; SGLang ``speculative_adaptive``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .rules import parse_version
from .servingrules import ServingRule  # the same row shape: topic, engine, since, until, outcome, detail, source
from .servingargs import _get, _is_none, _number, _truthy, spec_config

if TYPE_CHECKING:  # pragma: no cover
    from .serverargs import ServerArgs

_SGL = "sglang {v} sglang/srt/{f}"
_VLLM = "vllm {v} vllm/{f}"


RUNTIME_RULES: tuple[ServingRule, ...] = (
    ServingRule("hicache", "sglang", "0.4.10", "0.5.10", "target-only",
                "HiCache backs up and loads back the target's KV only: a prefix restored from host memory (L2) or "
                "storage (L3) skips the target forward, so the draft's KV for it is never written and the "
                "drafter reads stale slots",
                _SGL.format(v="0.4.10, 0.5.4, 0.5.8 - 0.5.10", f="managers/cache_controller.py") +
                " (no draft pool); fixed by sgl-project/sglang#21125"),
    ServingRule("hicache", "sglang", "0.5.11", "0.5.17", "paired",
                "the draft's MHA / MLA KV pool gets its own host pool and rides every L2/L3 backup and load "
                "(set_draft_kv_pool); other draft pool types (packed NextN layers, DSA indexer or SWA draft "
                "state) are skipped with a warning",
                _SGL.format(v="0.5.11, 0.5.12, 0.5.14, 0.5.17", f="managers/cache_controller.py") +
                " set_draft_kv_pool; managers/scheduler.py / mem_cache/kv_cache_builder.py 'Draft pool type %s "
                "not supported for HiCache, skipping.' (sgl-project/sglang#21125)"),
    ServingRule("hicache", "sglang", "0.5.18", None, "paired-packed",
                "draft KV, indexer and SWA state are packed into (or attached beside) the target's host pools "
                "and moved by the same L2/L3 operation",
                _SGL.format(v="0.5.18 - 0.5.20, 0.5.23", f="mem_cache/hybrid_cache/hybrid_pool_assembler.py") +
                " (DRAFT_INDEXER / DRAFT_SWA pools; 0.5.17 has none; sgl-project/sglang#30393)"),
    ServingRule("spec-off", "vllm", "0.9.2", "0.9.2", "applied",
                "speculative_config.disable_by_batch_size: the V0 engine stops drafting for new requests once more "
                "than that many are enqueued",
                _VLLM.format(v="0.9.2", f="spec_decode/spec_decode_worker.py") + " disable_by_batch_size"),
    ServingRule("spec-off", "vllm", "0.10.0", "0.14.1", "accepted-unused",
                "disable_by_batch_size is accepted by the config (>= 2) but no V1 code reads it: speculation stays "
                "on at every batch size",
                _VLLM.format(v="0.10.0, 0.11.0, 0.14.1", f="config/speculative.py") +
                " (0.10.0 config.py); no use under vllm/v1"),
    ServingRule("spec-off", "vllm", "0.33.0", None, "schedule",
                "num_speculative_tokens_per_batch_size: a list of (first batch size, last batch size, tokens); a "
                "batch in a range with 0 tokens runs without drafts",
                _VLLM.format(v="0.33.0, 0.34.0", f="config/speculative.py") +
                " num_speculative_tokens_per_batch_size; v1/spec_decode/dynamic/utils.py (0.25.0, 0.29.0 lack it)"),
    ServingRule("spec-off", "sglang", "0.5.11", "0.5.12", "adaptive",
                "speculative_adaptive: num_steps moves between candidate steps (default 1, 3, 7) with the "
                "observed accept length; never switched off",
                _SGL.format(v="0.5.11, 0.5.12", f="server_args.py") + " speculative_adaptive; "
                "speculative/adaptive_spec_params.py (0.5.10 has no such field)"),
    ServingRule("spec-off", "sglang", "0.5.14", None, "adaptive-by-batch",
                "speculative_adaptive: one step schedule per batch size; the default config allows 0 steps (no "
                "drafts, accept length 1.00) from batch 8 and uses only 0 steps from batch 64",
                _SGL.format(v="0.5.14, 0.5.17 - 0.5.20, 0.5.23", f="speculative/adaptive_spec_params.py") +
                " DEFAULT_ADAPTIVE_CONFIG, AdaptiveSpeculativeParams.get_steps_for_batch"),
)
AR_FUSION_RULES: tuple[ServingRule, ...] = (
    ServingRule("ar-fusion", "sglang", "0.5.8", "0.5.12", "partial-sums",
                "with the MLP all-reduce deferred into the next layer's fused all-reduce + RMSNorm "
                "(enable_flashinfer_allreduce_fusion, switched on by itself for DeepSeek-V3 / Kimi-K2.5 on SM90 / "
                "SM100 with TP > 1 and no DP attention), the aux capture reads hidden_states + residual before that "
                "all-reduce: each rank's partial sum, not the layer's output",
                "sglang 0.5.8 - 0.5.12 sglang/srt/models/deepseek_v2.py DeepseekV2Model.forward "
                "(aux_hidden_states.append(hidden_states + residual)); server_args.py auto-enable; fixed by "
                "sgl-project/sglang#28343"),
    ServingRule("ar-fusion", "sglang", "0.5.14", None, "reduced",
                "the aux state is taken inside the layer communicator after the fused all-reduce "
                "(captured_last_layer_outputs)",
                "sglang 0.5.14, 0.5.17 - 0.5.20, 0.5.23 sglang/srt/layers/communicator.py, models/deepseek_v2.py "
                "(0.5.13 not read)"),
)
ADAPTIVE_ZERO_FROM = 8  # SGLang's default adaptive config may pick 0 steps from this batch size on
ADAPTIVE_OFF_FROM = 64  # ... and picks only 0 steps from this one


def runtime_rules_between(topic: str, engine: str, first: str, last: str | None) -> list[ServingRule]:
    """Every row of ``topic`` for ``engine`` that may hold in releases ``first`` .. ``last`` (None: no bound)."""
    lo, hi = parse_version(first), parse_version(last) if last else None
    rows = sorted((r for r in RUNTIME_RULES + AR_FUSION_RULES if r.topic == topic and r.engine == engine),
                  key=lambda r: parse_version(r.since))
    out = []
    for i, r in enumerate(rows):
        end = parse_version(rows[i + 1].since) if i + 1 < len(rows) else None
        if (hi is None or parse_version(r.since) <= hi) and (end is None or end > lo):
            out.append(r)
    return out


def release_span(args: ServerArgs, given: str | None) -> tuple[str, str | None, bool]:
    """(first, last, exact) release the log may be: ``--engine-version``, the log's own, else its format's range."""
    exact = given or args.version
    if exact:
        return exact, exact, True
    if args.version_range:
        lo, hi = args.version_range
        return lo, hi, False
    return "0.0.0", None, False


# ---------------------------------------------------------------- the settings
@dataclass(frozen=True)
class CacheSetting:
    """Caches that can restore the target's KV without a target forward, as the arguments line sets them."""

    hicache: bool
    storage: str | None  # SGLang hicache_storage_backend (L3)
    kv_transfer: str | None  # vLLM kv_transfer_config's connector
    offload_gib: float | None  # vLLM kv_offloading_size
    pd_role: str | None  # SGLang disaggregation_mode prefill / decode
    prefix_caching: bool | None

    def describe(self) -> str:
        parts = []
        if self.hicache:
            parts.append("enable_hierarchical_cache=True" + (f", hicache_storage_backend={self.storage}"
                                                              if self.storage else ""))
        if self.kv_transfer:
            parts.append(f"kv_transfer_config connector {self.kv_transfer}")
        if self.offload_gib:
            parts.append(f"kv_offloading_size={self.offload_gib:g}")
        if self.pd_role:
            parts.append(f"disaggregation_mode={self.pd_role}")
        return ", ".join(parts) or "no cache that restores the target's KV without a forward"

    @property
    def any(self) -> bool:
        return bool(self.hicache or self.kv_transfer or self.offload_gib)


def _connector(value: Any) -> str | None:
    import json

    if _is_none(value):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value.strip("'\"") or None
    if isinstance(value, dict):
        name = value.get("kv_connector") or value.get("connector")
        return str(name) if name else "a KV connector"
    return None


def cache_setting(args: ServerArgs) -> CacheSetting:
    """Read SGLang ``enable_hierarchical_cache`` / ``hicache_storage_backend`` / ``disaggregation_mode`` /
    ``disable_radix_cache`` and vLLM ``kv_transfer_config`` / ``kv_offloading_size`` / ``enable_prefix_caching``."""
    _, hi = _get(args, "enable_hierarchical_cache")
    _, storage = _get(args, "hicache_storage_backend")
    _, transfer = _get(args, "kv_transfer_config")
    _, offload = _get(args, "kv_offloading_size")
    _, role = _get(args, "disaggregation_mode")
    _, radix_off = _get(args, "disable_radix_cache")
    _, prefix = _get(args, "enable_prefix_caching")
    role_s = None if _is_none(role) or str(role).strip("'\"").lower() == "null" else str(role).strip("'\"").lower()
    prefix_on = _truthy(prefix) if args.engine == "vllm" else (None if _truthy(radix_off) is None
                                                               else not _truthy(radix_off))
    if prefix_on is None and args.engine == "vllm":
        prefix_on = True  # V1 caches prefixes by default (config/cache.py)
    return CacheSetting(bool(_truthy(hi)), None if _is_none(storage) else str(storage).strip("'\""),
                        _connector(transfer), _number(offload) or None, role_s, prefix_on)


@dataclass(frozen=True)
class SpecOffSetting:
    """Where the engine runs a batch without drafts (``off_from``: batch size from which every batch is undrafted;
    ``maybe_from``: from which some may be), and the setting as read."""

    field: str | None
    text: str
    off_from: int | None
    maybe_from: int | None
    rule: ServingRule | None

    def explains(self, running: int | None) -> bool:
        """Whether a decode line at ``running`` requests may read accept length 1.00 because of this setting."""
        start = self.maybe_from if self.maybe_from is not None else self.off_from
        return running is not None and start is not None and running >= start


def _schedule(value: Any) -> list[tuple[int, int, int]]:
    import json

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    out = []
    for entry in value if isinstance(value, list) else []:
        if isinstance(entry, (list, tuple)) and len(entry) == 3 and all(_number(v) is not None for v in entry):
            out.append(tuple(int(_number(v)) for v in entry))
    return out


def spec_off_setting(args: ServerArgs, version: str | None) -> SpecOffSetting | None:
    """The setting that switches speculation off by batch size on this launch, None when none is set."""
    first, last, _ = release_span(args, version)
    if args.engine == "vllm":
        spec = spec_config(args)
        sched = _schedule(spec.get("num_speculative_tokens_per_batch_size"))
        if sched:
            rows = runtime_rules_between("spec-off", "vllm", first, last)
            rule = next((r for r in rows if r.outcome == "schedule"), None)
            zero = sorted(lo for lo, _, k in sched if k == 0)
            shorter = sorted(lo for lo, _, k in sched if 0 < k < (args.num_steps or k + 1))
            return SpecOffSetting("num_speculative_tokens_per_batch_size", f"num_speculative_tokens_per_batch_size="
                                  f"{sched}", zero[0] if zero else None, shorter[0] if shorter else
                                  (zero[0] if zero else None), rule)
        n = _number(spec.get("disable_by_batch_size"))
        if n is not None:
            rows = runtime_rules_between("spec-off", "vllm", first, last)
            applied = [r for r in rows if r.outcome == "applied"]
            return SpecOffSetting("disable_by_batch_size", f"disable_by_batch_size={int(n)}",
                                  int(n) + 1 if applied else None, int(n) + 1 if applied else None,
                                  applied[0] if applied else (rows[0] if rows else None))
        return None
    _, adaptive = _get(args, "speculative_adaptive")
    if _truthy(adaptive):
        rows = runtime_rules_between("spec-off", "sglang", first, last)
        by_batch = next((r for r in rows if r.outcome == "adaptive-by-batch"), None)
        _, cfg = _get(args, "speculative_adaptive_config")
        own = "" if _is_none(cfg) else f", speculative_adaptive_config={cfg}"
        if by_batch is not None and _is_none(cfg):
            return SpecOffSetting("speculative_adaptive", "speculative_adaptive=True" + own, ADAPTIVE_OFF_FROM,
                                  ADAPTIVE_ZERO_FROM, by_batch)
        return SpecOffSetting("speculative_adaptive", "speculative_adaptive=True" + own, None,
                              ADAPTIVE_ZERO_FROM if by_batch is not None else None, by_batch or (rows[0] if rows
                                                                                                 else None))
    return None


def undrafted_lines(df: Any, args: ServerArgs | None, version: str | None) -> Any:
    """The rows of a parsed log (``engines.logs.parse_log``) at accept length 1.00 that a run-time switch explains
    (the engine drafted nothing there): ``launch``'s accept-len-one, ``plan`` and the batch and uptime trends
    leave them out."""
    from .acceptlines import decode_points, spec_off_lines

    if args is None or df.empty:
        return df.iloc[0:0]
    setting = spec_off_setting(args, version)
    if setting is None:
        return df.iloc[0:0]
    lines = set(spec_off_lines(decode_points(df), setting.explains)["line"].tolist())
    return df[df["line"].isin(lines)]
