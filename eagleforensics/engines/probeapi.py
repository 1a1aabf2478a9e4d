"""Speak each engine's HTTP API for ``probe``: who the server is, one generation, and vLLM's spec-decode counters.

The field names and endpoints are those of ``engines.probeformats`` (read from the released
wheels). A reply that lacks what the format promises is bad input (one line naming the endpoint
and the field), never a guess.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import ForensicsError, printable
from ..io.httpclient import MAX_REPLY, Client
from . import probecounts as pc
from . import probeformats as pf

ENGINES = ("sglang", "vllm")
DECLARED = "#declared "  # counters() keys for a spec-decode family the page declares
FAMILIES = "#vllm-families"  # counters() key present when the page carries any vllm: family at all
# What a reply may hold (docs/probe.md, "Hardening"): a server's account of itself is a few KiB; /metrics is
# hundreds of KiB; a generation's reply grows with its tokens. Values bound what parsing builds.
INFO_BYTES = 1 << 20
INFO_VALUES = 50_000
METRICS_BYTES = 16 << 20
# spec-decode samples on one page: a per-position series per step, per engine (64 data-parallel engines at 128
# steps write ~8.5k); a page with more is not a server's
METRICS_SERIES = 20_000
REPLY_BYTES_BASE, REPLY_BYTES_PER_TOKEN = 1 << 20, 1 << 10
REPLY_VALUES_BASE, REPLY_VALUES_PER_TOKEN = 100_000, 4
_SPEC = "vllm:spec_decode_"
_HELP = "# HELP " + _SPEC
_TYPE = "# TYPE " + _SPEC


@dataclass(frozen=True)
class ServerInfo:
    """What the server says about itself: engine, release, model, and its speculative launch where it says."""

    engine: str
    version: str | None
    model: str | None
    speculative: bool | None  # None: the server does not say (vLLM: its counters decide)
    algorithm: str | None = None
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    draft: str | None = None
    cuda_graph: bool | None = None
    prefix_cache: bool | None = None
    counters: pf.CounterFormat | None = None
    adaptive: bool | None = None  # SGLang speculative_adaptive: the step count moves at run time
    identity: tuple[tuple[str, str], ...] = ()  # SGLang server-info fields that tell one back-end from another


@dataclass(frozen=True)
class Reply:
    """One finished generation: its text and ids, the tokens it made, the time it took, the engine's spec fields."""

    text: str
    ids: tuple[int, ...] | None
    completion_tokens: int
    finish: str | None
    seconds: float
    verify: int | None = None  # SGLang spec_verify_ct
    accept_length: float | None = None  # SGLang spec_accept_length, where the release gives it
    histogram: tuple[int, ...] | None = None  # SGLang spec_correct_drafts_histogram
    extra: dict[str, Any] = field(default_factory=dict)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _bad(client: Client, path: str, what: str) -> ForensicsError:
    return ForensicsError(f"{client.what}: the reply to {path} is not what the engine sends: {what}")


def _declared(client: Client, path: str, args: dict[str, Any], key: str, hi: int) -> int | None:
    """An integer the server declares about its launch, refused past what any engine runs (``probeformats``)."""
    value = _int(args.get(key))
    if value is not None and not 0 <= value <= hi:
        shown = str(value) if len(str(value)) <= 24 else f"a number of {len(str(value))} digits"
        raise ForensicsError(f"{client.what}: {path} declares {key} = {shown}, which no engine runs (at most {hi}; "
                             "docs/probe.md, Hardening): refusing the launch it describes")
    return value


def info_json(client: Client, path: str, *, missing_ok: bool = False) -> Any:
    """A server's account of itself (``/server_info``, ``/version``, ...), within ``INFO_BYTES`` and ``INFO_VALUES``."""
    return client.get_json(path, missing_ok=missing_ok, limit=INFO_BYTES, max_items=INFO_VALUES)


def metrics_page(client: Client) -> str:
    """The ``/metrics`` page, within ``METRICS_BYTES``."""
    return client.get_text("/metrics", limit=METRICS_BYTES)


def detect(client: Client) -> str:
    """``sglang`` or ``vllm`` from the endpoints the server answers (SGLang's model info, vLLM's /version).

    A 404 moves on to the next endpoint; any other failure (refused, stalled, malformed) is said at once.
    """
    for path in pf.SGLANG_MODEL_INFO:
        info = info_json(client, path, missing_ok=True)
        if isinstance(info, dict) and "model_path" in info:
            return "sglang"
    ver = info_json(client, "/version", missing_ok=True)
    if isinstance(ver, dict) and isinstance(ver.get("version"), str):
        return "vllm"
    raise ForensicsError(f"{client.what} answers neither SGLang's /model_info nor vLLM's /version: pass --engine")


def _first(client: Client, paths: tuple[str, ...]) -> tuple[str, Any]:
    for path in paths:
        got = info_json(client, path, missing_ok=True)
        if got is not None:
            return path, got
    raise ForensicsError(f"{client.what} answers none of {', '.join(paths)} (is it an SGLang server?)")


def info(client: Client, engine: str) -> ServerInfo:
    """The server's own account of itself (``probeformats`` names the endpoints)."""
    if engine == "sglang":
        path, model = _first(client, pf.SGLANG_MODEL_INFO)
        if not isinstance(model, dict) or not isinstance(model.get("model_path"), str):
            raise _bad(client, path, "no model_path")
        path, args = _first(client, pf.SGLANG_SERVER_INFO)
        if not isinstance(args, dict):
            raise _bad(client, path, "not an object")
        algo = args.get("speculative_algorithm")
        algo = algo if isinstance(algo, str) and algo and algo.upper() != "NONE" else None
        version = args.get("version")

        def flag(key: str) -> bool | None:
            value = args.get(key)
            return None if not isinstance(value, bool) else not value

        return ServerInfo("sglang", version if isinstance(version, str) else None, model["model_path"],
                          algo is not None, algo, _declared(client, path, args, "speculative_num_steps", pf.MAX_STEPS),
                          _declared(client, path, args, "speculative_eagle_topk", pf.MAX_TOPK),
                          _declared(client, path, args, "speculative_num_draft_tokens", pf.MAX_DRAFT_TOKENS),
                          args.get("speculative_draft_model_path") if isinstance(
                              args.get("speculative_draft_model_path"), str) else None,
                          flag("disable_cuda_graph"), flag("disable_radix_cache"),
                          adaptive=args.get("speculative_adaptive") is True, identity=pc.identity(args))
    ver = info_json(client, "/version")
    if not isinstance(ver, dict) or not isinstance(ver.get("version"), str):
        raise _bad(client, "/version", "no version string")
    models = info_json(client, "/v1/models")
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict) or not isinstance(data[0].get("id"), str):
        raise _bad(client, "/v1/models", "no data[0].id")
    values = counters(client)
    fmt = pf.counter_format(set(values))
    steps = None
    if fmt is pf.V1:
        steps = sum(1 for k in values if k.startswith(pf.V1_PER_POS + "|")) or None
    elif fmt is pf.V0:
        steps = v0_k(values)
    # pf.V1_EARLY: no k on the page; the probe takes it from its own tokens
    return ServerInfo("vllm", ver["version"], data[0]["id"], fmt is not None,
                      None, steps, 1 if steps else None, steps + 1 if steps else None, counters=fmt)


def v0_k(values: dict[str, float]) -> int | None:
    """vLLM 0.7.3's tokens per draft from its cumulative counters: efficiency = E / (D / k x (k + 1))."""
    e, d, eff = values.get(pf.V0_EMITTED, 0.0), values.get(pf.V0_DRAFT_TOKENS, 0.0), values.get(pf.V0_EFFICIENCY)
    if not eff or eff <= 0 or d <= 0 or e <= 0:
        return None
    drafts = e / eff - d  # D / k x (k + 1) - D = D / k
    if drafts <= 0:
        return None
    k = d / drafts
    if not 0.5 <= k <= pf.MAX_STEPS + 0.5:  # past what any engine runs: no k
        return None
    return int(round(k)) if abs(k - round(k)) < 0.05 and round(k) >= 1 else None


def counters(client: Client) -> dict[str, float]:
    """vLLM's spec-decode samples on /metrics, summed over model and engine labels; per-position ones keyed
    ``name|position``; every declared spec-decode family also as ``DECLARED + name`` (vLLM 0.7.3 declares its
    counters whether or not it speculates, and writes samples once it has logged spec-decode stats)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = metrics_page(client)
    # only the spec-decode families are parsed: a real page carries every histogram (hundreds of KiB),
    # and the probe reads it once per counter window
    lines = [line for line in text.splitlines()
             if line.startswith(_SPEC) or line.startswith(_HELP) or line.startswith(_TYPE)]
    if len(lines) > METRICS_SERIES:  # counted before any is parsed
        raise ForensicsError(f"{client.what}: /metrics has {len(lines):,} spec-decode lines, more than any server "
                             f"writes (at most {METRICS_SERIES:,}: a series per draft position per engine)")
    keep = "\n".join(lines)
    out: dict[str, float] = {}
    if pc.has_vllm_family(text):
        out[FAMILIES] = 1.0
    try:
        for family in text_string_to_metric_families(keep + "\n" if keep else ""):
            if family.name.startswith("vllm:spec_decode_"):
                out.setdefault(DECLARED + family.name, 0.0)  # declared, with or without samples yet
            for s in family.samples:
                if not s.name.startswith("vllm:spec_decode_") or s.name.endswith("_created"):
                    continue
                key = s.name
                if "position" in s.labels:
                    pos = s.labels["position"]
                    if not (pos.isascii() and pos.isdigit() and len(pos) <= 4 and int(pos) < pf.MAX_STEPS):
                        raise ForensicsError(
                            f"{client.what}: /metrics counts a draft position {printable(pos[:24])!r}, which no "
                            f"engine runs (positions 0 to {pf.MAX_STEPS - 1}; docs/probe.md, Hardening)")
                    key += f"|{int(pos)}"
                if not math.isfinite(s.value) or s.value < 0:
                    raise ValueError(f"{s.name} is {s.value}")
                out[key] = out.get(key, 0.0) + s.value
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ForensicsError(f"{client.what}: /metrics is not Prometheus text: {' '.join(str(exc).split())[:100]}"
                             ) from None
    return out


def generate(client: Client, engine: str, prompt: list[int] | str, *, max_tokens: int, temperature: float,
             model: str | None) -> Reply:
    """One non-streaming generation, timed from request to reply."""
    start = time.perf_counter()
    if engine == "sglang":
        body: dict[str, Any] = {"sampling_params": {"max_new_tokens": max_tokens, "temperature": temperature},
                                "stream": False}
        body["input_ids" if isinstance(prompt, list) else "text"] = prompt
        got = client.post_json("/generate", body, **_reply_bounds(max_tokens))
        seconds = time.perf_counter() - start
        return _sglang_reply(client, got, seconds)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
            "return_token_ids": True}
    got = client.post_json("/v1/completions", body, **_reply_bounds(max_tokens))
    seconds = time.perf_counter() - start
    return _vllm_reply(client, got, seconds)


def _reply_bounds(max_tokens: int) -> dict[str, int]:
    """Bytes and values a generation's reply may hold: its text and ids grow with the tokens asked for."""
    return {"limit": min(MAX_REPLY, REPLY_BYTES_BASE + REPLY_BYTES_PER_TOKEN * max_tokens),
            "max_items": REPLY_VALUES_BASE + REPLY_VALUES_PER_TOKEN * max_tokens}


def _histogram(client: Client, path: str, value: Any, done: int) -> tuple[int, ...] | None:
    """SGLang's verify passes by accepted drafts: at most MAX_STEPS + 1 counts (one per count of accepted drafts),
    each a count, together no more passes than tokens (every pass emits one)."""
    hist = _ids(value)
    if hist is None:
        return None
    if len(hist) > pf.MAX_STEPS + 1:
        raise _bad(client, path, f"{pf.SGLANG_HISTOGRAM[0]} has {len(hist):,} entries, more than the "
                                 f"{pf.MAX_STEPS + 1} of any engine's steps (docs/probe.md, Hardening)")
    if any(v < 0 for v in hist) or sum(hist) > max(done, 1):
        raise _bad(client, path, f"{pf.SGLANG_HISTOGRAM[0]} counts {sum(hist)} verify passes for {done} tokens")
    return hist


def _ids(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(_int(v) is not None for v in value):
        return tuple(int(v) for v in value)
    return None


def _sglang_reply(client: Client, got: Any, seconds: float) -> Reply:
    path = "/generate"
    if isinstance(got, list) and len(got) == 1:
        got = got[0]
    if not isinstance(got, dict) or not isinstance(got.get("text"), str) or not isinstance(got.get("meta_info"), dict):
        raise _bad(client, path, "no text and meta_info")
    meta = got["meta_info"]
    done = _int(meta.get("completion_tokens"))
    if done is None or done < 0:
        raise _bad(client, path, "meta_info.completion_tokens is not a count")
    finish = meta.get("finish_reason")
    finish = finish.get("type") if isinstance(finish, dict) else finish
    verify = next((_int(meta[k]) for k in pf.SGLANG_VERIFY if k in meta), None)
    if verify is not None and (verify < 0 or verify > max(done, 1)):
        raise _bad(client, path, f"spec_verify_ct {verify} for {done} tokens")
    length = next((meta[k] for k in pf.SGLANG_ACCEPT_LENGTH if k in meta), None)
    length = float(length) if isinstance(length, (int, float)) and not isinstance(length, bool) else None
    hist = next((_histogram(client, path, meta[k], done) for k in pf.SGLANG_HISTOGRAM if k in meta), None)
    ids = _ids(got.get("output_ids")) if "output_ids" in got else None
    return Reply(got["text"], ids, done, finish if isinstance(finish, str) else None, seconds, verify, length, hist)


def _vllm_reply(client: Client, got: Any, seconds: float) -> Reply:
    path = "/v1/completions"
    choices = got.get("choices") if isinstance(got, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict) or \
            not isinstance(choices[0].get("text"), str):
        raise _bad(client, path, "no choices[0].text")
    usage = got.get("usage")
    done = _int(usage.get("completion_tokens")) if isinstance(usage, dict) else None
    if done is None or done < 0:
        raise _bad(client, path, "usage.completion_tokens is not a count")
    choice = choices[0]
    finish = choice.get("finish_reason")
    spec = pc.request_spec(got)
    if spec is not None and not spec.k <= pf.MAX_STEPS:
        shown = str(spec.k) if len(str(spec.k)) <= 24 else f"a number of {len(str(spec.k))} digits"
        raise _bad(client, path, f"metrics.speculative_decoding declares num_spec_tokens = {shown}, which no engine "
                                 f"runs (at most {pf.MAX_STEPS}; docs/probe.md, Hardening)")
    return Reply(choice["text"], _ids(choice.get("token_ids")), done, finish if isinstance(finish, str) else None,
                 seconds, extra={"spec": spec})
