"""The drafter's cache is missing where the target's is restored without a target forward (docs/causes.md row 31).

``drafter-cache-lost``: read from the arguments line and the decode lines.

* Launch: SGLang HiCache (``enable_hierarchical_cache``, L3 via ``hicache_storage_backend``) on a release that
  restores only the target's KV (<= 0.5.10; the draft's MHA/MLA pool rides L2/L3 from 0.5.11, packed NextN /
  indexer / SWA draft state from 0.5.18: ``engines.runtimerules`` topic ``hicache``); vLLM KV connectors
  (``kv_transfer_config``: LMCache, Mooncake, OffloadingConnector) and ``kv_offloading_size`` (no vLLM
  release was read for this; the threads report it open); a prefill/decode role without a speculative
  algorithm.
* Log: accept length falling with uptime (``engines.acceptlines.uptime_trend``) or with the cumulative share
  of prompt tokens served from cache (SGLang ``Prefill batch`` lines' ``#cached-token``), and coming back after
  a flush. GLM-5.2 with HiCache: 4.49 -> 1.59 once the cache fills, 4.33 after a flush (sgl-project/sglang#32176);
  HiCache + Mooncake 5.94 -> 2.87 (#31600); 3.33 -> 1.90 over two hours (#28771); prefix caching on a
  context-cache drafter 2.98 -> 1.25 (vllm-project/vllm#47930, #47926).

Error where the release restores the target alone and the log shows the fall; warning where either shows;
info where a cache is on and the release pairs the draft's (or the log stays flat). Cause: an engine bug in the
serving path.
"""
from __future__ import annotations

import math
from typing import Any

from ..engines.acceptlines import cached_share, decode_points, recovery, share_rho, uptime_trend
from ..engines.runtimerules import cache_setting, release_span, runtime_rules_between
from ..errors import printable
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register
from .specoff import explained_lines

SOURCE = ("sgl-project/sglang#32176, sgl-project/sglang#31600, sgl-project/sglang#28771, vllm-project/vllm#47930 "
          "(docs/causes.md row 31)")
CAUSE = "engine bug in the serving path"
PACKED = ("mtp", "nextn")
CONTEXT_CACHE = ("dflash", "dspark")  # block drafters that keep a context cache of the target's states  # algorithms whose draft layers the engine packs beside the target's pool


def _log_signal(art: Artifacts) -> tuple[str, bool, dict[str, Any]]:
    """What the decode lines say about a cache-driven fall: (text, falls, data)."""
    df = art.server_log
    off = explained_lines(df, art.server_args, art.engine_version)
    points = decode_points(df[~df["line"].isin(off["line"])] if len(off) else df)
    trend = uptime_trend(points)
    if trend is None:
        return "", False, {}
    share = cached_share(art.inputs.log) if art.engine == "sglang" else None
    rho_share = share_rho(points, share) if share is not None else math.nan
    back = recovery(points, trend)
    data = {"uptime": trend.to_dict(), "cached_share_rho": None if math.isnan(rho_share) else round(rho_share, 3),
            "recovered_at_line": back}
    falls = trend.falls() or (math.isfinite(rho_share) and rho_share <= -0.6 and trend.lost >= 0.3)
    text = (f"accept length {trend.start:.2f} at start, {trend.end:.2f} after {trend.high:.0f} min (fitted over "
            f"{trend.lines} decode lines, rank correlation with uptime {trend.rho:.2f}"
            + (f", with the cached share of prompt tokens {rho_share:.2f}" if math.isfinite(rho_share) else "")
            + ")" + (f", back near the start from line {back} (a flush or restart)" if back else ""))
    return text, falls, data


def run(art: Artifacts) -> CheckResult:
    """Place the cache settings against the release rows and read the decode lines' trend."""
    args = art.server_args
    if args is None:
        return CheckResult(skipped="the log has no arguments line (the cache settings are read from it)")
    cache = cache_setting(args)
    if not args.speculative:
        if cache.pd_role == "prefill":
            return CheckResult((Finding("drafter-cache-lost", "info", printable(
                "a prefill server of a prefill/decode split without a speculative algorithm: if the decode server "
                "speculates, its drafter gets no states or KV for the prompt from this side and drafts from a cold "
                "cache; start the prefill server with the same speculative arguments."), source=SOURCE,
                impact="medium"),), "prefill role without speculation", {"setting": cache.describe()})
        return CheckResult((), "the server does not speculate", {})
    data: dict[str, Any] = {"setting": cache.describe(), "cause": CAUSE}
    trend_text, falls, tdata = _log_signal(art)
    data.update(tdata)
    findings = []
    fix = ("Serve without the hierarchical cache / KV offload while speculating, upgrade to a release that restores "
           "the draft's cache with the target's (SGLang >= 0.5.11; packed MTP / NextN draft state >= 0.5.18), or "
           "flush the cache and compare accept length before and after.")
    if args.engine == "sglang" and cache.hicache:
        first, last, exact = release_span(args, art.inputs.engine_version)
        rows = runtime_rules_between("hicache", "sglang", first, last)
        packed = args.algorithm in PACKED
        bad = [r for r in rows if r.outcome == "target-only" or (packed and r.outcome == "paired")]
        data["rows"] = [{"span": r.span(), "outcome": r.outcome} for r in rows]
        if not rows:
            msg = f"SGLang {first}: HiCache with a drafter was not read for this release."
            findings.append(Finding("drafter-cache-lost", "warning" if falls else "info", printable(
                msg + (f" The log: {trend_text}." if trend_text else "")), fix=fix, source=SOURCE,
                impact="high" if falls else "low"))
        elif bad:
            rule = bad[0]
            lead = "" if exact or len(bad) == len(rows) else \
                f"if your release is one of SGLang {rule.span()} (pass --engine-version), then "
            msg = (f"HiCache with speculation ({cache.describe()}): {lead}{rule.detail} ({rule.source}). A prefix "
                   "restored from host memory or storage then drafts from a cache the drafter never wrote: accept "
                   "length falls as the cache fills (4.49 -> 1.59 in sgl-project/sglang#32176)."
                   + (f" The log: {trend_text}." if trend_text else ""))
            certain = (exact or len(bad) == len(rows)) and falls
            findings.append(Finding("drafter-cache-lost", "error" if certain else "warning", printable(msg), fix=fix,
                                    source=f"{rule.source}; {SOURCE}", impact="high"))
        else:
            rule = rows[-1]
            sev = "warning" if falls else "info"
            findings.append(Finding("drafter-cache-lost", sev, printable(
                f"HiCache with speculation ({cache.describe()}): {rule.detail} ({rule.source})."
                + (f" Yet the log: {trend_text}: some draft state is still not restored." if falls else
                   (f" The log stays flat: {trend_text}." if trend_text else ""))), fix=fix if falls else None,
                source=f"{rule.source}; {SOURCE}", impact="high" if falls else "low"))
    elif args.engine == "vllm" and (cache.kv_transfer or cache.offload_gib):
        msg = (f"vLLM with a KV connector or CPU offload ({cache.describe()}) and speculation: whether the drafter's "
               "KV is restored with the target's was not read for this release; the threads report a drafter "
               "that keeps its own context cache losing it on a restored prefix (vllm-project/vllm#47930, #47926)."
               + (f" The log: {trend_text}." if trend_text else ""))
        findings.append(Finding("drafter-cache-lost", "warning" if falls else "info", printable(msg),
                                fix=fix if falls else None, source=SOURCE, impact="high" if falls else "low"))
    elif args.engine == "vllm" and cache.prefix_caching and args.algorithm_raw and \
            str(args.algorithm_raw).lower() in CONTEXT_CACHE:
        findings.append(Finding("drafter-cache-lost", "warning" if falls else "info", printable(
            f"vLLM caches prefixes (enable_prefix_caching on, V1's default) for a {args.algorithm_raw} drafter, which "
            "keeps its own context cache: on a prefix hit that cache is not rebuilt (vllm-project/vllm#47930: 2.98 "
            "-> 1.25 as the cached share grows, reported open; not read in the wheels)."
            + (f" The log: {trend_text}." if trend_text else "")), fix="Compare with --no-enable-prefix-caching.",
            source=SOURCE, impact="high" if falls else "low"))
    elif falls:
        findings.append(Finding("drafter-cache-lost", "info", printable(
            f"{trend_text}: accept length falls with uptime, the shape a drafter cache lost on restored prefixes "
            "gives; no cache setting on this launch explains it (prefix caching, preemption or a KV connector "
            "elsewhere may)."), source=SOURCE, impact="medium"))
    if args.engine == "sglang" and cache.pd_role == "decode" and falls:
        findings.append(Finding("drafter-cache-lost", "warning", printable(
            "a decode server of a prefill/decode split whose accept length falls with uptime: check that the "
            "prefill server runs the same speculative algorithm, else the drafter starts each request without "
            "its states."), source=SOURCE, impact="medium"))
    return CheckResult(tuple(findings), cache.describe() + (f"; {trend_text}" if trend_text else ""), data)


CHECK = register(Check("drafter-cache", "the drafter's cache lost where the target's is restored (--log)",
                       ("drafter-cache-lost",), ("log",), run, order=63))
