"""Stand-in deployments for probe: vLLM and SGLang back-ends as the cited releases count and reply, and routers.

Written from the released wheels (pip download --no-deps, unzipped; not from probe's own tables):

* vLLM 0.10.1.1 / 0.29.0 / 0.34.0 (``vllm/v1/core/sched/scheduler.py``, ``update_from_output``): a
  request's first token comes from prefill; every later step verifies k drafts, accepts a of them
  and emits a + 1 tokens; the step is counted (``make_spec_decoding_stats``: one draft, k draft
  tokens, a accepted, per position i accepted when a > i) *before* ``_update_request_with_output``
  cuts the new tokens at the stop token or ``max_tokens``. 0.33.0 and 0.34.0 propose no drafts in a step that
  samples the request's last token under ``max_tokens`` (``_drafts_unused``): that step is a plain one,
  not counted. Counters as ``SpecDecodingProm`` declares them (``vllm/v1/spec_decode/metrics.py``:
  ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens``,
  ``..._num_accepted_tokens_per_pos`` with ``position``; labels ``model_name``, ``engine``), beside
  other ``vllm:`` families; ``--disable-log-stats`` leaves no ``vllm:`` family at all
  (``vllm/v1/engine/async_llm.py``: no ``StatLoggerManager``). 0.29.0+ with
  ``--per-request-spec-decode-metrics summary`` adds ``metrics.speculative_decoding`` to the reply
  (``vllm/v1/metrics/stats.py`` ``RequestSpecDecodeMetrics.to_dict``; ``PerRequestMetrics`` in
  ``entrypoints/generate/base/protocol.py``).
* SGLang 0.5.23: ``POST /generate`` -> ``{"text", "output_ids", "meta_info"}``; ``meta_info`` as
  ``tokenizer_manager._calculate_spec_decoding_metrics`` fills it (``spec_verify_ct``,
  ``spec_accept_length`` = completion tokens / verify passes, ``spec_accept_rate``,
  ``spec_num_correct_drafts``, ``spec_num_proposed_drafts``, ``spec_correct_drafts_histogram``, a
  histogram grown to the largest accepted count seen, ``schedule_batch.py``); ``GET /server_info``
  the resolved server arguments (``speculative_adaptive`` among them) plus ``startup_time``,
  ``internal_states`` and ``version`` (``srt/entrypoints/http_server.py``); with ``--enable-metrics``
  ``/metrics`` has the gauge ``sglang:spec_num_steps`` (``srt/observability/metrics_collector.py``).
  Adaptive steps (``srt/speculative/adaptive_spec_params.py``) are simulated as a launch at
  ``k`` steps that moves to ``running`` steps after ``adapt_after`` verify passes.

Acceptance: each next draft accepted with probability ``q`` (a chain), seeded by the prompt and the
back-end. Every server binds 127.0.0.1 on an ephemeral port and stops itself after ``LIFETIME``
seconds whatever the test does.
"""
from __future__ import annotations

import contextlib
import hashlib
import http.client
import itertools
import json
import random
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from .probeservers import _Server, reply  # 127.0.0.1 servers that ignore clients leaving first

MODEL = "/models/tiny-llama"
LIFETIME = 90.0  # seconds: a stand-in shuts itself down after this
EOS = 2


@dataclass
class Backend:
    """One serving back-end: engine, release, speculation, and what it was started with."""

    engine: str = "vllm"
    release: str = "0.34.0"
    k: int = 7
    q: float = 0.92
    seed: int = 0
    eos_at: int | None = None  # the target ends its answer after this many tokens (finish "stop")
    log_stats: bool = True  # vLLM: False is --disable-log-stats
    per_request: str = "none"  # vLLM 0.29+: --per-request-spec-decode-metrics
    adaptive: bool = False  # SGLang: --speculative-adaptive
    running: int | None = None  # SGLang adaptive: the steps it moves to
    adapt_after: int = 20  # ... after this many verify passes
    enable_metrics: bool = True  # SGLang --enable-metrics
    port_tag: int = 30000  # SGLang: the port its arguments name
    log: str | None = None  # SGLang: write a decode line per finished request here (metrics_reporter's format)
    q_code: float | None = None  # SGLang: prompts that mention "code" accept with this q instead (another kind)
    other_on: tuple[int, ...] = ()  # vLLM: generations (0-based) during which another client's request is counted
    seen: list[dict[str, Any]] = field(default_factory=list)


def _seed(*parts: Any) -> int:
    return int(hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:8], 16)


def _accepted(rng: random.Random, k: int, q: float) -> int:
    a = 0
    while a < k and rng.random() < q:
        a += 1
    return a


class _Running(contextlib.AbstractContextManager):
    """An HTTP server on 127.0.0.1 (ephemeral port) answering with ``route``; stops itself after LIFETIME."""

    def __init__(self, route: Callable[[str, str, dict[str, Any] | None], tuple[int, bytes, str]]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, method: str) -> None:
                body = None
                if method == "POST":
                    n = int(self.headers.get("Content-Length", "0"))
                    body = json.loads(self.rfile.read(n) or b"{}")
                reply(self, *route(method, self.path, body))

            def do_GET(self) -> None:  # noqa: N802
                self._answer("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._answer("POST")

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.timer = threading.Timer(LIFETIME, self.close)
        self.timer.daemon = True
        self.timer.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.timer.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def __exit__(self, *exc: object) -> None:
        self.close()


def _json(body: Any, status: int = 200) -> tuple[int, bytes, str]:
    return status, json.dumps(body).encode(), "application/json"


class VllmBackend(_Running):
    """A vLLM V1 server as the cited releases count and reply."""

    def __init__(self, b: Backend) -> None:
        self.b = b
        self.lock = threading.Lock()
        self.registry = CollectorRegistry()
        self.counted: list[tuple[int, int]] = []  # per request: (drafts counted, accepted counted)
        if b.log_stats:
            names, labels = ["model_name", "engine"], [MODEL, "0"]
            Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", names,
                  registry=self.registry).labels(*labels).set(0)
            self.gen = Counter("vllm:generation_tokens", "Number of generation tokens processed.", names,
                               registry=self.registry).labels(*labels)
        if b.log_stats and b.k > 0:  # SpecDecodingProm declares nothing without a speculative config
            self.drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", names,
                                  registry=self.registry).labels(*labels)
            self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", names,
                                        registry=self.registry).labels(*labels)
            self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", names,
                                    registry=self.registry).labels(*labels)
            per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                              names + ["position"], registry=self.registry)
            self.pos = [per_pos.labels(*labels, str(i)) for i in range(b.k)]
        super().__init__(self.route)

    def decode(self, prompt: Any, max_tokens: int) -> tuple[list[int], str, list[int], int]:
        """(output ids, finish reason, accepted per counted step, draft tokens counted)."""
        b = self.b
        rng = random.Random(_seed(prompt, b.seed))
        stream = [rng.randrange(10, 500) for _ in range(max_tokens + b.k + 2)]
        if b.eos_at is not None:
            stream[b.eos_at] = EOS
        out = [stream[0]]  # prefill samples the first token, with no drafts
        steps: list[int] = []
        while True:
            stop = EOS in out or len(out) >= max_tokens
            if stop:
                break
            left = max_tokens - len(out)
            if b.k == 0 or (b.release in ("0.33.0", "0.34.0") and left == 1):  # _drafts_unused: none for the last token
                out.append(stream[len(out)])
                continue
            a = _accepted(rng, b.k, b.q)
            steps.append(a)  # counted here, before the cut (make_spec_decoding_stats runs first)
            new = stream[len(out):len(out) + a + 1]
            for t in new:  # _update_request_with_output: append until a stop, trim the rest
                out.append(t)
                if t == EOS or len(out) >= max_tokens:
                    break
        finish = "stop" if out[-1] == EOS else "length"
        return out, finish, steps, len(steps) * b.k

    def route(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, bytes, str]:
        b = self.b
        b.seen.append({"method": method, "path": path})
        if method == "GET" and path == "/version":
            return _json({"version": b.release})
        if method == "GET" and path == "/v1/models":
            return _json({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "vllm"}]})
        if method == "GET" and path == "/metrics":
            page = generate_latest(self.registry)  # --disable-log-stats: no vllm: family, only what else registers
            return 200, b"# HELP python_info Python platform information\n" + page, "text/plain; version=0.0.4"
        if method == "POST" and path == "/v1/completions" and body is not None:
            ids, finish, steps, draft_tokens = self.decode(body["prompt"], int(body["max_tokens"]))
            nth = sum(1 for e in b.seen if e["method"] == "POST") - 1
            if nth in b.other_on:  # another client's request, counted in the same window
                _, _, other, other_tokens = self.decode(["other", nth], int(body["max_tokens"]))
                steps, draft_tokens = steps + other, draft_tokens + other_tokens
            with self.lock:
                self.counted.append((len(steps), sum(steps)))
                if b.log_stats:
                    self.gen.inc(len(ids))
                if b.log_stats and b.k > 0:
                    self.drafts.inc(len(steps))
                    self.draft_tokens.inc(draft_tokens)
                    self.accepted.inc(sum(steps))
                    for i in range(b.k):
                        self.pos[i].inc(sum(1 for a in steps if a > i))
            choice: dict[str, Any] = {"index": 0, "text": " ".join(f"w{t}" for t in ids), "logprobs": None,
                                      "finish_reason": finish, "stop_reason": None}
            if body.get("return_token_ids") and b.release != "0.10.1.1":  # the field came after 0.10.1.1
                choice.update({"token_ids": ids, "prompt_token_ids": None})
            reply: dict[str, Any] = {"id": f"cmpl-{len(b.seen)}", "object": "text_completion",
                                     "created": int(time.time()), "model": MODEL, "choices": [choice],
                                     "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids),
                                               "total_tokens": len(ids) + len(body["prompt"])}}
            if b.per_request != "none" and b.k > 0:
                hist = [sum(1 for a in steps if a == j) for j in range(b.k + 1)]
                acc = sum(steps)
                reply["metrics"] = {"time_to_first_token_ms": None, "generation_time_ms": None,
                                    "queue_time_ms": None, "mean_itl_ms": None, "tokens_per_second": None,
                                    "speculative_decoding": {
                                        "mean_acceptance_length": 1.0 + acc / len(steps) if steps else 1.0,
                                        "draft_acceptance_rate": acc / draft_tokens if draft_tokens else 0.0,
                                        "acceptance_histogram": hist, "num_spec_steps": len(steps),
                                        "num_accepted_draft_tokens": acc, "num_draft_tokens": draft_tokens,
                                        "num_spec_tokens": b.k, "per_step_accepted": None,
                                        "per_step_drafted": None}}
            return _json(reply)
        return _json({"detail": "Not Found"}, 404)


class SglangBackend(_Running):
    """An SGLang 0.5.x server (native /generate), with 0.5.23's adaptive steps when asked."""

    def __init__(self, b: Backend) -> None:
        self.b = b
        self.lock = threading.Lock()
        self.passes = 0  # verify passes served so far (adaptive steps move after adapt_after)
        self.started = 1_765_000_000.0 + b.port_tag
        self.registry = CollectorRegistry()  # observe_one_finished_request's counters (--enable-metrics)
        self.generated = Counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                                 ["model_name", "is_streaming"], registry=self.registry)
        self.verify_calls = Counter("sglang:spec_verify_calls_total",
                                    "Number of speculative decoding verification calls.", ["model_name"],
                                    registry=self.registry)
        self.steps_gauge = Gauge("sglang:spec_num_steps", "Currently active speculative_num_steps.", ["model_name"],
                                 registry=self.registry)
        super().__init__(self.route)

    def steps_now(self) -> int:
        b = self.b
        return b.running if b.adaptive and b.running and self.passes >= b.adapt_after else b.k

    def route(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, bytes, str]:
        b = self.b
        b.seen.append({"method": method, "path": path})
        if method == "GET" and path in ("/model_info", "/get_model_info"):
            return _json({"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True})
        if method == "GET" and path in ("/server_info", "/get_server_info"):
            return _json({"model_path": MODEL, "host": "127.0.0.1", "port": b.port_tag, "tp_size": 1,
                          "disable_cuda_graph": False, "disable_radix_cache": False,
                          "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/drafter",
                          "speculative_num_steps": b.k, "speculative_eagle_topk": 1,
                          "speculative_num_draft_tokens": b.k + 1, "speculative_adaptive": b.adaptive,
                          "speculative_adaptive_config": None, "enable_metrics": b.enable_metrics,
                          "startup_time": self.started, "internal_states": [{"avg_spec_accept_length": 0.0}],
                          "version": b.release, "frontend": "python"})
        if method == "GET" and path == "/metrics":
            if not b.enable_metrics:
                return _json({"detail": "Not Found"}, 404)
            self.steps_gauge.labels(MODEL).set(self.steps_now())
            return 200, generate_latest(self.registry), "text/plain; version=0.0.4"
        if method == "POST" and path == "/generate" and body is not None:
            prompt = body.get("input_ids", body.get("text"))
            n = int(body["sampling_params"]["max_new_tokens"])
            rng = random.Random(_seed(prompt, b.seed))
            ids = [rng.randrange(10, 500) for _ in range(n)]
            q = b.q_code if b.q_code is not None and "code" in str(prompt) else b.q
            left, hist, verify = n - 1, [], 0
            while left > 0:
                with self.lock:
                    k = self.steps_now()
                    self.passes += 1
                a = min(_accepted(rng, k, q), left - 1)
                if len(hist) <= a:
                    hist.extend([0] * (a + 1 - len(hist)))
                hist[a] += 1
                verify += 1
                left -= a + 1
            correct = sum(j * c for j, c in enumerate(hist))
            self.generated.labels(MODEL, "false").inc(n)
            self.verify_calls.labels(MODEL).inc(verify)
            if b.log is not None:  # srt/managers/scheduler_components/metrics_reporter.py report_decode_stats
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                with self.lock, open(b.log, "a") as fh:
                    fh.write(f"[{stamp} TP0] Decode batch, #running-req: 1, #token: {n + 8}, token usage: 0.01, "
                             f"accept len: {n / verify:.2f}, accept rate: {correct / (verify * k):.2f}, "
                             "cuda graph: True, gen throughput (token/s): 80.00, #queue-req: 0\n")
            meta = {"id": f"r{len(b.seen)}", "finish_reason": {"type": "length", "length": n},
                    "prompt_tokens": len(prompt) if isinstance(prompt, list) else 8, "completion_tokens": n,
                    "cached_tokens": 0, "spec_accept_rate": correct / (verify * k),
                    "spec_accept_length": n / verify, "spec_num_correct_drafts": correct,
                    "spec_num_proposed_drafts": verify * k, "spec_verify_ct": verify,
                    "spec_correct_drafts_histogram": hist, "e2e_latency": 0.01}
            return _json({"text": " ".join(f"w{t}" for t in ids), "output_ids": ids, "meta_info": meta})
        return _json({"detail": "Not Found"}, 404)


class Router(_Running):
    """A router over back-ends: generations round-robin; /metrics from ``metrics_from`` (one back-end's) or,
    with None, round-robin like every other GET."""

    def __init__(self, backends: list[_Running], metrics_from: int | None = 0) -> None:
        self.backends = backends
        self.turn = itertools.count()
        self.get_turn = itertools.count()
        self.metrics_from = metrics_from
        super().__init__(self.route)

    def route(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, bytes, str]:
        if method == "POST":
            target = self.backends[next(self.turn) % len(self.backends)]
        elif path == "/metrics" and self.metrics_from is not None:
            target = self.backends[self.metrics_from]
        else:
            target = self.backends[next(self.get_turn) % len(self.backends)]
        host, port = target.httpd.server_address[:2]
        conn = http.client.HTTPConnection(str(host), int(port), timeout=30)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read(), resp.getheader("Content-Type") or "application/json"
        finally:
            conn.close()


def backend(b: Backend) -> _Running:
    return VllmBackend(b) if b.engine == "vllm" else SglangBackend(b)
